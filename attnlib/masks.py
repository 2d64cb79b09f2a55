"""Masks: which keys each query may attend to.

attnlib's convention is the one of ``torch.nn.functional.scaled_dot_product_attention``:
a boolean mask is True where query i *may attend* to key j. (``torch.nn.MultiheadAttention``
uses the opposite: True there means "ignore".) An additive float mask holds 0
for kept keys and -inf for dropped ones.
"""

import numpy as np

from .arrays import is_tensor, torch_module


def causal_mask(T, T_k=None):
    """Boolean (T, T_k) mask, True where query i may attend to key j, i.e. j <= i.

    A decoder (GPT) uses it so that no token sees the tokens after it; an
    encoder (BERT) uses no mask. ``T_k`` defaults to ``T``. For T_k != T the
    mask is aligned at the top-left, as ``is_causal=True`` is in PyTorch.
    """
    T_k = T if T_k is None else T_k
    for name, value in (("T", T), ("T_k", T_k)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return np.tri(int(T), int(T_k), dtype=bool)  # (T, T_k), lower triangle incl. diagonal


def to_additive(mask, dtype=None):
    """Boolean "may attend" mask -> float mask of 0 (keep) and -inf (drop).

    ``dtype`` defaults to float64 for NumPy masks and float32 for torch masks
    (on the mask's device); pass the scores' dtype when an API insists on it.
    """
    if is_tensor(mask):
        torch = torch_module()
        zeros = torch.zeros(mask.shape, dtype=dtype or torch.float32, device=mask.device)
        return zeros.masked_fill(~mask, float("-inf"))
    return np.where(mask, 0.0, -np.inf).astype(dtype or np.float64)


def to_ignore_mask(mask):
    """attnlib/SDPA "may attend" mask -> ``nn.MultiheadAttention``'s "ignore" mask."""
    return ~mask
