"""attnlib.bench.decode: what it times computes the right thing, and its files read back. No timing
is asserted: a test checks what was measured and how it is stored, never how fast it was."""

from importlib.resources import files
from pathlib import Path

import pytest
import torch

from attnlib.bench import decode
from attnlib.bench.decode import DecodeModel, decode_bytes, decode_calls, decode_flops, window_flops
from attnlib.kv_cache import kv_cache_bytes

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


@pytest.mark.parametrize("preset", ["decode", "window"])
def test_a_quick_run_writes_a_stamped_file_that_reads_back(preset, tmp_path, capsys):
    path = tmp_path / f"{preset}.csv"
    assert decode.main(["--preset", preset, "--quick", "--output", str(path)]) == 0
    stamp, rows = decode.read_decode_results(path)
    modes = {"decode": {"recompute", "cached"}, "window": {"window", "causal"}}[preset]
    assert {row["mode"] for row in rows} == modes
    assert len(rows) == 2 * len(decode.QUICK[preset]["contexts"])
    for row in rows:
        assert row["preset"] == preset and row["repeats"] >= 2
        assert len(row["times_ms"].split()) == row["repeats"] and row["time_ms"] > 0
    assert stamp["command"].startswith("python -m attnlib.bench.decode") and stamp["date_utc"]
    assert stamp["torch_num_threads"] == 1 and stamp["device_name"] == rows[0]["device_name"]
    assert "wrote" in capsys.readouterr().out


def test_a_file_of_another_benchmark_is_refused(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("kernel,T\ntorch,128\n")
    with pytest.raises(ValueError, match="not a decode benchmark file"):
        decode.read_decode_results(path)


@pytest.mark.parametrize("name, preset, modes", [("decode_cpu.csv", "decode", {"recompute", "cached"}),
                                                 ("window_cpu.csv", "window", {"window", "causal"})])
def test_the_stored_files_the_chapter_plots_hold_every_context_of_their_preset(name, preset, modes):
    stamp, rows = decode.read_decode_results(DATA / name)
    contexts = decode.PRESETS[preset]["contexts"]
    assert {(row["mode"], row["context"]) for row in rows} == {(m, t) for m in modes for t in contexts}
    assert stamp["device_name"] and stamp["load_average"] and stamp["command"].endswith(name)
    assert all(len(row["times_ms"].split()) == row["repeats"] >= 5 for row in rows)
