"""Grouped-query attention: H query heads share H_kv key/value heads.

Multi-head attention gives every query head its own key and value head. During
decoding the keys and values are cached, and that cache is what a step reads
from memory; sharing them shrinks it. With H query heads and H_kv key/value
heads (H divisible by H_kv), query head h uses key/value head ``h // G``, where
``G = H / H_kv`` query heads form one group (Ainslie et al. 2023, "GQA"). H_kv = 1
is multi-query attention (Shazeer 2019, "MQA"); H_kv = H is ordinary multi-head
attention. This is the ``enable_gqa=True`` of PyTorch's
``scaled_dot_product_attention``: the heads are dimension -3.

The result equals multi-head attention with each key/value head repeated G times
(:func:`repeat_kv`), but nothing is copied: :func:`group_heads` views the queries
as (..., H_kv, G, T_q, d) and the keys as (..., H_kv, 1, T_k, d), and
broadcasting lets the G query heads of a group read the same key head. Every
backend already broadcasts its leading dimensions, the tiled and Triton ones
through stride-0 views.
"""

import numpy as np

from .arrays import is_tensor
from .errors import MaskError, ShapeError


def _shape(x):
    return tuple(int(n) for n in x.shape)


def repeat_kv(x, n_rep):
    """(..., H_kv, T, d) -> (..., H_kv * n_rep, T, d), each head repeated n_rep times in a row.

    Head h of the result is head ``h // n_rep`` of ``x``, the order of
    ``torch.repeat_interleave(x, n_rep, dim=-3)``. This is the copy that
    grouped-query attention avoids; the tests and the book use it to check that
    the two agree.
    """
    if isinstance(n_rep, bool) or not isinstance(n_rep, (int, np.integer)) or n_rep < 1:
        raise ValueError(f"n_rep must be a positive integer, got {n_rep!r}")
    if x.ndim < 3:
        raise ShapeError(f"repeat_kv needs heads at dimension -3, (..., H_kv, T, d), got shape {_shape(x)}")
    if is_tensor(x):
        return x.repeat_interleave(int(n_rep), dim=-3)
    return np.repeat(x, int(n_rep), axis=-3)


def check_gqa_heads(q, k, v=None):
    """``(H, H_kv)``: the heads of q and of k (and v), checked for grouped-query attention.

    Raises a ShapeError naming the shapes when an input has no head dimension
    (rank < 3), when k and v have different numbers of heads, or when H is not a
    multiple of H_kv.
    """
    named = {"q": q, "k": k} if v is None else {"q": q, "k": k, "v": v}
    for name, x in named.items():
        if x.ndim < 3:
            raise ShapeError(f"enable_gqa=True reads the heads from dimension -3, (..., H, T, d), but "
                             f"{name} has shape {_shape(x)}")
    n_heads, n_kv_heads = int(q.shape[-3]), int(k.shape[-3])
    if v is not None and int(v.shape[-3]) != n_kv_heads:
        raise ShapeError(f"k and v must have the same number of heads for enable_gqa=True: k has "
                         f"H_kv={n_kv_heads} (shape {_shape(k)}), v has {int(v.shape[-3])} "
                         f"(shape {_shape(v)})")
    if n_heads % n_kv_heads:
        raise ShapeError(f"enable_gqa=True needs the query heads to be a multiple of the key/value heads: "
                         f"q has H={n_heads} (shape {_shape(q)}), k has H_kv={n_kv_heads} (shape {_shape(k)}), "
                         f"and {n_heads} is not divisible by {n_kv_heads}")
    return n_heads, n_kv_heads


def _split_heads_axis(x, n_kv_heads, group):
    """(..., H, rows, cols) -> (..., H_kv, G, rows, cols): query head h = kv head h // G, member h % G."""
    return x.reshape(*x.shape[:-3], n_kv_heads, group, *x.shape[-2:])


def _one_head_axis(x):
    """(..., H_kv, rows, cols) -> (..., H_kv, 1, rows, cols): one key head, broadcast over its group."""
    return x[..., None, :, :]


def group_mask(mask, n_heads, n_kv_heads, score_shape):
    """A mask for the scores (..., H, T_q, T_k), reshaped for the grouped scores (..., H_kv, G, T_q, T_k).

    A mask with a head dimension of H is split into (H_kv, G); one with a head
    dimension of 1, or with fewer than 3 dimensions, broadcasts as it is.
    """
    if mask is None:
        return None
    try:
        broadcast = tuple(np.broadcast_shapes(_shape(mask), score_shape))
    except ValueError:
        broadcast = None
    if broadcast != tuple(score_shape):
        raise MaskError(f"mask of shape {_shape(mask)} does not broadcast to the score shape "
                        f"{tuple(score_shape)} (batch..., H={n_heads}, T_q, T_k)")
    if mask.ndim < 3:
        return mask
    if int(mask.shape[-3]) == 1:
        return _one_head_axis(mask)
    return _split_heads_axis(mask, n_kv_heads, n_heads // n_kv_heads)


def group_heads(q, k, v, mask=None, d_out=None):
    """Views for grouped-query attention, and the shape to give the output back.

    Parameters
    ----------
    q : shape (..., H, T_q, d_k)
    k : shape (..., H_kv, T_k, d_k)
    v : shape (..., H_kv, T_k, d_v)
    mask : optional, broadcastable to (..., H, T_q, T_k)
    d_out : optional, shape (..., H, T_q, d_v) (the backward pass's upstream gradient)

    Returns
    -------
    q (..., H_kv, G, T_q, d_k), k (..., H_kv, 1, T_k, d_k), v (..., H_kv, 1, T_k, d_v),
    the mask and d_out grouped like q, and ``ungroup``, a function that turns an
    output (..., H_kv, G, T_q, d_v) back into (..., H, T_q, d_v). No input is
    copied: ordinary attention on these views, broadcasting over G, is
    grouped-query attention.
    """
    n_heads, n_kv_heads = check_gqa_heads(q, k, v)
    group = n_heads // n_kv_heads
    try:
        batch = np.broadcast_shapes(_shape(q)[:-3], _shape(k)[:-3], _shape(v)[:-3])
    except ValueError:
        raise ShapeError(f"the leading (batch) dimensions of q, k and v do not broadcast: q {_shape(q)}, "
                         f"k {_shape(k)}, v {_shape(v)}") from None
    score_shape = (*batch, n_heads, int(q.shape[-2]), int(k.shape[-2]))
    grouped_mask = group_mask(mask, n_heads, n_kv_heads, score_shape)
    grouped_d_out = None if d_out is None else _split_heads_axis(d_out, n_kv_heads, group)

    def ungroup(out):
        return out.reshape(*out.shape[:-4], n_heads, *out.shape[-2:])  # (..., H, T_q, d_v)

    return (_split_heads_axis(q, n_kv_heads, group), _one_head_axis(k), _one_head_axis(v),
            grouped_mask, grouped_d_out, ungroup)

