"""What gets timed: each attnlib backend, with SDPA split into its pinned kernels.

``torch.nn.functional.scaled_dot_product_attention`` picks one of several
kernels silently (fp32 inputs rule out flash, some masks rule out others), so a
timing of plain "sdpa" would not say what ran. Here each kernel is pinned with
``torch.nn.attention.sdpa_kernel`` and is a benchmark row of its own:

=================  =====================  ==========================================
kernel             SDPBackend             what it is
=================  =====================  ==========================================
``sdpa-flash``     FLASH_ATTENTION        FlashAttention-2 on a GPU (fp16/bf16 only);
                                          on a CPU, PyTorch's fused flash-style kernel
``sdpa-efficient`` EFFICIENT_ATTENTION    memory-efficient attention (xFormers), GPU
``sdpa-cudnn``     CUDNN_ATTENTION        cuDNN's fused attention, GPU
``sdpa-math``      MATH                   the unfused reference: matmul, softmax, matmul
=================  =====================  ==========================================

A pinned kernel that cannot run a configuration raises; the sweep records it
as "unsupported" with PyTorch's reason.

Every other backend of :func:`attnlib.backends` is timed as it is, by calling
its ``forward`` directly on inputs made here (valid by construction), so the
timing does not include :func:`attnlib.attention`'s input checks. NumPy
backends run on the CPU only, and ``triton`` on a GPU only (its CPU interpreter
is far too slow to benchmark).
"""

import contextlib

import numpy as np

from ..attention import backend_module, backends

SDPA_KERNELS = {
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-math": "MATH",
}

# Kernels that hold the whole (B, H, T, T) score matrix in memory at once.
MATERIALIZE_SCORES = ("numpy", "torch", "sdpa-math")


def backend_of(kernel):
    """The attnlib backend behind a kernel name: ``"sdpa-flash"`` -> ``"sdpa"``."""
    return "sdpa" if kernel in SDPA_KERNELS else kernel


def array_kind(kernel):
    """``"numpy"`` or ``"torch"``: which arrays the kernel computes on."""
    return backend_module(backend_of(kernel)).ARRAY_KIND


def available_kernels(device):
    """Every kernel that can be timed on ``device`` ("cpu" or "cuda"), readable ones first."""
    kernels = []
    for name in backends():
        if name == "sdpa":
            kernels += list(SDPA_KERNELS)
        elif name == "triton":
            if device == "cuda":
                kernels.append(name)
        elif backend_module(name).ARRAY_KIND == "torch" or device == "cpu":
            kernels.append(name)
    return kernels


def pinned(kernel):
    """A context in which SDPA runs only the kernel named (a no-op for other kernels)."""
    if kernel not in SDPA_KERNELS:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_KERNELS[kernel]))


def make_inputs(kind, B, H, T, d, dtype, device, seed=0):
    """Seeded standard-normal q, k, v of shape (B, H, T, d) for a kernel of array ``kind``.

    torch inputs are drawn on ``device`` directly (no large host-to-device
    copy); NumPy ones come from NumPy's generator. NumPy has no bfloat16, so
    that combination raises TypeError.
    """
    if kind == "numpy":
        if dtype == "bfloat16":
            raise TypeError("NumPy has no bfloat16 dtype")
        rng = np.random.default_rng(seed)
        return tuple(rng.standard_normal((B, H, T, d)).astype(dtype) for _ in range(3))
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    return tuple(
        torch.randn((B, H, T, d), generator=generator, device=device, dtype=getattr(torch, dtype))
        for _ in range(3)
    )


def make_call(kernel, q, k, v, causal, threads=None, direction="fwd"):
    """A function of no arguments that runs one forward pass of ``kernel`` (or its backward).

    Uses the default scale ``1 / sqrt(d)`` and no mask other than ``causal``.
    ``threads`` caps the tiled backend's worker threads, as ``--threads`` caps
    torch's and the BLAS libraries'. For a pinned SDPA kernel, call it inside
    :func:`pinned`. ``direction`` "bwd" or "fwd+bwd": see :func:`make_backward_call`.
    """
    if direction != "fwd":
        return make_backward_call(kernel, q, k, v, causal, threads, direction)
    forward = backend_module(backend_of(kernel)).forward
    scale = 1.0 / float(np.sqrt(q.shape[-1]))
    causal = "top-left" if causal else None
    if kernel == "tiled":
        return lambda: forward(q, k, v, None, causal, scale, workers=threads)
    return lambda: forward(q, k, v, None, causal, scale)


def upstream_gradient(out_like, seed=1):
    """A seeded standard-normal ``d_out``, the gradient a backward pass starts from."""
    if isinstance(out_like, np.ndarray):
        return np.random.default_rng(seed).standard_normal(out_like.shape).astype(out_like.dtype)
    import torch

    generator = torch.Generator(device=out_like.device).manual_seed(seed)
    return torch.randn(out_like.shape, generator=generator, device=out_like.device, dtype=out_like.dtype)


def make_backward_call(kernel, q, k, v, causal, threads=None, direction="bwd"):
    """A function of no arguments that runs the backward pass of ``kernel``, alone or after its forward.

    - NumPy kernels call their backward from :mod:`attnlib.backward`: ``numpy`` recomputes
      the weights from q and k; for "bwd", ``tiled`` starts from the output and
      log-sum-exp of a forward run here, once, before timing.
    - torch kernels (``torch``, each pinned ``sdpa-*``, ``triton``) run through
      ``torch.autograd``, what training does: for "bwd" the forward runs here, once
      (pinned), and each call is ``torch.autograd.grad(out, (q, k, v), d_out,
      retain_graph=True)``; for "fwd+bwd" each call runs both.

    A kernel without a backward pass (``loop``) raises NotImplementedError, which the
    sweep records as "unsupported".
    """
    from ..backward import backward_function

    name = backend_of(kernel)
    scale = 1.0 / float(np.sqrt(q.shape[-1]))
    causal = "top-left" if causal else None
    try:
        backward, kind = backward_function(name)
    except ValueError:
        raise NotImplementedError(f"backend {name!r} has no backward pass") from None
    forward = backend_module(name).forward
    d_out = upstream_gradient(q)  # the output's shape, (B, H, T, d), since d_v = d_k here
    if kind == "numpy":
        if direction == "fwd+bwd":
            if name == "tiled":  # computes the output and log-sum-exp, then the gradients
                return lambda: backward(q, k, v, d_out, None, causal, scale, workers=threads)
            return lambda: (forward(q, k, v, None, causal, scale),
                            backward(q, k, v, d_out, None, causal, scale))
        if name == "tiled":
            from ..backends.tiled import forward as tiled_forward

            out, lse = tiled_forward(q, k, v, None, causal, scale, workers=threads, return_lse=True)
            return lambda: backward(q, k, v, d_out, None, causal, scale, out=out, lse=lse, workers=threads)
        return lambda: backward(q, k, v, d_out, None, causal, scale)
    import torch

    leaves = tuple(x.detach().requires_grad_() for x in (q, k, v))
    if direction == "fwd+bwd":
        return lambda: torch.autograd.grad(forward(*leaves, None, causal, scale), leaves, d_out)
    with pinned(kernel), torch.enable_grad():
        out = forward(*leaves, None, causal, scale)
    return lambda: torch.autograd.grad(out, leaves, d_out, retain_graph=True)
