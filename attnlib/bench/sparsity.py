"""The tiled backend's time against a block mask's sparsity, on a CPU.

    python -m attnlib.bench.sparsity --output attnlib/data/sparsity_cpu.csv

One sequence of T tokens, H heads of width d, float32: the tiled backend
(:mod:`attnlib.backends.tiled`) without a block mask (no mask, and ``causal=True``), which runs
its own blocks of ``tiled.BLOCK_SIZE`` (1,024: ``attention`` takes no block size), then with the
block mask (:func:`attnlib.block_mask`, tiles of ``block_size``) of each mod of the gallery
below, the first of which allows every key (every tile computed), timed in turns
(:func:`attnlib.bench.timing.time_cpu_interleaved`: warm-up, repeats, the median and the
quartiles; a row whose interquartile range exceeds a fifth of its median is flagged noisy).
Each row carries the mod, the block size it ran, its sparsity (the percentage of tiles
skipped) and the tiles computed, so the time can be set against the work. The run is stamped
(:func:`attnlib.provenance.stamp`: date, git commit, versions, CPU, load average, command).
"""

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from .. import mods
from ..attention import attention
from ..backends import tiled
from ..block_mask import block_mask
from ..provenance import stamp as provenance_stamp
from ..validation import unchecked
from . import report, timing

COLUMNS = ["mod", "sparsity", "tiles", "tiles_total", "T", "n_heads", "head_dim", "block_size", "dtype",
           "time_ms", "time_q25_ms", "time_q75_ms", "repeats", "flag"]
STAMP_COLUMNS = ["date_utc", "git_commit", "torch_version", "numpy_version", "cpu", "load_average", "command"]


def every_key(b, h, q_idx, kv_idx):
    """A mask_mod that allows every key: its block mask computes every tile, the block-mask path's 100%."""
    return (kv_idx >= 0) & (q_idx >= 0)


def gallery(T):
    """The mods timed: name -> mask_mod, for sequences of T tokens. Two more rows time the tiled
    backend without a block mask: "plain, no mask" and "plain, causal=True" (its own block skipping)."""
    eight_documents = np.repeat(np.arange(8), T // 8)  # 8 packed sequences of T / 8 tokens
    return {
        "every tile": every_key,
        "prefix_lm(T/4)": mods.prefix_lm(T // 4),
        "causal": mods.causal(),
        "sliding_window(T/4)": mods.sliding_window(T // 4),
        "document(8)": mods.document(eight_documents),
        "causal & document(8)": mods.and_masks(mods.causal(), mods.document(eight_documents)),
        "sliding_window(T/16)": mods.sliding_window(T // 16),
    }


def plain_tiles(T, block_size, causal):
    """``(tiles computed, tiles in all)`` of the tiled backend's own loop over one (T, T) head."""
    n_blocks = -(-T // block_size)
    visited = sum(len(list(tiled.key_blocks(i0, min(block_size, T - i0), T, block_size, causal)))
                  for i0 in range(0, T, block_size))
    return visited, n_blocks * n_blocks


def partial_tiles(row):
    """How many of a row's computed tiles are partial: the mask cuts through them, so it is applied
    entry by entry (a full tile skips it). The plain loop's partial tiles are the causal diagonal's."""
    T, size = row["T"], row["block_size"]
    if row["mod"].startswith("plain"):
        causal = row["mod"] == "plain, causal=True"
        return sum(on_diagonal for i0 in range(0, T, size)
                   for _, _, on_diagonal in tiled.key_blocks(i0, min(size, T - i0), T, size, causal))
    return int(block_mask(gallery(T)[row["mod"]], 1, 1, T, T, block_size=size).partial.sum())


def run(T=2048, n_heads=4, head_dim=64, block_size=128, budget_s=4.0, progress=print):
    """One row per mod of :func:`gallery`, timed in turns."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, n_heads, T, head_dim)).astype(np.float32) for _ in range(3))
    calls, masks = [], {"plain, no mask": None, "plain, causal=True": None}
    for causal in (False, True):
        def plain(causal=causal):
            with unchecked():
                return attention(q, k, v, backend="tiled", causal=causal)

        calls.append(plain)
    for name, mod in gallery(T).items():
        masks[name] = block_mask(mod, 1, 1, T, T, block_size=block_size)

        def call(bm=masks[name]):
            with unchecked():
                return attention(q, k, v, backend="tiled", block_mask=bm)

        calls.append(call)
    results = timing.time_cpu_interleaved(calls, warmup=1, min_repeats=5, max_repeats=30, budget_s=budget_s)
    rows = []
    for (name, bm), result in zip(masks.items(), results):
        if bm is None:  # the plain loop: its own blocks, and its own causal skipping
            size = tiled.BLOCK_SIZE
            tiles, tiles_total = plain_tiles(T, size, causal=name == "plain, causal=True")
        else:
            size, tiles, tiles_total = block_size, int(bm.visited.sum()), bm.visited[0, 0].size
        spread = (result.q75_s - result.q25_s) / result.median_s
        rows.append({"mod": name, "sparsity": round(100 * (1 - tiles / tiles_total), 3), "tiles": tiles,
                     "tiles_total": tiles_total, "T": T, "n_heads": n_heads, "head_dim": head_dim,
                     "block_size": size, "dtype": "float32", "time_ms": round(result.median_s * 1e3, 4),
                     "time_q25_ms": round(result.q25_s * 1e3, 4), "time_q75_ms": round(result.q75_s * 1e3, 4),
                     "repeats": result.repeats,
                     "flag": f"noisy: IQR {spread:.0%} of the median"
                     if spread > report.NOISY_IQR_OVER_MEDIAN else ""})
        progress(f"{name:<22} sparsity {rows[-1]['sparsity']:6.2f}%  {rows[-1]['time_ms']:9.2f} ms"
                 + (f"  ({rows[-1]['flag']})" if rows[-1]["flag"] else ""))
    return rows


def write(path, stamp, rows):
    """The rows as CSV, the stamp's fields repeated on every line."""
    report.write_stamped_csv(path, COLUMNS, stamp, STAMP_COLUMNS, rows)


def read(path):
    """``(stamp, rows)`` from a file :func:`write` wrote; numbers as numbers."""
    with open(path, newline="") as f:
        records = list(csv.DictReader(f))
    if not records or "sparsity" not in records[0]:
        raise ValueError(f"{path} is not a sparsity benchmark file")
    numbers = {"sparsity": float, "tiles": int, "tiles_total": int, "T": int, "n_heads": int, "head_dim": int,
               "block_size": int, "time_ms": float, "time_q25_ms": float, "time_q75_ms": float, "repeats": int}
    rows = [{name: numbers.get(name, str)(record[name]) for name in COLUMNS} for record in records]
    return {name: records[0][name] for name in STAMP_COLUMNS}, rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=None, help="CSV to write (default: print only)")
    parser.add_argument("--T", type=int, default=2048)
    parser.add_argument("--budget", type=float, default=4.0, help="seconds of timing per mod")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    command = "python -m attnlib.bench.sparsity " + " ".join(argv if argv is not None else sys.argv[1:])
    stamp = provenance_stamp(command.strip())
    rows = run(T=args.T, budget_s=args.budget)
    if args.output:
        write(args.output, stamp, rows)
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()


def stored():
    """``(stamp, rows)`` of the measurement the book ships (``attnlib/data/sparsity_cpu.csv``)."""
    from importlib.resources import files

    return read(Path(files("attnlib") / "data" / "sparsity_cpu.csv"))
