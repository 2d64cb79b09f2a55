"""Attention token by token: one query at a time, exactly as it is derived by hand.

For query t: score every key, ``s_tj = q_t . k_j * scale``; turn the scores
into weights, ``alpha_t = softmax(s_t)``; mix the values,
``output_t = sum_j alpha_tj v_j``. Slow (a Python loop over queries), and
meant to be read, not run at large T.
"""

import numpy as np

from ..softmax import stable_softmax

ARRAY_KIND = "numpy"


def forward(q, k, v, mask, causal, scale):
    batch_shape = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    t_q, t_k = q.shape[-2], k.shape[-2]
    q = np.broadcast_to(q, (*batch_shape, *q.shape[-2:]))
    k = np.broadcast_to(k, (*batch_shape, *k.shape[-2:]))
    v = np.broadcast_to(v, (*batch_shape, *v.shape[-2:]))
    if mask is not None:
        mask = np.broadcast_to(mask, (*batch_shape, t_q, t_k))
    output = np.empty((*batch_shape, t_q, v.shape[-1]), dtype=q.dtype)
    for b in np.ndindex(*batch_shape):
        for t in range(t_q):
            scores_t = (k[b] @ q[b][t]) * scale  # (T_k, d_k) @ (d_k,) -> (T_k,)
            if causal:
                scores_t[t + 1 :] = -np.inf  # keys after t are in the future
            if mask is not None:
                row = mask[b][t]
                scores_t = np.where(row, scores_t, -np.inf) if row.dtype == np.bool_ else scores_t + row
            alpha_t = stable_softmax(scores_t)  # (T_k,), sums to 1
            output[b][t] = alpha_t @ v[b]  # sum_j alpha_tj v_j: (T_k,) @ (T_k, d_v) -> (d_v,)
    return output
