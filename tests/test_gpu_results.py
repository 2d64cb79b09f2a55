"""Reading the stored GPU files for the book: rows, ratios, causal tile counts, stamps, ncu, figures,
and the matrix products counted from the code (attnlib.bench.gpu_results, gpu_plots, source_counts)."""

import doctest

import matplotlib
import numpy as np
import pytest

from attnlib.backends import numpy_backward, tiled, tiled_backward
from attnlib.bench import flops, gpu_plots, gpu_results, source_counts

matplotlib.use("Agg")


def row(kernel, T, time_ms, *, causal=False, status="ok", tile=None, **fields):
    """A result row with the columns these helpers read."""
    return {"kernel": kernel, "T": T, "causal": causal, "status": status, "message": None,
            "time_ms": time_ms if status == "ok" else None, "tile": tile, "B": 4, "H": 32, "d": 64,
            "dtype": "float16", "direction": "fwd", "tflop_per_s": 1.0 if status == "ok" else None,
            "peak_tflop_per_s": 989.4, "measured_peak_tflop_per_s": 640.0, **fields}


def test_every_stored_gpu_sweep_loads_with_an_h100_stamp():
    for name in ("fwd_d64", "fwd_d128", "fwdbwd_d64", "fwdbwd_d128", "bf16", "fp32", "dobench_t4096"):
        stamp, rows = gpu_results.load(name)
        assert stamp["device"] == "cuda" and "H100" in stamp["device_name"]
        assert rows and all(r["device"] == "cuda" for r in rows)


def test_an_unknown_file_name_lists_the_stored_ones():
    with pytest.raises(FileNotFoundError, match="fwd_d64"):
        gpu_results.load("fwd_d96")


def test_find_returns_one_row_and_refuses_an_ambiguous_question():
    _, rows = gpu_results.load("bf16")  # d = 64 and 128 in one file
    with pytest.raises(KeyError, match="2 rows match"):
        gpu_results.find(rows, "triton", 4096)
    found = gpu_results.find(rows, "triton", 4096, d=128)
    assert (found["kernel"], found["T"], found["d"], found["causal"]) == ("triton", 4096, 128, False)
    with pytest.raises(KeyError, match="0 rows match"):
        gpu_results.find(rows, "triton", 4097, d=128)


def test_speed_ratio_is_the_reference_time_over_the_kernel_time():
    rows = [row("fast", 1024, 2.0), row("slow", 1024, 3.0), row("oom", 1024, None, status="out of memory")]
    assert gpu_results.speed_ratio(rows, "fast", "slow", 1024) == pytest.approx(1.5)
    assert gpu_results.speed_ratio(rows, "slow", "fast", 1024) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="oom at T=1024 did not run"):
        gpu_results.speed_ratio(rows, "oom", "fast", 1024)


def test_tile_shape_reads_each_kernel_of_a_triton_row():
    r = row("triton", 4096, 1.0, tile="fwd 64x64 w4 s3; dkdv 32x128 w8 s3; dq 128x32 w8 s3")
    assert gpu_results.tile_shape(r) == (64, 64)
    assert gpu_results.tile_shape(r, "dkdv") == (32, 128)
    assert gpu_results.tile_shape(r, "dq") == (128, 32)
    with pytest.raises(ValueError, match="records no 'fwd' tile"):
        gpu_results.tile_shape(row("sdpa-flash", 4096, 1.0))


@pytest.mark.parametrize(("T", "block_m", "block_n"),
                         [(256, 64, 64), (200, 64, 32), (300, 32, 128), (64, 128, 64)])
def test_causal_tiles_counts_the_tile_pairs_holding_an_allowed_score(T, block_m, block_n):
    allowed = np.tril(np.ones((T, T), dtype=bool))  # query i sees keys j <= i
    n_m, n_n = -(-T // block_m), -(-T // block_n)
    visited = sum(allowed[i * block_m:(i + 1) * block_m, j * block_n:(j + 1) * block_n].any()
                  for i in range(n_m) for j in range(n_n))
    assert gpu_results.causal_tiles(T, block_m, block_n) == (visited, n_m * n_n)


def test_causal_tiles_agree_with_the_tiled_backends_block_skipping_and_approach_half():
    T, block = 4096, 256
    counted = sum(len(list(tiled.key_blocks(i0, block, T, block, causal=True))) for i0 in range(0, T, block))
    assert gpu_results.causal_tiles(T, block, block) == (counted, (T // block) ** 2)
    counts = (gpu_results.causal_tiles(T, 64, 64) for T in (512, 4096, 65536))
    predicted = [total / visited for visited, total in counts]
    assert predicted == sorted(predicted) and 1.9 < predicted[-1] < 2


def test_causal_speedups_pair_each_length_with_and_without_the_mask():
    tile = "fwd 64x64 w4 s3"
    rows = [row("k", 1024, 4.0, tile="fwd 128x128 w8 s3"), row("k", 1024, 2.5, causal=True, tile=tile),
            row("k", 2048, 9.0, tile=tile), row("k", 2048, None, causal=True, status="error")]
    (only,) = gpu_results.causal_speedups(rows, "k")
    assert only["T"] == 1024 and only["tile"] == (64, 64) and only["full_tile"] == (128, 128)
    assert only["measured"] == pytest.approx(1.6)
    assert only["predicted"] == pytest.approx(only["total"] / only["visited"]) == pytest.approx(256 / 136)


def test_the_stored_triton_causal_speedup_grows_with_t_towards_the_tile_count():
    _, rows = gpu_results.load("fwd_d64")
    table = gpu_results.causal_speedups(rows, "triton")
    assert [r["T"] for r in table] == [512, 1024, 2048, 4096, 8192, 16384]
    long = [r for r in table if r["T"] >= 4096]
    assert all(abs(r["measured"] / r["predicted"] - 1) < 0.15 for r in long)


@pytest.mark.parametrize(("version", "text"), [("91900", "9.19.0"), ("90100", "9.1.0"), ("8902", "8.9.2")])
def test_cudnn_versions_are_written_out(version, text):
    assert gpu_results.cudnn_version_text(version) == text


def test_the_stamp_line_is_made_of_the_stamps_own_fields():
    stamp, _ = gpu_results.load("fwd_d64")
    line = gpu_results.stamp_line(stamp)
    for field in ("device_name", "torch_version", "triton_version", "cuda_version", "driver_version"):
        assert stamp[field] in line
    assert gpu_results.cudnn_version_text(stamp["cudnn_version"]) in line
    assert line.endswith(stamp["date_utc"][:10])


def test_gpu_state_reads_clocks_and_power_at_start_and_end():
    stamp = {"gpu_state_start": "clocks.sm=345 MHz; power.draw=80.94 W",
             "gpu_state_end": "clocks.sm=1650 MHz; clocks_throttle_reasons.active=0x4"}
    assert gpu_results.gpu_state(stamp, "start") == {"clocks.sm": "345 MHz", "power.draw": "80.94 W"}
    assert gpu_results.gpu_state(stamp)["clocks_throttle_reasons.active"] == "0x4"
    assert gpu_results.gpu_state({}) == {}


def test_ncu_metrics_parses_rows_with_and_without_units(tmp_path):
    report = tmp_path / "ncu.txt"
    report.write_text("\n".join([
        "  _attn_fwd (4096, 1, 1)x(256, 1, 1), Context 1",
        "    Section: Launch Statistics",
        "    -------------------------------- --------------- -----------------",
        "    Metric Name                          Metric Unit      Metric Value",
        "    Block Size                                                     256",
        "    Grid Size                                                    4,096",
        "    Registers Per Thread             register/thread               181",
        "    Theoretical Occupancy                     %        12.50",
        "    Function Cache Configuration                     CachePreferShared",
    ]))
    metrics = gpu_results.ncu_metrics(report)
    assert metrics["Grid Size"] == ("", 4096.0)
    assert metrics["Registers Per Thread"] == ("register/thread", 181.0)
    assert metrics["Theoretical Occupancy"] == ("%", 12.5)
    assert metrics["Function Cache Configuration"] == ("", "CachePreferShared")
    assert "Metric Name" not in metrics
    stored = gpu_results.ncu_metrics()
    assert stored["Registers Per Thread"][1] > 0 and stored["Block Size"][1] % 32 == 0


def test_tflops_figure_has_both_panels_both_peaks_and_says_what_ran_out_of_memory():
    stamp, rows = gpu_results.load("fwd_d64")
    fig = gpu_plots.plot_tflops(stamp, rows, ["torch", "sdpa-flash", "triton-simple", "triton"])
    left, right = fig.axes
    labels = [line.get_label() for line in left.get_lines()]
    assert "torch (out of memory from T = 8,192)" in labels
    assert any(label.startswith("datasheet peak") for label in labels)
    assert any(label.startswith("measured matmul peak") for label in labels)
    assert right.get_title() == "causal mask" and stamp["device_name"] in fig._suptitle.get_text()


def test_speed_relative_figure_puts_the_reference_at_one():
    stamp, rows = gpu_results.load("fwdbwd_d64")
    fig = gpu_plots.plot_speed_relative(stamp, rows, ["sdpa-cudnn", "triton"])
    triton_line = next(line for line in fig.axes[0].get_lines() if line.get_label() == "triton")
    T, speed = triton_line.get_data()
    expected = [gpu_results.speed_ratio(rows, "triton", "sdpa-flash", t) for t in T]
    np.testing.assert_allclose(speed, expected)


def test_source_counts_doctest():
    assert doctest.testmod(source_counts).failed == 0


def test_products_are_counted_in_the_code_that_runs():
    assert source_counts.count_products(numpy_backward.grads_from_weights) == 4  # the matrix form
    assert source_counts.count_products(tiled_backward._key_block_grads) == 5  # FA2's Algorithm 2


def test_the_triton_backward_does_seven_products_and_agrees_with_the_flops_table():
    # imported as tests/test_triton.py imports them (TRITON_INTERPRET set first on a CPU)
    from test_triton import triton_backward, triton_flash

    dkdv = source_counts.count_products(triton_backward._attn_bwd_dkdv_inner)
    dq = source_counts.count_products(triton_backward._attn_bwd_dq_inner)
    assert (dkdv, dq) == (4, 3)
    assert source_counts.count_products(triton_flash._attn_fwd_inner) == 2
    table = getattr(flops, "PRODUCTS_DONE", None)
    if table is not None:  # the bench's table of products, where it has one, says the same
        assert table["bwd"]["triton"] == dkdv + dq
        assert table["bwd"]["numpy"] == source_counts.count_products(numpy_backward.grads_from_weights)
        assert table["bwd"]["tiled"] == source_counts.count_products(tiled_backward._key_block_grads)


def test_code_lines_leave_out_blank_lines_comments_and_the_docstring():
    def example(x):
        """A docstring
        of two lines."""
        # a comment
        y = x + 1  # a comment after code counts as code

        return y

    assert source_counts.code_lines(example) == 3


def test_the_teaching_kernel_is_at_most_40_lines_and_shorter_than_the_library_kernel():
    from test_triton import triton_flash, triton_simple

    simple = source_counts.code_lines(triton_simple._simple_attn_fwd)
    library = (source_counts.code_lines(triton_flash._attn_fwd)
               + source_counts.code_lines(triton_flash._attn_fwd_inner))
    assert simple <= 40 < library


def test_the_h200_recheck_ran_the_tiles_the_library_offers_now():
    """attnlib/data/gpu/h200 (README there): a fwd+bwd sweep at d=128 after the dK/dV tile limits changed.

    Each Triton row must name, for every kernel, a tile that autotuning may pick for fp16 at d=128 now;
    a change to the tile lists that drops one fails here until the sweep is run again. The kernels are
    imported in a subprocess under the interpreter, as tests/test_triton.py needs them (see there).
    """
    import json
    import os
    import subprocess
    import sys

    stamp, rows = gpu_results.load("fwdbwd_d128", folder=gpu_results.GPU_DIR / "h200")
    assert "H200" in stamp["device_name"] and stamp["triton_version"] == "3.6.0"
    tiles = {r["tile"] for r in rows if r["kernel"] == "triton" and r["status"] == "ok"}
    assert len(rows) == 70 and tiles
    script = (
        "import json\n"
        "from attnlib.backends import triton_backward as b, triton_flash as f\n"
        "lists = {'fwd': f.FWD_TILES, 'dkdv': b.DKDV_TILES, 'dq': b.DQ_TILES}\n"
        "print(json.dumps({k: ['%dx%d w%d s%d' % (c.kwargs['BLOCK_M'], c.kwargs['BLOCK_N'], c.num_warps,"
        " c.num_stages) for c in f.usable_configs(t, 128, tensor_cores=True)] for k, t in lists.items()}))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TRITON_INTERPRET": "1"}, check=True).stdout
    offered = json.loads(out.strip().splitlines()[-1])
    for tile in tiles:
        for part in tile.split("; "):
            kernel, shape = part.split(" ", 1)
            assert shape in offered[kernel], f"{kernel} {shape} is no longer offered at d=128: re-run the sweep"
