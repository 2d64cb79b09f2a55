"""The matrix form in NumPy: ``softmax(Q K^T * scale + mask) V``, all tokens at once."""

import numpy as np

from ..masks import causal_mask
from ..softmax import stable_softmax

ARRAY_KIND = "numpy"


def masked_scores(q, k, mask, causal, scale):
    """Scaled scores with masked entries set to -inf, shape (..., T_q, T_k)."""
    scores = (q @ k.swapaxes(-2, -1)) * scale  # (..., T_q, d_k) @ (..., d_k, T_k) -> (..., T_q, T_k)
    if causal:
        scores = np.where(causal_mask(q.shape[-2], k.shape[-2]), scores, -np.inf)
    if mask is not None:
        if mask.dtype == np.bool_:
            scores = np.where(mask, scores, -np.inf)  # True = may attend
        else:
            scores = scores + mask  # additive: 0 keeps, -inf drops
    return scores.astype(q.dtype, copy=False)


def forward(q, k, v, mask, causal, scale):
    weights = stable_softmax(masked_scores(q, k, mask, causal, scale), axis=-1)  # (..., T_q, T_k)
    return weights @ v  # (..., T_q, T_k) @ (..., T_k, d_v) -> (..., T_q, d_v)
