"""The score matrix ``S = Q @ K^T``: every query dotted with every key."""

import numpy as np

from .arrays import as_arrays, is_tensor
from .validation import check_qkv


def score_matrix(q, k):
    """Raw (unscaled) attention scores.

    Parameters
    ----------
    q : array, shape (..., T_q, d_k)
    k : array, shape (..., T_k, d_k)

    Returns
    -------
    array, shape (..., T_q, T_k)
        Entry ``[i, j]`` is ``q[i] . k[j]``, how well query i matches key j.
    """
    from .attention import check_scores_fit

    q, k = as_arrays(q=q, k=k)
    kind, _ = check_qkv(q, k)
    k_t = k.transpose(-2, -1) if is_tensor(k) else k.swapaxes(-2, -1)
    with np.errstate(over="ignore"):  # overflow is reported below, in words
        scores = q @ k_t  # (..., T_q, d_k) @ (..., d_k, T_k) -> (..., T_q, T_k)
    check_scores_fit("score_matrix", scores, q.dtype, kind)
    return scores
