"""NumPy or torch? The small amount of glue that lets one function take either.

attnlib never imports torch until a torch tensor (or a torch backend) shows up,
so the NumPy chapters start fast and run where torch is missing.
"""

import importlib
import sys

import numpy as np

from .errors import MixedArrayTypesError


def is_tensor(x):
    """True for a ``torch.Tensor``, checked without importing torch."""
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "device")


def array_kind(**named_arrays):
    """Return ``"numpy"`` or ``"torch"`` for the arrays given by keyword.

    ``None`` values are skipped (an absent mask). Mixing the two kinds raises
    :class:`MixedArrayTypesError`, naming which argument is which.
    """
    kinds = {}
    for name, value in named_arrays.items():
        if value is None:
            continue
        kinds[name] = "torch" if is_tensor(value) else "numpy"
    if len(set(kinds.values())) > 1:
        described = ", ".join(f"{name} is a {kind} array" for name, kind in kinds.items())
        raise MixedArrayTypesError(
            f"NumPy arrays and torch tensors cannot be mixed in one call ({described}); "
            "convert them all to one kind first"
        )
    return next(iter(kinds.values()), "numpy")


def torch_module():
    """Import torch on first use, with a clear message when it is missing."""
    loaded = sys.modules.get("torch")  # no import machinery once loaded (torch.compile traces this)
    if loaded is not None:
        return loaded
    try:
        return importlib.import_module("torch")
    except ImportError as exc:  # pragma: no cover - torch is a requirement
        raise ImportError("this part of attnlib needs PyTorch: pip install torch") from exc


def torch_available():
    """True when ``import torch`` works here."""
    try:
        torch_module()
    except ImportError:  # pragma: no cover - torch is a requirement
        return False
    return True


def as_array(x, name="x"):
    """The one rule for inputs across attnlib's public API.

    NumPy arrays and torch tensors pass through unchanged. A Python list, tuple
    or number becomes a NumPy array; since a list carries no dtype, whole
    numbers in it become float64 (``[[1, 0], [0, 1]]`` is a valid ``q``), and
    a list of bools stays boolean (a valid mask). Anything else (a string, a
    dict, None) raises a TypeError that names the argument, and so does a NumPy
    masked array: attention would ignore its ``.mask``, so it is refused rather
    than silently read as its data.
    """
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(
            f"{name} is a NumPy masked array (shape {x.shape}); attnlib does not read its .mask. To "
            f"drop keys, pass the plain array ({name}.filled(0) or np.ma.getdata({name})) and a boolean "
            "mask= (True = may attend), e.g. ~np.ma.getmaskarray(k).any(-1) for keys whose row is masked"
        )
    if is_tensor(x) or isinstance(x, np.ndarray):
        return x
    if isinstance(x, (list, tuple, int, float, np.number, np.bool_)) and not isinstance(x, str):
        try:
            arr = np.asarray(x)
        except ValueError as exc:  # ragged nested lists
            raise TypeError(f"{name} must be a rectangular nested list of numbers: {exc}") from None
        if arr.dtype.kind in "iu":
            return arr.astype(np.float64)
        if arr.dtype.kind in "fcb":
            return arr
        raise TypeError(f"{name} must hold numbers, got a list of {arr.dtype} (shape {arr.shape})")
    raise TypeError(
        f"{name} must be a NumPy array, a torch tensor or a nested list of numbers, "
        f"got {type(x).__name__}"
    )


def as_arrays(**named):
    """:func:`as_array` on each keyword argument, in order; an absent ``mask`` (None) stays None."""
    return [None if x is None and name == "mask" else as_array(x, name) for name, x in named.items()]
