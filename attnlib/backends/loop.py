"""Attention token by token: one query at a time, exactly as it is derived by hand.

:func:`attend_one_query` is the whole idea: score every key, turn the scores
into weights with a softmax, mix the values. :func:`forward` only loops it over
the queries (and the batch), after turning the causal and user masks into one
additive bias row per query: 0 keeps a key, -inf drops it. Slow (a Python loop
over queries), and meant to be read, not run at large T.
"""

import numpy as np

from ..masks import causal_offset
from ..softmax import stable_softmax
from .numpy_matrix import compute_dtype

ARRAY_KIND = "numpy"


def attend_one_query(q_t, k, v, scale, bias_t=0.0):
    """The output of one query: ``softmax(k @ q_t * scale + bias_t) @ v``.

    ``q_t`` is (d_k,), ``k`` (T_k, d_k), ``v`` (T_k, d_v); ``bias_t`` is 0 for a key
    the query may attend to and -inf for a masked one. Returns (d_v,).
    """
    scores_t = (k @ q_t) * scale + bias_t  # (T_k, d_k) @ (d_k,) -> (T_k,): one score per key
    alpha_t = stable_softmax(scores_t)  # (T_k,): weights in [0, 1] that sum to 1
    return alpha_t @ v  # sum over j of alpha_tj * v_j: (T_k,) @ (T_k, d_v) -> (d_v,)


def bias_row(t, t_k, mask_row, causal, offset, dtype):
    """Query t's additive bias over the keys: 0 keeps, -inf drops; a float mask is added."""
    bias = np.zeros(t_k, dtype=dtype)
    if causal:
        bias[max(t + offset + 1, 0):] = -np.inf  # keys after t (+ offset) are in the future
    if mask_row is not None:
        bias = np.where(mask_row, bias, -np.inf) if mask_row.dtype == np.bool_ else bias + mask_row
    return bias


def forward(q, k, v, mask, causal, scale):
    batch_shape = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    t_q, t_k = q.shape[-2], k.shape[-2]
    offset = causal_offset(t_q, t_k, causal) if causal else 0
    out_dtype, dtype = q.dtype, compute_dtype(q.dtype)  # float16 is computed in float32
    q, k, v = (np.broadcast_to(x.astype(dtype, copy=False), (*batch_shape, *x.shape[-2:])) for x in (q, k, v))
    if mask is not None:
        mask = np.broadcast_to(mask, (*batch_shape, t_q, t_k))
    output = np.empty((*batch_shape, t_q, v.shape[-1]), dtype=dtype)
    for b in np.ndindex(*batch_shape):
        for t in range(t_q):
            bias_t = bias_row(t, t_k, None if mask is None else mask[b][t], causal, offset, dtype)
            output[b][t] = attend_one_query(q[b][t], k[b], v[b], scale, bias_t)
    return output.astype(out_dtype, copy=False)
