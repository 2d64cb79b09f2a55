"""The ``triton`` backend: the FlashAttention-2 kernels joined for autograd.

:func:`forward` runs the forward kernel (:mod:`.triton_flash`) alone when no
input requires grad. When q, k or v does, it runs through :class:`FlashAttention`,
a ``torch.autograd.Function`` that saves the output and the log-sum-exp and, on
``.backward()``, runs the backward kernels (:mod:`.triton_backward`). Imports go
one way: this file imports both kernel files, and neither imports it. A mask that
requires grad is refused before this point (``attnlib.attention``): the kernels
compute no gradient for it.
"""

import torch

from . import triton_backward, triton_flash

ARRAY_KIND = "torch"


class FlashAttention(torch.autograd.Function):
    """The forward kernel (:mod:`.triton_flash`) with the backward kernels (:mod:`.triton_backward`)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale, tile):
        batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        q4, k4, v4 = (triton_flash._as_4d(x, batch_shape) for x in (q, k, v))
        out, lse = triton_flash.forward_with_lse(q4, k4, v4, mask, causal, scale, batch_shape, tile)
        out = out.to(q.dtype)
        ctx.save_for_backward(q4, k4, v4, out, lse, mask)
        ctx.causal, ctx.scale, ctx.batch_shape = causal, scale, batch_shape
        ctx.shapes = (q.shape, k.shape, v.shape)
        return out.reshape(*batch_shape, q.shape[-2], v.shape[-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        q4, k4, v4, out, lse, mask = ctx.saved_tensors
        grads = triton_backward.grads_from_lse(q4, k4, v4, out, lse, d_out, mask, ctx.causal, ctx.scale,
                               ctx.batch_shape, need_dq=ctx.needs_input_grad[0])
        dq, dk, dv = triton_backward._to_input_shapes(grads, ctx.shapes, ctx.batch_shape, q4.dtype)
        return dq, dk, dv, None, None, None, None


def forward(q, k, v, mask, causal, scale, *, tile=None):
    """The backend entry point: :func:`.triton_flash.forward`, through autograd when needed.

    Parameters and result as for :func:`.triton_flash.forward`; if any of q, k and v
    requires grad (and grad mode is on), the result supports ``.backward()``.
    """
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        triton_flash._check_supported(q, k, v)
        return FlashAttention.apply(q, k, v, mask, causal, scale, tile)
    return triton_flash.forward(q, k, v, mask, causal, scale, tile=tile)
