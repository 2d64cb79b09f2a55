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


def causal_mask(T, T_k=None, alignment="top-left", window=None):
    """Boolean (T, T_k) mask, True where query i may attend to key j, i.e. ``j <= i + offset``.

    A decoder (GPT) uses it so that no token sees the tokens after it; an
    encoder (BERT) uses no causal mask. ``T_k`` defaults to ``T``, and then both
    alignments give the lower triangle. For T_k != T, "top-left" (PyTorch's
    ``is_causal=True``) lets query i see keys 0..i, and "bottom-right"
    (flash_attn's) lines the last query up with the last key: query i sees keys
    0..i + T_k - T.

    ``window=W`` (a sliding window, as in Longformer and Mistral) also drops the
    keys more than W - 1 places before that last allowed key: query i sees
    ``i + offset - W < j <= i + offset``, at most W keys, a band W wide.
    """
    T_k = T if T_k is None else T_k
    for name, value in (("T", T), ("T_k", T_k)):
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    offset = causal_offset(T, T_k, alignment)
    keep = np.tri(int(T), int(T_k), k=offset, dtype=bool)  # (T, T_k), on and below diagonal `offset`
    if window is not None:
        window = check_window(window, alignment)
        keep &= ~np.tri(int(T), int(T_k), k=offset - window, dtype=bool)  # drop j <= i + offset - W
    return keep


def check_window(window, causal):
    """The sliding window W as an int >= 1, or None; a clear error for anything else.

    A window counts back from the last key a query may see, so it needs a causal
    alignment (``causal`` True, "top-left" or "bottom-right").
    """
    if window is None:
        return None
    if isinstance(window, (bool, np.bool_)) or not isinstance(window, (int, np.integer)):
        raise TypeError(f"window must be a positive int (the number of most recent keys a query "
                        f"sees) or None, got {window!r} of type {type(window).__name__}")
    if window < 1:
        raise ValueError(f"window must be at least 1 (each query sees at most `window` keys, itself "
                         f"included), got window={int(window)}")
    if causal_alignment(causal) is None:
        raise ValueError(f"window={int(window)} needs causal=True, 'top-left' or 'bottom-right', but causal "
                         "is off: a sliding window counts back from the last key a query may see, which "
                         "only a causal alignment defines")
    return int(window)


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


def with_window(mask, t_q, t_k, causal, window, like):
    """``mask`` with the sliding-window band folded in: what a backend without its own window applies.

    Parameters
    ----------
    mask : array or tensor or None
        A validated mask, broadcastable to (..., T_q, T_k): boolean (True = may
        attend) or additive float.
    t_q, t_k : int
    causal : "top-left" or "bottom-right"
    window : int
    like : array or tensor
        Decides the kind (NumPy or torch) and the device of the band.

    Returns
    -------
    The band ``causal_mask(t_q, t_k, causal, window)`` (T_q, T_k) when ``mask`` is None;
    else ``mask`` and the band together: ``mask & band`` for a boolean mask, -inf outside
    the band for a float one.
    """
    band = causal_mask(t_q, t_k, causal, window)  # (T_q, T_k)
    if is_tensor(like):
        band = torch_module().from_numpy(band).to(like.device)
        if mask is None:
            return band
        return mask & band if mask.dtype == torch_module().bool else mask.masked_fill(~band, float("-inf"))
    if mask is None:
        return band
    return mask & band if mask.dtype == np.bool_ else np.where(band, mask, -np.inf).astype(mask.dtype)
