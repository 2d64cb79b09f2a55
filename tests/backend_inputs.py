"""Inputs for one backend: NumPy arrays for the NumPy backends, torch tensors for the others."""

import numpy as np
import torch

NUMPY_BACKENDS = ("numpy", "loop", "tiled")


def for_backend(backend, *arrays):
    """``arrays`` (NumPy) as the kind ``backend`` computes on; None stays None."""
    if backend in NUMPY_BACKENDS:
        return arrays
    return tuple(None if a is None else torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)


def as_numpy(x):
    """A result of either kind as a NumPy array."""
    return x if isinstance(x, np.ndarray) else x.detach().cpu().numpy()
