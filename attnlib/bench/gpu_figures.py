"""Figures and tables of the stored GPU measurements (chapter 11): what a GPU does with attention.

The files are read with :mod:`attnlib.bench.gpu_results`; everything here draws or
tabulates them, so a page built on a machine without a GPU still shows the GPU's
numbers. Every figure and table carries its file's stamp (:func:`caption`): the
device, the dtype, the library versions and the date, never typed by hand.

- :func:`format_table`: the kernels at one shape, time, speed, TFLOP/s, fraction of
  the datasheet's and of the measured peak, memory;
- :func:`plot_time_vs_t`: time against T, one panel per head dimension and mask;
- :func:`plot_roofline`: achieved TFLOP/s against arithmetic intensity, under the
  datasheet's roof and the measured matrix-product peak;
- :func:`torch_naive_bytes`: the memory traffic of attnlib's ``torch`` path kernel
  by kernel, which places it under the bandwidth roof;
- :func:`clocks`: the GPU's SM clock, power and throttle reasons at the start and
  end of a run, as numbers; :func:`out_of_memory`, where a kernel ran out of memory and
  what it asked for; :func:`l2_cache_mib` and :func:`multiprocessors`, the L2 cache and
  the SM count torch reported.
"""

import re

from . import flops
from .gpu_results import GPU_DIR, gpu_state, stamp_line
from .kernels import MATERIALIZE_SCORES
from .plots import KERNEL_COLORS, plot_against_t

SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}

# Bits of nvidia-smi's clocks_throttle_reasons.active (NVML's nvmlClocksThrottleReason* constants).
THROTTLE_REASONS = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}


def caption(stamp, dtype=None):
    """The stamp of a stored file in one line, with the dtype of the rows shown:
    ``"NVIDIA H100 80GB HBM3; torch 2.11.0+cu130, Triton 3.6.0, ...; 2026-11-25 | fp16 | TF32 off"``."""
    parts = [stamp_line(stamp)]
    if dtype:
        parts.append(SHORT_DTYPE.get(dtype, dtype))
    parts.append(f"TF32 {'on' if stamp['tf32'] else 'off'}")
    return " | ".join(parts)


def clocks(stamp, when="end"):
    """The GPU at the ``"start"`` or ``"end"`` of a run, as numbers, or None if not recorded.

    A dict with ``sm_mhz``, ``max_sm_mhz``, ``power_w``, ``power_limit_w``,
    ``temperature_c``, ``throttle`` (nvidia-smi's bit mask of active throttle reasons)
    and ``reasons`` (their names, :data:`THROTTLE_REASONS`). An SM clock below its
    maximum with reason 0x4 means the GPU held its power under the cap by slowing down.
    """
    if when not in ("start", "end"):
        raise ValueError(f"when must be 'start' or 'end', got {when!r}")
    state = gpu_state(stamp, when)
    if not state:
        return None

    def number(name):
        return float(state[name].split()[0])

    throttle = int(state["clocks_throttle_reasons.active"], 16)
    return {"sm_mhz": number("clocks.sm"), "max_sm_mhz": number("clocks.max.sm"),
            "power_w": number("power.draw"), "power_limit_w": number("power.limit"),
            "temperature_c": number("temperature.gpu"), "throttle": throttle,
            "reasons": [name for bit, name in THROTTLE_REASONS.items() if throttle & bit]}


def l2_cache_mib(path=GPU_DIR / "versions.txt"):
    """The GPU's L2 cache in MiB, as torch reported it in the session's ``versions.txt``
    (``L2_cache_size=50MB``, which torch computes in units of 2**20 bytes); None if absent."""
    found = re.search(r"L2_cache_size=(\d+)MB", path.read_text()) if path.is_file() else None
    return None if found is None else int(found.group(1))


def multiprocessors(path=GPU_DIR / "versions.txt"):
    """The GPU's number of streaming multiprocessors (SMs), as torch reported it in the session's
    ``versions.txt`` (``multi_processor_count=132``); None if absent."""
    found = re.search(r"multi_processor_count=(\d+)", path.read_text()) if path.is_file() else None
    return None if found is None else int(found.group(1))


def out_of_memory(rows, kernel, **where):
    """``(T, asked_gib, capacity_gib)`` for the smallest T at which ``kernel`` ran out of memory
    (among rows matching ``where``, e.g. ``d=64, causal=False``), from the row's CUDA message;
    None if it never did."""
    failed = sorted((r for r in rows if r["kernel"] == kernel and r["status"] == "out of memory"
                     and all(r[key] == value for key, value in where.items())), key=lambda r: r["T"])
    if not failed:
        return None
    message = failed[0]["message"] or ""
    asked = re.search(r"Tried to allocate ([\d.]+) GiB", message)
    capacity = re.search(r"total capacity of ([\d.]+) GiB", message)
    return (failed[0]["T"], float(asked.group(1)) if asked else None,
            float(capacity.group(1)) if capacity else None)


def bytes_moved(row):
    """The least memory traffic of one forward pass of ``row``: :func:`~attnlib.bench.flops.naive_bytes`
    for a kernel that stores the scores, :func:`~attnlib.bench.flops.fused_bytes` (Q, K, V and O
    moved once) for a fused one."""
    count = flops.naive_bytes if row["kernel"] in MATERIALIZE_SCORES else flops.fused_bytes
    return count(row["B"], row["H"], row["T"], row["d"], flops.ITEMSIZE[row["dtype"]])


def torch_naive_bytes(B, H, T, d, itemsize, causal=False):
    """Memory traffic of attnlib's ``torch`` forward (:mod:`attnlib.backends.torch_naive`), kernel by
    kernel, with no mask, in bytes: what :func:`~attnlib.bench.flops.naive_bytes` counts, plus the
    copies this readable path makes. With s = ``itemsize`` and n = B*H*T*T scores:

    1. ``q * scale``: reads and writes Q                      ``2*B*H*T*d*s``
    2. ``@ k.transpose``: reads Q, K, writes the scores S     ``2*B*H*T*d*s + n*s``
    3. ``.to(float32)``, half precision only: reads S, writes ``n*(s + 4)``
    4. ``masked_fill``, causal only: reads, writes fp32 S     ``8*n`` (the (T, T) mask is small)
    5. ``softmax``: reads fp32 S, writes fp32 weights          ``8*n``
    6. ``.to(v.dtype)``, half precision only: reads, writes   ``n*(4 + s)``
    7. ``@ v``: reads the weights and V, writes O               ``n*s + 2*B*H*T*d*s``

    In fp16 that is 24 bytes per score (32 causal) where ``naive_bytes`` counts 8.

    >>> scores = 4096 * 4096  # one head, T = 4096, d = 64, fp16: bytes per score
    >>> round(torch_naive_bytes(1, 1, 4096, 64, 2) / scores, 2), round(torch_naive_bytes(1, 1, 4096, 64, 2, True) / scores, 2)
    (24.19, 32.19)
    """
    n = B * H * T * T
    vectors = 6 * B * H * T * d * itemsize  # q read and written, then q, k, v read and o written
    half = itemsize < 4  # the scores go to float32 and the weights come back: two more passes
    matrix = n * itemsize + (n * (itemsize + 4) if half else 0) + (8 * n if causal else 0) + 8 * n \
        + (n * (4 + itemsize) if half else 0) + n * itemsize
    return vectors + matrix


def format_table(stamp, rows, *, T, d, causal=False, dtype="float16", kernels=None, reference="sdpa-flash",
                 measured=True, header=True):
    """The kernels at one shape as text: median time, speed against ``reference``, achieved TFLOP/s,
    its fraction of the datasheet's and (unless ``measured`` is False) of the measured peak, and the
    peak extra memory. A kernel that did not run says why. The first line is the file's stamp
    (:func:`caption`) after "measured on: " (left out if ``header`` is False, for a page that
    prints its stamp once), the last a legend."""
    chosen = [r for r in rows if r["T"] == T and r["d"] == d and r["causal"] == causal and r["dtype"] == dtype
              and (kernels is None or r["kernel"] in kernels)]
    if not chosen:
        raise ValueError(f"no rows at T={T}, d={d}, causal={causal}, {dtype}")
    if kernels is not None:
        chosen.sort(key=lambda r: list(kernels).index(r["kernel"]))
    first = chosen[0]
    lines = [f"measured on: {caption(stamp, dtype)}"] if header else []
    lines += [f"{first['direction']}, B={first['B']} H={first['H']} T={T} d={d}{', causal' if causal else ''}",
             f"{'kernel':<15}{'ms':>9}{'speed':>8}{'TFLOP/s':>9}{'of datasheet':>14}"
             + (f"{'of measured':>13}" if measured else "") + f"{'memory':>11}"]
    reference_ms = next((r["time_ms"] for r in chosen if r["kernel"] == reference and r["status"] == "ok"), None)
    for r in chosen:
        if r["status"] != "ok":
            asked = re.search(r"Tried to allocate [\d.]+ GiB", r["message"] or "")
            lines.append(f"{r['kernel']:<15} {r['status']}" + (f" ({asked.group(0)})" if asked else ""))
            continue
        speed = "" if reference_ms is None else f"{reference_ms / r['time_ms']:.2f}"
        mib = r["peak_extra_bytes"] / 2**20
        memory = f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"
        lines.append(f"{r['kernel']:<15}{r['time_ms']:>9.3f}{speed:>8}{r['tflop_per_s']:>9.0f}"
                     f"{_percent(r['fraction_of_peak']):>14}"
                     + (f"{_percent(r['fraction_of_measured_peak']):>13}" if measured else "")
                     + f"{memory:>11}")
    if reference_ms is not None:
        lines += [f"speed: {reference}'s time over the kernel's (above 1: faster than {reference})",
                  *(["of datasheet, of measured: TFLOP/s over the datasheet's peak, and over the matrix",
                     "  product measured in the same run; memory: the most one call held beyond its inputs"]
                    if measured else
                    ["of datasheet: TFLOP/s over the datasheet's peak; memory: the most one call held",
                     "  beyond its inputs"])]
    return "\n".join(lines)


def _percent(value):
    return "" if value is None else f"{value:.0%}"


def plot_time_vs_t(files, *, kernels, dtype="float16"):
    """Time against T, log-log: one column per head dimension, one row per mask, one line per kernel.

    ``files`` maps each head dimension d to its ``(stamp, rows)``. A kernel that ran out of
    memory gets a cross at the top of its panel at the first T that failed. The title is the
    first file's stamp (:func:`caption`).
    """
    import matplotlib.pyplot as plt

    head_dims = list(files)
    highest = 0  # the longest time in any panel: the shared y axis leaves room above it
    fig, axes = plt.subplots(2, len(head_dims), figsize=(5.5 * len(head_dims), 7.5), squeeze=False,
                             constrained_layout=True, sharey=True)
    for column, d in enumerate(head_dims):
        rows = files[d][1]
        for line, causal in enumerate((False, True)):
            ax = axes[line][column]
            chosen = [r for r in rows if r["d"] == d and r["causal"] == causal and r["dtype"] == dtype
                      and r["kernel"] in kernels]
            plot_against_t(ax, chosen, "time_ms", kernels=kernels)
            top = max(r["time_ms"] for r in chosen if r["status"] == "ok")
            for kernel in kernels:
                failed = out_of_memory(chosen, kernel)
                if failed is not None:
                    ax.plot([failed[0]], [top], "X", color=KERNEL_COLORS.get(kernel), markersize=11)
                    # above the cross, in headroom left for it: clear of every line
                    ax.annotate(f"{kernel}: out of memory", (failed[0], top), xytext=(0, 8),
                                textcoords="offset points", ha="center", va="bottom", fontsize=8)
            ax.set_title(f"B={chosen[0]['B']} H={chosen[0]['H']} d={d}, {'causal' if causal else 'no mask'}",
                         fontsize=10)
            highest = max(highest, top)
    axes[0][0].set_ylim(top=highest * 6)  # shared: room for the out-of-memory labels
    fig.suptitle(f"{caption(files[head_dims[0]][0], dtype)}, forward", fontsize=9)
    return fig


def plot_roofline(stamp, rows, spec, *, kernels, dtype="float16", d=64, causal=False):
    """Achieved TFLOP/s against arithmetic intensity, on the device's roofline.

    The roof is the datasheet's, ``min(peak, bandwidth * intensity)``, from ``spec`` (a
    :class:`~attnlib.bench.devices.DeviceSpec`). Beside it, dashed, the same roof with the
    matrix-product peak measured in the run (the rows' ``measured_peak_tflop_per_s``) and the
    datasheet's bandwidth, which no file measures. Each kernel is a line over T; its
    intensity counts the least bytes it must move (:func:`bytes_moved`), so a point below
    the roof moved more bytes than that, or did not keep the arithmetic busy.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    intensity = np.logspace(0, 4.2, 200)
    ax.plot(intensity, np.minimum(spec.dense_fp16_tflops, spec.memory_tb_per_s * intensity), "k-",
            linewidth=1.5, label=f"datasheet: {spec.dense_fp16_tflops:.0f} TFLOP/s, {spec.memory_tb_per_s:.2f} TB/s")
    measured = [r["measured_peak_tflop_per_s"] for r in rows
                if r["measured_peak_tflop_per_s"] and r["dtype"] == dtype]
    if measured:
        peak = measured[0]
        ax.plot(intensity, np.minimum(peak, spec.memory_tb_per_s * intensity), "k--", linewidth=1,
                label=f"{SHORT_DTYPE.get(dtype, dtype)} matrix product measured in this run: {peak:.0f} TFLOP/s")
    ridge = spec.dense_fp16_tflops / spec.memory_tb_per_s
    ax.axvline(ridge, color="grey", linewidth=0.8, linestyle=":")
    ax.annotate(f"ridge point\n{ridge:.0f} FLOP/B", (ridge, spec.dense_fp16_tflops), xytext=(-6, 4), textcoords="offset points",
                fontsize=8, color="grey", ha="right")
    highest = {}  # T -> (intensity, TFLOP/s) of the highest fused point, where T is written
    for kernel in kernels:
        chosen = sorted((r for r in rows if r["kernel"] == kernel and r["status"] == "ok" and r["d"] == d
                         and r["causal"] == causal and r["dtype"] == dtype), key=lambda r: r["T"])
        if not chosen:
            continue
        x = [r["flops"] / bytes_moved(r) for r in chosen]
        y = [r["tflop_per_s"] for r in chosen]
        ax.plot(x, y, "o-", color=KERNEL_COLORS.get(kernel), label=kernel)
        if kernel in MATERIALIZE_SCORES:  # its points crowd together: one label for the range
            ax.annotate(f"T={chosen[0]['T']}...{chosen[-1]['T']}", (x[-1], y[-1]), xytext=(6, -4),
                        textcoords="offset points", fontsize=7)
            if kernel == "torch":  # the same times over the bytes attnlib's torch path really moves
                real = [r["flops"] / torch_naive_bytes(r["B"], r["H"], r["T"], r["d"],
                                                       flops.ITEMSIZE[r["dtype"]], r["causal"]) for r in chosen]
                ax.plot(real, y, "o", markerfacecolor="none", color=KERNEL_COLORS.get(kernel),
                        label="torch, counting the fp32 copies it makes")
            continue
        for r, xi, yi in zip(chosen, x, y):
            if yi > highest.get(r["T"], (0, 0))[1]:
                highest[r["T"]] = (xi, yi)
    for T, (xi, yi) in highest.items():
        ax.annotate(f"T={T}", (xi, yi), xytext=(0, 6), textcoords="offset points", fontsize=7, ha="center")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(1, spec.dense_fp16_tflops * 2)
    ax.set_xlabel("arithmetic intensity: FLOPs per byte the kernel must move at the least")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"{stamp_line(stamp)}\n{SHORT_DTYPE.get(dtype, dtype)}, TF32 {'on' if stamp['tf32'] else 'off'}, forward, B={rows[0]['B']} H={rows[0]['H']} d={d}"
                 f"{', causal' if causal else ''}; dashed: measured peak, solid: datasheet", fontsize=8)
    return fig
