"""Multi-head attention: split d_model into heads, attend per head, concatenate, project.

Head j uses columns ``j*d_head`` to ``(j+1)*d_head`` of the projected Q, K and V,
the layout ``torch.nn.MultiheadAttention`` uses, so the same weights give the
same answer there and here.
"""

import numpy as np

from .arrays import array_kind, as_arrays, is_tensor
from .attention import attention
from .errors import ShapeError
from .projections import project_qkv


def split_heads(x, n_heads):
    """(..., T, n_heads * d_head) -> (..., n_heads, T, d_head)."""
    *lead, T, width = x.shape
    if width % n_heads:
        raise ShapeError(f"width {width} of shape {tuple(x.shape)} is not divisible by n_heads={n_heads}")
    x = x.reshape(*lead, T, n_heads, width // n_heads)  # (..., T, H, d_head)
    return x.transpose(-3, -2) if is_tensor(x) else x.swapaxes(-3, -2)  # (..., H, T, d_head)


def merge_heads(x):
    """(..., n_heads, T, d_head) -> (..., T, n_heads * d_head), undoing :func:`split_heads`."""
    *lead, H, T, d_head = x.shape
    x = x.transpose(-3, -2) if is_tensor(x) else x.swapaxes(-3, -2)  # (..., T, H, d_head)
    return x.reshape(*lead, T, H * d_head)


def multi_head_attention(x, w_q, w_k, w_v, w_o, n_heads, *, causal=False, backend=None):
    """Multi-head self-attention.

    Parameters
    ----------
    x : array or tensor, shape (..., T, d_model)
    w_q, w_k : shape (d_model, H * d_k)
    w_v : shape (d_model, H * d_v)
    w_o : shape (H * d_v, d_out)
        The output projection applied to the concatenated heads.
    n_heads : int
        H. Each head sees ``d_k = w_q.shape[1] / H`` dimensions.
    causal, backend
        As for :func:`attnlib.attention`.

    Returns
    -------
    Same kind as ``x``, shape (..., T, d_out).
    """
    x, w_q, w_k, w_v, w_o = as_arrays(x=x, w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o)
    array_kind(x=x, w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o)
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive integer, got {n_heads!r}")
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v), ("w_o", w_o)):
        if w.ndim != 2:
            raise ShapeError(f"{name} must be a 2-D weight matrix, got shape {tuple(w.shape)}")
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        if w.shape[1] % n_heads:
            raise ShapeError(
                f"{name} has {w.shape[1]} output columns (shape {tuple(w.shape)}), "
                f"which n_heads={n_heads} does not divide"
            )
    if w_o.ndim != 2 or w_o.shape[0] != w_v.shape[1]:
        raise ShapeError(
            f"w_o must be (H * d_v, d_out) = ({w_v.shape[1]}, d_out) to follow w_v of shape "
            f"{tuple(w_v.shape)}, got w_o of shape {tuple(w_o.shape)}"
        )
    q, k, v = project_qkv(x, w_q, w_k, w_v)  # (..., T, H*d_k), (..., T, H*d_k), (..., T, H*d_v)
    q, k, v = (split_heads(t, n_heads) for t in (q, k, v))  # (..., H, T, d_head)
    heads = attention(q, k, v, causal=causal, backend=backend)  # (..., H, T, d_v)
    return merge_heads(heads) @ w_o  # (..., T, H*d_v) @ (H*d_v, d_out) -> (..., T, d_out)
