"""Figures of the stored GPU measurements (:mod:`attnlib.bench.gpu_results`) for chapters 12 and 13.

Two figures, each with a panel without a mask and one with a causal mask, one line per
kernel against the sequence length T, the machine and versions from the file's stamp
in the title:

- :func:`plot_tflops`: achieved TFLOP/s, with the datasheet peak and the peak a large
  matrix product measured in the same run drawn across;
- :func:`plot_speed_relative`: each kernel's speed as a multiple of a reference
  kernel's (the reference's time over the kernel's), on a linear axis, where
  differences of a few percent stay visible.

Kernels that ran out of memory at some T say so in the legend.
"""

from . import gpu_results
from .plots import KERNEL_COLORS

COLORS = {**KERNEL_COLORS, "triton-simple": KERNEL_COLORS.get("triton-simple", "#c5b0d5")}
STYLES = {"triton-simple": "--"}  # the teaching kernel: dashed, beside the library kernel


def _label(kernel, rows):
    """The kernel's name, and from which T it ran out of memory, if it did."""
    failed = sorted(r["T"] for r in rows if r["kernel"] == kernel and r["status"] == "out of memory")
    return f"{kernel} (out of memory from T = {failed[0]:,})" if failed else kernel


def _panels(rows, title, ylabel):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True, constrained_layout=True)
    for ax, causal in zip(axes, (False, True)):
        ax.set_xscale("log", base=2)
        seq_lens = sorted({r["T"] for r in rows})
        ax.set_xticks(seq_lens, [f"{T:,}" for T in seq_lens])
        ax.minorticks_off()
        ax.set_xlabel("sequence length T")
        ax.set_title("causal mask" if causal else "no mask", fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel(ylabel)
    fig.suptitle(title, fontsize=10)
    return fig, axes


def _describe(stamp, rows):
    first = rows[0]
    return (f"{gpu_results.stamp_line(stamp)}\n{first['dtype']}, {first['direction']}, "
            f"B = {first['B']}, H = {first['H']}, d = {first['d']}")


def _lines(ax, rows, kernels, values):
    """One line per kernel through ``values(row)`` at each T where it ran."""
    for kernel in kernels:
        chosen = sorted((r for r in rows if r["kernel"] == kernel and r["status"] == "ok"),
                        key=lambda r: r["T"])
        if chosen:
            ax.plot([r["T"] for r in chosen], [values(r) for r in chosen], STYLES.get(kernel, "-"),
                    marker="o", color=COLORS.get(kernel), label=_label(kernel, rows))


def plot_tflops(stamp, rows, kernels):
    """Achieved TFLOP/s (FLOPs as the file counts them) against T, no mask | causal.

    ``rows`` are one file's rows of a single d, dtype and direction.
    """
    fig, axes = _panels(rows, _describe(stamp, rows), "TFLOP/s (as counted)")
    datasheet = max(r["peak_tflop_per_s"] or 0 for r in rows)
    measured = max(r["measured_peak_tflop_per_s"] or 0 for r in rows)
    for ax, causal in zip(axes, (False, True)):
        _lines(ax, [r for r in rows if r["causal"] == causal], kernels, lambda r: r["tflop_per_s"])
        if datasheet:
            ax.axhline(datasheet, color="black", ls="--", lw=1, label=f"datasheet peak, {datasheet:.0f}")
        if measured:
            ax.axhline(measured, color="black", ls=":", lw=1, label=f"measured matmul peak, {measured:.0f}")
        ax.set_yscale("log")
    axes[0].legend(fontsize=8, loc="lower right")
    return fig


def plot_speed_relative(stamp, rows, kernels, reference="sdpa-flash"):
    """Each kernel's speed as a multiple of ``reference``'s at the same T, no mask | causal."""
    fig, axes = _panels(rows, _describe(stamp, rows), f"speed relative to {reference}")
    for ax, causal in zip(axes, (False, True)):
        chosen = [r for r in rows if r["causal"] == causal]
        reference_ms = {r["T"]: r["time_ms"] for r in chosen
                        if r["kernel"] == reference and r["status"] == "ok"}
        ok = [r for r in chosen if r["T"] in reference_ms]
        _lines(ax, ok + [r for r in chosen if r["status"] == "out of memory"], kernels,
               lambda r: reference_ms[r["T"]] / r["time_ms"])
        ax.axhline(1.0, color=COLORS.get(reference), lw=1.5, label=f"{reference} (= 1)")
    axes[0].legend(fontsize=8, loc="best")
    return fig
