"""Figures of benchmark rows: time, memory and FLOP/s against T, on log-log axes.

Every figure names the machine its numbers were measured on, from the
stamp of the file they came from (see :mod:`attnlib.bench.report`).
"""

KERNEL_COLORS = {
    "numpy": "#8c564b",
    "loop": "#7f7f7f",
    "tiled": "#bcbd22",
    "torch": "#d62728",
    "sdpa-math": "#ff9896",
    "sdpa-flash": "#17becf",
    "sdpa-efficient": "#e377c2",
    "sdpa-cudnn": "#393b79",
    "triton": "#9467bd",
}

COLUMN_LABELS = {
    "time_ms": ("median time (ms)", 1.0),
    "peak_extra_bytes": ("peak extra memory (MiB)", 1 / 2**20),
    "tflop_per_s": ("achieved TFLOP/s", 1.0),
}


def describe(stamp):
    """One line naming where and when a file was measured."""
    tf32 = "on" if stamp["tf32"] else "off"
    return f"{stamp['device_name']} | torch {stamp['torch_version']} | TF32 {tf32} | {stamp['date_utc'][:10]}"


def plot_against_t(ax, rows, column, *, kernels=None):
    """One line per kernel of ``column`` against T, log-log; rows that did not run are left out.

    Times get bars from the first to the third quartile of their repeats, and
    rows that :func:`attnlib.bench.report.flag_rows` flagged get a black cross.
    """
    label, factor = COLUMN_LABELS[column]
    names = kernels or list(dict.fromkeys(r["kernel"] for r in rows))
    for kernel in names:
        chosen = sorted((r for r in rows if r["kernel"] == kernel and r["status"] == "ok" and r[column]),
                        key=lambda r: r["T"])
        if not chosen:
            continue
        seq_lens = [r["T"] for r in chosen]
        values = [r[column] * factor for r in chosen]
        if column == "time_ms" and all(r["time_q25_ms"] is not None for r in chosen):
            # the bars span the interquartile range of the repeats: long bars mean a noisy row
            spread = [[v - r["time_q25_ms"] for v, r in zip(values, chosen)],
                      [r["time_q75_ms"] - v for v, r in zip(values, chosen)]]
            ax.errorbar(seq_lens, values, yerr=spread, fmt="o-", capsize=3,
                        color=KERNEL_COLORS.get(kernel), label=kernel)
        else:
            ax.plot(seq_lens, values, "o-", color=KERNEL_COLORS.get(kernel), label=kernel)
        flagged = [(T, v) for T, v, r in zip(seq_lens, values, chosen) if r.get("flag")]
        if flagged:
            ax.plot(*zip(*flagged), "x", color="black", markersize=9, zorder=5)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel(label)
    ax.grid(True, which="major", alpha=0.3)
    if any(r.get("flag") for r in rows):
        ax.plot([], [], "x", color="black", label="flagged (noisy, or no\nslower than a shorter T)")
    # below the panel, so that it never hides a line
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    return ax


def plot_time_and_memory(rows, title):
    """Time and peak extra memory against T, side by side."""
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_memory) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    plot_against_t(ax_time, rows, "time_ms")
    plot_against_t(ax_memory, rows, "peak_extra_bytes")
    ax_time.set_title("time per call", fontsize=10)
    ax_memory.set_title("peak extra memory", fontsize=10)
    fig.suptitle(title, fontsize=10)
    return fig


def plot_gpu_results(stamp, rows, *, d=64, causal=False):
    """A GPU sweep: for each dtype, time and achieved TFLOP/s against T.

    The device's dense fp16/bf16 peak, where the file knows it, is drawn as a
    dashed line on the TFLOP/s panels.
    """
    import matplotlib.pyplot as plt

    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    fig, axes = plt.subplots(len(dtypes), 2, figsize=(11, 3.6 * len(dtypes)), squeeze=False,
                             constrained_layout=True)
    for (ax_time, ax_flops), dtype in zip(axes, dtypes):
        chosen = [r for r in rows if r["dtype"] == dtype and r["d"] == d and r["causal"] == causal]
        plot_against_t(ax_time, chosen, "time_ms")
        plot_against_t(ax_flops, chosen, "tflop_per_s")
        peaks = {r["peak_tflop_per_s"] for r in chosen if r["peak_tflop_per_s"]}
        if peaks:
            ax_flops.axhline(peaks.pop(), color="black", linestyle="--", linewidth=1,
                             label="dense fp16/bf16 peak")
            ax_flops.legend(fontsize=8)
        sizes = f"B={chosen[0]['B']} H={chosen[0]['H']} d={d}" if chosen else f"d={d}"
        for ax in (ax_time, ax_flops):
            ax.set_title(f"{dtype}, {sizes}{', causal' if causal else ''}", fontsize=10)
    fig.suptitle(describe(stamp), fontsize=10)
    return fig
