"""One decode step over a batch of KV caches, timed against memory bandwidth (issues 33 and 34).

``python -m attnlib.bench.kvcache_decode --preset decode --output DIR/decode.csv`` (a GPU only)
times one new token's attention (T_new = 1) over every sequence's cache, H = 32 query heads over
H_kv = 8 key/value heads, d = 128, fp16 and bf16, B in {1, 8, 64}, context 1k ... 128k (every
sequence that long), for:

- ``triton-contiguous-1`` / ``triton-contiguous-auto``: :func:`attnlib.attention_with_kvcache` on a
  (B, T, H_kv, d) cache, backend "triton", ``num_splits`` 1 and 0 (automatic);
- ``triton-paged-1`` / ``triton-paged-auto``: the same cache viewed as a pool of 256-position pages
  whose block table is a random permutation (the reads land wherever the pages are);
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` with one query and ``enable_gqa``.

Each row gives the time (CUDA events, L2 flushed, median and every repeat) and the achieved
bandwidth, ``GB/s = bytes of the cache read (keys and values of every sequence) / time``, beside the
``copy_gbps`` that a device-to-device copy of a 2 GiB buffer reaches on the same GPU (read + write
counted), measured once at the start. Before timing, each kernel's output for the first sequence is
checked against SDPA in float32 (``max_abs_error``); contexts are multiples of the page size.
A row is written as soon as it is measured, so a run stopped early keeps what it measured; a shape
that does not fit in memory is a row with ``status`` "oom".

On a CPU, ``--preset decode`` refuses with a message; ``--dry-run`` runs the same code on tiny
shapes on the CPU (the triton kernel under ``TRITON_INTERPRET=1``, float32), to test the sweep.
"""

import argparse
import csv
import json
import os
import sys
import time

PRESETS = {
    "decode": dict(batches=(1, 8, 64), contexts=(1024, 4096, 16384, 32768, 131072), dtypes=("fp16", "bf16"),
                   n_heads=32, n_kv_heads=8, head_dim=128, page_size=256),
    "dry-run": dict(batches=(1, 3), contexts=(48, 112), dtypes=("fp32",), n_heads=4, n_kv_heads=2,
                    head_dim=16, page_size=16),
}
VARIANTS = ("triton-contiguous-1", "triton-contiguous-auto", "triton-paged-1", "triton-paged-auto", "sdpa")
COLUMNS = ("dtype", "batch", "context", "n_heads", "n_kv_heads", "head_dim", "variant", "num_splits",
           "page_size",
           "status", "time_ms", "q25_ms", "q75_ms", "repeats", "cache_bytes", "gbps", "copy_gbps",
           "fraction_of_copy", "max_abs_error", "times_ms")
COPY_BYTES = 2 * 2**30
STORED = ("decode_fp16.csv", "decode_bf16.csv")  # what tools/gpu_run.sh's decode step writes


def stored(directory=None):
    """The stored GPU rows of this benchmark: a list of dicts (numbers as floats, each with its file's
    stamp under ``"stamp"``), or None when no GPU run has been stored yet
    (``attnlib/data/gpu/decode_fp16.csv`` and ``decode_bf16.csv``, each beside its ``.stamp.json``).

    Chapter 15 plots these and only these; it says so when there are none.
    """
    from importlib.resources import files
    from pathlib import Path

    directory = Path(directory) if directory is not None else Path(files("attnlib") / "data" / "gpu")
    rows = []
    for name in STORED:
        path = directory / name
        if not path.exists():
            continue
        stamp_path = path.with_name(path.name + ".stamp.json")
        stamp = json.loads(stamp_path.read_text()) if stamp_path.exists() else {}
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                for key in ("batch", "context", "num_splits", "time_ms", "gbps", "copy_gbps",
                            "fraction_of_copy", "max_abs_error"):
                    if row.get(key) not in (None, ""):
                        row[key] = float(row[key])
                row["stamp"] = stamp
                rows.append(row)
    return rows or None


def plot_stored(rows, dtype=None):
    """Achieved bandwidth as a fraction of the copy kernel's, against the context, one panel per
    batch size, one line per variant, for one dtype (the first stored by default). Returns the figure."""
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("status") == "ok"]
    if not ok:
        raise ValueError("no row with status 'ok' to plot")
    dtype = dtype or ok[0]["dtype"]
    ok = [r for r in ok if r["dtype"] == dtype]
    batches = sorted({r["batch"] for r in ok})
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 3.4), sharey=True,
                             constrained_layout=True, squeeze=False)
    for ax, batch in zip(axes[0], batches):
        for variant in VARIANTS:
            line = sorted((r["context"], r["fraction_of_copy"]) for r in ok
                          if r["batch"] == batch and r["variant"] == variant)
            if line:
                ax.semilogx(*zip(*line), "o-", label=variant, base=2)
        ax.axhline(1.0, color="0.5", lw=0.8, ls="--")
        ax.set(title=f"B = {int(batch)}", xlabel="context (keys per sequence)")
    axes[0][0].set_ylabel("GB/s achieved / copy kernel's")
    axes[0][-1].legend(fontsize=7)
    device = ok[0].get("stamp", {}).get("device_name", "GPU")
    fig.suptitle(f"One decode step, {dtype}, on {device}", fontsize=10)
    return fig


def _torch_dtype(name):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


def cache_bytes(batch, context, n_kv_heads, head_dim, itemsize):
    """Bytes of keys and values one step reads: every sequence's whole cache."""
    return 2 * batch * context * n_kv_heads * head_dim * itemsize


def copy_bandwidth(device, timer, n_bytes=COPY_BYTES):
    """GB/s of a device-to-device copy: (read + write) bytes over the median time."""
    import torch

    source = torch.empty(n_bytes // 2, dtype=torch.float16, device=device)
    target = torch.empty_like(source)
    timing = timer(lambda: target.copy_(source))
    return 2 * n_bytes / timing.median_s / 1e9


def make_calls(q, k, v, seqlens, page_size, seed):
    """The callable of each variant, and the block table of the paged view (a random permutation of pages)."""
    import torch
    import torch.nn.functional as F

    from .. import attention_with_kvcache

    batch, context, n_kv_heads, d = k.shape
    pages_per_sequence = context // page_size
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(batch * pages_per_sequence, generator=generator)
    table = order.reshape(batch, pages_per_sequence).to(torch.int32).to(q.device)
    k_pages = k.view(batch * pages_per_sequence, page_size, n_kv_heads, d)
    v_pages = v.view(batch * pages_per_sequence, page_size, n_kv_heads, d)
    calls = {
        "triton-contiguous-1": lambda: attention_with_kvcache(q, k, v, cache_seqlens=seqlens,
                                                              backend="triton"),
        "triton-contiguous-auto": lambda: attention_with_kvcache(q, k, v, cache_seqlens=seqlens, num_splits=0,
                                                                 backend="triton"),
        "triton-paged-1": lambda: attention_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens,
                                                         block_table=table, backend="triton"),
        "triton-paged-auto": lambda: attention_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens,
                                                            block_table=table, num_splits=0,
                                                            backend="triton"),
        "sdpa": lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                       v.transpose(1, 2),
                                                       enable_gqa=True).transpose(1, 2),
    }
    # what the paged variants read for sequence 0: page table[0, i] holds its positions i*P..(i+1)*P-1
    first_pages = table[0].long()
    first_paged = (k_pages[first_pages].reshape(k.shape[1:]), v_pages[first_pages].reshape(v.shape[1:]))
    return calls, first_paged


def run_shape(dtype_name, batch, context, preset, device, timer, copy_gbps, seed=0):
    """The rows of one (dtype, B, context): every variant, checked against SDPA, then timed."""
    import torch
    import torch.nn.functional as F

    from ..split_kv import choose_num_splits

    dtype = _torch_dtype(dtype_name)
    h, h_kv, d, page_size = preset["n_heads"], preset["n_kv_heads"], preset["head_dim"], preset["page_size"]
    base = dict(dtype=dtype_name, batch=batch, context=context, n_heads=h, n_kv_heads=h_kv, head_dim=d,
                page_size=page_size)
    n_bytes = cache_bytes(batch, context, h_kv, d, torch.empty(0, dtype=dtype).element_size())
    generator = torch.Generator(device=device).manual_seed(seed)
    try:
        q = torch.randn(batch, 1, h, d, generator=generator, device=device, dtype=dtype)
        k = torch.randn(batch, context, h_kv, d, generator=generator, device=device, dtype=dtype)
        v = torch.randn(batch, context, h_kv, d, generator=generator, device=device, dtype=dtype)
    except torch.cuda.OutOfMemoryError:
        return [dict(base, variant=name, status="oom") for name in VARIANTS]
    seqlens = torch.full((batch,), context, dtype=torch.int32, device=device)
    calls, (k_first, v_first) = make_calls(q, k, v, seqlens, page_size, seed)
    auto = choose_num_splits(batch, h_kv, context)
    rows = []
    for name, call in calls.items():
        row = dict(base, variant=name, num_splits=auto if name.endswith("auto") else 1, cache_bytes=n_bytes)
        try:
            out = call()
            paged = "paged" in name  # checked on sequence 0, in float32 (the whole batch would not fit twice)
            reference = F.scaled_dot_product_attention(
                q[0].transpose(0, 1).float(), (k_first if paged else k[0]).transpose(0, 1).float(),
                (v_first if paged else v[0]).transpose(0, 1).float(), enable_gqa=True).transpose(0, 1)
            row["max_abs_error"] = float((out[0].float() - reference).abs().max())
            timing = timer(call)
        except torch.cuda.OutOfMemoryError:
            rows.append(dict(row, status="oom"))
            continue
        gbps = n_bytes / timing.median_s / 1e9
        rows.append(dict(row, status="ok", time_ms=timing.median_s * 1e3, q25_ms=timing.q25_s * 1e3,
                         q75_ms=timing.q75_s * 1e3, repeats=timing.repeats, gbps=gbps, copy_gbps=copy_gbps,
                         fraction_of_copy=gbps / copy_gbps,
                         times_ms=" ".join(f"{t * 1e3:.5g}" for t in timing.times_s)))
        del out
    del q, k, v, k_first, v_first
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m attnlib.bench.kvcache_decode",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=["decode"], default="decode")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny shapes on the CPU, the triton kernel under TRITON_INTERPRET=1, float32")
    parser.add_argument("--output", required=True, help="CSV file; rows are appended as they are measured, "
                        "with the stamp in OUTPUT.stamp.json")
    parser.add_argument("--dtypes", nargs="+", choices=["fp16", "bf16"],
                        help="only these dtypes (default: the preset's fp16 and bf16), to split the run "
                        "in two calls")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before the triton kernels are imported
    import torch

    from . import report, timing

    if args.dry_run:
        device, preset = "cpu", PRESETS["dry-run"]
        if "attnlib.backends.triton_decode" in sys.modules and not sys.modules[
                "attnlib.backends.triton_decode"].RUNS_ON_CPU:  # pragma: no cover
            parser.error("the triton decode kernel was imported without TRITON_INTERPRET=1")

        def timer(fn):
            return timing.time_cpu(fn, warmup=1, min_repeats=2, max_repeats=3, budget_s=0.05)
    else:
        if not torch.cuda.is_available():
            parser.exit(2, "attnlib.bench.kvcache_decode: the decode preset measures a GPU's bandwidth and "
                           "needs "
                           "a CUDA GPU; none is visible here. Use --dry-run to test the sweep on the CPU.\n")
        device, preset = "cuda", dict(PRESETS[args.preset])
        if args.dtypes:
            preset["dtypes"] = tuple(args.dtypes)

        def timer(fn):
            return timing.time_cuda(fn, warmup=3, warmup_s=0.1, min_repeats=10, max_repeats=50, budget_s=0.5)
    stamp = report.make_stamp(device=device, device_name=torch.cuda.get_device_name() if device == "cuda" else
                              "cpu (dry run)", tf32=False, dtypes=list(preset["dtypes"]),
                              command=report.command_line(sys.argv if argv is None else
                                                          ["python -m attnlib.bench.kvcache_decode", *argv]))
    copy_gbps = copy_bandwidth(device, timer, COPY_BYTES if device == "cuda" else 2**24)
    stamp["copy_gbps"] = copy_gbps
    with open(args.output + ".stamp.json", "w") as f:
        json.dump(stamp, f, indent=1, default=str)
    start = time.perf_counter()
    with open(args.output, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for dtype in preset["dtypes"]:
            for batch in preset["batches"]:
                for context in preset["contexts"]:
                    for row in run_shape(dtype, batch, context, preset, device, timer, copy_gbps):
                        writer.writerow(row)
                        f.flush()
                        print(" ".join(f"{key}={row.get(key)}" for key in
                                       ("dtype", "batch", "context", "variant", "status", "time_ms", "gbps",
                                        "fraction_of_copy", "max_abs_error")), flush=True)
    print(f"done in {time.perf_counter() - start:.0f} s; copy bandwidth {copy_gbps:.0f} GB/s")


if __name__ == "__main__":
    main()
