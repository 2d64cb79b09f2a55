"""The errors attnlib raises on bad input.

Each one subclasses ``ValueError`` or ``TypeError``, so ``except ValueError``
keeps working for callers who do not care which check failed, and each message
names the argument and the shapes involved.
"""


class ShapeError(ValueError):
    """Shapes that do not fit together: ranks, d_k, lengths, broadcasting."""


class MaskError(ValueError):
    """A mask of the wrong shape or dtype, or one that leaves a query no key."""


class NonFiniteError(ValueError):
    """NaN or inf in an input, where attention would silently return NaN."""


class DTypeError(TypeError):
    """An integer, boolean or complex array where a float one is needed."""


class MixedArrayTypesError(TypeError):
    """NumPy arrays and torch tensors mixed in one call."""


class DeviceError(TypeError):
    """A tensor on the ``meta`` device: it has a shape and a dtype but no values to compute with."""


class SequenceTooLongError(ValueError):
    """A sequence longer than the ``max_seq_len`` a module was built for."""


class CacheFullError(ValueError):
    """An update that would take a :class:`attnlib.KVCache` past its ``max_len``."""
