"""A benchmark sweep: every kernel at every configuration, one result row each.

:func:`build_configs` lists the configurations, :func:`run_sweep` times each
one with :mod:`~attnlib.bench.timing`, measures its memory with
:mod:`~attnlib.bench.memory` and turns it into a row (see
:data:`attnlib.bench.report.ROW_COLUMNS`). A configuration that cannot run
(a dtype a kernel does not support, an input that does not fit in memory)
becomes a row whose ``status`` says so; the sweep goes on.
"""

import contextlib
import gc
import itertools
import sys
import warnings
from dataclasses import dataclass

from . import devices, kernels, memory, report, timing
from .flops import ITEMSIZE, direction_flops, products_done
from .report import ROW_COLUMNS


@dataclass(frozen=True)
class Config:
    """One benchmark row: which kernel, at which sizes."""

    kernel: str  # a name from kernels.available_kernels(), e.g. "sdpa-flash"
    B: int  # batch
    H: int  # heads
    T: int  # sequence length
    d: int  # head dimension (d_k = d_v)
    dtype: str  # "float32", "float16", "bfloat16" or "float64"
    causal: bool
    direction: str = "fwd"  # "fwd", "bwd" or "fwd+bwd" (see kernels.make_backward_call)


@dataclass(frozen=True)
class Settings:
    """How to time: the same for every row of a sweep."""

    device: str = "cpu"
    timer: str = "auto"  # "auto" (perf_counter on CPU, CUDA events on GPU) or "do_bench"
    tf32: bool = False
    warmup: int = 1  # untimed calls, at least
    warmup_s: float = 0.2  # and at least this long (see timing.time_cpu)
    min_repeats: int = 3
    max_repeats: int = 20
    budget_s: float = 1.0  # time for the timed repeats of one row, about
    flush_bytes: int | None = None  # None: 256 MB on a GPU, none on a CPU
    measure_memory: bool = True
    peak_tflops: float | None = None  # a user-supplied dense peak, for a device not in the table
    threads: int | None = None  # CPU threads for torch and BLAS; None leaves their defaults
    interleave: bool = False  # on a CPU, time the kernels of one size in turns (run_interleaved)
    check: bool = True  # compare each kernel with the float64 reference once before timing it
    measured_peaks: dict | None = None  # {dtype: TFLOP/s of a large matmul measured in this run}


def build_configs(kernel_names, seq_lens, *, batch=1, heads=8, head_dims=(64,), dtypes=("float32",),
                  causal_modes=(False,), max_t=None, direction="fwd"):
    """Every combination, grouped so that kernels sharing inputs run one after another.

    ``max_t`` maps a kernel name to the largest T it runs at (``{"loop": 512}``):
    the token-by-token loop is far too slow for long sequences.
    """
    max_t = max_t or {}
    configs = []
    for dtype, d, causal, T in itertools.product(dtypes, head_dims, causal_modes, sorted(seq_lens)):
        for kernel in kernel_names:
            if T <= max_t.get(kernel, T):
                configs.append(Config(kernel, int(batch), int(heads), int(T), int(d), dtype, bool(causal),
                                      direction))
    return configs


@contextlib.contextmanager
def tf32_mode(enabled):
    """Set ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32``,
    and put the previous values back afterwards."""
    import torch

    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = bool(enabled)
    torch.backends.cudnn.allow_tf32 = bool(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@contextlib.contextmanager
def cpu_threads(n):
    """Limit torch's and the BLAS libraries' CPU thread pools to ``n`` threads (None: no change).

    On a machine shared with other jobs, a pool of threads waits at every
    barrier for its slowest thread, and if another process holds that core the
    wait lasts a whole scheduler time slice: timings then come out in steps of
    milliseconds. Fewer threads than cores avoids that, at the price of speed.
    """
    if n is None:
        yield
        return
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        with threadpool_limits(limits=int(n), user_api="blas"):
            yield
    finally:
        torch.set_num_threads(before)


def available_memory_bytes():
    """The kernel's ``MemAvailable`` (Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def too_big_for_cpu(config):
    """A message when a score-matrix kernel would clearly not fit in RAM, else None.

    On a CPU, running out of memory may not raise at all: Linux can kill the
    process instead. So kernels that hold the (B, H, T, T) matrix are not
    started when three copies of it (NumPy's softmax holds three) exceed the
    memory available. On a GPU the allocator raises, and that is recorded.
    """
    if config.kernel not in kernels.MATERIALIZE_SCORES:
        return None
    needed = 3 * config.B * config.H * config.T**2 * max(ITEMSIZE[config.dtype], 4)
    available = available_memory_bytes()
    if available is None or needed <= available:
        return None
    return f"not run: needs about {needed / 2**30:.1f} GiB, {available / 2**30:.1f} GiB available"


def classify_failure(exc):
    """``(status, message)`` for an exception raised by a kernel."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lowered = str(exc).lower()
    if isinstance(exc, MemoryError) or "out of memory" in lowered or "can't allocate memory" in lowered:
        return "out of memory", text
    if isinstance(exc, (NotImplementedError, TypeError)) or "no viable backend" in lowered \
            or "not implemented for" in lowered or "not supported" in lowered:
        return "unsupported", text
    return "error", f"{type(exc).__name__}: {text}"


def _time(fn, settings):
    if settings.device == "cuda" and settings.timer == "do_bench":
        return timing.time_do_bench(fn)
    default_flush = timing.FLUSH_BYTES if settings.device == "cuda" else 0
    return timing.time_on(settings.device, fn, warmup=settings.warmup, warmup_s=settings.warmup_s,
                          min_repeats=settings.min_repeats, max_repeats=settings.max_repeats,
                          budget_s=settings.budget_s,
                          flush_bytes=default_flush if settings.flush_bytes is None else settings.flush_bytes)


def _empty_row(config, settings, device_name):
    row = dict.fromkeys(ROW_COLUMNS)
    row.update(kernel=config.kernel, backend=kernels.backend_of(config.kernel), device=settings.device,
               device_name=device_name, dtype=config.dtype, tf32=settings.tf32, B=config.B, H=config.H,
               T=config.T, d=config.d, causal=config.causal, direction=config.direction, status="ok",
               flops=direction_flops(config.direction, config.B, config.H, config.T, config.d, config.causal),
               products=products_done(config.kernel, config.direction))
    if settings.device == "cuda":
        peak = devices.peak_flops(device_name, config.dtype, settings.peak_tflops)
        row["peak_tflop_per_s"] = None if peak is None else peak / 1e12
    return row


def _prepare(config, settings, device_name, inputs):
    """The row of ``config`` and the call to time, or the row with its failure and None."""
    row = _empty_row(config, settings, device_name)
    if settings.device == "cpu" and (reason := too_big_for_cpu(config)):
        row.update(status="out of memory", message=reason)
        return row, None
    try:
        kind = kernels.array_kind(config.kernel)
        if inputs is None:
            inputs = kernels.make_inputs(kind, config.B, config.H, config.T, config.d, config.dtype,
                                         settings.device)
        fn = kernels.make_call(config.kernel, *inputs, config.causal, threads=settings.threads,
                               direction=config.direction)
        if settings.check and not _output_agrees(row, config, settings, inputs):
            return row, None
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row, never a crash
        _fail(row, exc, [], settings)
        return row, None
    return row, fn


def _output_agrees(row, config, settings, inputs):
    """Check the kernel against the float64 reference (see kernels.check_against_reference).

    Records the error and the tolerance in the row; a kernel that disagrees gets status
    "error" and no time.
    """
    error, tolerance = kernels.check_against_reference(config.kernel, *inputs, config.causal,
                                                       config.direction, tf32=settings.tf32)
    row.update(check_error=error, check_tolerance=tolerance)
    if error <= tolerance:  # False for NaN too
        return True
    row.update(status="error", message=f"not timed: its output differs from the float64 reference by "
                                       f"{error:.2e} (relative), more than the {tolerance:.1e} allowed for "
                                       f"{config.dtype} on these inputs ({kernels.CHECK_MARGIN} times the "
                                       f"error of the rounding model, kernels.check_tolerance)")
    return False


def _fail(row, exc, caught, settings):
    """Record a kernel's failure, and the warnings it raised, in its row."""
    reasons = sorted({str(w.message).strip().splitlines()[0] for w in caught})
    status, message = classify_failure(exc)
    row.update(status=status, message="; ".join([message, *reasons])[:500])
    _release_memory(settings.device)


def _finish(row, config, fn, result, settings):
    """Fill the row with the timing ``result`` and, if asked, the memory of one call."""
    if settings.measure_memory:
        with kernels.pinned(config.kernel):
            row["peak_extra_bytes"], row["memory_method"] = memory.peak_extra_bytes(
                fn, array_kind=kernels.array_kind(config.kernel), device=settings.device)
    row.update(time_ms=result.median_s * 1e3, time_q25_ms=result.q25_s * 1e3, time_q75_ms=result.q75_s * 1e3,
               time_min_ms=result.min_s * 1e3, time_first_ms=result.first_s * 1e3, repeats=result.repeats,
               times_ms=" ".join(f"{t * 1e3:.6g}" for t in result.times_s) or None,
               warmup=result.warmup, timer=result.method)
    achieved = row["flops"] / result.median_s
    row["tflop_per_s"] = achieved / 1e12
    if row["peak_tflop_per_s"] is not None:
        row["fraction_of_peak"] = achieved / (row["peak_tflop_per_s"] * 1e12)
    measured = (settings.measured_peaks or {}).get(config.dtype)
    if measured:
        row["measured_peak_tflop_per_s"] = measured
        row["fraction_of_measured_peak"] = row["tflop_per_s"] / measured
    row["tile"] = kernels.tiles_used(config.kernel, config.direction)
    return row


def run_config(config, settings, device_name, inputs=None):
    """Time one configuration and return its row (a dict with :data:`ROW_COLUMNS`)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row, fn = _prepare(config, settings, device_name, inputs)
        if fn is None:
            return row
        try:
            with kernels.pinned(config.kernel):
                result = _time(fn, settings)
            return _finish(row, config, fn, result, settings)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a row, never a crash
            _fail(row, exc, caught, settings)
            return row


def run_interleaved(configs, settings, device_name, inputs_of=None):
    """Time configurations that differ only in their kernel in turns (see
    :func:`~attnlib.bench.timing.time_cpu_interleaved`); their rows, in order.

    ``inputs_of`` maps an array kind ("numpy" or "torch") to the inputs to share.
    A kernel that fails while warming up gets its failure row, and the others
    are timed again without it.
    """
    inputs_of = inputs_of or {}
    rows, calls = {}, {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for config in configs:
            row, fn = _prepare(config, settings, device_name, inputs_of.get(kernels.array_kind(config.kernel)))
            rows[config] = row
            if fn is not None:
                calls[config] = fn
        while calls:
            timed = list(calls)
            try:
                results = timing.time_cpu_interleaved(
                    [calls[c] for c in timed], contexts=[lambda c=c: kernels.pinned(c.kernel) for c in timed],
                    warmup=settings.warmup, warmup_s=settings.warmup_s, min_repeats=settings.min_repeats,
                    max_repeats=settings.max_repeats, budget_s=settings.budget_s,
                    flush_bytes=settings.flush_bytes or 0)
            except Exception:  # noqa: BLE001 - find the failing kernel alone, record it, time the rest
                for config in timed:
                    try:
                        with kernels.pinned(config.kernel):
                            calls[config]()
                    except Exception as exc:  # noqa: BLE001
                        _fail(rows[config], exc, caught, settings)
                        del calls[config]
                if len(calls) == len(timed):  # nothing failed alone: time them one by one
                    return [run_config(c, settings, device_name, inputs_of.get(kernels.array_kind(c.kernel)))
                            for c in configs]
                continue
            for config, result in zip(timed, results):
                try:
                    _finish(rows[config], config, calls[config], result, settings)
                except Exception as exc:  # noqa: BLE001
                    _fail(rows[config], exc, caught, settings)
            break
    return [rows[c] for c in configs]


def _release_memory(device):
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def _same_sizes(config):
    return (config.B, config.H, config.T, config.d, config.dtype, config.causal, config.direction)


def run_sweep(configs, settings, *, progress=True, on_row=None):
    """Run every configuration; return the rows, in the order of ``configs``.

    Inputs are made once and shared by consecutive rows of the same sizes
    and array kind. With ``settings.interleave`` on a CPU, consecutive rows
    that differ only in their kernel are timed in turns
    (:func:`run_interleaved`). A progress bar goes to stderr unless
    ``progress`` is False. ``on_row(row)`` is called with each row as soon as it
    is measured (the command line writes its file then), before the rows are flagged.
    """
    from tqdm import tqdm

    device_name = devices.device_name(settings.device)
    interleave = settings.interleave and settings.device == "cpu"
    groups = [list(g) for _, g in itertools.groupby(configs, key=_same_sizes)] if interleave \
        else [[c] for c in configs]
    rows, cached = [], {}
    bar = tqdm(total=len(configs), desc="attnlib.bench", unit="row", file=sys.stderr, disable=not progress)
    with tf32_mode(settings.tf32), cpu_threads(settings.threads):
        for group in groups:
            first = group[0]
            bar.set_postfix_str(f"{'+'.join(c.kernel for c in group)} T={first.T} d={first.d} {first.dtype}"
                                f"{' causal' if first.causal else ''}")
            inputs_of = {}
            for kind in dict.fromkeys(kernels.array_kind(c.kernel) for c in group):
                key = (kind, first.B, first.H, first.T, first.d, first.dtype)
                if key not in cached:
                    for old in [k for k in cached if k[1:] != key[1:]]:  # keep one size's inputs at a time
                        del cached[old]
                    _release_memory(settings.device)
                    try:
                        cached[key] = kernels.make_inputs(*key, settings.device)
                    except Exception:  # noqa: BLE001 - run_config makes them again and records why it fails
                        cached[key] = None
                inputs_of[kind] = cached[key]
            if len(group) > 1:
                new_rows = run_interleaved(group, settings, device_name, inputs_of)
            else:
                new_rows = [run_config(first, settings, device_name,
                                       inputs=inputs_of[kernels.array_kind(first.kernel)])]
            rows.extend(new_rows)
            for row in new_rows:
                if on_row is not None:
                    on_row(row)
            bar.update(len(group))
    bar.close()
    report.flag_rows(rows)
    return rows
