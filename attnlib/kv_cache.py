"""The KV cache: the keys and values a decoder has already computed, kept for the next tokens.

A decoder generates one token at a time. Without a cache, every new token runs
the model over the whole sequence again, recomputing every earlier key and
value, although they cannot change: a causal mask keeps each position from
seeing the ones after it. With a cache, each step computes the keys and values
of the new position only, appends them, and lets the one new query attend over
everything cached (``causal="bottom-right"``, which lines the last query up with
the last key).

- :class:`KVCache` holds one attention layer's keys and values, NumPy or torch.
  Optionally it refuses to grow past ``max_len``, or, for a model with a
  sliding window of W keys, keeps only the last W positions.
- :func:`kv_cache_bytes` is the arithmetic of its size: 2 (keys and values) x
  layers x key/value heads x head width x bytes per number, per token.
"""

import numpy as np

from .arrays import array_kind, as_array, is_tensor, torch_module
from .errors import CacheFullError, DTypeError, ShapeError  # noqa: F401 (CacheFullError: raised here)


def _positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        expected = "a positive int or None" if allow_none else "a positive int"
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value)


def itemsize(dtype):
    """Bytes per number of ``dtype``: a name ("float16", "bfloat16"), a NumPy dtype or a torch dtype."""
    if is_tensor_dtype(dtype):
        if not dtype.is_floating_point:
            raise DTypeError(f"dtype must be a floating-point type (the keys and values are floats), "
                             f"got {dtype!r}")
        return dtype.itemsize
    if dtype is None:
        raise DTypeError("dtype must name a floating-point type such as 'float16' or torch.bfloat16, "
                         "got None")
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
        return 2
    try:
        numpy_dtype = np.dtype({"fp16": "float16", "fp32": "float32", "fp64": "float64"}.get(dtype, dtype))
    except TypeError:
        raise DTypeError(f"dtype must name a floating-point type such as 'float16' or torch.bfloat16, "
                         f"got {dtype!r}") from None
    if numpy_dtype.kind != "f":
        raise DTypeError(f"dtype must be a floating-point type (the keys and values are floats), got {dtype!r}")
    return numpy_dtype.itemsize


def is_tensor_dtype(dtype):
    return type(dtype).__module__.split(".")[0] == "torch"


def kv_cache_bytes(n_layers, n_kv_heads, head_dim, dtype, *, seq_len=1, batch=1):
    """Bytes of the keys and values a decoder caches: ``2 * L * H_kv * d * itemsize * T * B``.

    Parameters
    ----------
    n_layers : int
        Attention layers L; each caches its own keys and values.
    n_kv_heads : int
        Key/value heads H_kv per layer: the number of heads for multi-head
        attention, fewer with grouped-query attention, 1 with multi-query.
    head_dim : int
        Width d of one head's keys (and values).
    dtype : str, NumPy dtype or torch dtype
        What the cache stores: "float16" and "bfloat16" take 2 bytes a number.
    seq_len : int
        Cached positions T (1: the bytes per token).
    batch : int
        Sequences decoded at once, B; each has a cache of its own.

    Returns
    -------
    int

    >>> kv_cache_bytes(32, 32, 128, "float16") / 2**20  # per token, MiB
    0.5
    """
    sizes = {name: _positive_int(name, value) for name, value in
             (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
              ("seq_len", seq_len), ("batch", batch))}
    keys_and_values = 2
    return (keys_and_values * sizes["n_layers"] * sizes["n_kv_heads"] * sizes["head_dim"] * itemsize(dtype)
            * sizes["seq_len"] * sizes["batch"])


def _shape(x):
    return tuple(int(n) for n in x.shape)


class KVCache:
    """The keys and values of one attention layer, for every position decoded so far.

    Parameters
    ----------
    max_len : int, optional
        The most positions it may hold; an update past it raises
        :class:`CacheFullError`. None: it grows as needed.
    window : int, optional
        For a model whose attention has a sliding window of W keys: keep only the
        last W positions, so the cache never holds more than W, however long the
        sequence. Cannot be combined with ``max_len``.

    Use
    ---
    ``keys, values = cache.update(k, v)`` appends the keys k (..., T_new, d_k) and
    values v (..., T_new, d_v) of the new positions and returns what the new
    queries attend to: the positions held before, then the new ones,
    (..., T_held + T_new, d). Give them to :func:`attnlib.attention` with
    ``causal="bottom-right"`` (and ``window=W`` for a windowed cache). The
    returned arrays are views into the cache, valid until the next update.

    NumPy arrays or torch tensors; the first update fixes the kind, dtype,
    device, leading shape (batch, heads) and widths, and later updates must
    match them. Storage is preallocated and doubles when full, so appending one
    position costs O(1) on average and ``keys`` is always one contiguous view.
    """

    def __init__(self, max_len=None, *, window=None):
        self.max_len = _positive_int("max_len", max_len, allow_none=True)
        self.window = _positive_int("window", window, allow_none=True)
        if self.max_len is not None and self.window is not None:
            raise ValueError(f"give KVCache either max_len (it refuses to grow past it) or window (it keeps "
                             f"the last W positions), not both: got max_len={max_len}, window={window}")
        self._k = self._v = None  # buffers (..., capacity, d_k) and (..., capacity, d_v)
        self._start = self._end = 0  # the positions held are buffer rows start ... end - 1
        self.seen = 0  # positions ever appended: the absolute position of the next token

    def __len__(self):
        """The number of positions held now."""
        return self._end - self._start

    @property
    def keys(self):
        """The keys held, oldest first: (..., len(self), d_k), a view; None before the first update."""
        return None if self._k is None else self._k[..., self._start:self._end, :]

    @property
    def values(self):
        """The values held, oldest first: (..., len(self), d_v), a view; None before the first update."""
        return None if self._v is None else self._v[..., self._start:self._end, :]

    @property
    def nbytes(self):
        """Bytes of the keys and values held now (the buffers may have room for more)."""
        if self._k is None:
            return 0
        k, v = self.keys, self.values
        return int(k.numel() * k.element_size() + v.numel() * v.element_size()) if is_tensor(k) \
            else int(k.nbytes + v.nbytes)

    def update(self, k, v):
        """Append the keys and values of new positions; return every key and value to attend to.

        Parameters
        ----------
        k : array or tensor, shape (..., T_new, d_k)
        v : array or tensor, shape (..., T_new, d_v)

        Returns
        -------
        keys (..., T_held + T_new, d_k), values (..., T_held + T_new, d_v):
        the positions held before this update, then the new ones. Views, valid
        until the next update.

        Raises
        ------
        CacheFullError
            When ``max_len`` is set and the cache would hold more.
        ShapeError, DTypeError, MixedArrayTypesError
            When k and v do not fit each other or what the cache already holds.
        """
        k, v = as_array(k, "k"), as_array(v, "v")
        self._check(k, v)
        n_new = int(k.shape[-2])
        if self.max_len is not None and len(self) + n_new > self.max_len:
            raise CacheFullError(
                f"KVCache(max_len={self.max_len}) holds {len(self)} positions and update got {n_new} more "
                f"(k of shape {_shape(k)}): that makes {len(self) + n_new}. Create the cache with a larger "
                "max_len, or with window=W to keep only the last W positions")
        self._make_room(k, v, n_new)
        self._k[..., self._end:self._end + n_new, :] = k
        self._v[..., self._end:self._end + n_new, :] = v
        attend_from = self._start
        self._end += n_new
        self.seen += n_new
        if self.window is not None:  # keep the last W positions for the next update
            self._start = max(self._start, self._end - self.window)
        return self._k[..., attend_from:self._end, :], self._v[..., attend_from:self._end, :]

    def truncate(self, length):
        """Forget the newest positions, keeping the first ``length`` of those held (a rollback).

        With a window, positions that already slid out of it do not come back.
        """
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 0 <= length <= len(self):
            raise ValueError(f"length must be an int from 0 to len(cache)={len(self)}, got {length!r}")
        dropped = len(self) - int(length)
        self._end -= dropped
        self.seen -= dropped

    def _check(self, k, v):
        kind = array_kind(k=k, v=v)
        for name, x in (("k", k), ("v", v)):
            if x.ndim < 2:
                raise ShapeError(f"{name} must be (..., T_new, d), at least 2 dimensions, got shape {_shape(x)}")
        floating = (k.is_floating_point() if kind == "torch" else np.issubdtype(k.dtype, np.floating))
        if not floating or k.dtype != v.dtype:
            raise DTypeError(f"k and v must share one floating-point dtype, got k {k.dtype} and v {v.dtype}")
        if _shape(k)[:-1] != _shape(v)[:-1]:
            raise ShapeError(f"k and v must have the same leading shape and T_new: k {_shape(k)}, v {_shape(v)}")
        if self._k is None:
            return
        held_kind = "torch" if is_tensor(self._k) else "numpy"
        if kind != held_kind:
            raise DTypeError(f"the cache holds {held_kind} arrays but update got {kind} arrays")
        expected_k = (*_shape(self._k)[:-2], "T_new", int(self._k.shape[-1]))
        expected_v = (*_shape(self._v)[:-2], "T_new", int(self._v.shape[-1]))
        for name, x, expected in (("k", k, expected_k), ("v", v, expected_v)):
            if _shape(x)[:-2] != expected[:-2] or int(x.shape[-1]) != expected[-1]:
                raise ShapeError(f"{name} of shape {_shape(x)} does not fit the cache, which holds {name} of "
                                 f"shape {_shape(getattr(self, 'keys' if name == 'k' else 'values'))}: "
                                 f"expected {expected}")
        if k.dtype != self._k.dtype:
            raise DTypeError(f"the cache holds {self._k.dtype} but update got {k.dtype}")
        if kind == "torch" and k.device != self._k.device:
            raise ValueError(f"the cache is on {self._k.device} but update got tensors on {k.device}")

    def _make_room(self, k, v, n_new):
        """Make sure buffer rows ``end ... end + n_new - 1`` exist, keeping the held rows."""
        capacity = 0 if self._k is None else int(self._k.shape[-2])
        if self._end + n_new <= capacity:
            return
        held = len(self)
        needed = held + n_new
        if self.max_len is not None:
            new_capacity = self.max_len
        elif self.window is not None:
            new_capacity = max(2 * self.window, needed)  # held + new fit, then room to slide
        else:
            new_capacity = max(2 * capacity, needed, 16)
        k_buffer = _empty_like(k, (*k.shape[:-2], new_capacity, k.shape[-1]))
        v_buffer = _empty_like(v, (*v.shape[:-2], new_capacity, v.shape[-1]))
        if held:
            k_buffer[..., :held, :] = self.keys
            v_buffer[..., :held, :] = self.values
        self._k, self._v, self._start, self._end = k_buffer, v_buffer, 0, held


def _empty_like(x, shape):
    if is_tensor(x):
        return torch_module().empty(shape, dtype=x.dtype, device=x.device)
    return np.empty(shape, dtype=x.dtype)
