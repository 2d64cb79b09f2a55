"""The backward pass of attention: the gradients of a loss with respect to q, k and v.

Given ``d_out``, the gradient of some loss with respect to the output of
:func:`attnlib.attention`, :func:`attention_backward` returns ``(dq, dk, dv)``.
With ``S = scale * Q K^T``, ``P = softmax(S)`` and ``O = P V`` (rows are tokens):

    dV = P^T dO
    dP = dO V^T
    dS = P * (dP - rowsum(dO * O))
    dQ = scale * dS K
    dK = scale * dS^T Q

Backends that have a backward pass:

- ``numpy``: the matrix form (:mod:`attnlib.backends.numpy_backward`).
- ``tiled``: FlashAttention-2's backward in NumPy, recomputing the weights block
  by block from the forward's log-sum-exp (:mod:`attnlib.backends.tiled_backward`).
- ``torch``: the matrix form in torch ops (:mod:`attnlib.backends.torch_backward`).
- ``sdpa``: PyTorch's autograd through its fused kernel.
- ``triton``: FlashAttention-2 backward kernels (:mod:`attnlib.backends.triton_backward`);
  ``attention(..., backend="triton")`` on tensors that require grad uses them too.
"""

import importlib

import numpy as np

from .arrays import array_kind, as_arrays, is_tensor, torch_module
from .attention import (_to_backend_kind, backend_module, backends, check_enable_gqa, check_mod_arguments,
                        gqa_group, quiet_overflow, uses_mods, window_arguments)
from .errors import DTypeError, NonFiniteError, ShapeError
from .gqa import check_gqa_heads, group_heads
from .masks import causal_alignment, check_window
from .validation import (
    all_finite,
    check_backend,
    check_finite,
    check_float,
    check_mask,
    check_qkv,
    check_scale,
    check_window_rows,
    checking_values,
    dtype_name,
)

_BACKWARD = {  # backend -> (module, function): backward(q, k, v, d_out, mask, causal, scale)
    "numpy": ("attnlib.backends.numpy_backward", "backward"),
    "tiled": ("attnlib.backends.tiled_backward", "backward"),
    "torch": ("attnlib.backends.torch_backward", "backward"),
    "sdpa": ("attnlib.backends.torch_backward", "sdpa_backward"),
    "triton": ("attnlib.backends.triton_backward", "backward"),
}


def backward_backends():
    """The backends that can compute gradients on this machine."""
    return [name for name in backends() if name in _BACKWARD]


def backward_function(name):
    """``(function, array kind)`` of backend ``name``'s backward pass; a clear error if it has none."""
    backend_module(name)  # raises for an unknown or unavailable backend, listing the valid ones
    if name not in _BACKWARD:
        raise ValueError(f"backend {name!r} has no backward pass; backends with one here: "
                         f"{backward_backends()}")
    module_name, function_name = _BACKWARD[name]
    module = importlib.import_module(module_name)
    return getattr(module, function_name), module.ARRAY_KIND


def check_d_out(d_out, q, shapes):
    """``d_out`` must be a finite float array of q's kind and dtype, shaped like the output."""
    kind = array_kind(q=q, d_out=d_out)  # MixedArrayTypesError for NumPy with torch
    check_float("d_out", d_out, kind)
    if d_out.dtype != q.dtype:
        raise DTypeError(f"d_out is {dtype_name(d_out.dtype)} but q, k and v are {dtype_name(q.dtype)}")
    expected = (*shapes.batch_shape, shapes.t_q, shapes.d_v)
    if tuple(d_out.shape) != expected:
        raise ShapeError(
            f"d_out has shape {tuple(int(n) for n in d_out.shape)} but the output of attention has "
            f"shape {expected} (batch..., T_q={shapes.t_q}, d_v={shapes.d_v}): d_out holds one "
            "gradient per output entry"
        )
    check_finite("d_out", d_out, kind)


def check_gqa_d_out(q, k, v, d_out):
    """With ``enable_gqa``, ``d_out`` must have the output's shape (..., H, T_q, d_v) before grouping."""
    n_heads, _ = check_gqa_heads(q, k, v)
    array_kind(q=q, d_out=d_out)  # MixedArrayTypesError for NumPy with torch
    try:
        batch = np.broadcast_shapes(*(tuple(x.shape[:-3]) for x in (q, k, v)))
    except ValueError:
        return  # group_heads names the shapes that do not broadcast
    expected = (*batch, n_heads, int(q.shape[-2]), int(v.shape[-1]))
    if tuple(int(n) for n in d_out.shape) != expected:
        raise ShapeError(
            f"d_out has shape {tuple(int(n) for n in d_out.shape)} but the output of attention with "
            f"enable_gqa=True has shape {expected} (batch..., H={n_heads}, T_q, d_v): d_out holds one "
            "gradient per output entry"
        )


def sum_to_shape(grad, shape):
    """Sum ``grad`` over the dimensions broadcasting added or stretched, back to ``shape``.

    An input shared across the batch (k of shape (T_k, d_k) with q of shape
    (B, H, T_q, d_k)) gets the sum of its gradients over every batch entry.
    """
    extra = grad.ndim - len(shape)
    stretched = [extra + i for i, n in enumerate(shape) if n == 1 and grad.shape[extra + i] != 1]
    axes = (*range(extra), *stretched)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad.reshape(tuple(shape))


def attention_backward(q, k, v, d_out, *, mask=None, causal=False, scale=None, backend=None, window=None,
                       enable_gqa=False, score_mod=None, mask_mod=None, block_mask=None, empty_rows="raise"):
    """Gradients of attention: ``(dq, dk, dv)`` for the upstream gradient ``d_out``.

    Parameters
    ----------
    q, k, v, mask, causal, scale, window, enable_gqa, score_mod, mask_mod, block_mask, empty_rows
        As for :func:`attnlib.attention`, and checked the same way. A query row
        with no key sends no gradient under ``empty_rows="zero"``. With a
        score_mod, the ``numpy`` and ``tiled`` backward multiply by its derivative:
        the mod's own ``derivative`` (the gallery's have one), else torch.autograd
        on a float64 copy. With
        ``enable_gqa``, dk and dv sum the gradients of the query heads that share
        each key/value head. A window is applied as a mask on every backend.
    d_out : array or tensor, shape (..., T_q, d_v)
        The gradient of a loss with respect to ``attention(q, k, v, ...)``: the
        output's exact (broadcast) shape, and the dtype of q.
    backend : str, optional
        One of :func:`backward_backends`. Defaults to ``"numpy"`` for NumPy input and
        ``"torch"`` for tensors.

    Returns
    -------
    (dq, dk, dv)
        Same kind and dtype as the input, shaped like q, k and v. An input that was
        broadcast over batch dimensions gets its gradients summed over them.

    Raises
    ------
    The errors of :func:`attnlib.attention`, plus ShapeError and DTypeError for a
    ``d_out`` of the wrong shape or dtype, and NonFiniteError for a NaN or inf in it
    or for gradients too large for the dtype.
    """
    q, k, v, d_out, mask = as_arrays(q=q, k=k, v=v, d_out=d_out, mask=mask)
    causal = causal_alignment(causal)
    window = check_window(window, causal)
    score_mod, mask_mod, block_mask, zero = check_mod_arguments(score_mod, mask_mod, block_mask, empty_rows)
    original_shapes = group = None
    if check_enable_gqa(enable_gqa):  # as in attention: (..., H_kv, G, T, d) views, k and v with G = 1
        original_shapes = (q.shape, k.shape, v.shape)
        check_gqa_d_out(q, k, v, d_out)
        group = gqa_group(q, k, v)
        q, k, v, mask, d_out, _ = group_heads(q, k, v, mask, d_out=d_out)
    kind, shapes = check_qkv(q, k, v)
    check_d_out(d_out, q, shapes)
    mask = check_mask(mask, shapes, kind, causal=causal, dtype=q.dtype, rows=not zero)
    if not zero:
        check_window_rows(shapes, causal, window)
    scale = check_scale(scale, shapes.d_k)
    name = check_backend(backend) or ("torch" if kind == "torch" else "numpy")
    backward, backend_kind = backward_function(name)
    if kind == "torch":  # the gradients are computed, not recorded
        q, k, v, d_out = (x.detach() for x in (q, k, v, d_out))
    if uses_mods(score_mod, mask_mod, block_mask, zero):  # FlexAttention's mods, or no gradient from empty rows
        from .backends import flex

        with quiet_overflow(kind, backend_kind):
            grads = flex.backward(name, backward, backend_kind, q, k, v, d_out, mask, causal, window, scale,
                                  shapes, score_mod, mask_mod, block_mask, empty_rows, group)
    else:
        mask, _ = window_arguments(mask, shapes, kind, causal, window, q)
        arrays = _to_backend_kind([q, k, v, d_out, mask], kind, backend_kind, name)
        with quiet_overflow(kind, backend_kind):
            grads = backward(*arrays, causal, scale)
    result = []
    with quiet_overflow(kind, backend_kind):  # overflow is reported below, in words
        for grad, x in zip(grads, (q, k, v)):
            grad = sum_to_shape(grad, x.shape)
            if kind == "numpy" and is_tensor(grad):
                grad = grad.cpu().numpy()
            result.append(grad.to(q.dtype) if kind == "torch" else grad.astype(q.dtype, copy=False))
    _check_finite_grads(result, q.dtype, kind)
    if original_shapes is not None:  # back from the grouped views to the shapes of q, k and v
        result = [grad.reshape(tuple(shape)) for grad, shape in zip(result, original_shapes)]
    return tuple(result)


def _check_finite_grads(grads, dtype, kind):
    """Raise NonFiniteError when a gradient of finite, validated inputs holds NaN or inf."""
    if not checking_values():
        return
    for name, grad in zip(("dq", "dk", "dv"), grads):
        if not all_finite(grad, kind):
            raise NonFiniteError(
                f"attention_backward got finite inputs but {name} is not finite in "
                f"{dtype_name(dtype)}: the scores q . k * scale, or products with d_out, overflow "
                "that dtype; rescale the inputs or compute in a wider dtype"
            )
