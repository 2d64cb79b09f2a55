"""Softmax along one axis, the numerically stable way.

``softmax(x) = exp(x - max(x)) / sum(exp(x - max(x)))``. Subtracting the row
maximum changes nothing mathematically (it cancels between numerator and
denominator) but keeps every ``exp`` at or below 1, so scores of 1e4 do not
overflow. Entries of -inf (masked keys) come out as exactly 0.
"""

import numpy as np

from .arrays import as_array, is_tensor, torch_module
from .errors import DTypeError, MaskError, NonFiniteError, ShapeError


def softmax(x, axis=-1):
    """Stable softmax of ``x`` along ``axis``.

    Parameters
    ----------
    x : array_like or torch.Tensor
        Scores. Finite values, or -inf for entries that must get zero weight.
        Lists and integer arrays are converted to float64.
    axis : int
        The axis that sums to 1 (the keys, ``-1``, for attention scores).

    Returns
    -------
    Same kind and shape as ``x``: non-negative, summing to 1 along ``axis``.

    Raises
    ------
    DTypeError
        If ``x`` is complex (softmax is defined on real scores).
    ShapeError
        If ``x`` is empty, or ``axis`` is not one of its axes.
    NonFiniteError
        If ``x`` holds NaN or +inf.
    MaskError
        If a whole slice along ``axis`` is -inf (there is nothing to normalise).
    """
    if is_tensor(x):
        _check_shape_and_dtype(tuple(x.shape), x.dtype, x.is_complex(), axis)
        return _softmax_torch(x, axis)
    x = as_array(x)
    _check_shape_and_dtype(x.shape, x.dtype, np.iscomplexobj(x), axis)
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    if np.isnan(x).any() or (x == np.inf).any():
        raise NonFiniteError(f"softmax input (shape {x.shape}) contains NaN or +inf")
    if np.isneginf(np.max(x, axis=axis)).any():
        raise MaskError(
            f"softmax input (shape {x.shape}) has a slice along axis {axis} that is all "
            "-inf, so no entry can take the weight"
        )
    return stable_softmax(x, axis)


def _check_shape_and_dtype(shape, dtype, is_complex, axis):
    if is_complex:
        raise DTypeError(
            f"softmax needs real scores, got complex dtype {dtype} with shape {shape}; "
            "take .real or abs() first"
        )
    ndim = len(shape)
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ShapeError(f"axis={axis!r} is not an axis of the softmax input of shape {shape}")
    if 0 in shape:
        raise ShapeError(
            f"softmax of an empty array (shape {shape}): there is no entry to give the weight to"
        )


def stable_softmax(x, axis=-1):
    """The softmax itself, without :func:`softmax`'s input checks (NumPy).

    The backends call this on scores they have already validated.
    """
    row_max = np.max(x, axis=axis, keepdims=True)
    exps = np.exp(x - row_max)  # every exponent <= 0, so every exp <= 1
    return exps / np.sum(exps, axis=axis, keepdims=True)


def _softmax_torch(x, axis):
    torch = torch_module()
    if not x.is_floating_point():
        x = x.to(torch.float64)
    if bool((torch.isnan(x) | (x == float("inf"))).any()):
        raise NonFiniteError(f"softmax input (shape {tuple(x.shape)}) contains NaN or +inf")
    row_max = torch.amax(x, dim=axis, keepdim=True)
    if bool(torch.isneginf(row_max).any()):
        raise MaskError(
            f"softmax input (shape {tuple(x.shape)}) has a slice along axis {axis} that "
            "is all -inf, so no entry can take the weight"
        )
    exps = torch.exp(x - row_max)
    return exps / exps.sum(dim=axis, keepdim=True)
