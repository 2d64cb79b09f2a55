"""The matrix form in NumPy: ``softmax(Q K^T * scale + mask) V``, all tokens at once."""

import numpy as np

from ..masks import causal_mask
from ..softmax import stable_softmax

ARRAY_KIND = "numpy"


def compute_dtype(dtype):
    """The dtype scores are computed in: float16 -> float32 (as fused kernels do), else ``dtype``."""
    return np.result_type(dtype, np.float32)


def masked_scores(q, k, mask, causal, scale):
    """Scaled scores with masked entries set to -inf, shape (..., T_q, T_k).

    The scale multiplies q before the product, and float16 is computed in
    float32, so a raw q . k too large for float16 cannot overflow on the way
    to a scaled score that fits.
    """
    dtype = compute_dtype(q.dtype)
    q_scaled = q.astype(dtype) * dtype.type(scale)  # (..., T_q, d_k)
    k_t = k.astype(dtype, copy=False).swapaxes(-2, -1)  # (..., d_k, T_k)
    scores = q_scaled @ k_t  # (..., T_q, d_k) @ (..., d_k, T_k) -> (..., T_q, T_k)
    if causal:
        scores = np.where(causal_mask(q.shape[-2], k.shape[-2], causal), scores, -np.inf)
    if mask is not None:
        if mask.dtype == np.bool_:
            scores = np.where(mask, scores, -np.inf)  # True = may attend
        else:
            scores = scores + mask  # additive: 0 keeps, -inf drops
    return scores


def forward(q, k, v, mask, causal, scale):
    weights = stable_softmax(masked_scores(q, k, mask, causal, scale), axis=-1)  # (..., T_q, T_k)
    out = weights @ v.astype(weights.dtype, copy=False)  # (..., T_q, T_k) @ (..., T_k, d_v) -> (..., T_q, d_v)
    return out.astype(q.dtype, copy=False)
