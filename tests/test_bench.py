"""attnlib.bench: the formulas, the timers' logic, the rows, the files and the command line.

No test here asserts how long anything takes: timings depend on the machine.
The timers are checked with a fake clock instead.
"""

import contextlib
import csv
import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import attnlib
from attnlib import provenance
from attnlib.bench import cli, devices, kernels, memory, report, sweep, timing
from attnlib.bench.flops import ITEMSIZE, arithmetic_intensity, attention_flops, fused_bytes, naive_bytes

REPO = Path(__file__).resolve().parents[1]


# --- FLOPs and bytes ------------------------------------------------------------------------------


def test_flops_are_four_b_h_t_squared_d_and_half_when_causal():
    assert attention_flops(1, 1, 2, 3) == 48
    assert attention_flops(4, 32, 4096, 64) == 4 * 4 * 32 * 4096**2 * 64
    assert attention_flops(4, 32, 4096, 64, causal=True) * 2 == attention_flops(4, 32, 4096, 64)


def test_flops_match_torch_flop_counter_on_the_naive_path():
    from torch.utils.flop_counter import FlopCounterMode

    B, H, T, d = 2, 3, 16, 8
    q, k, v = kernels.make_inputs("torch", B, H, T, d, "float32", "cpu")
    with FlopCounterMode(display=False) as counter:
        kernels.make_call("torch", q, k, v, causal=False)()
    assert counter.get_total_flops() == attention_flops(B, H, T, d)


def test_fused_bytes_count_q_k_v_and_o_once():
    B, H, T, d = 2, 4, 128, 64
    q, k, v = kernels.make_inputs("numpy", B, H, T, d, "float32", "cpu")
    output = np.empty_like(q)
    assert fused_bytes(B, H, T, d, 4) == q.nbytes + k.nbytes + v.nbytes + output.nbytes


def test_naive_bytes_count_each_kernels_reads_and_writes():
    B, H, T, d = 2, 4, 128, 64
    q, k, v = kernels.make_inputs("numpy", B, H, T, d, "float32", "cpu")
    scores = q @ k.swapaxes(-2, -1)  # kernel 1 reads q, k and writes scores
    weights = attnlib.softmax(scores)  # kernel 2 reads scores and writes weights
    output = weights @ v  # kernel 3 reads weights, v and writes output
    moved = (q.nbytes + k.nbytes + scores.nbytes) + (scores.nbytes + weights.nbytes) \
        + (weights.nbytes + v.nbytes + output.nbytes)
    assert naive_bytes(B, H, T, d, 4) == moved


def test_fused_bytes_with_query_blocks_count_one_pass_over_k_and_v_per_block():
    B, H, T, d = 1, 2, 1000, 64
    assert fused_bytes(B, H, T, d, 2, block_q=T) == fused_bytes(B, H, T, d, 2)  # one block: one pass
    passes = 8  # ceil(1000 / 128)
    assert fused_bytes(B, H, T, d, 2, block_q=128) == (2 + 2 * passes) * B * H * T * d * 2


@pytest.mark.parametrize("T", [64, 512, 4096])
def test_naive_moves_one_plus_t_over_d_times_the_fused_bytes(T):
    assert naive_bytes(1, 8, T, 64, 2) == fused_bytes(1, 8, T, 64, 2) * (1 + T / 64)


def test_fused_intensity_grows_with_t_and_naive_intensity_stays_below_d_over_itemsize():
    d, itemsize = 64, ITEMSIZE["float16"]
    for T in [512, 4096, 16384]:
        flops = attention_flops(1, 1, T, d)
        assert arithmetic_intensity(flops, fused_bytes(1, 1, T, d, itemsize)) == T / itemsize
        naive = arithmetic_intensity(flops, naive_bytes(1, 1, T, d, itemsize))
        assert naive < d / itemsize
        assert naive == pytest.approx(T * d / ((T + d) * itemsize))


# --- devices --------------------------------------------------------------------------------------


def test_known_devices_have_their_dense_peak():
    assert devices.lookup("NVIDIA H100 80GB HBM3").dense_fp16_tflops == 989.4
    assert devices.lookup("  nvidia h200 ").dense_fp16_tflops == 989.4
    h100 = devices.lookup("NVIDIA H100 80GB HBM3")
    assert devices.ridge_point(h100) == pytest.approx(989.4 / 3.35)


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA GeForce RTX 4090 D",
                                  "Some Future GPU", "AMD EPYC (2 CPUs)", ""])
def test_unknown_device_reports_no_fraction(name):
    assert devices.lookup(name) is None
    assert devices.peak_flops(name, "float16") is None
    assert devices.fraction_of_peak(1e12, name, "float16") is None


def test_fraction_of_peak_only_for_fp16_and_bf16():
    name = "NVIDIA H100 80GB HBM3"
    assert devices.fraction_of_peak(494.7e12, name, "bfloat16") == pytest.approx(0.5)
    assert devices.fraction_of_peak(494.7e12, name, "float32") is None
    user_peak = devices.fraction_of_peak(50e12, "Some Future GPU", "float16", override_tflops=100)
    assert user_peak == pytest.approx(0.5)


# --- timers, with a fake clock --------------------------------------------------------------------


class FakeClock:
    """Stands in for time.perf_counter; the functions under test move it forward."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_summarize_gives_median_quartiles_and_minimum():
    result = timing.summarize([4.0, 1.0, 3.0, 2.0, 5.0], first_s=9.0, warmup=2, method="perf_counter")
    assert (result.median_s, result.q25_s, result.q75_s, result.min_s) == (3.0, 2.0, 4.0, 1.0)
    assert (result.first_s, result.repeats, result.warmup) == (9.0, 5, 2)
    with pytest.raises(ValueError, match="at least one"):
        timing.summarize([], first_s=1.0, warmup=1, method="perf_counter")


def test_choose_repeats_fills_the_budget_within_bounds():
    assert timing.choose_repeats(0.1, budget_s=1.0, min_repeats=3, max_repeats=20) == 10
    assert timing.choose_repeats(5.0, budget_s=1.0, min_repeats=3, max_repeats=20) == 3
    assert timing.choose_repeats(1e-6, budget_s=1.0, min_repeats=3, max_repeats=20) == 20
    assert timing.choose_repeats(0.0, budget_s=1.0, min_repeats=3, max_repeats=20) == 20
    with pytest.raises(ValueError):
        timing.choose_repeats(0.1, budget_s=1.0, min_repeats=5, max_repeats=4)


def test_time_cpu_reports_the_first_call_apart_and_flushes_outside_the_timed_region(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    calls, flushes = [], []

    def fn():
        calls.append(clock.now)
        clock.now += 5.0 if len(calls) == 1 else 0.25  # the first call pays a one-off cost

    def fake_flush(n_bytes):
        assert n_bytes == 1024

        def flush():
            flushes.append(clock.now)
            clock.now += 100.0  # slow, but must not be timed

        return flush

    monkeypatch.setattr(timing, "cpu_cache_flush", fake_flush)
    result = timing.time_cpu(fn, warmup=2, warmup_s=0.0, min_repeats=2, max_repeats=50, budget_s=1.0,
                             flush_bytes=1024)
    assert result.first_s == 5.0
    assert result.median_s == result.min_s == result.q75_s == 0.25
    assert result.repeats == 4  # a 1 s budget at 0.25 s per call
    assert len(calls) == result.warmup + result.repeats == 6
    assert len(flushes) == result.repeats
    assert result.method == "perf_counter"
    assert result.times_s == (0.25,) * 4


def test_time_cuda_times_with_events_and_flushes_the_l2_before_each_call(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    log = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self):
            self.at = clock.now
            log.append("record")

        def elapsed_time(self, end):
            return (end.at - self.at) * 1e3  # milliseconds, like torch.cuda.Event

    def fn():
        clock.now += 0.002
        log.append("fn")

    def fake_flush(n_bytes):
        assert n_bytes == timing.FLUSH_BYTES

        def flush():
            clock.now += 1.0
            log.append("flush")

        return flush

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: log.append("sync"))
    monkeypatch.setattr(timing, "cuda_cache_flush", fake_flush)
    result = timing.time_cuda(fn, warmup=3, warmup_s=0.0, min_repeats=5, max_repeats=7, budget_s=1.0)
    assert result.method == "cuda-events"
    assert result.median_s == pytest.approx(0.002)  # the flush is outside the events
    assert result.first_s == pytest.approx(0.002)
    assert result.warmup == 3
    assert result.repeats == 7
    assert log[:2] == ["sync", "fn"] and log[2] == "sync"  # the first call is synchronized on both sides
    timed = log[log.index("flush"):]
    assert timed[:4] == ["flush", "record", "fn", "record"]
    assert timed.count("flush") == 1 + result.repeats  # one estimate call, then the repeats


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_time_cuda_on_a_real_gpu_gives_positive_times():
    a = torch.randn(512, 512, device="cuda")
    result = timing.time_cuda(lambda: a @ a, warmup=2, min_repeats=3, max_repeats=5, budget_s=0.1)
    assert result.median_s > 0 and result.repeats >= 3
    assert memory.peak_cuda(lambda: a @ a) >= a.nbytes


def test_time_on_picks_the_timer_for_the_device(monkeypatch):
    monkeypatch.setattr(timing, "time_cuda", lambda fn, **options: ("cuda", options))
    monkeypatch.setattr(timing, "time_cpu", lambda fn, **options: ("cpu", options))
    assert timing.time_on("cuda", print, warmup=3) == ("cuda", {"warmup": 3})
    assert timing.time_on("cpu", print, warmup=3) == ("cpu", {"warmup": 3})


def test_cpu_cache_flush_writes_a_new_value_each_time():
    assert timing.cpu_cache_flush(0) is None
    flush = timing.cpu_cache_flush(4096)
    flush()
    flush()  # no error, and the closure keeps its buffer


# --- memory ---------------------------------------------------------------------------------------


def test_numpy_peak_sees_the_score_matrix():
    q, k, v = kernels.make_inputs("numpy", 1, 2, 256, 16, "float64", "cpu")
    peak = memory.peak_numpy(kernels.make_call("numpy", q, k, v, causal=False))
    assert peak >= 2 * 256 * 256 * 8  # at least one (B, H, T, T) float64 matrix


def test_torch_cpu_peak_sees_the_naive_matrix_and_not_the_fused_one():
    q, k, v = kernels.make_inputs("torch", 1, 2, 256, 16, "float32", "cpu")
    matrix = 2 * 256 * 256 * 4
    naive = memory.peak_torch_cpu(kernels.make_call("torch", q, k, v, causal=False))
    with kernels.pinned("sdpa-flash"):
        fused = memory.peak_torch_cpu(kernels.make_call("sdpa-flash", q, k, v, causal=False))
    assert naive >= matrix
    assert fused < matrix


# --- kernels --------------------------------------------------------------------------------------


def test_cpu_kernels_include_every_backend_and_the_pinned_sdpa_kernels_a_cpu_has():
    available = kernels.available_kernels("cpu")
    for name in attnlib.backends():
        if name == "sdpa":
            assert {"sdpa-flash", "sdpa-math"} <= set(available)
        elif name not in ("triton", "triton-simple"):
            assert name in available
    assert "triton" not in available
    assert "sdpa" not in available  # only pinned kernels are timed
    assert not set(kernels.GPU_ONLY_SDPA_KERNELS) & set(available)  # they only say "unsupported" here


@pytest.mark.parametrize("kernel", kernels.GPU_ONLY_SDPA_KERNELS)
def test_the_sdpa_kernels_left_out_on_a_cpu_really_cannot_run_there(kernel):
    q, k, v = kernels.make_inputs("torch", 1, 2, 32, 8, "float32", "cpu")
    with pytest.raises(RuntimeError), kernels.pinned(kernel):
        kernels.make_call(kernel, q, k, v, False)()


def test_a_run_without_output_says_nothing_was_saved_and_plot_draws_a_file(tmp_path, capsys):
    image = tmp_path / "rows.png"
    assert cli.main(["--kernels", "numpy,tiled", "--seq-lens", "32", "64", "--head-dims", "8",
                     "--causal", "both", "--no-progress", "--device", "cpu", "--plot", str(image)]) == 0
    out = capsys.readouterr().out
    assert "were not saved: add --output" in out
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 10_000
    assert "% peak" in out and "of peak" not in out  # the header's last columns read apart


def test_gpu_kernels_leave_out_numpy_backends():
    for name in kernels.available_kernels("cuda"):
        assert kernels.array_kind(name) == "torch"


@pytest.mark.parametrize("kernel", kernels.available_kernels("cpu"))
@pytest.mark.parametrize("causal", [False, True])
def test_every_cpu_kernel_computes_attention(kernel, causal):
    q, k, v = kernels.make_inputs(kernels.array_kind(kernel), 1, 2, 32, 8, "float64", "cpu")
    with kernels.pinned(kernel):
        out = kernels.make_call(kernel, q, k, v, causal)()
    expected = attnlib.attention(np.asarray(q), np.asarray(k), np.asarray(v), causal=causal)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-10)


def test_numpy_kernels_have_no_bfloat16():
    with pytest.raises(TypeError, match="bfloat16"):
        kernels.make_inputs("numpy", 1, 1, 4, 4, "bfloat16", "cpu")


# --- rows: unsupported, out of memory, fractions --------------------------------------------------

FAST = sweep.Settings(device="cpu", warmup=1, warmup_s=0.0, min_repeats=1, max_repeats=2, budget_s=0.01,
                      measure_memory=False)


def test_a_kernel_that_cannot_run_gives_an_unsupported_row():
    config = sweep.Config("sdpa-efficient", 1, 2, 32, 16, "float32", False)
    row = sweep.run_config(config, FAST, "test cpu")
    assert row["status"] == "unsupported"
    assert "no viable backend" in row["message"].lower()
    assert row["time_ms"] is None and row["tflop_per_s"] is None


def test_numpy_bfloat16_gives_an_unsupported_row():
    row = sweep.run_config(sweep.Config("numpy", 1, 2, 32, 16, "bfloat16", False), FAST, "test cpu")
    assert row["status"] == "unsupported" and "bfloat16" in row["message"]


@pytest.mark.parametrize("error", [MemoryError(),
                                   RuntimeError("CUDA out of memory. Tried to allocate 64 GiB"),
                                   RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried")])
def test_running_out_of_memory_gives_a_row_not_a_crash(monkeypatch, error):
    def exhausted():
        raise error

    monkeypatch.setattr(kernels, "make_call", lambda *args, **kwargs: exhausted)
    row = sweep.run_config(sweep.Config("torch", 1, 2, 32, 16, "float32", False), FAST, "test cpu")
    assert row["status"] == "out of memory"
    assert row["time_ms"] is None


def test_a_matrix_too_big_for_ram_is_not_started(monkeypatch):
    monkeypatch.setattr(sweep, "available_memory_bytes", lambda: 2**30)
    monkeypatch.setattr(kernels, "make_call", lambda *args, **kwargs: pytest.fail("must not run"))
    row = sweep.run_config(sweep.Config("numpy", 1, 8, 8192, 64, "float32", False), FAST, "test cpu")
    assert row["status"] == "out of memory" and row["message"].startswith("not run")
    monkeypatch.undo()
    monkeypatch.setattr(sweep, "available_memory_bytes", lambda: 2**30)
    fused = sweep.run_config(sweep.Config("sdpa-flash", 1, 2, 64, 16, "float32", False), FAST, "test cpu")
    assert fused["status"] == "ok"  # only kernels that hold the T x T matrix are guarded


def test_other_failures_are_error_rows():
    assert sweep.classify_failure(ValueError("bad"))[0] == "error"
    assert sweep.classify_failure(NotImplementedError("x"))[0] == "unsupported"
    assert sweep.classify_failure(RuntimeError('"bmm" not implemented for \'Half\''))[0] == "unsupported"


def test_cpu_rows_have_no_fraction_of_peak():
    row = sweep.run_config(sweep.Config("sdpa-flash", 1, 2, 64, 16, "float16", False), FAST,
                           devices.device_name("cpu"))
    assert row["status"] == "ok" and row["tflop_per_s"] > 0
    assert row["peak_tflop_per_s"] is None and row["fraction_of_peak"] is None


@pytest.mark.parametrize("name, dtype, has_fraction", [("NVIDIA H100 80GB HBM3", "float16", True),
                                                       ("NVIDIA H100 80GB HBM3", "float32", False),
                                                       ("Mystery GPU 9000", "float16", False)])
def test_gpu_rows_get_a_fraction_only_for_a_known_peak(monkeypatch, name, dtype, has_fraction):
    fake = timing.Timing(median_s=0.5, q25_s=0.4, q75_s=0.6, min_s=0.3, first_s=1.0, repeats=5, warmup=2,
                         method="cuda-events")
    monkeypatch.setattr(sweep, "_time", lambda fn, settings: fake)
    monkeypatch.setattr(kernels, "make_inputs", lambda kind, B, H, T, d, dt, device: (None, None, None))
    monkeypatch.setattr(kernels, "make_call", lambda *args, **kwargs: lambda: None)
    settings = sweep.Settings(device="cuda", measure_memory=False, check=False)  # the fake kernel computes nothing
    row = sweep.run_config(sweep.Config("torch", 4, 32, 4096, 64, dtype, False), settings, name)
    achieved = attention_flops(4, 32, 4096, 64) / 0.5
    assert row["tflop_per_s"] == pytest.approx(achieved / 1e12)
    if has_fraction:
        assert row["fraction_of_peak"] == pytest.approx(achieved / 989.4e12)
    else:
        assert row["fraction_of_peak"] is None and row["peak_tflop_per_s"] is None


def test_tf32_mode_sets_both_flags_and_restores_them():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with sweep.tf32_mode(True):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    with sweep.tf32_mode(False):
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_loglog_slope_reads_the_power_of_t():
    rows = [{"kernel": "k", "status": "ok", "T": T, "time_ms": 3e-6 * T**2, "peak_extra_bytes": 40 * T}
            for T in [128, 256, 512, 1024]]
    rows.append({"kernel": "k", "status": "out of memory", "T": 2048, "time_ms": None,
                 "peak_extra_bytes": None})
    assert report.loglog_slope(rows, "k") == pytest.approx(2.0)
    assert report.loglog_slope(rows, "k", "peak_extra_bytes", min_t=256) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="two or more"):
        report.loglog_slope(rows, "k", min_t=1024)


def test_cpu_threads_limits_torch_and_blas_and_restores_them():
    from threadpoolctl import threadpool_info

    outer = torch.get_num_threads()
    torch.set_num_threads(3)  # not 1, so that limiting to 1 is seen (make test runs with 1)
    try:
        before = torch.get_num_threads()
        with sweep.cpu_threads(1):
            assert torch.get_num_threads() == 1
            assert all(pool["num_threads"] == 1 for pool in threadpool_info() if pool["user_api"] == "blas")
        assert torch.get_num_threads() == before == 3
        with sweep.cpu_threads(None):
            assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(outer)


def test_build_configs_limits_the_loop_and_groups_shared_inputs():
    configs = sweep.build_configs(["loop", "torch"], [1024, 256], heads=2, causal_modes=(False, True),
                                  max_t={"loop": 512})
    assert [(c.kernel, c.T, c.causal) for c in configs] == [
        ("loop", 256, False), ("torch", 256, False), ("torch", 1024, False),
        ("loop", 256, True), ("torch", 256, True), ("torch", 1024, True)]


# --- files: schema and stamp ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_rows():
    configs = sweep.build_configs(["numpy", "torch", "sdpa-flash", "sdpa-efficient"], [32, 64], heads=2,
                                  head_dims=[16])
    settings = sweep.Settings(device="cpu", warmup=1, warmup_s=0.0, min_repeats=1, max_repeats=2,
                              budget_s=0.01)
    rows = sweep.run_sweep(configs, settings, progress=False)
    stamp = report.make_stamp(device="cpu", device_name=devices.device_name("cpu"), tf32=False,
                              dtypes=["float32"], command="python -m attnlib.bench --test")
    return stamp, rows


def _check_types(rows):
    for row in rows:
        assert list(row) == list(report.ROW_COLUMNS)
        for name, kind in report.ROW_COLUMNS.items():
            assert row[name] is None or isinstance(row[name], kind), (name, row[name])
        if row["status"] == "ok":
            assert row["time_ms"] > 0 and row["flops"] > 0 and row["repeats"] >= 1
            assert row["peak_extra_bytes"] is not None and row["memory_method"]
        else:
            assert row["time_ms"] is None and row["message"]


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_files_round_trip_with_every_column_and_stamp_field(tmp_path, small_rows, suffix):
    stamp, rows = small_rows
    path = tmp_path / f"results{suffix}"
    report.write_results(path, stamp, rows)
    read_stamp, read_rows = report.read_results(path)
    assert len(read_rows) == len(rows) == 8
    _check_types(read_rows)
    assert {r["status"] for r in read_rows} == {"ok", "unsupported"}
    for field in [*report.STAMP_COLUMNS, *report.JSON_STAMP_ONLY]:
        assert field in read_stamp
    assert read_stamp["device"] == "cpu" and read_stamp["tf32"] is False
    assert read_stamp["dtypes"] == ["float32"]
    assert read_stamp["torch_version"] == torch.__version__
    assert read_stamp["attnlib_version"] == attnlib.__version__
    date = datetime.datetime.fromisoformat(read_stamp["date_utc"])
    assert date.utcoffset() == datetime.timedelta(0)
    assert read_rows == rows  # every value, None included, comes back as it was written
    assert read_stamp == stamp
    if provenance.git_commit() is not None:  # run from a git checkout: the commit of the code that measured
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", read_stamp["git_commit"])


def test_a_file_written_before_the_stamp_had_a_git_commit_still_reads(tmp_path, small_rows):
    stamp, rows = small_rows
    path = tmp_path / "old.csv"
    report.write_results(path, stamp, rows)
    with open(path, newline="") as f:
        records = list(csv.DictReader(f))
    with open(path, "w", newline="") as f:
        newer = ("git_commit", "check_tolerance")
        writer = csv.DictWriter(f, fieldnames=[c for c in records[0] if c not in newer])
        writer.writeheader()
        writer.writerows({c: r[c] for c in writer.fieldnames} for r in records)
    read_stamp, read_rows = report.read_results(path)
    assert read_stamp["git_commit"] is None and all(r["check_tolerance"] is None for r in read_rows)
    assert [r["time_ms"] for r in read_rows] == [r["time_ms"] for r in rows]


def test_csv_repeats_the_stamp_on_every_line(tmp_path, small_rows):
    stamp, rows = small_rows
    path = tmp_path / "results.csv"
    report.write_results(path, stamp, rows)
    with open(path, newline="") as f:
        records = list(csv.DictReader(f))
    assert set(report.ROW_COLUMNS) | set(report.STAMP_COLUMNS) == set(records[0])
    assert all(r["torch_version"] == torch.__version__ and r["tf32"] == "False" for r in records)


def test_json_file_has_a_stamp_and_rows(tmp_path, small_rows):
    stamp, rows = small_rows
    path = tmp_path / "results.json"
    report.write_results(path, stamp, rows)
    data = json.loads(path.read_text())
    assert set(data) == {"stamp", "rows"}
    assert data["stamp"]["command"] == "python -m attnlib.bench --test"


def test_ratio_table_divides_by_the_reference_at_the_same_t(small_rows):
    _, rows = small_rows
    table = report.ratio_table(rows)
    assert table["sdpa-flash"] == {32: 1.0, 64: 1.0}
    assert "sdpa-efficient" not in table  # it did not run
    ok = {(r["kernel"], r["T"]): r["time_ms"] for r in rows if r["status"] == "ok"}
    assert table["torch"][64] == pytest.approx(ok["torch", 64] / ok["sdpa-flash", 64])
    with pytest.raises(ValueError, match="split_groups"):
        report.ratio_table(rows + [{**rows[0], "dtype": "float64"}])


# --- the command line -----------------------------------------------------------------------------


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for action in cli.build_parser()._actions:
        for flag in action.option_strings:
            assert flag in text
        assert action.help, f"{action.option_strings} has no help"


def test_explicit_options_win_over_the_preset():
    args = cli.build_parser().parse_args(["--preset", "cpu-ratios", "--seq-lens", "64", "--heads", "2"])
    options = cli.resolve_options(args)
    assert options["seq_lens"] == [64] and options["heads"] == 2
    assert options["loop_max_t"] == 4096 and options["device"] == "cpu"


def test_presets_name_only_known_options():
    for name, values in cli.PRESETS.items():
        assert set(values) <= set(cli.DEFAULTS)
        args = cli.build_parser().parse_args(cli.preset_flags(name).split())  # the flags parse as written
        assert cli.resolve_options(args) == {**cli.DEFAULTS, **values}


def test_gpu_presets_are_the_sweeps_the_book_asks_for():
    for d in (64, 128):
        fwd, both = cli.PRESETS[f"gpu-fwd-d{d}"], cli.PRESETS[f"gpu-fwdbwd-d{d}"]
        for preset in (fwd, both):
            assert (preset["batch"], preset["heads"], preset["head_dims"]) == (4, 32, [d])
            assert preset["dtypes"] == ["float16"] and preset["causal"] == "both" and preset["device"] == "cuda"
            assert max(preset["seq_lens"]) == 16384
        assert min(fwd["seq_lens"]) == 512 and min(both["seq_lens"]) == 1024
        assert "direction" not in fwd and both["direction"] == "fwd+bwd"
    assert cli.PRESETS["gpu-bf16"]["dtypes"] == ["bfloat16"]
    assert cli.PRESETS["gpu-fp32"]["dtypes"] == ["float32"] and max(cli.PRESETS["gpu-fp32"]["seq_lens"]) <= 2048


@pytest.mark.parametrize("preset", [name for name in cli.PRESETS if name.startswith("gpu")])
def test_gpu_presets_dry_run_without_a_gpu(preset, capsys):
    assert cli.main(["--preset", preset, "--dry-run"]) == 0
    out = capsys.readouterr().out
    rows = int(out.strip().splitlines()[-1].split()[0])
    assert rows > 0 and out.count("\n  ") == rows


def test_main_runs_a_tiny_sweep_and_writes_json(tmp_path, capsys):
    path = tmp_path / "tiny.json"
    code = cli.main(["--quick", "--seq-lens", "32", "--kernels", "numpy,loop,torch,sdpa-flash,sdpa-math",
                     "--no-progress", "--no-memory", "--tf32", "on", "--threads", "1", "--output", str(path)])
    assert code == 0
    stamp, rows = report.read_results(path)
    assert stamp["tf32"] is True and all(r["tf32"] is True for r in rows)
    assert stamp["torch_num_threads"] == 1
    assert {r["kernel"] for r in rows} == {"numpy", "loop", "torch", "sdpa-flash", "sdpa-math"}
    assert len(rows) == 10  # 5 kernels, causal off and on
    assert "--quick" in stamp["command"]
    out = capsys.readouterr().out
    assert "time / sdpa-flash time" in out


def test_main_rejects_unknown_kernels():
    with pytest.raises(SystemExit):
        cli.main(["--kernels", "no-such-kernel", "--no-progress"])


def test_a_gpu_only_sdpa_kernel_asked_for_on_a_cpu_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--kernels", "sdpa-cudnn", "--device", "cpu", "--no-progress"])
    assert "['sdpa-cudnn'] are not available on cpu" in capsys.readouterr().err


def test_list_kernels(capsys):
    assert cli.main(["--list-kernels", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.split() == kernels.available_kernels("cpu")


def test_quick_runs_end_to_end_on_cpu(tmp_path):
    """The real ``python -m attnlib.bench --quick``, as a user would type it."""
    path = tmp_path / "quick.csv"
    done = subprocess.run([sys.executable, "-m", "attnlib.bench", "--quick", "--device", "cpu",
                           "--output", str(path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "attnlib.bench" in done.stderr  # the progress bar
    stamp, rows = report.read_results(path)
    _check_types(rows)
    assert {r["T"] for r in rows} == {128, 256, 512}
    assert {r["causal"] for r in rows} == {False, True}
    assert set(kernels.available_kernels("cpu")) == {r["kernel"] for r in rows}


# --- figures --------------------------------------------------------------------------------------


def test_gpu_figure_names_the_device_and_draws_the_peak():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlib.bench import plots

    stamp = {"device_name": "NVIDIA H100 80GB HBM3", "torch_version": "2.11", "tf32": False,
             "date_utc": "2026-01-31T00:00:00+00:00"}
    rows = [{**dict.fromkeys(report.ROW_COLUMNS), "kernel": kernel, "status": "ok", "dtype": "float16",
             "B": 4, "H": 32, "d": 64, "causal": False, "T": T, "time_ms": 0.1 * T, "tflop_per_s": 100.0,
             "peak_tflop_per_s": 989.4} for kernel in ["torch", "sdpa-flash"] for T in [512, 1024]]
    rows.append({**rows[0], "kernel": "sdpa-math", "status": "out of memory", "time_ms": None})
    fig = plots.plot_gpu_results(stamp, rows)
    assert "NVIDIA H100 80GB HBM3" in fig._suptitle.get_text()
    ax_time, ax_flops = fig.axes[:2]
    assert [line.get_label() for line in ax_time.get_lines()] == ["torch", "sdpa-flash"]
    assert 989.4 in [line.get_ydata()[0] for line in ax_flops.get_lines()]
    plt.close(fig)


# --- interleaved timing ---------------------------------------------------------------------------


def test_time_cpu_interleaved_takes_turns_rotating_the_order(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    log = []

    def make(name):
        def fn():
            log.append(name)
            clock.now += 0.1
        return fn

    results = timing.time_cpu_interleaved([make("a"), make("b"), make("c")], warmup=1, warmup_s=0.0,
                                          min_repeats=2, max_repeats=3, budget_s=10.0)
    assert log[:3] == ["a", "b", "c"]  # the warm-up, one kernel after the other
    assert log[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # three rounds, rotated
    assert [r.repeats for r in results] == [3, 3, 3]
    assert all(r.method == "perf_counter-interleaved" for r in results)


def test_time_cpu_interleaved_gives_a_fair_ratio_when_the_load_changes(monkeypatch):
    """Halfway through, the machine gets twice as slow. Timed in turns, kernel b still comes out
    exactly twice as slow as kernel a; timed one after the other, b would take the whole slowdown."""
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    calls, halfway = [0], [12]  # 2 warm-up calls and 10 rounds of 2: the slowdown starts after call 12

    def make(cost):
        def fn():
            calls[0] += 1
            clock.now += cost * (2.0 if calls[0] > halfway[0] else 1.0)
        return fn

    a, b = timing.time_cpu_interleaved([make(1.0), make(2.0)], warmup=1, warmup_s=0.0, min_repeats=10,
                                       max_repeats=10, budget_s=1.0)
    assert b.median_s / a.median_s == pytest.approx(2.0)

    calls[0], halfway[0] = 0, 6  # a: 1 warm-up and 5 timed calls, then b: all slowed
    a_alone = timing.time_cpu(make(1.0), warmup=1, warmup_s=0.0, min_repeats=5, max_repeats=5, budget_s=1.0)
    b_alone = timing.time_cpu(make(2.0), warmup=1, warmup_s=0.0, min_repeats=5, max_repeats=5, budget_s=1.0)
    assert b_alone.median_s / a_alone.median_s == pytest.approx(4.0)  # what interleaving avoids


def test_time_cpu_interleaved_enters_each_context_outside_the_timed_region(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    inside = []

    @contextlib.contextmanager
    def slow_context():
        clock.now += 50.0  # entering costs time that must not be counted
        inside.append(True)
        yield
        inside.pop()
        clock.now += 50.0

    def fn():
        assert inside, "called outside its context"
        clock.now += 0.5

    (result,) = timing.time_cpu_interleaved([fn], contexts=[slow_context], warmup=1, warmup_s=0.0,
                                            min_repeats=3, max_repeats=3, budget_s=1.0)
    assert result.times_s == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="2 functions but 1 contexts"):
        timing.time_cpu_interleaved([fn, fn], contexts=[None])
    with pytest.raises(ValueError, match="at least one function"):
        timing.time_cpu_interleaved([])


def test_run_sweep_interleaves_kernels_of_one_size_and_isolates_a_failing_one(monkeypatch):
    real_make_call = kernels.make_call

    def make_call(kernel, *args, **options):
        fn = real_make_call(kernel, *args, **options)
        if kernel != "torch":
            return fn
        calls = [0]

        def breaks_on_the_second_call():  # passes the first call, fails in the warm-up
            calls[0] += 1
            if calls[0] > 1:
                raise RuntimeError("simulated kernel failure")
            return fn()

        return breaks_on_the_second_call

    monkeypatch.setattr(kernels, "make_call", make_call)
    configs = sweep.build_configs(["numpy", "torch", "sdpa-flash"], [32, 64], heads=2, head_dims=[16])
    settings = sweep.Settings(device="cpu", warmup=2, warmup_s=0.0, min_repeats=2, max_repeats=2,
                              budget_s=0.01, measure_memory=False, interleave=True)
    rows = sweep.run_sweep(configs, settings, progress=False)
    assert [(r["kernel"], r["T"]) for r in rows] == [(c.kernel, c.T) for c in configs]
    for row in rows:
        if row["kernel"] == "torch":
            assert row["status"] == "error" and "simulated kernel failure" in row["message"]
        else:
            assert row["status"] == "ok" and row["timer"] == "perf_counter-interleaved", row
            assert row["repeats"] == 2


def test_main_interleaves_on_one_cpu_thread_by_default(monkeypatch):
    seen = []

    def fake_sweep(configs, settings, progress=True, on_row=None):
        seen.append(settings)
        return []

    monkeypatch.setattr(sweep, "run_sweep", fake_sweep)
    base = ["--device", "cpu", "--seq-lens", "32", "--kernels", "numpy", "--no-progress"]
    cli.main(base)
    cli.main([*base, "--threads", "2"])
    cli.main([*base, "--threads", "2", "--interleave"])
    cli.main([*base, "--no-interleave"])
    assert [s.interleave for s in seen] == [True, False, True, False]


def test_a_run_killed_halfway_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    """Each row is written as soon as it is measured: a run stopped at its third row (as a
    10-minute limit would stop it) leaves the first two on disk, in a file that reads back."""
    calls = []

    def fake_time(fn, settings):  # a fake clock: every call takes 2 ms; the third row is never finished
        calls.append(fn)
        if len(calls) == 3:
            raise KeyboardInterrupt("stopped from outside")
        return timing.Timing(median_s=0.002, q25_s=0.002, q75_s=0.002, min_s=0.002, first_s=0.003,
                             repeats=5, warmup=1, method="perf_counter")

    monkeypatch.setattr(sweep, "_time", fake_time)
    for suffix in ("csv", "json"):
        calls.clear()
        path = tmp_path / f"partial.{suffix}"
        with pytest.raises(KeyboardInterrupt):
            cli.main(["--device", "cpu", "--kernels", "numpy,torch", "-T", "32", "64", "-B", "1", "-H", "1",
                      "-d", "8", "--no-progress", "--no-memory", "--no-interleave", "--output", str(path)])
        stamp, rows = report.read_results(path)
        assert [(r["kernel"], r["T"], r["time_ms"]) for r in rows] == [("numpy", 32, 2.0), ("torch", 32, 2.0)]
        assert stamp["command"] and not list(tmp_path.glob("*.partial"))


def test_a_kernel_that_disagrees_with_the_reference_gets_an_error_row_not_a_time(monkeypatch):
    import numpy as np

    real_make_call = kernels.make_call

    def off_by_a_little(kernel, q, k, v, causal, threads=None, direction="fwd"):
        call = real_make_call(kernel, q, k, v, causal, threads=threads, direction=direction)
        return (lambda: call() * np.float32(1.01)) if kernel == "numpy" else call

    monkeypatch.setattr(kernels, "make_call", off_by_a_little)
    settings = sweep.Settings(device="cpu", measure_memory=False, min_repeats=1, max_repeats=1, budget_s=0.01,
                              warmup_s=0.0)
    bad = sweep.run_config(sweep.Config("numpy", 1, 2, 16, 8, "float32", False), settings, "test cpu")
    good = sweep.run_config(sweep.Config("torch", 1, 2, 16, 8, "float32", False), settings, "test cpu")
    assert bad["status"] == "error" and bad["time_ms"] is None and "differs from the float64 reference" in bad["message"]
    assert bad["check_error"] > bad["check_tolerance"] and "rounding model" in bad["message"]
    assert good["status"] == "ok" and good["check_error"] <= good["check_tolerance"] < 1e-5


def test_rows_say_how_many_products_each_kernel_really_does():
    from attnlib.bench.flops import products_done

    assert products_done("triton", "bwd") == 7 and products_done("torch", "bwd") == 4
    assert products_done("tiled", "fwd+bwd") == 7 and products_done("sdpa-cudnn", "bwd") is None
    row = sweep._empty_row(sweep.Config("triton", 1, 1, 8, 8, "float16", False, "fwd+bwd"), sweep.Settings(), "x")
    assert row["products"] == 9 and row["flops"] == 3.5 * 4 * 8 * 8 * 8


@pytest.mark.parametrize("step", ["check", "fwd", "fwdbwd", "extra", "recheck"])
def test_gpu_run_dry_runs_each_step_on_a_cpu(step, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "tools" / "gpu_run.sh"
    result = subprocess.run(["bash", str(script), "--dry-run", step, str(tmp_path)], capture_output=True,
                            text=True, env={**__import__("os").environ, "PYTHON": sys.executable}, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"step {step} done" in result.stdout and (tmp_path / "run.log").exists()
    commands = [line for line in result.stdout.splitlines() if line.startswith("+ [limit")]
    assert commands and all(int(line.split("limit ")[1].split("s]")[0]) < 600 for line in commands)
    if step != "check":
        assert "rows would be timed" in result.stdout
