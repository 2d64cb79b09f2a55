"""Timing one call of a function without fooling yourself, on a CPU and on a GPU.

A single stopwatch reading around one call is wrong in four ways:

1. **Asynchronous launches** (GPU). A CUDA operation returns as soon as its
   kernel is queued, so ``time.perf_counter()`` around it measures the launch,
   not the work. Record CUDA events on the stream around the call, or call
   ``torch.cuda.synchronize()`` before reading the clock.
2. **The first call.** It pays one-off costs: lazy initialisation, memory
   allocation, kernel compilation and Triton's autotuning, cuDNN's choice of
   algorithm. Warm-up calls, not timed, absorb them. The first call is still
   reported (``first_s``), so its cost is visible.
3. **Warm caches.** Repeating a call on the same inputs finds them in cache
   (a GPU's L2 of tens of MB, a CPU's L1 to L3), faster than a model would see
   them. Writing a buffer larger than the cache (256 MB) between repeats evicts
   them; the write is outside the timed region.
4. **Clocks and noise.** Boost clocks, heat, power limits and other processes
   move every reading. Take many repeats and report the median with the
   quartiles, not one reading and not the mean.

:func:`time_cpu` and :func:`time_cuda` do all of this; :func:`time_do_bench`
hands it to ``triton.testing.do_bench``, which does the same on a GPU.

Comparing kernels on a shared machine adds a fifth: the load changes while you
measure. Timed one after the other, kernel A may get a quiet minute and kernel
B a busy one, and their ratio measures the neighbours. :func:`time_cpu_interleaved`
takes turns instead, one call of each kernel per round, so every kernel sees the
same conditions and the ratio of two medians is fair.
"""

import contextlib
import time
from dataclasses import dataclass

import numpy as np

FLUSH_BYTES = 256 * 2**20  # larger than the L2 of every GPU in the device table, and most CPUs' caches
MAX_WARMUP_CALLS = 1000  # a warm-up measured in seconds stops here for very fast functions


@dataclass(frozen=True)
class Timing:
    """The summary of one timed function, in seconds."""

    median_s: float
    q25_s: float  # first quartile: a quarter of the repeats were faster
    q75_s: float  # third quartile
    min_s: float
    first_s: float  # the very first call, one-off costs included
    repeats: int | None  # timed calls after the warm-up; None when do_bench chose
    warmup: int  # untimed calls, the first one included
    method: str  # "perf_counter", "cuda-events" or "do_bench"
    times_s: tuple = ()  # every timed call, in order (empty for do_bench)


def summarize(times_s, *, first_s, warmup, method):
    """Median, quartiles and minimum of the per-call times ``times_s``."""
    times = np.asarray(times_s, dtype=float)
    if times.size == 0:
        raise ValueError("summarize needs at least one timed call")
    q25, median, q75 = np.percentile(times, [25, 50, 75])
    return Timing(
        median_s=float(median),
        q25_s=float(q25),
        q75_s=float(q75),
        min_s=float(times.min()),
        first_s=float(first_s),
        repeats=int(times.size),
        warmup=int(warmup),
        method=method,
        times_s=tuple(float(t) for t in times),
    )


def choose_repeats(seconds_per_call, budget_s, min_repeats, max_repeats):
    """How many timed calls fit in ``budget_s``, kept between the two bounds.

    A slow call still gets ``min_repeats`` (so there is a median and a spread);
    a fast one stops at ``max_repeats``.
    """
    if min_repeats < 1 or max_repeats < min_repeats:
        raise ValueError(f"need 1 <= min_repeats <= max_repeats, got {min_repeats} and {max_repeats}")
    if seconds_per_call <= 0:
        return max_repeats
    return int(min(max_repeats, max(min_repeats, int(budget_s / seconds_per_call))))


def cpu_cache_flush(n_bytes=FLUSH_BYTES):
    """A function that writes ``n_bytes`` of memory, evicting the CPU caches; None for 0."""
    if not n_bytes:
        return None
    buffer = np.empty(int(n_bytes), dtype=np.uint8)
    calls = [0]

    def flush():
        calls[0] += 1
        buffer.fill(calls[0] % 251)  # a new value each time, so no write can be skipped

    return flush


def cuda_cache_flush(n_bytes=FLUSH_BYTES):
    """A function that zeroes ``n_bytes`` on the GPU, evicting its L2; None for 0.

    Queued on the current stream like any kernel, so it runs between two
    timed calls and outside both.
    """
    if not n_bytes:
        return None
    import torch

    buffer = torch.empty(int(n_bytes), dtype=torch.uint8, device="cuda")
    return buffer.zero_


def _warm_up(fn, warmup, warmup_s):
    """Untimed calls: at least ``warmup`` and ``warmup_s`` seconds' worth (up to
    ``MAX_WARMUP_CALLS``). Returns the first call's time, the last one's, and the number of calls."""
    start = time.perf_counter()
    fn()
    first_s = last_s = time.perf_counter() - start
    calls, warmup_start = 1, start
    while calls < warmup or (time.perf_counter() - warmup_start < warmup_s and calls < MAX_WARMUP_CALLS):
        start = time.perf_counter()
        fn()
        last_s = time.perf_counter() - start
        calls += 1
    return first_s, last_s, calls


def time_cpu(fn, *, warmup=1, warmup_s=0.0, min_repeats=3, max_repeats=20, budget_s=1.0, flush_bytes=0):
    """Time ``fn()`` on the CPU with ``time.perf_counter``.

    Untimed warm-up calls come first: at least ``warmup`` of them (the first
    is also reported alone) and, for a fast ``fn``, enough to fill
    ``warmup_s`` seconds. A warm-up that lasts a while also lets the thread
    pools of other libraries stop spinning: on a machine with few cores,
    OpenBLAS threads left busy-waiting by a NumPy call can slow torch's next
    calls by an order of magnitude or more, and torch's OpenMP threads can do
    the same to NumPy. Then come as many
    timed calls as fit in ``budget_s``, between ``min_repeats`` and
    ``max_repeats``. With ``flush_bytes``, that much memory is written before
    each timed call, so every call starts with cold caches.
    """
    (result,) = time_cpu_interleaved([fn], warmup=warmup, warmup_s=warmup_s, min_repeats=min_repeats,
                                     max_repeats=max_repeats, budget_s=budget_s, flush_bytes=flush_bytes)
    return result


def time_cpu_interleaved(fns, *, contexts=None, warmup=1, warmup_s=0.0, min_repeats=3, max_repeats=20,
                         budget_s=1.0, flush_bytes=0):
    """Time several functions on the CPU in turns; one :class:`Timing` per function.

    Each function is warmed up as :func:`time_cpu` does, one after the other.
    Then come rounds: in each round every function is called once, timed, the
    order rotating by one from round to round so that none always runs right
    after the same neighbour. As many rounds as fit in ``budget_s`` per
    function, between ``min_repeats`` and ``max_repeats``. ``contexts``, if
    given, holds one context-manager factory per function (or None), entered
    around each of its calls but outside the timed region: for example, the
    choice of SDPA kernel. With ``flush_bytes``, that much memory is written
    before each timed call. With one function this is :func:`time_cpu`, and
    its method is plain "perf_counter".
    """
    fns = list(fns)
    if not fns:
        raise ValueError("time_cpu_interleaved needs at least one function")
    contexts = [c or contextlib.nullcontext for c in (contexts or [None] * len(fns))]
    if len(contexts) != len(fns):
        raise ValueError(f"got {len(fns)} functions but {len(contexts)} contexts")
    first_s, last_s, calls = [], [], []
    for fn, context in zip(fns, contexts):
        with context():
            first, last, n = _warm_up(fn, warmup, warmup_s)
        first_s.append(first)
        last_s.append(last)
        calls.append(n)
    flush = cpu_cache_flush(flush_bytes)
    rounds = choose_repeats(sum(last_s), budget_s * len(fns), min_repeats, max_repeats)
    times = [[] for _ in fns]
    for r in range(rounds):
        for i in [(r + j) % len(fns) for j in range(len(fns))]:
            with contexts[i]():
                if flush is not None:
                    flush()
                start = time.perf_counter()
                fns[i]()
                times[i].append(time.perf_counter() - start)
    method = "perf_counter" if len(fns) == 1 else "perf_counter-interleaved"
    return [summarize(t, first_s=f, warmup=n, method=method)
            for t, f, n in zip(times, first_s, calls)]


def time_cuda(fn, *, warmup=2, warmup_s=0.025, min_repeats=5, max_repeats=100, budget_s=1.0,
              flush_bytes=FLUSH_BYTES):
    """Time ``fn()`` on the GPU with CUDA events, each call after an L2 flush.

    The first call is timed alone, with ``torch.cuda.synchronize()`` on both
    sides, then more warm-up calls follow until ``warmup`` calls and
    ``warmup_s`` seconds have passed (Triton's autotuning and cuDNN's
    plan choice happen in these, and the clocks ramp up). Each timed call is
    bracketed by two events recorded on the stream, so the time is the GPU's,
    not the launch's; one synchronize at the end collects them all.
    """
    import torch

    warmup = max(1, int(warmup))
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    calls, warmup_start = 1, time.perf_counter()
    while calls < warmup or (time.perf_counter() - warmup_start < warmup_s and calls < MAX_WARMUP_CALLS):
        fn()
        torch.cuda.synchronize()
        calls += 1
    flush = cuda_cache_flush(flush_bytes)

    def timed_calls(n):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
        for begin, end in events:
            if flush is not None:
                flush()
            begin.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [begin.elapsed_time(end) / 1e3 for begin, end in events]  # elapsed_time is in ms

    (estimate_s,) = timed_calls(1)
    times = timed_calls(choose_repeats(estimate_s, budget_s, min_repeats, max_repeats))
    return summarize(times, first_s=first_s, warmup=calls, method="cuda-events")


def time_do_bench(fn, *, warmup_ms=25, rep_ms=100):
    """Time ``fn()`` on the GPU with ``triton.testing.do_bench``.

    do_bench runs ``fn`` for ``warmup_ms`` untimed, then repeats it for about
    ``rep_ms`` with CUDA events and an L2 flush (it zeroes a 256 MB buffer)
    before each call. It chooses the number of repeats itself and does not
    return it, so ``repeats`` is None. The first call is timed here,
    before do_bench starts.
    """
    import torch
    from triton.testing import do_bench

    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    median_ms, q25_ms, q75_ms, min_ms = do_bench(fn, warmup=warmup_ms, rep=rep_ms,
                                                 quantiles=[0.5, 0.25, 0.75, 0.0])
    return Timing(median_s=median_ms / 1e3, q25_s=q25_ms / 1e3, q75_s=q75_ms / 1e3, min_s=min_ms / 1e3,
                  first_s=first_s, repeats=None, warmup=1, method="do_bench")


def time_on(device, fn, **options):
    """:func:`time_cuda` on ``"cuda"``, :func:`time_cpu` elsewhere, with the same options."""
    return (time_cuda if device == "cuda" else time_cpu)(fn, **options)
