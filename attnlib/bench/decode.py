"""Decoding, timed: milliseconds per generated token, with and without a KV cache.

Run it as ``python -m attnlib.bench.decode`` (``--help`` lists the options).
Two presets:

- ``decode`` (the default): chapter 8's decoder at a fixed size, one token
  generated after a context of T tokens, for T = 256 ... 4096. Five modes
  (:data:`DECODE_MODES`), timed in turns
  (:func:`attnlib.bench.timing.time_cpu_interleaved`) after a warm-up, on one
  thread, each row keeping every repeat and its median:

  - *recompute* runs the model over all T tokens
    (:func:`attnlib.decoding.forward_step` without a cache);
  - *cached* runs it over the one new token, whose query attends over T - 1
    cached keys and values and its own;
  - *cached-unchecked* is *cached* inside :func:`attnlib.unchecked`, which skips
    the checks that read values (NaN and inf in the weights, the activations
    and the cache);
  - *recompute-floor* and *cached-floor* are the step's *floor*: only its
    matrix products (the projections, SDPA, the MLP, the unembedding), the same
    shapes and weights, called on torch directly (:func:`floor_calls`). What a
    step takes beyond its floor is its *overhead*: Python, attnlib's checks and
    dispatch, and the small element-wise steps (LayerNorm, GELU, RoPE, the
    cache's copy). :func:`step_breakdown` computes it from the rows.
- ``window``: the tiled attention kernel over a whole sequence of T tokens,
  causal, once with a sliding window of W keys and once without, to show its
  cost grow as T * W instead of T^2.

*recompute* and *cached* time the library as the chapters run it, input checks
included; :mod:`attnlib.bench.kernels` times the bare attention kernels instead.
The file is stamped like the main benchmark's (:func:`attnlib.bench.report.make_stamp`),
plus the git commit (:func:`attnlib.provenance.git_commit`), and the chapters read it
back with :func:`read_decode_results` (files written before a column existed read
it as None).
"""

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import devices, report, timing
from .sweep import cpu_threads

# The modes of the decode preset, in the order they are timed in turns (see the module's docstring).
DECODE_MODES = ("recompute", "recompute-floor", "cached", "cached-unchecked", "cached-floor")
FLOOR_SUFFIX = "-floor"  # mode + FLOOR_SUFFIX: the bare matrix products of that mode's step

PRESETS = {
    # A small GPT-like stack: 4 blocks of width 512 (8 heads of 64), float32, batch 1.
    "decode": dict(n_layers=4, d_model=512, n_heads=8, vocab=1024, contexts=[256, 512, 1024, 2048, 4096],
                   dtype="float32", backend="sdpa", warmup=1, warmup_s=0.5, min_repeats=7, max_repeats=30,
                   budget=2.0),
    # The tiled kernel, causal, with and without a window: B=1, H=8, d=64, float32, blocks of 256 keys
    # (a window of W visits about (W + block) / block blocks per query block, so blocks smaller than W).
    "window": dict(n_heads=8, head_dim=64, window=512, block_size=256, contexts=[1024, 2048, 4096, 8192],
                   dtype="float32", warmup=1, warmup_s=0.5, min_repeats=5, max_repeats=20, budget=2.0),
}
QUICK = {"decode": dict(n_layers=1, d_model=64, n_heads=2, vocab=64, contexts=[32, 64], warmup_s=0.0,
                        min_repeats=2, max_repeats=3, budget=0.05),
         "window": dict(n_heads=1, head_dim=16, window=16, block_size=8, contexts=[64, 128], warmup_s=0.0,
                        min_repeats=2, max_repeats=3, budget=0.05)}

# One row per (mode, context). Columns that do not apply to a preset are empty.
DECODE_COLUMNS = {
    "preset": str,  # "decode" or "window"
    "mode": str,  # one of DECODE_MODES (decode); "window" or "causal" (window)
    "backend": str,  # the attention backend
    "device": str,
    "device_name": str,
    "dtype": str,
    "batch": int,
    "n_layers": int,
    "d_model": int,
    "n_heads": int,
    "head_dim": int,
    "vocab": int,
    "window": int,  # the sliding window W of a "window" row
    "block_size": int,  # queries and keys per block of the tiled kernel ("window" preset)
    "context": int,  # T: the tokens before the new one (decode), or the sequence length (window)
    "time_ms": float,  # median of the timed calls
    "time_q25_ms": float,
    "time_q75_ms": float,
    "time_min_ms": float,
    "time_first_ms": float,
    "repeats": int,
    "warmup": int,
    "timer": str,
    "times_ms": str,  # every timed call, in order
    "flops": int,  # counted as in decode_flops / window_flops
    "bytes_read": int,  # weights and cache one cached step reads (decode), at the least
    "cache_bytes": int,  # the KV cache at this context (kv_cache_bytes)
    "flag": str,  # why the row's time is not to be trusted; empty when it looks sound
}

# The stamp: the main benchmark's fields, the commit of the code that measured among them (None in old files).
DECODE_STAMP_COLUMNS = report.STAMP_COLUMNS


@dataclass(frozen=True)
class DecodeModel:
    """The sizes of the decoder the ``decode`` preset times."""

    n_layers: int
    d_model: int
    n_heads: int
    vocab: int

    @property
    def head_dim(self):
        return self.d_model // self.n_heads

    @property
    def weights_per_layer(self):
        """Weights of one block: W_Q, W_K, W_V, W_O (4 d^2) and a 4x-wide MLP (8 d^2)."""
        return 12 * self.d_model**2


def decode_flops(model, context, cached):
    """FLOPs to produce one token after ``context`` tokens (a multiply-add is 2 FLOPs).

    Per block and per position run, the weights cost ``2 * 12 * d^2`` and attention
    ``4 * T_k * d`` (q . k and the weighted sum over T_k keys, all heads). *Cached*
    runs one position over ``context`` keys; *recompute* runs ``context`` positions,
    position t over t + 1 keys (causal, counted as half the square, as chapter 11
    does). The unembedding adds ``2 * d * V`` per position.
    """
    d, n = model.d_model, int(context)
    weights_and_logits = 2 * (model.weights_per_layer * model.n_layers + d * model.vocab)
    if cached:
        return weights_and_logits + model.n_layers * 4 * n * d
    return n * weights_and_logits + model.n_layers * 4 * d * n * (n + 1) // 2


def decode_bytes(model, context, dtype):
    """Bytes one cached step reads at the least: every weight once (the unembedding included), and the
    whole cache of ``context`` positions (:func:`attnlib.kv_cache_bytes`)."""
    from ..kv_cache import itemsize, kv_cache_bytes

    weights = model.n_layers * model.weights_per_layer + model.vocab * model.d_model
    return weights * itemsize(dtype) + kv_cache_bytes(model.n_layers, model.n_heads, model.head_dim, dtype,
                                                      seq_len=context)


def window_flops(n_heads, head_dim, context, window=None):
    """Forward FLOPs of causal attention over ``context`` tokens, each query seeing at most ``window`` keys."""
    n = int(context)
    keys = n * (n + 1) // 2 if window is None else sum(min(t + 1, window) for t in range(n))
    return 4 * n_heads * head_dim * keys


def decode_calls(model, context, backend):
    """``(recompute, cached)``: functions of no arguments that each produce one token after ``context``.

    ``cached`` holds caches filled with the first ``context - 1`` positions; each
    call appends the last one, runs it, and rolls the caches back, so every call
    sees the same ``context``.
    """
    import torch

    from ..decoding import forward_step
    from ..kv_cache import KVCache

    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.vocab_size, (1, context), generator=generator)  # (1, T)
    positions = torch.arange(context)
    caches = [KVCache() for _ in model.blocks]
    with torch.no_grad():
        forward_step(model, tokens[:, :-1], positions[:-1], caches, backend=backend)  # the prefill

    @torch.no_grad()
    def recompute():
        return forward_step(model, tokens, positions, backend=backend)[:, -1]  # (1, V)

    @torch.no_grad()
    def cached():
        logits = forward_step(model, tokens[:, -1:], positions[-1:], caches, backend=backend)[:, -1]
        for cache in caches:
            cache.truncate(context - 1)
        return logits

    return recompute, cached


def floor_calls(model, context):
    """``(recompute_floor, cached_floor)``: the matrix products of one step, and nothing else.

    Each does, with torch directly, the products :func:`decode_calls`' step does, in the same
    shapes, with the model's own weights: per block ``x @ W_Q``, ``x @ W_K``, ``x @ W_V``,
    SDPA over the heads, ``@ W_O`` and the MLP's two products; then the unembedding. No
    attnlib call, no check, no LayerNorm, GELU, RoPE or cache copy: their inputs are made
    once, beforehand. *Recompute* runs ``context`` positions (SDPA with ``is_causal``);
    *cached* one query over ``context`` keys and values. A step's time minus its floor's is
    what it spends beyond these products (:func:`step_breakdown`).
    """
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    dtype = model.unembedding.dtype
    d_model, n_heads = model.unembedding.shape[0], model.blocks[0].attention.n_heads
    head_dim = d_model // n_heads

    def inputs(n_queries):
        def normal(*shape):
            return torch.randn(*shape, generator=generator, dtype=dtype)

        return dict(x=normal(1, n_queries, d_model),  # (1, n, d_model): the normed input of each product
                    q=normal(1, n_heads, n_queries, head_dim),  # (1, H, n, d_head)
                    k=normal(1, n_heads, context, head_dim),  # (1, H, T, d_head): every key attended to
                    v=normal(1, n_heads, context, head_dim),
                    hidden=normal(1, n_queries, 4 * d_model))  # (1, n, 4 d_model): the MLP's middle

    def products(x, q, k, v, hidden, causal):
        for block in model.blocks:
            attention = block.attention
            for weight in (attention.w_q, attention.w_k, attention.w_v):
                torch.matmul(x, weight)  # (1, n, d) @ (d, d)
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (1, H, n, d_head)
            torch.matmul(x, attention.w_o)  # the merged heads (1, n, d) @ (d, d)
            if block.mlp is not None:
                torch.matmul(x, block.mlp.w_1)  # (1, n, d) @ (d, 4d)
                torch.matmul(hidden, block.mlp.w_2)  # (1, n, 4d) @ (4d, d)
        return torch.matmul(x, model.unembedding)  # (1, n, d) @ (d, V)

    recompute_inputs, cached_inputs = inputs(context), inputs(1)

    @torch.no_grad()
    def recompute_floor():
        return products(**recompute_inputs, causal=True)

    @torch.no_grad()
    def cached_floor():
        return products(**cached_inputs, causal=False)  # one query sees every key

    return recompute_floor, cached_floor


def step_breakdown(rows):
    """Where each decode step's time goes, per (mode, context), from the rows of the ``decode`` preset.

    For every step mode with a floor row at the same context (``recompute``, ``cached``), a dict:
    ``step_ms`` (its median), ``floor_ms``, ``overhead_ms`` (step - floor), ``floor_fraction``
    (floor / step; the step is *dominated by overhead* where this is below 0.5), ``gflop_per_s``
    and ``floor_gflop_per_s`` (the row's FLOPs over each time), and the rows' ``flags`` (those
    that are set). The ``cached`` entries add ``unchecked_ms``, ``checks_ms`` (cached - unchecked),
    ``checks_fraction`` (of the step) and ``unchecked_overhead_ms`` (unchecked - floor), when the
    file has ``cached-unchecked`` rows.
    """
    by_key = {(row["mode"], row["context"]): row for row in rows if row["preset"] == "decode"}
    breakdown = {}
    for (mode, context), step in sorted(by_key.items()):
        floor = by_key.get((mode + FLOOR_SUFFIX, context))
        if mode.endswith(FLOOR_SUFFIX) or floor is None:
            continue
        entry = dict(step_ms=step["time_ms"], floor_ms=floor["time_ms"],
                     overhead_ms=step["time_ms"] - floor["time_ms"],
                     floor_fraction=floor["time_ms"] / step["time_ms"],
                     gflop_per_s=step["flops"] / step["time_ms"] / 1e6,
                     floor_gflop_per_s=floor["flops"] / floor["time_ms"] / 1e6,
                     flags=[row["flag"] for row in (step, floor) if row["flag"]])
        unchecked = by_key.get((mode + "-unchecked", context))
        if unchecked is not None:
            entry.update(unchecked_ms=unchecked["time_ms"], checks_ms=step["time_ms"] - unchecked["time_ms"],
                         checks_fraction=(step["time_ms"] - unchecked["time_ms"]) / step["time_ms"],
                         unchecked_overhead_ms=unchecked["time_ms"] - floor["time_ms"])
            entry["flags"] += [unchecked["flag"]] if unchecked["flag"] else []
        breakdown[mode, context] = entry
    return breakdown


def build_decoder(sizes, dtype):
    """Chapter 8's decoder with RoPE (any length), random weights from seed 0, in ``dtype``."""
    import torch

    from ..learn.transformer import Decoder

    return Decoder(sizes.vocab, sizes.d_model, sizes.n_heads, sizes.n_layers, positions="rope", seed=0,
                   dtype=getattr(torch, dtype))


def _row(options, timing_result, **fields):
    row = dict.fromkeys(DECODE_COLUMNS)
    row.update(device="cpu", device_name=devices.device_name("cpu"), dtype=options["dtype"], batch=1, **fields)
    row.update(time_ms=timing_result.median_s * 1e3, time_q25_ms=timing_result.q25_s * 1e3,
               time_q75_ms=timing_result.q75_s * 1e3, time_min_ms=timing_result.min_s * 1e3,
               time_first_ms=timing_result.first_s * 1e3, repeats=timing_result.repeats,
               warmup=timing_result.warmup, timer=timing_result.method,
               times_ms=" ".join(f"{t * 1e3:.6g}" for t in timing_result.times_s))
    spread = (timing_result.q75_s - timing_result.q25_s) / timing_result.median_s
    if spread > report.NOISY_IQR_OVER_MEDIAN:
        row["flag"] = f"noisy: IQR {spread:.0%} of the median"
    return row


def _time_in_turns(functions, options, contexts=None):
    return timing.time_cpu_interleaved(functions, contexts=contexts, warmup=options["warmup"],
                                       warmup_s=options["warmup_s"],
                                       min_repeats=options["min_repeats"], max_repeats=options["max_repeats"],
                                       budget_s=options["budget"])


def run_decode(options, progress=print):
    """Rows of the ``decode`` preset: the five :data:`DECODE_MODES`, timed in turns at every context."""
    from ..kv_cache import kv_cache_bytes
    from ..validation import unchecked

    sizes = DecodeModel(options["n_layers"], options["d_model"], options["n_heads"], options["vocab"])
    model = build_decoder(sizes, options["dtype"])
    rows = []
    for context in options["contexts"]:
        recompute, cached = decode_calls(model, context, options["backend"])
        recompute_floor, cached_floor = floor_calls(model, context)
        calls = {"recompute": recompute, "recompute-floor": recompute_floor, "cached": cached,
                 "cached-unchecked": cached, "cached-floor": cached_floor}
        contexts = [unchecked if mode.endswith("-unchecked") else None for mode in DECODE_MODES]
        results = _time_in_turns([calls[mode] for mode in DECODE_MODES], options, contexts)
        for mode, result in zip(DECODE_MODES, results):
            rows.append(_row(options, result, preset="decode", mode=mode,
                             backend=None if mode.endswith(FLOOR_SUFFIX) else options["backend"],
                             n_layers=sizes.n_layers, d_model=sizes.d_model, n_heads=sizes.n_heads,
                             head_dim=sizes.head_dim, vocab=sizes.vocab, context=context,
                             flops=decode_flops(sizes, context, cached=mode.startswith("cached")),
                             bytes_read=decode_bytes(sizes, context, options["dtype"]),
                             cache_bytes=kv_cache_bytes(sizes.n_layers, sizes.n_heads, sizes.head_dim,
                                                        options["dtype"], seq_len=context)))
            progress(f"decode T={context:>5} {mode:<16} {rows[-1]['time_ms']:10.2f} ms"
                     + (f"  ({rows[-1]['flag']})" if rows[-1]["flag"] else ""))
    return rows


def run_window(options, progress=print):
    """Rows of the ``window`` preset: the tiled kernel, causal, with and without a window, in turns."""
    from ..backends import tiled
    from .kernels import make_inputs

    n_heads, head_dim, window, block = options["n_heads"], options["head_dim"], options["window"], \
        options["block_size"]
    scale = 1.0 / float(np.sqrt(head_dim))
    rows = []
    for context in options["contexts"]:
        q, k, v = make_inputs("numpy", 1, n_heads, context, head_dim, options["dtype"], "cpu")

        def windowed(q=q, k=k, v=v):
            return tiled.forward(q, k, v, None, "top-left", scale, window=window, block_size=block, workers=1)

        def causal(q=q, k=k, v=v):
            return tiled.forward(q, k, v, None, "top-left", scale, block_size=block, workers=1)

        for mode, result in zip(("window", "causal"), _time_in_turns([windowed, causal], options)):
            rows.append(_row(options, result, preset="window", mode=mode, backend="tiled", n_heads=n_heads,
                             head_dim=head_dim, window=window if mode == "window" else None, block_size=block,
                             context=context,
                             flops=window_flops(n_heads, head_dim, context, window if mode == "window" else None)))
            progress(f"window T={context:>5} {mode:<7} {rows[-1]['time_ms']:10.2f} ms"
                     + (f"  ({rows[-1]['flag']})" if rows[-1]["flag"] else ""))
    return rows


def write_decode_results(path, stamp, rows):
    """Write ``rows`` as CSV, the stamp repeated on every line, atomically (as the main benchmark does)."""
    stamp_columns = [name for name in DECODE_STAMP_COLUMNS if name in stamp]
    report.write_stamped_csv(path, DECODE_COLUMNS, stamp, stamp_columns, rows)


def read_decode_results(path):
    """``(stamp, rows)`` from a file :func:`write_decode_results` wrote, with typed values."""
    with open(path, newline="") as f:
        records = list(csv.DictReader(f))
    if not records or "mode" not in records[0]:
        raise ValueError(f"{path} is not a decode benchmark file (no rows, or no 'mode' column)")
    types = {**DECODE_COLUMNS, **DECODE_STAMP_COLUMNS}

    def typed(name, text):
        return None if text in ("", None) else types[name](text)

    rows = [{name: typed(name, record.get(name)) for name in DECODE_COLUMNS} for record in records]
    stamp = {name: typed(name, records[0].get(name)) for name in DECODE_STAMP_COLUMNS if name in records[0]}
    stamp["device_name"] = rows[0]["device_name"]
    return stamp, rows


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m attnlib.bench.decode",
        description="Time generating one token with and without a KV cache, checked and unchecked, and "
                    "the step's floor (its matrix products alone) (preset decode), or the tiled attention "
                    "kernel with and without a sliding window (preset window), on one CPU thread. Prints each "
                    "row and optionally writes a CSV stamped with the machine and the git commit.",
        epilog="Examples: python -m attnlib.bench.decode --output attnlib/data/decode_cpu.csv | "
               "python -m attnlib.bench.decode --preset window --output attnlib/data/window_cpu.csv")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="decode",
                        help="; ".join(f"{name}: {options}" for name, options in PRESETS.items()))
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few repeats, to check it runs")
    parser.add_argument("--contexts", "-T", type=int, nargs="+", metavar="T", help="the contexts to time")
    parser.add_argument("--output", "-o", metavar="PATH", help="write the rows to this CSV file")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    options = {**PRESETS[args.preset], **(QUICK[args.preset] if args.quick else {})}
    if args.contexts:
        if any(t < 2 for t in args.contexts):
            build_parser().error("every context must be at least 2 (one cached token and a new one)")
        options["contexts"] = sorted(args.contexts)
    command = " ".join(["python", "-m", "attnlib.bench.decode", *(sys.argv[1:] if argv is None else argv)])
    stamp = report.make_stamp(device="cpu", device_name=devices.device_name("cpu"), tf32=False,
                              dtypes=[options["dtype"]], command=command, threads=1)
    print(f"# {stamp['device_name']} | torch {stamp['torch_version']} | one thread | preset {args.preset} | "
          f"load average {stamp['load_average']} | {stamp['date_utc']} | commit {stamp['git_commit']}")
    with cpu_threads(1):
        rows = (run_decode if args.preset == "decode" else run_window)(options)
    if args.output:
        write_decode_results(args.output, stamp, rows)
        print(f"wrote {len(rows)} rows to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def stored(preset):
    """``(stamp, rows)`` of the measurement the book ships for ``preset`` ("decode" or "window")."""
    from importlib.resources import files

    if preset not in ("decode", "window"):
        raise ValueError(f"preset must be 'decode' or 'window', got {preset!r}")
    return read_decode_results(Path(files("attnlib") / "data" / f"{preset}_cpu.csv"))
