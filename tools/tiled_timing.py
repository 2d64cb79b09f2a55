"""The tiled NumPy backend timed live against torch's SDPA, and what its thread pool buys.

Chapter 12 quotes the stored CPU file (``attnlib/data/cpu_ratios.csv``), where every
kernel ran on one thread. This tool repeats the comparison on the machine at hand, in
the way that holds up best on a shared machine: the calls take turns (SDPA, tiled,
SDPA, tiled, ...), the ratio is taken within each round, and the median over rounds is
printed. Three tables:

1. ``live``: (B, H, T, d) = (1, 8, 4096, 64), float32, every library at its default
   threads: the tiled backend against SDPA (5 rounds), and the matrix forms (torch and
   NumPy) on two of the eight heads, next to SDPA on the same two heads (3 rounds).
2. ``thread pool``: T = 2048, the tiled backend with its default workers (one per core
   this process may use) and with one, in turns with SDPA.
3. ``one thread``: the same with every library held to one thread, as in the stored file.

A ratio timed with several threads need not equal the one-thread ratio of the file: the
tiled backend spreads its (batch, head, query block) tasks over the cores, SDPA its own
work, and each gains differently from the extra threads. ``--write DIR`` also writes the
times of every round and the peak memory of the matrix form and the tiled form
(``tracemalloc``, one head, d = 64) to ``DIR/cpu_timing.csv`` and ``DIR/memory.csv``,
stamped with the machine and the date.

    .venv/bin/python tools/tiled_timing.py [--rounds 5] [--write attnlib/data/tiled]
"""

import argparse
import csv
import datetime
import os
import platform
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import attnlib  # noqa: E402
from attnlib.backends import tiled  # noqa: E402
from attnlib.bench import sweep  # noqa: E402


def time_interleaved(calls, rounds):
    """``{name: array of seconds, one per round}``: one untimed warm-up call each, then the
    calls take turns in every round, so that load from elsewhere falls on all alike."""
    for fn in calls.values():
        fn()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: np.array(seconds) for name, seconds in times.items()}


def paired_ratio(times, name, other="sdpa-flash"):
    """The median over rounds of ``name``'s time over ``other``'s in the same round."""
    return float(np.median(times[name] / times[other]))


def sdpa_flash(q, k, v):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v)


def live_comparison(rng, rounds, B=1, H=8, T=4096, d=64, heads_for_matrix_forms=2):
    """Table 1: ``{name: (heads, times)}``."""
    q, k, v = (rng.standard_normal((B, H, T, d), dtype=np.float32) for _ in range(3))
    q_t, k_t, v_t = (torch.from_numpy(x) for x in (q, k, v))
    tiled_times = time_interleaved({
        "sdpa-flash": lambda: sdpa_flash(q_t, k_t, v_t),
        "tiled": lambda: attnlib.attention(q, k, v, backend="tiled"),
    }, rounds)
    few = (slice(None), slice(0, heads_for_matrix_forms))  # (B, H, T, d)[:, :2]
    q2, k2, v2 = (x[few] for x in (q, k, v))
    q2_t, k2_t, v2_t = (x[few] for x in (q_t, k_t, v_t))
    matrix_times = time_interleaved({
        "sdpa-flash": lambda: sdpa_flash(q2_t, k2_t, v2_t),
        "torch (matrix form)": lambda: attnlib.attention(q2_t, k2_t, v2_t, backend="torch"),
        "numpy (matrix form)": lambda: attnlib.attention(q2, k2, v2, backend="numpy"),
    }, max(3, rounds - 2))
    return [(H, tiled_times), (heads_for_matrix_forms, matrix_times)]


def thread_pool_comparison(rng, rounds, B=1, H=8, T=2048, d=64):
    """Tables 2 and 3: (default threads, one thread), each ``{name: times}``."""
    q, k, v = (rng.standard_normal((B, H, T, d), dtype=np.float32) for _ in range(3))
    q_t, k_t, v_t = (torch.from_numpy(x) for x in (q, k, v))
    default = time_interleaved({
        "sdpa-flash": lambda: sdpa_flash(q_t, k_t, v_t),
        "tiled, default workers": lambda: tiled.tiled_attention(q, k, v),
        "tiled, 1 worker": lambda: tiled.tiled_attention(q, k, v, workers=1),
    }, rounds)
    with sweep.cpu_threads(1):  # PyTorch and NumPy's matrix library held to one thread
        one_thread = time_interleaved({
            "sdpa-flash": lambda: sdpa_flash(q_t, k_t, v_t),
            "tiled, 1 thread": lambda: tiled.tiled_attention(q, k, v, workers=1),
        }, rounds)
    return default, one_thread


def print_table(title, groups):
    print(title)
    print(f"  {'':24} {'heads':>5} {'rounds':>6} {'median ms':>10} {'x SDPA':>7}")
    for heads, times in groups:
        for name, seconds in times.items():
            print(f"  {name:24} {heads:5} {len(seconds):6} {np.median(seconds) * 1e3:10.1f} "
                  f"{paired_ratio(times, name):7.2f}")


def peak_extra_bytes(fn):
    """Peak bytes allocated while fn() runs, counting only what it allocates."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def memory_rows(rng):
    """``[(form, T, peak bytes)]``: one head, d = 64, float32, as chapter 12 measures it."""
    rows = []
    for form, backend, lens in (("matrix form", "numpy", (512, 1024, 2048, 4096)),
                                ("tiled", "tiled", (512, 1024, 2048, 4096, 16384))):
        warm_up = (rng.standard_normal((256, 64), dtype=np.float32) for _ in range(3))
        attnlib.attention(*warm_up, backend=backend)  # one-off allocations
        for T in lens:
            q, k, v = (rng.standard_normal((T, 64), dtype=np.float32) for _ in range(3))
            rows.append((form, T, peak_extra_bytes(lambda: attnlib.attention(q, k, v, backend=backend))))
    return rows


def write(folder, stamp, timing_groups, memory):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "memory.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["form", "T", "B", "H", "d", "dtype", "causal", "peak_extra_bytes", "how", *stamp])
        for form, T, peak in memory:
            writer.writerow([form, T, 1, 1, 64, "float32", False, peak, "tracemalloc", *stamp.values()])
    with open(folder / "cpu_timing.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "call", "round", "seconds", "heads", *stamp])
        for run, heads, times in timing_groups:
            for name, seconds in times.items():
                for i, s in enumerate(seconds):
                    writer.writerow([run, name, i, f"{s:.6f}", heads, *stamp.values()])
    print(f"wrote {folder / 'memory.csv'} and {folder / 'cpu_timing.csv'}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", type=Path, metavar="DIR", help="also write the stamped CSV files here")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"PyTorch threads: {torch.get_num_threads()}, tiled workers: {len(os.sched_getaffinity(0))}")
    live = live_comparison(rng, args.rounds)
    print_table("live, (1, 8, 4096, 64) float32, default threads", live)
    default, one_thread = thread_pool_comparison(rng, args.rounds)
    print_table("thread pool, (1, 8, 2048, 64), default threads", [(8, default)])
    print_table("one thread", [(8, one_thread)])
    print("x SDPA: the median over rounds of each round's time over SDPA's in that round")
    print(f"tiled, 1 worker over tiled, default workers, the same way: "
          f"{paired_ratio(default, 'tiled, 1 worker', 'tiled, default workers'):.2f}")
    if args.write:
        now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
        stamp = {"date_utc": now.isoformat(),
                 "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                 "numpy": np.__version__, "torch": torch.__version__}
        groups = [("interleaved", live[0][0], live[0][1]), ("matrix forms", live[1][0], live[1][1]),
                  ("thread pool", 8, default), ("one thread", 8, one_thread)]
        write(args.write, stamp, groups, memory_rows(rng))


if __name__ == "__main__":
    main()
