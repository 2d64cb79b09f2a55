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


# SDPA kernels with no CPU implementation in PyTorch: pinned on a CPU they raise "No available kernel".
GPU_ONLY_SDPA_KERNELS = ("sdpa-efficient", "sdpa-cudnn")


def available_kernels(device):
    """Every kernel that can be timed on ``device`` ("cpu" or "cuda"), readable ones first."""
    kernels = []
    for name in backends():
        if name == "sdpa":
            kernels += [k for k in SDPA_KERNELS if device == "cuda" or k not in GPU_ONLY_SDPA_KERNELS]
        elif name in ("triton", "triton-simple"):
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


# The check before timing (check_against_reference). A kernel passes when its error against SDPA's
# math kernel in float64, max |got - expected| / max(1, max |expected|) over the output (and gradients),
# is at most CHECK_MARGIN times the error of rounding_model on the same inputs: the matrix form that
# rounds to the inputs' dtype wherever the naive path stores a value in it.
# - On the stored H100 files no kernel's error exceeded the naive path's at the same shape by more than
#   5% in fp16 and bf16, and by more than 2.2 times in fp32, where float32 sums dominate
#   (tests/test_gpu_evidence.py).
# - On a CPU (tests/test_bench_check.py) correct kernels stay below two thirds of the tolerance, while a
#   1% error in the scale (fp16, fp32, fp64) or one dropped block of 64 keys (every dtype) exceeds twice
#   it. The fixed 1e-2 allowed before let a 1% scale error in fp16 through from T = 2048.
# - In bf16 a 1% error in the scale moves the output about as much as bf16's own rounding of the
#   scores, and no tolerance can tell the two apart.
CHECK_MARGIN = 4
# A ceiling: the fixed tolerances the bench used before; the rule above is far below them in practice.
CHECK_TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-4, "float64": 1e-10}
TF32_TOLERANCE = 2e-2  # fp32 products in TF32 keep 10 bits, like fp16
TF32_MANTISSA_BITS = 10


def _as_float64(x):
    """A float64 torch tensor on x's device (NumPy arrays: on the CPU)."""
    import torch

    if isinstance(x, np.ndarray):
        return torch.from_numpy(x.astype(np.float64))
    return x.detach().to(torch.float64)


def _torch_dtype(x):
    """The torch dtype of a torch tensor or NumPy array (float16, float32, float64)."""
    import torch

    return x.dtype if isinstance(x, torch.Tensor) else getattr(torch, np.dtype(x.dtype).name)


def _reference(q, k, v, causal, d_out):
    """Float64 output and, with ``d_out``, gradients of SDPA's math kernel, on the inputs' device."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    leaves = [_as_float64(x).requires_grad_(d_out is not None) for x in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH), torch.enable_grad():
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=bool(causal))
        if d_out is None:
            return [out.detach()]
        grads = torch.autograd.grad(out, leaves, _as_float64(d_out).to(out.device))
    return [out.detach(), *grads]


def _round_to_tf32(x):
    """float32 ``x`` rounded to TF32's 10 mantissa bits (to nearest, ties away from zero)."""
    import torch

    dropped = 23 - TF32_MANTISSA_BITS
    bits = x.contiguous().view(torch.int32)
    return ((bits + (1 << (dropped - 1))) & ~((1 << dropped) - 1)).view(torch.float32)


def rounding_model(q, k, v, causal, d_out=None, tf32=False):
    """The output (and gradients) of attention with the roundings a correct kernel may make.

    The matrix form, computed in float32 (float64 for float64 inputs), rounded to the
    inputs' dtype wherever attnlib's naive ``torch`` path stores a value in it: the
    scaled queries, the scores, the weights before the product with V, the output, and
    backward dP, dS (after the softmax's backward, with FlashAttention's
    ``rowsum(dO * O)`` from the rounded output) and the gradients. Fused kernels keep
    the scores in float32 and round at a subset of these places. With ``tf32`` the
    operands of float32 products are rounded to TF32, as the tensor cores do.
    ``q``, ``k``, ``v`` (and ``d_out``): (B, H, T, d), torch or NumPy; no mask but
    ``causal`` (top-left). Returns float64 tensors: ``[out]`` or ``[out, dq, dk, dv]``.
    """
    import torch

    dtype = _torch_dtype(q)
    work = torch.float64 if dtype == torch.float64 else torch.float32

    def stored(x):  # a value the naive path keeps in the inputs' dtype
        return x.to(dtype).to(work)

    def operand(x):  # an operand of a product, as the hardware reads it
        return _round_to_tf32(x) if tf32 and dtype == torch.float32 else x

    def product(a, b):
        return operand(a) @ operand(b)

    q, k, v = (_as_float64(x).to(work) for x in (q, k, v))
    scale = 1.0 / float(np.sqrt(q.shape[-1]))
    q_scaled = stored(q * scale)
    scores = stored(product(q_scaled, k.transpose(-2, -1)))  # (B, H, T_q, d) @ (B, H, d, T_k)
    if causal:
        t_q, t_k = scores.shape[-2:]
        hidden = torch.ones(t_q, t_k, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    weights_stored = stored(weights)
    out = stored(product(weights_stored, v))  # (B, H, T_q, T_k) @ (B, H, T_k, d)
    if d_out is None:
        return [out.double()]
    d_out = _as_float64(d_out).to(device=out.device, dtype=work)
    d_v = stored(product(weights_stored.transpose(-2, -1), d_out))
    d_weights = stored(product(d_out, v.transpose(-2, -1)))
    row_dot = (d_out * out).sum(-1, keepdim=True)  # rowsum(dO * O) = sum_j P_ij dP_ij
    d_scores = stored(weights * (d_weights - row_dot))
    d_q = stored(stored(product(d_scores, k)) * scale)
    d_k = stored(product(d_scores.transpose(-2, -1), q_scaled))
    return [x.double() for x in (out, d_q, d_k, d_v)]


def relative_error(got, expected):
    """``max |got - expected| / max(1, max |expected|)`` over pairs of tensors (NumPy or torch)."""
    worst = 0.0
    for g, want in zip(got, expected):
        error = float((_as_float64(g).to(want.device) - want).abs().max())
        worst = max(worst, error / max(1.0, float(want.abs().max())))
    return worst


def check_tolerance(q, k, v, causal, d_out=None, tf32=False, expected=None):
    """The largest error a kernel may show on these inputs: ``(tolerance, model_error)``.

    ``model_error`` is :func:`relative_error` of :func:`rounding_model` against
    ``expected`` (SDPA's math kernel in float64, computed here when not given); the
    tolerance is :data:`CHECK_MARGIN` times the larger of it and ``u * sqrt(T_k + d)``,
    the unit roundoff of the model's working precision times the usual growth of a
    rounding error over a sum of that many terms (the floor that matters for float64,
    whose model rounds nothing), capped at the fixed :data:`CHECK_TOLERANCE`.
    """
    import torch

    if expected is None:
        expected = _reference(q, k, v, causal, d_out)
    model_error = relative_error(rounding_model(q, k, v, causal, d_out, tf32), expected)
    dtype = _torch_dtype(q)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    floor = torch.finfo(work).eps / 2 * float(np.sqrt(k.shape[-2] + q.shape[-1]))
    if tf32 and dtype == torch.float32:
        ceiling = TF32_TOLERANCE
    else:
        ceiling = CHECK_TOLERANCE[str(dtype).removeprefix("torch.")]
    return min(ceiling, CHECK_MARGIN * max(model_error, floor)), model_error


def check_against_reference(kernel, q, k, v, causal, direction="fwd", tf32=False):
    """``(error, tolerance)`` of the kernel against SDPA's math kernel in float64, on one (batch, head).

    The kernel runs on the first (batch, head) of the inputs (so the check costs
    1 / (B * H) of a timed call); the forward output is compared, and for "bwd" and
    "fwd+bwd" the gradients of q, k and v too. ``error`` is :func:`relative_error`,
    ``tolerance`` :func:`check_tolerance` on the same slice: the kernel passes when
    ``error <= tolerance``.
    """
    qs, ks, vs = (x[:1, :1].copy() if isinstance(x, np.ndarray) else x[:1, :1].contiguous() for x in (q, k, v))
    with pinned(kernel):
        outputs = [make_call(kernel, qs, ks, vs, causal)()]
        d_out = None
        if direction != "fwd":
            d_out = upstream_gradient(outputs[0])
            outputs += list(_gradients(kernel, qs, ks, vs, causal, d_out))
    expected = _reference(qs, ks, vs, causal, d_out)
    tolerance, _ = check_tolerance(qs, ks, vs, causal, d_out, tf32, expected=expected)
    return relative_error(outputs, expected), tolerance


def _gradients(kernel, q, k, v, causal, d_out):
    """``(dq, dk, dv)`` of ``kernel`` (its backward function, or torch autograd through it)."""
    from ..backward import backward_function

    name = backend_of(kernel)
    scale = 1.0 / float(np.sqrt(q.shape[-1]))
    causal = "top-left" if causal else None
    try:
        backward, kind = backward_function(name)
    except ValueError:
        raise NotImplementedError(f"backend {name!r} has no backward pass") from None
    if kind == "numpy":
        return backward(q, k, v, d_out, None, causal, scale)
    import torch

    leaves = tuple(x.detach().requires_grad_() for x in (q, k, v))
    with torch.enable_grad():
        out = backend_module(name).forward(*leaves, None, causal, scale)
        return torch.autograd.grad(out, leaves, d_out)


def tiles_used(kernel, direction):
    """For a Triton kernel: ``"fwd 128x64 w4 s3"`` and the backward kernels' tiles of its last launch."""
    if not kernel.startswith("triton"):
        return None
    from ..backends import triton_flash

    launched = triton_flash.LAST_TILES
    names = ["fwd"] if direction == "fwd" or kernel == "triton-simple" else ["fwd", "dkdv", "dq"]
    if kernel == "triton-simple":
        launched = __import__("attnlib.backends.triton_simple", fromlist=["LAST_TILES"]).LAST_TILES
    return "; ".join(f"{name} {launched[name]}" for name in names if name in launched) or None
