"""Backward passes on torch tensors: the matrix form in explicit torch ops, and SDPA's autograd.

- ``backward`` (backend ``"torch"``): the five lines of
  :func:`attnlib.backends.numpy_backward.grads_from_weights`, on weights computed
  as the ``torch`` forward computes them (scores in at least float32).
- ``sdpa_backward`` (backend ``"sdpa"``): whatever PyTorch's autograd does through
  ``scaled_dot_product_attention``; attnlib writes no formula here.
"""

from .numpy_backward import grads_from_weights
from .torch_naive import masked_scores

ARRAY_KIND = "torch"


def backward(q, k, v, d_out, mask, causal, scale):
    """Gradients of attention on validated tensors, in at least float32; see numpy_backward."""
    import torch

    p = torch.softmax(masked_scores(q, k, mask, causal, scale), dim=-1)  # (..., T_q, T_k)
    q, k, v, d_out = (x.to(p.dtype) for x in (q, k, v, d_out))
    out = p @ v  # (..., T_q, T_k) @ (..., T_k, d_v) -> (..., T_q, d_v)
    return grads_from_weights(p, q, k, v, out, d_out, scale)


def sdpa_backward(q, k, v, d_out, mask, causal, scale):
    """Gradients from ``torch.autograd`` through the ``sdpa`` backend's forward."""
    import torch

    from .sdpa import forward

    with torch.enable_grad():
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        out = forward(q, k, v, mask, causal, scale)
        return torch.autograd.grad(out, (q, k, v), d_out)
