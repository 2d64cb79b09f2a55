"""tools/tiled_timing.py, the live CPU timing chapter 12 used to run in its deep dives, at small shapes."""

import csv

import numpy as np

from tools import tiled_timing


def test_interleaved_timing_gives_one_time_per_round_and_paired_ratios():
    calls = {"sdpa-flash": lambda: None, "other": lambda: sum(range(1000))}
    times = tiled_timing.time_interleaved(calls, rounds=3)
    assert {name: len(t) for name, t in times.items()} == {"sdpa-flash": 3, "other": 3}
    assert tiled_timing.paired_ratio(times, "sdpa-flash") == 1.0


def test_the_three_tables_and_the_written_files(tmp_path):
    rng = np.random.default_rng(0)
    live = tiled_timing.live_comparison(rng, rounds=1, H=2, T=128, heads_for_matrix_forms=1)
    assert [heads for heads, _ in live] == [2, 1]
    assert set(live[1][1]) == {"sdpa-flash", "torch (matrix form)", "numpy (matrix form)"}
    default, one_thread = tiled_timing.thread_pool_comparison(rng, rounds=1, H=2, T=128)
    assert set(default) == {"sdpa-flash", "tiled, default workers", "tiled, 1 worker"}
    assert set(one_thread) == {"sdpa-flash", "tiled, 1 thread"}
    memory = [("matrix form", 128, 1000), ("tiled", 128, 500)]
    tiled_timing.write(tmp_path, {"date_utc": "2026-11-25T00:00:00+00:00"},
                       [("one thread", 2, one_thread)], memory)
    with open(tmp_path / "cpu_timing.csv") as f:
        timing = list(csv.DictReader(f))
    assert {row["call"] for row in timing} == {"sdpa-flash", "tiled, 1 thread"}
    assert all(row["date_utc"].startswith("2026-11-25") for row in timing)
    with open(tmp_path / "memory.csv") as f:
        assert [row["peak_extra_bytes"] for row in csv.DictReader(f)] == ["1000", "500"]
