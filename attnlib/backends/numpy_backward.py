"""The backward pass of the matrix form, in NumPy: every gradient from the whole weight matrix.

Forward, rows are tokens: ``S = scale * Q K^T``, ``P = softmax(S)`` row by row,
``O = P V``. Given ``dO``, the gradient of a loss with respect to ``O``:

    dV = P^T dO
    dP = dO V^T
    dS = P * (dP - rowsum(dO * O))      (* is element-wise)
    dQ = scale * dS K
    dK = scale * dS^T Q

``rowsum(dO * O)`` is what the softmax's Jacobian reduces to: for one row,
``p^T dp = sum_j p_j (dO_i . v_j) = dO_i . o_i``. :func:`grads_from_weights`
is these five lines; it works on NumPy arrays and torch tensors alike, and the
``torch`` backward (:mod:`attnlib.backends.torch_backward`) uses it too.

Memory: P is (T_q, T_k), and dP and dS are too, as autograd's would be.
:mod:`attnlib.backends.tiled_backward` computes the same gradients block by
block without them.
"""

from ..softmax import stable_softmax
from .numpy_matrix import compute_dtype, masked_scores

ARRAY_KIND = "numpy"


def grads_from_weights(p, q, k, v, out, d_out, scale):
    """``(dq, dk, dv)`` from the attention weights ``p`` and the output ``out = p @ v``.

    Shapes: p (..., T_q, T_k); q (..., T_q, d_k); k (..., T_k, d_k);
    v (..., T_k, d_v); out and d_out (..., T_q, d_v). NumPy or torch.
    """
    d_v = p.swapaxes(-2, -1) @ d_out  # (T_k, T_q) @ (T_q, d_v) -> (T_k, d_v)
    d_p = d_out @ v.swapaxes(-2, -1)  # (T_q, d_v) @ (d_v, T_k) -> (T_q, T_k)
    delta = (d_out * out).sum(axis=-1, keepdims=True)  # (T_q, 1): rowsum(dO * O)
    d_s = p * (d_p - delta)  # (T_q, T_k), the gradient of the scaled scores
    d_q = scale * (d_s @ k)  # (T_q, T_k) @ (T_k, d_k) -> (T_q, d_k)
    d_k = scale * (d_s.swapaxes(-2, -1) @ q)  # (T_k, T_q) @ (T_q, d_k) -> (T_k, d_k)
    return d_q, d_k, d_v


def backward(q, k, v, d_out, mask, causal, scale):
    """Gradients of attention on validated NumPy inputs; the backward entry point.

    Returns ``(dq, dk, dv)`` with the broadcast batch shape (``attnlib.attention_backward``
    sums them back to the shapes of q, k and v), in the compute dtype (float16 -> float32).
    """
    dtype = compute_dtype(q.dtype)
    q, k, v, d_out = (x.astype(dtype, copy=False) for x in (q, k, v, d_out))
    p = stable_softmax(masked_scores(q, k, mask, causal, scale), axis=-1)  # (..., T_q, T_k)
    out = p @ v  # (..., T_q, T_k) @ (..., T_k, d_v) -> (..., T_q, d_v)
    return grads_from_weights(p, q, k, v, out, d_out, scale)
