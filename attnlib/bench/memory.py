"""Peak extra memory of one call: how far memory use rose above where it started.

Each device needs its own instrument, and each sees something different:

- NumPy on the CPU: ``tracemalloc``. NumPy reports every array buffer it
  allocates to tracemalloc, so the peak covers the score matrix, the softmax
  temporaries and the output. It does not see memory that a BLAS library
  allocates for itself, nor anything torch allocates.
- torch on the CPU: tracemalloc does not see torch's allocator, so the call
  runs once under ``torch.profiler`` with ``profile_memory=True``, and the
  peak is the largest running sum of the allocations and frees it records,
  in time order. It sees every buffer torch's CPU allocator hands out,
  the scratch space a fused kernel takes and gives back inside one operator
  included; it misses memory that a library such as oneDNN or MKL allocates
  for itself. The profiler's first use in a process takes a few seconds.
- CUDA: ``torch.cuda.max_memory_allocated`` after
  ``torch.cuda.reset_peak_memory_stats``, minus what was allocated before the
  call: every tensor of the call, from torch's caching allocator. Workspace
  that cuDNN or cuBLAS take outside that allocator is not counted.

Each of these counts the output, which the call allocates too. Run the call
once before measuring, so that one-off allocations (a workspace, a cache) do
not count.
"""

import contextlib
import os
import sys
import tracemalloc


def peak_numpy(fn):
    """Peak bytes NumPy allocated during ``fn()``, above what was allocated before."""
    already_tracing = tracemalloc.is_tracing()
    if not already_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not already_tracing:
            tracemalloc.stop()
    return max(0, peak - before)


@contextlib.contextmanager
def _stderr_to_devnull():
    """Send file descriptor 2 to /dev/null for a moment (C++ code writes there directly)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_torch_cpu(fn):
    """Peak bytes torch's CPU allocator held during ``fn()``, above the start.

    The profiler records every allocation and free as a ``[memory]`` event
    with a time stamp and a signed size; their running sum, in time order, is
    the memory in use, and its maximum the peak. Starting and stopping the
    profiler prints trace lines from C++ to the process's stderr; those two
    moments (not ``fn()``) run with stderr sent to /dev/null.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _stderr_to_devnull():
        prof.start()
    try:
        fn()
    finally:
        with _stderr_to_devnull():
            prof.stop()
    changes = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU
    )
    in_use = peak = 0
    for _, change in changes:
        in_use += change
        peak = max(peak, in_use)
    return peak


def peak_cuda(fn):
    """Peak bytes torch's CUDA allocator held during ``fn()``, above the start."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return max(0, torch.cuda.max_memory_allocated() - before)


def peak_extra_bytes(fn, *, array_kind, device):
    """``(bytes, method)``: the peak extra memory of ``fn()``, and which instrument measured it."""
    if device == "cuda":
        return peak_cuda(fn), "torch.cuda.max_memory_allocated"
    if array_kind == "numpy":
        return peak_numpy(fn), "tracemalloc"
    return peak_torch_cpu(fn), "torch.profiler"
