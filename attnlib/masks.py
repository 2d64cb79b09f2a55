"""Masks: which keys each query may attend to.

attnlib's convention is the one of ``torch.nn.functional.scaled_dot_product_attention``:
a boolean mask is True where query i *may attend* to key j. (``torch.nn.MultiheadAttention``
uses the opposite: True there means "ignore".) An additive float mask holds 0
for kept keys and -inf for dropped ones.
"""

import numpy as np

from .arrays import is_tensor, torch_module


CAUSAL_ALIGNMENTS = ("top-left", "bottom-right")


def causal_alignment(causal):
    """Normalise the ``causal`` argument: None (no causal mask), "top-left" or "bottom-right".

    ``False``/``None`` mean no causal mask; ``True`` means "top-left", the alignment of
    PyTorch's ``is_causal=True``; "bottom-right" is flash_attn's, where the last query lines
    up with the last key (what decoding with a KV cache needs). Anything else, the string
    "False" included, raises rather than being read as true.
    """
    if causal is None or isinstance(causal, (bool, np.bool_)):
        return "top-left" if causal else None
    if isinstance(causal, str) and causal in CAUSAL_ALIGNMENTS:
        return causal
    raise ValueError(
        f"causal must be True, False, None, 'top-left' or 'bottom-right', got {causal!r}"
    )


def causal_offset(t_q, t_k, alignment):
    """Diagonal offset of a causal mask: query i may attend key j iff ``j <= i + offset``.

    0 for "top-left" (or True); ``t_k - t_q`` for "bottom-right", so the last query
    sees every key.
    """
    alignment = causal_alignment(alignment)
    if alignment is None:
        raise ValueError("causal_offset needs an alignment, 'top-left' or 'bottom-right', got none")
    return 0 if alignment == "top-left" else int(t_k) - int(t_q)


def causal_mask(T, T_k=None, alignment="top-left"):
    """Boolean (T, T_k) mask, True where query i may attend to key j, i.e. ``j <= i + offset``.

    A decoder (GPT) uses it so that no token sees the tokens after it; an
    encoder (BERT) uses no causal mask. ``T_k`` defaults to ``T``, and then both
    alignments give the lower triangle. For T_k != T, "top-left" (PyTorch's
    ``is_causal=True``) lets query i see keys 0..i, and "bottom-right"
    (flash_attn's) lines the last query up with the last key: query i sees keys
    0..i + T_k - T.
    """
    T_k = T if T_k is None else T_k
    for name, value in (("T", T), ("T_k", T_k)):
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    offset = causal_offset(T, T_k, alignment)
    return np.tri(int(T), int(T_k), k=offset, dtype=bool)  # (T, T_k), on and below diagonal `offset`


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
