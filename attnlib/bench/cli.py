"""The command line: ``python -m attnlib.bench --help``.

Options left out take their value from ``--preset`` (if given), else from
:data:`DEFAULTS`; an option given on the command line always wins.
"""

import argparse
import dataclasses
import sys

from .. import device as default_device
from . import devices, kernels, report, sweep
from .flops import DIRECTIONS

DTYPES = ("float32", "float16", "bfloat16", "float64")

DEFAULTS = {
    "device": "auto",
    "kernels": None,  # every kernel available on the device
    "seq_lens": [512, 1024, 2048, 4096],
    "batch": 1,
    "heads": 8,
    "head_dims": [64],
    "dtypes": ["float32"],
    "causal": "off",
    "direction": "fwd",
    "tf32": "off",
    "timer": "auto",
    "warmup": 2,
    "warmup_s": 0.2,
    "min_repeats": 3,
    "max_repeats": 20,
    "budget": 1.0,
    "flush_mb": None,  # 256 on a GPU, 0 on a CPU
    "loop_max_t": 512,
    "reference": "sdpa-flash",
}

_GPU_T = [512, 1024, 2048, 4096, 8192, 16384]
_GPU = {"device": "cuda", "seq_lens": _GPU_T, "batch": 4, "heads": 32, "dtypes": ["float16"], "causal": "both",
        "tf32": "off", "warmup": 2, "warmup_s": 0.1, "min_repeats": 5, "max_repeats": 30, "budget": 0.3}

PRESETS = {
    # Every kernel at small sizes, on a CPU in well under a minute.
    "quick": {"seq_lens": [128, 256, 512], "batch": 1, "heads": 2, "head_dims": [64], "dtypes": ["float32"],
              "causal": "both", "warmup": 1, "warmup_s": 0.1, "min_repeats": 3, "max_repeats": 5,
              "budget": 0.1},
    # The book's CPU table: every kernel against torch's fused CPU SDPA kernel, one run.
    "cpu-ratios": {"device": "cpu", "seq_lens": [512, 2048, 4096], "batch": 1, "heads": 8, "head_dims": [64],
                   "dtypes": ["float32"], "causal": "off", "loop_max_t": 4096, "warmup": 1, "warmup_s": 0.5,
                   "min_repeats": 5, "max_repeats": 20, "budget": 2.0},
    # The book's GPU measurements, for an H100 or H200: B=4, H=32, each preset a run of a few
    # minutes, so that one call of a GPU session (at most 10 minutes) never loses a whole sweep.
    "gpu-fwd-d64": {**_GPU, "head_dims": [64]},
    "gpu-fwd-d128": {**_GPU, "head_dims": [128]},
    "gpu-fwdbwd-d64": {**_GPU, "head_dims": [64], "direction": "fwd+bwd", "seq_lens": _GPU_T[1:]},
    "gpu-fwdbwd-d128": {**_GPU, "head_dims": [128], "direction": "fwd+bwd", "seq_lens": _GPU_T[1:]},
    "gpu-bf16": {**_GPU, "head_dims": [64, 128], "dtypes": ["bfloat16"], "seq_lens": _GPU_T[1:],
                 "kernels": ["triton", "sdpa-flash", "sdpa-cudnn"]},
    "gpu-fp32": {**_GPU, "head_dims": [64], "dtypes": ["float32"], "seq_lens": [512, 1024, 2048]},
}

CAUSAL_MODES = {"off": (False,), "on": (True,), "both": (False, True)}


def preset_flags(name):
    """The options preset ``name`` stands for, written the way one would type them."""
    flags = []
    for key, value in PRESETS[name].items():
        separator = "," if key == "kernels" else " "
        shown = separator.join(map(str, value)) if isinstance(value, list) else str(value)
        flags.append(f"--{key.replace('_', '-')} {shown}")
    return " ".join(flags)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m attnlib.bench",
        description="Time every attention kernel attnlib has on this machine (its backends, and each "
                    "SDPA kernel pinned with torch.nn.attention.sdpa_kernel) over sequence lengths, sizes "
                    "and dtypes. Prints a table, optionally writes CSV or JSON stamped with the device, "
                    "library versions, TF32 setting and date.",
        epilog="Examples: python -m attnlib.bench --quick | "
               "python -m attnlib.bench --preset cpu-ratios --output book/data/cpu_ratios.csv | "
               "python -m attnlib.bench --preset gpu-fwd-d64 --output attnlib/data/gpu/fwd_d64.csv",
    )
    what = parser.add_argument_group("what to run")
    what.add_argument("--preset", choices=sorted(PRESETS),
                      help="a named set of options, overridden by any option given: "
                           + "; ".join(f"{name}: {preset_flags(name)}" for name in PRESETS))
    what.add_argument("--quick", action="store_true", help="same as --preset quick")
    what.add_argument("--device", choices=["auto", "cpu", "cuda"],
                      help="where to run; auto means cuda when PyTorch sees a GPU (default: auto)")
    what.add_argument("--kernels", type=lambda s: [k for k in s.split(",") if k], metavar="K1,K2",
                      help="comma-separated kernels to time (default: every one available; "
                           "see --list-kernels)")
    what.add_argument("--list-kernels", action="store_true", help="print the kernels available here and exit")
    what.add_argument("--dry-run", action="store_true",
                      help="print what would be timed (the options and the rows) and exit, without timing; "
                           "works for --device cuda on a machine without a GPU")
    what.add_argument("--seq-lens", "-T", type=int, nargs="+", metavar="T",
                      help=f"sequence lengths (default: {' '.join(map(str, DEFAULTS['seq_lens']))})")
    what.add_argument("--batch", "-B", type=int, help=f"batch size B (default: {DEFAULTS['batch']})")
    what.add_argument("--heads", "-H", type=int, help=f"number of heads H (default: {DEFAULTS['heads']})")
    what.add_argument("--head-dims", "-d", type=int, nargs="+", metavar="d",
                      help=f"head dimensions d = d_k = d_v (default: {DEFAULTS['head_dims'][0]})")
    what.add_argument("--dtypes", nargs="+", choices=DTYPES, metavar="DTYPE",
                      help=f"dtypes, from {', '.join(DTYPES)} (default: float32)")
    what.add_argument("--causal", choices=sorted(CAUSAL_MODES),
                      help="causal mask off, on, or both (default: off)")
    what.add_argument("--direction", choices=DIRECTIONS,
                      help="what one timed call does: fwd, the forward pass; bwd, the backward pass "
                           "alone (torch kernels through torch.autograd, after one untimed forward); "
                           "fwd+bwd, both. FLOPs count 2.5x the forward's for the backward "
                           "(default: fwd)")
    what.add_argument("--loop-max-t", type=int, metavar="T",
                      help=f"largest T for the token-by-token 'loop' kernel, which is slow "
                           f"(default: {DEFAULTS['loop_max_t']})")

    how = parser.add_argument_group("how to time")
    how.add_argument("--tf32", choices=["on", "off"],
                     help="set torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 to "
                          "this for the whole run, and record it (default: off)")
    how.add_argument("--timer", choices=["auto", "do_bench"],
                     help="auto: time.perf_counter on a CPU, CUDA events on a GPU; do_bench: "
                          "triton.testing.do_bench (GPU only) (default: auto)")
    how.add_argument("--warmup", type=int, metavar="N",
                     help=f"untimed calls before timing, the first included (default: {DEFAULTS['warmup']})")
    how.add_argument("--warmup-s", type=float, metavar="SECONDS",
                     help=f"keep warming up until this long has passed, so caches, clocks and other "
                          f"libraries' thread pools settle (default: {DEFAULTS['warmup_s']})")
    how.add_argument("--min-repeats", type=int, metavar="N",
                     help=f"fewest timed calls per row (default: {DEFAULTS['min_repeats']})")
    how.add_argument("--max-repeats", type=int, metavar="N",
                     help=f"most timed calls per row (default: {DEFAULTS['max_repeats']})")
    how.add_argument("--budget", type=float, metavar="SECONDS",
                     help=f"about how long the timed calls of one row may take; the number of repeats "
                          f"follows from it (default: {DEFAULTS['budget']})")
    how.add_argument("--flush-mb", type=int, metavar="MB",
                     help="write a buffer of this many MiB before every timed call to evict the caches "
                          "(default: 256 on a GPU, 0 on a CPU)")
    how.add_argument("--threads", type=int, metavar="N",
                     help="limit torch's, the BLAS libraries' and the tiled kernel's CPU threads to N for the "
                          "run, and record it (default on a CPU: 1, so that no kernel's idle threads spin on "
                          "the cores another kernel is timed on, which on a small shared machine makes "
                          "times jump by whole scheduler slices; on a GPU: the libraries' own defaults)")
    how.add_argument("--interleave", action=argparse.BooleanOptionalAction, default=None,
                     help="on a CPU, time the kernels of one size in turns, one call each per round, so that "
                          "a change in the machine's load hits them all alike (default: on with one thread, "
                          "off with more, where one library's spinning threads would slow the next)")
    how.add_argument("--no-memory", action="store_true",
                     help="skip the extra call that measures peak memory")
    how.add_argument("--no-check", action="store_true",
                     help="skip the check of each kernel's output (and gradients) against SDPA's math kernel "
                          "in float64 on one (batch, head), done once before timing it; a kernel whose error "
                          f"exceeds {kernels.CHECK_MARGIN} times that of a model of its dtype's rounding on "
                          "the same inputs (kernels.check_tolerance) gets an error row, not a time")
    how.add_argument("--no-measured-peak", action="store_true",
                     help="on a GPU, skip the large matrix product per dtype that measures the peak each "
                          "row's fraction_of_measured_peak divides by")
    how.add_argument("--peak-tflops", type=float, metavar="TFLOPS",
                     help="dense fp16/bf16 peak of a GPU that is not in attnlib.bench.devices; without it "
                          "such a GPU gets no fraction of peak")

    out = parser.add_argument_group("output")
    out.add_argument("--output", "-o", metavar="PATH", help="write the rows to this file (CSV or JSON)")
    out.add_argument("--plot", metavar="PATH",
                     help="draw time and peak memory against T (one panel each) into this image file "
                          "(PNG, SVG or PDF, from its suffix)")
    out.add_argument("--format", choices=["csv", "json"],
                     help="file format (default: from the suffix of --output)")
    out.add_argument("--reference", metavar="KERNEL",
                     help=f"kernel the printed ratio table divides by (default: {DEFAULTS['reference']})")
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return parser


def resolve_options(args):
    """The effective options: command line, then preset, then defaults."""
    preset = "quick" if args.quick else args.preset
    given = {key: value for key, value in vars(args).items() if value is not None and key in DEFAULTS}
    return {**DEFAULTS, **PRESETS.get(preset, {}), **given}


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick and args.preset not in (None, "quick"):
        parser.error("--quick is --preset quick; it cannot be combined with another preset")
    options = resolve_options(args)
    device = default_device() if options["device"] == "auto" else options["device"]
    if args.dry_run:
        return dry_run(options, device)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda, but PyTorch sees no GPU here")
    available = kernels.available_kernels(device)
    if args.list_kernels:
        print("\n".join(available))
        return 0
    chosen = options["kernels"] or available
    unknown = [k for k in chosen if k not in available]
    if unknown:
        parser.error(f"kernels {unknown} are not available on {device}; available: {', '.join(available)}")
    if options["timer"] == "do_bench" and device != "cuda":
        parser.error("--timer do_bench needs a GPU")
    if options["min_repeats"] < 1 or options["max_repeats"] < options["min_repeats"]:
        parser.error("need 1 <= --min-repeats <= --max-repeats")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    threads = args.threads if args.threads is not None or device != "cpu" else 1

    settings = sweep.Settings(
        device=device, timer=options["timer"], tf32=options["tf32"] == "on", warmup=options["warmup"],
        warmup_s=options["warmup_s"],
        min_repeats=options["min_repeats"], max_repeats=options["max_repeats"], budget_s=options["budget"],
        flush_bytes=None if options["flush_mb"] is None else options["flush_mb"] * 2**20,
        measure_memory=not args.no_memory, peak_tflops=args.peak_tflops, threads=threads,
        interleave=device == "cpu" and (threads == 1 if args.interleave is None else args.interleave),
        check=not args.no_check,
    )
    configs = sweep.build_configs(
        chosen, options["seq_lens"], batch=options["batch"], heads=options["heads"],
        head_dims=options["head_dims"], dtypes=options["dtypes"],
        causal_modes=CAUSAL_MODES[options["causal"]], max_t={"loop": options["loop_max_t"]},
        direction=options["direction"],
    )
    stamp = report.make_stamp(device=device, device_name=devices.device_name(device), tf32=settings.tf32,
                              dtypes=options["dtypes"], command=report.command_line(argv),
                              threads=threads)
    print(f"# {stamp['device_name']} | torch {stamp['torch_version']} | TF32 {options['tf32']} | "
          f"threads {threads or 'default'} | {'interleaved' if settings.interleave else 'one kernel at a time'} | "
          f"direction {options['direction']} | "
          f"load average {stamp['load_average']} | "
          f"{len(configs)} rows | {stamp['date_utc']}")
    if device == "cuda" and not args.no_measured_peak:
        with sweep.tf32_mode(settings.tf32):
            peaks = {dtype: devices.measure_matmul_tflops(dtype) for dtype in options["dtypes"]}
        settings = dataclasses.replace(settings, measured_peaks=peaks)
        print("# measured matmul peak (8192^3): "
              + ", ".join(f"{dtype} {tflops:.0f} TFLOP/s" for dtype, tflops in peaks.items()))
    writer = report.ResultWriter(args.output, stamp, args.format)
    rows = sweep.run_sweep(configs, settings, progress=not args.no_progress, on_row=writer.add)
    print(report.format_rows(rows))
    for group_rows in report.split_groups(rows).values():
        if any(r["kernel"] == options["reference"] and r["status"] == "ok" for r in group_rows):
            first = group_rows[0]
            print(f"\nB={first['B']} H={first['H']} d={first['d']} {first['dtype']} "
                  f"causal={first['causal']} {first['direction']}: "
                  + report.format_ratio_table(group_rows, options["reference"]))
    warning = report.format_flags(rows)
    if warning:
        print("\n" + warning)
    writer.finish(rows)
    if args.output:
        print(f"\nwrote {len(rows)} rows to {args.output}")
    else:
        print(f"\nthe {len(rows)} rows above were not saved: add --output FILE.csv (or .json) to keep them")
    if args.plot:
        save_plot(rows, stamp, args.plot)
        print(f"drew time and peak memory against T in {args.plot}")
    errors = [r for r in rows if r["status"] == "error"]
    if errors:
        print(f"{len(errors)} rows failed with an error (status 'error'); see their message column",
              file=sys.stderr)
    return 1 if errors else 0


def save_plot(rows, stamp, path):
    """Time and peak extra memory against T, one row of two panels per group of rows
    (batch, heads, d, dtype, direction, causal), titled with the stamp; written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # a file, no window
    import matplotlib.pyplot as plt

    from . import plots

    groups = report.split_groups(rows)
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 4 * len(groups)), squeeze=False,
                             constrained_layout=True)
    for (ax_time, ax_memory), ((B, H, d, dtype, direction, causal), group) in zip(axes, groups.items()):
        plots.plot_against_t(ax_time, group, "time_ms")
        plots.plot_against_t(ax_memory, group, "peak_extra_bytes")
        shape = f"B={B} H={H} d={d} {dtype} {direction}{' causal' if causal else ''}"
        ax_time.set_title(f"time per call, {shape}", fontsize=9)
        ax_memory.set_title(f"peak extra memory, {shape}", fontsize=9)
    fig.suptitle(plots.describe(stamp), fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def dry_run(options, device):
    """Print the options and the rows a run would time, and return 0; nothing is timed."""
    names = options["kernels"]  # a preset that names its kernels needs no backend imported (nor torch)
    if not names and device == "cuda":  # on a machine without a GPU, list what a GPU would run
        torch_backends = [k for k in kernels.available_kernels("cpu")
                          if kernels.array_kind(k) == "torch" and k not in kernels.SDPA_KERNELS]
        names = torch_backends + list(kernels.SDPA_KERNELS) + ["triton-simple", "triton"]
    elif not names:
        names = kernels.available_kernels(device)
    configs = sweep.build_configs(
        names, options["seq_lens"], batch=options["batch"], heads=options["heads"],
        head_dims=options["head_dims"], dtypes=options["dtypes"],
        causal_modes=CAUSAL_MODES[options["causal"]], max_t={"loop": options["loop_max_t"]},
        direction=options["direction"],
    )
    shown = {key: value for key, value in options.items() if key != "kernels"}
    print(f"dry run on {device}: kernels {', '.join(dict.fromkeys(names))}; {shown}")
    for config in configs:
        print(f"  {config.kernel} B={config.B} H={config.H} T={config.T} d={config.d} {config.dtype} "
              f"causal={config.causal} {config.direction}")
    print(f"{len(configs)} rows would be timed")
    return 0
