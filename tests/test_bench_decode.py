"""attnlib.bench.decode: what it times computes the right thing, and its files read back. No timing
is asserted: a test checks what was measured and how it is stored, never how fast it was."""

import contextlib
from importlib.resources import files
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from attnlib.bench import decode, timing
from attnlib.bench.decode import (DECODE_MODES, DecodeModel, decode_bytes, decode_calls, decode_flops,
                                  floor_calls, step_breakdown, window_flops)
from attnlib.kv_cache import kv_cache_bytes
from attnlib.validation import checking_values

DATA = Path(files("attnlib") / "data")


def test_the_two_timed_calls_produce_the_same_next_token_scores():
    sizes = DecodeModel(n_layers=2, d_model=32, n_heads=4, vocab=50)
    model = decode.build_decoder(sizes, "float64")
    recompute, cached = decode_calls(model, 20, backend="torch")
    expected = recompute()
    torch.testing.assert_close(cached(), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(cached(), expected, rtol=0, atol=1e-12)  # rolled back: the same context


def test_the_flop_and_byte_counts_follow_their_formulas():
    sizes = DecodeModel(n_layers=2, d_model=8, n_heads=2, vocab=10)
    per_position = 2 * (2 * 12 * 64 + 8 * 10)  # weights of 2 blocks and the unembedding
    assert decode_flops(sizes, 5, cached=True) == per_position + 2 * 4 * 5 * 8
    assert decode_flops(sizes, 5, cached=False) == 5 * per_position + 2 * 4 * 8 * (1 + 2 + 3 + 4 + 5)
    assert decode_bytes(sizes, 5, "float32") == (2 * 12 * 64 + 10 * 8) * 4 + kv_cache_bytes(2, 2, 4, "float32",
                                                                                           seq_len=5)
    assert window_flops(1, 1, 4) == 4 * (1 + 2 + 3 + 4)
    assert window_flops(1, 1, 4, window=2) == 4 * (1 + 2 + 2 + 2)


class RecordedCalls(TorchFunctionMode):
    """Every torch function called inside it (but no_grad's switch), with its tensor arguments' shapes."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name != "_set_grad_enabled":  # torch.no_grad's switch, not a computation
            self.calls.append((name, [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]))
        return func(*args, **(kwargs or {}))


def test_the_cached_floor_does_the_products_the_flop_count_counts_and_nothing_else():
    sizes = DecodeModel(n_layers=2, d_model=32, n_heads=4, vocab=50)
    model = decode.build_decoder(sizes, "float32")
    context = 12
    _, cached_floor = floor_calls(model, context)
    with RecordedCalls() as recorded:
        logits = cached_floor()
    assert logits.shape == (1, 1, sizes.vocab)
    names = [name for name, _ in recorded.calls]
    assert set(names) == {"matmul", "scaled_dot_product_attention"}  # no LayerNorm, GELU, RoPE, checks
    assert names.count("scaled_dot_product_attention") == sizes.n_layers
    flops = 0
    for name, shapes in recorded.calls:
        if name == "matmul":  # (1, n, k) @ (k, m): 2 n k m
            (_, n, k), (_, m) = shapes
            flops += 2 * n * k * m
        else:  # q (1, H, 1, d_head) over k and v (1, H, T, d_head): 4 H T d_head
            (_, heads, n_q, d_head), (_, _, n_k, _), _ = shapes
            assert n_q == 1 and n_k == context
            flops += 4 * heads * n_k * d_head
    assert flops == decode_flops(sizes, context, cached=True)


def test_the_recompute_floor_runs_every_position_with_the_models_weights():
    sizes = DecodeModel(n_layers=1, d_model=16, n_heads=2, vocab=20)
    model = decode.build_decoder(sizes, "float64")
    recompute_floor, _ = floor_calls(model, 9)
    with RecordedCalls() as recorded:
        logits = recompute_floor()
    assert logits.shape == (1, 9, sizes.vocab)
    block = model.blocks[0]
    weights = {block.attention.w_q.shape, block.mlp.w_1.shape, block.mlp.w_2.shape, model.unembedding.shape}
    assert {tuple(shapes[1]) for name, shapes in recorded.calls if name == "matmul"} == weights
    assert all(shapes[0][-2] == 9 for name, shapes in recorded.calls)  # (.., T, ..): every position


def test_only_the_unchecked_mode_is_timed_with_the_value_checks_off(monkeypatch):
    checked = {}

    def fake_time_in_turns(fns, *, contexts, **options):
        results = []
        for fn, context in zip(fns, contexts):
            with (context or contextlib.nullcontext)():
                checked.setdefault(len(results), []).append(checking_values())
                fn()
            results.append(timing.summarize([1e-3, 1e-3], first_s=1e-3, warmup=1, method="fake"))
        return results

    monkeypatch.setattr(timing, "time_cpu_interleaved", fake_time_in_turns)
    options = {**decode.PRESETS["decode"], **decode.QUICK["decode"], "contexts": [8]}
    rows = decode.run_decode(options, progress=lambda line: None)
    assert [row["mode"] for row in rows] == list(DECODE_MODES)
    assert {DECODE_MODES[i]: values for i, values in checked.items()} == {
        mode: [mode != "cached-unchecked"] for mode in DECODE_MODES}
    assert [row["backend"] for row in rows] == ["sdpa", None, "sdpa", "sdpa", None]  # floors call torch


def _rows(times):
    """Rows of the decode preset with the given (mode, context): time_ms, and a FLOP count of 1e6."""
    return [dict(dict.fromkeys(decode.DECODE_COLUMNS), preset="decode", mode=mode, context=context,
                 time_ms=time_ms, flops=10**6, flag="noisy: IQR 30% of the median" if time_ms == 7.0 else None)
            for (mode, context), time_ms in times.items()]


def test_the_breakdown_splits_each_step_into_floor_overhead_and_checks():
    rows = _rows({("recompute", 4): 40.0, ("recompute-floor", 4): 30.0, ("cached", 4): 10.0,
                  ("cached-unchecked", 4): 7.0, ("cached-floor", 4): 2.0, ("cached", 8): 12.0})
    breakdown = step_breakdown(rows)
    assert set(breakdown) == {("recompute", 4), ("cached", 4)}  # ("cached", 8) has no floor
    cached = breakdown["cached", 4]
    assert cached["overhead_ms"] == pytest.approx(8.0) and cached["floor_fraction"] == pytest.approx(0.2)
    assert cached["checks_ms"] == pytest.approx(3.0) and cached["checks_fraction"] == pytest.approx(0.3)
    assert cached["unchecked_overhead_ms"] == pytest.approx(5.0)
    assert cached["gflop_per_s"] == pytest.approx(0.1) and cached["floor_gflop_per_s"] == pytest.approx(0.5)
    assert cached["flags"] == ["noisy: IQR 30% of the median"]  # the unchecked row's
    recompute = breakdown["recompute", 4]
    assert recompute["floor_fraction"] == pytest.approx(0.75) and "checks_ms" not in recompute
    assert recompute["flags"] == []


@pytest.mark.parametrize("preset", ["decode", "window"])
def test_a_quick_run_writes_a_stamped_file_that_reads_back(preset, tmp_path, capsys):
    path = tmp_path / f"{preset}.csv"
    assert decode.main(["--preset", preset, "--quick", "--output", str(path)]) == 0
    stamp, rows = decode.read_decode_results(path)
    modes = {"decode": set(DECODE_MODES), "window": {"window", "causal"}}[preset]
    assert {row["mode"] for row in rows} == modes
    assert len(rows) == len(modes) * len(decode.QUICK[preset]["contexts"])
    for row in rows:
        assert row["preset"] == preset and row["repeats"] >= 2
        assert len(row["times_ms"].split()) == row["repeats"] and row["time_ms"] > 0
    assert stamp["command"].startswith("python -m attnlib.bench.decode") and stamp["date_utc"]
    assert stamp["torch_num_threads"] == 1 and stamp["device_name"] == rows[0]["device_name"]
    assert "git_commit" in stamp  # None only outside a git checkout
    if preset == "decode":
        assert set(step_breakdown(rows)) == {(mode, t) for mode in ("recompute", "cached")
                                             for t in decode.QUICK[preset]["contexts"]}
    assert "wrote" in capsys.readouterr().out


def test_a_file_written_before_the_commit_was_stamped_still_reads(tmp_path):
    path = tmp_path / "old.csv"
    stamp = {"date_utc": "2026-01-01T00:00:00+00:00", "command": "python -m attnlib.bench.decode",
             "load_average": "0.10 0.20 0.30"}  # no git_commit column
    rows = _rows({("recompute", 4): 40.0, ("cached", 4): 10.0})
    for row in rows:
        row.update(device_name="a CPU", repeats=1, times_ms="1")
    decode.write_decode_results(path, stamp, rows)
    assert "git_commit" not in path.read_text().splitlines()[0]
    read_stamp, read_rows = decode.read_decode_results(path)
    assert read_stamp["load_average"] == "0.10 0.20 0.30" and "git_commit" not in read_stamp
    assert [row["mode"] for row in read_rows] == ["recompute", "cached"]
    assert step_breakdown(read_rows) == {}  # no floor rows: nothing to break down


def test_a_file_of_another_benchmark_is_refused(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("kernel,T\ntorch,128\n")
    with pytest.raises(ValueError, match="not a decode benchmark file"):
        decode.read_decode_results(path)


@pytest.mark.parametrize("name, preset, modes", [("decode_cpu.csv", "decode", set(DECODE_MODES)),
                                                 ("window_cpu.csv", "window", {"window", "causal"})])
def test_the_stored_files_the_chapter_plots_hold_every_context_of_their_preset(name, preset, modes):
    stamp, rows = decode.read_decode_results(DATA / name)
    contexts = decode.PRESETS[preset]["contexts"]
    assert {(row["mode"], row["context"]) for row in rows} == {(m, t) for m in modes for t in contexts}
    assert stamp["device_name"] and stamp["load_average"] and stamp["command"].endswith(name)
    assert stamp["git_commit"]
    assert all(len(row["times_ms"].split()) == row["repeats"] >= 5 for row in rows)


def test_the_stored_runs_are_read_by_name():
    from attnlib.bench import decode as decode_bench

    for preset in ("decode", "window"):
        stamp, rows = decode_bench.stored(preset)
        assert rows and {row["preset"] for row in rows} == {preset} and stamp["device_name"]
    with pytest.raises(ValueError, match="preset must be"):
        decode_bench.stored("gpu")
