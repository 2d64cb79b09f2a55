"""A paged KV cache: one pool of fixed-size pages shared by every sequence of a batch.

A contiguous cache reserves ``max_len`` positions for each sequence, however short it
turns out to be. A paged cache (vLLM's PagedAttention) cuts the memory into pages of
``page_size`` positions and gives a sequence a new page only when its last one is full,
so it reserves at most ``page_size - 1`` positions it does not use. A sequence's pages
need not be neighbours: its row of the *block table* lists them in order, and
:func:`attnlib.attention_with_kvcache` reads the keys through it.

Continuous batching: sequences join (:meth:`PagedKVCache.add`) and leave
(:meth:`PagedKVCache.release`, which puts their pages back on the free list) at any step,
so the batch decoded at each step is whichever sequences are running.
"""

import numpy as np

from .arrays import is_tensor, torch_module
from .errors import CacheFullError, DTypeError, ShapeError
from .kv_cache import _positive_int, is_tensor_dtype


class PagedKVCache:
    """A pool of ``num_blocks`` pages of ``page_size`` positions, for one attention layer.

    Parameters
    ----------
    num_blocks, page_size, n_kv_heads, head_dim : int
    dtype : torch dtype (then the pages are tensors on ``device``) or a NumPy float dtype
    device : torch device, optional (torch dtypes only)

    Attributes
    ----------
    k_cache, v_cache : (num_blocks, page_size, n_kv_heads, head_dim)
        The pages, what :func:`attnlib.attention_with_kvcache` takes with a block table.

    Use
    ---
    ::

        cache.add("a"); cache.append("a", k, v)     # k, v: (T_new, n_kv_heads, head_dim)
        out = attention_with_kvcache(q, cache.k_cache, cache.v_cache,
                                     cache_seqlens=cache.seqlens(["a", "b"]),
                                     block_table=cache.block_table(["a", "b"]))
        cache.release("a")                          # its pages go back to the free list

    A call that fails (pool full, unknown sequence, wrong shape) changes nothing.
    """

    def __init__(self, num_blocks, page_size, n_kv_heads, head_dim, *, dtype, device=None):
        self.num_blocks = _positive_int("num_blocks", num_blocks)
        self.page_size = _positive_int("page_size", page_size)
        self.n_kv_heads = _positive_int("n_kv_heads", n_kv_heads)
        self.head_dim = _positive_int("head_dim", head_dim)
        shape = (self.num_blocks, self.page_size, self.n_kv_heads, self.head_dim)
        if is_tensor_dtype(dtype):
            if not dtype.is_floating_point:
                raise DTypeError(f"dtype must be a floating-point type, got {dtype!r}")
            torch = torch_module()
            self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
            self.v_cache = torch.zeros(shape, dtype=dtype, device=device)
            self.kind = "torch"
        else:
            if device is not None:
                raise ValueError(f"device={device!r} needs a torch dtype (NumPy arrays live on the CPU), "
                                 f"got dtype {dtype!r}")
            try:
                numpy_dtype = np.dtype(dtype)
            except TypeError:
                raise DTypeError(f"dtype must be a torch dtype or a NumPy float dtype, "
                                 f"got {dtype!r}") from None
            if numpy_dtype.kind != "f":
                raise DTypeError(f"dtype must be a floating-point type, got {dtype!r}")
            self.k_cache = np.zeros(shape, dtype=numpy_dtype)
            self.v_cache = np.zeros(shape, dtype=numpy_dtype)
            self.kind = "numpy"
        self.dtype = self.k_cache.dtype
        self._free = list(range(self.num_blocks - 1, -1, -1))  # pop() hands out page 0 first
        self._pages = {}  # seq_id -> its pages, in order
        self._lengths = {}  # seq_id -> positions stored

    # --- the sequences ---------------------------------------------------------------------

    @property
    def seq_ids(self):
        """The sequences held, in the order they were added."""
        return list(self._pages)

    def __contains__(self, seq_id):
        return seq_id in self._pages

    def __len__(self):
        return len(self._pages)

    def _known(self, seq_id):
        if seq_id not in self._pages:
            raise ValueError(f"unknown sequence {seq_id!r}: the cache holds {self.seq_ids} "
                             "(add it with cache.add(seq_id) first)")

    def add(self, seq_id):
        """Start sequence ``seq_id`` (any hashable id), with no position and no page yet."""
        try:
            hash(seq_id)
        except TypeError:
            raise TypeError(f"seq_id must be hashable (an int or a str), "
                            f"got {type(seq_id).__name__}") from None
        if seq_id in self._pages:
            raise ValueError(f"sequence {seq_id!r} is already in the cache; release it first to start "
                             "it again")
        self._pages[seq_id] = []
        self._lengths[seq_id] = 0

    def pages_needed(self, seq_id, n_new):
        """How many more pages appending ``n_new`` positions to ``seq_id`` would take."""
        self._known(seq_id)
        length = self._lengths[seq_id] + n_new
        return -(-length // self.page_size) - len(self._pages[seq_id])

    def can_append(self, seq_id, n_new=1):
        """True when the free list has the pages that appending ``n_new`` positions needs."""
        return self.pages_needed(seq_id, n_new) <= len(self._free)

    def append(self, seq_id, k, v):
        """Append sequence ``seq_id``'s new keys k and values v, each (T_new, n_kv_heads, head_dim).

        Takes pages from the free list as needed; raises :class:`CacheFullError` (and changes
        nothing) when it has too few.
        """
        self._known(seq_id)
        k, v = self._checked(k, "k"), self._checked(v, "v")
        if k.shape[0] != v.shape[0]:
            raise ShapeError(f"k and v must have the same number of new positions, got k {tuple(k.shape)} "
                             f"and v {tuple(v.shape)}")
        n_new = int(k.shape[0])
        needed = self.pages_needed(seq_id, n_new)
        if needed > len(self._free):
            raise CacheFullError(f"the pool is full: appending {n_new} positions to sequence {seq_id!r} "
                                 f"needs {needed} more pages of {self.page_size}, and {len(self._free)} of "
                                 f"{self.num_blocks} are free; release a finished sequence first")
        pages = self._pages[seq_id]
        for _ in range(needed):
            pages.append(self._free.pop())
        start = self._lengths[seq_id]
        for offset in range(n_new):  # one position at a time: the page each lands in
            position = start + offset
            page, row = pages[position // self.page_size], position % self.page_size
            self.k_cache[page, row] = k[offset]
            self.v_cache[page, row] = v[offset]
        self._lengths[seq_id] = start + n_new

    def append_batch(self, seq_ids, k, v):
        """One decoding step for a batch: k (B, T_new, n_kv_heads, head_dim) and v, row b to ``seq_ids[b]``.

        All or nothing: when the free list has too few pages for all of them, raises
        :class:`CacheFullError` before appending any.
        """
        seq_ids = list(seq_ids)
        for seq_id in seq_ids:
            self._known(seq_id)
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"seq_ids must not repeat a sequence, got {seq_ids}")
        for name, x in (("k", k), ("v", v)):
            if len(x.shape) != 4 or x.shape[0] != len(seq_ids):
                raise ShapeError(f"{name} must have shape (B, T_new, n_kv_heads, head_dim) with B = "
                                 f"{len(seq_ids)} (one row per seq_id), got {tuple(x.shape)}")
        rows = [(self._checked(k[b], "k"), self._checked(v[b], "v")) for b in range(len(seq_ids))]
        needed = sum(self.pages_needed(s, int(k.shape[1])) for s in seq_ids)
        if needed > len(self._free):
            raise CacheFullError(f"the pool is full: this step needs {needed} more pages of {self.page_size} "
                                 f"for {len(seq_ids)} sequences, and {len(self._free)} of {self.num_blocks} "
                                 "are free; release a finished sequence first")
        for seq_id, (k_row, v_row) in zip(seq_ids, rows):
            self.append(seq_id, k_row, v_row)

    def _checked(self, x, name):
        expected = (self.n_kv_heads, self.head_dim)
        if self.kind == "torch":
            if not is_tensor(x):
                raise TypeError(f"{name} must be a torch tensor (this cache holds {self.dtype} tensors), "
                                f"got {type(x).__name__}")
            floating = x.dtype.is_floating_point
        else:
            if is_tensor(x):
                raise TypeError(f"{name} must be a NumPy array (this cache holds NumPy {self.dtype}), got a "
                                "torch tensor")
            x = np.asarray(x)
            floating = x.dtype.kind == "f"
        if not floating:
            raise DTypeError(f"{name} must hold floats, got dtype {x.dtype}")
        if x.ndim != 3 or tuple(x.shape[1:]) != expected or x.shape[0] < 1:
            raise ShapeError(f"{name} must have shape (T_new, n_kv_heads, head_dim) = (T_new, {expected[0]}, "
                             f"{expected[1]}) with T_new >= 1, got {tuple(x.shape)}")
        if self.kind == "torch":
            return x.to(device=self.k_cache.device, dtype=self.dtype)
        return x.astype(self.dtype)

    def release(self, seq_id):
        """Forget sequence ``seq_id`` and put its pages back on the free list (first to be reused)."""
        self._known(seq_id)
        self._free.extend(reversed(self._pages.pop(seq_id)))
        del self._lengths[seq_id]

    # --- what attention_with_kvcache takes ---------------------------------------------------

    def seqlens(self, seq_ids):
        """Positions stored for each sequence: int32 (B,), on the pages' device."""
        for seq_id in seq_ids:
            self._known(seq_id)
        lengths = [self._lengths[s] for s in seq_ids]
        return self._int32(np.array(lengths, dtype=np.int32).reshape(len(lengths)))

    def block_table(self, seq_ids, max_blocks=None):
        """Each sequence's pages in order: int32 (B, max_blocks), padded with -1 (never read).

        ``max_blocks`` defaults to the most pages any of them holds.
        """
        for seq_id in seq_ids:
            self._known(seq_id)
        rows = [self._pages[s] for s in seq_ids]
        longest = max((len(r) for r in rows), default=0)
        if max_blocks is None:
            max_blocks = max(longest, 1)
        elif isinstance(max_blocks, (bool, np.bool_)) or not isinstance(max_blocks, (int, np.integer)) \
                or max_blocks < longest:
            raise ValueError(f"max_blocks must be an int >= {longest} (the most pages a sequence holds), "
                             f"got {max_blocks!r}")
        table = np.full((len(rows), int(max_blocks)), -1, dtype=np.int32)
        for b, pages in enumerate(rows):
            table[b, :len(pages)] = pages
        return self._int32(table)

    def _int32(self, array):
        if self.kind == "torch":
            return torch_module().from_numpy(array).to(self.k_cache.device)
        return array

    # --- memory ----------------------------------------------------------------------------

    @property
    def free_blocks(self):
        """Pages on the free list."""
        return len(self._free)

    def _bytes_per_position(self):
        keys_and_values = 2
        return keys_and_values * self.n_kv_heads * self.head_dim * self.dtype.itemsize

    def bytes_used(self):
        """Bytes of keys and values the sequences hold: their positions, not their pages."""
        return sum(self._lengths.values()) * self._bytes_per_position()

    def bytes_reserved(self):
        """Bytes of the pages the sequences hold (used or not): at most page_size - 1 positions each beyond
        bytes_used."""
        return sum(len(p) for p in self._pages.values()) * self.page_size * self._bytes_per_position()

    def bytes_total(self):
        """Bytes of the whole pool, free pages included."""
        return self.num_blocks * self.page_size * self._bytes_per_position()

    def __repr__(self):
        return (f"PagedKVCache({self.num_blocks} pages of {self.page_size} x {self.n_kv_heads} heads x "
                f"{self.head_dim}, {self.dtype}; {len(self)} sequences, {self.free_blocks} pages free)")
