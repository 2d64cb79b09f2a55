"""Block masks: which (query block, key block) tiles a mask_mod leaves anything to compute in.

:func:`block_mask` evaluates a ``mask_mod`` (see :mod:`attnlib.mods`) on every
(query, key) pair once, cuts the (T_q, T_k) grid into ``block_size`` x
``block_size`` tiles, and records per query block which key blocks hold any
allowed key, with the meaning of torch's ``create_block_mask``:

- ``kv_num_blocks[b, h, i]`` and ``kv_indices[b, h, i, :kv_num_blocks]``: the
  *partial* key blocks of query block i, those that hold some allowed and some
  dropped key (the mask_mod must be applied inside them);
- ``full_kv_num_blocks`` and ``full_kv_indices``: the *full* ones, every key
  allowed (no mask needed);
- every other key block holds no allowed key and is skipped.

``q_num_blocks``, ``q_indices`` (and the ``full_`` pair) are the same lists per
key block, for a backward pass that walks key blocks outside. Padding past T_q
or T_k counts as dropped, as in torch, so a ragged last block is never full.
The ``tiled`` backend visits only the listed blocks; the others apply the mask_mod.
"""

import numpy as np


def _check_size(name, value, allow_none=False):
    if value is None and allow_none:
        return 1
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        none = " or None" if allow_none else ""
        raise ValueError(f"{name} must be a positive int{none}, got {value!r}")
    return int(value)


def _sorted_lists(blocks):
    """``(count, indices)`` of the True entries of ``blocks`` (..., n), as torch orders them:
    the True indices ascending, then the others ascending (int32)."""
    count = blocks.sum(axis=-1).astype(np.int32)
    indices = np.argsort(~blocks, axis=-1, kind="stable").astype(np.int32)
    return count, indices


class BlockMask:
    """The block structure of a mask_mod; made by :func:`block_mask`.

    Attributes
    ----------
    shape : (B, H, T_q, T_k)
    block_size : int
    mask_mod : the function it was made from
    kv_num_blocks, full_kv_num_blocks : int32 (B, H, n_q_blocks)
    kv_indices, full_kv_indices : int32 (B, H, n_q_blocks, n_kv_blocks)
    q_num_blocks, full_q_num_blocks : int32 (B, H, n_kv_blocks)
    q_indices, full_q_indices : int32 (B, H, n_kv_blocks, n_q_blocks)
    partial, full : bool (B, H, n_q_blocks, n_kv_blocks), the same information as grids
    """

    def __init__(self, partial, full, shape, block_size, mask_mod):
        self.partial, self.full = partial, full
        self.shape, self.block_size, self.mask_mod = tuple(shape), block_size, mask_mod
        self.kv_num_blocks, self.kv_indices = _sorted_lists(partial)
        self.full_kv_num_blocks, self.full_kv_indices = _sorted_lists(full)
        self.q_num_blocks, self.q_indices = _sorted_lists(partial.swapaxes(-2, -1))
        self.full_q_num_blocks, self.full_q_indices = _sorted_lists(full.swapaxes(-2, -1))

    @property
    def visited(self):
        """bool (B, H, n_q_blocks, n_kv_blocks): the tiles a kernel computes (partial or full)."""
        return self.partial | self.full

    def sparsity(self):
        """The percentage of tiles left out (0: every tile computed; torch's ``sparsity()``)."""
        return 100.0 * (1.0 - float(self.visited.mean()))

    def to_dense(self):
        """int32 (B, H, n_q_blocks, n_kv_blocks): 1 for a computed tile, 0 for a skipped one."""
        return self.visited.astype(np.int32)

    def __repr__(self):
        return (f"BlockMask(shape={self.shape}, block_size={self.block_size}, sparsity={self.sparsity():.2f}%, "
                f"mask_mod={self.mask_mod!r})")


def block_mask(mask_mod, B, H, T_q, T_k, *, block_size=128):
    """The :class:`BlockMask` of ``mask_mod`` for B batch entries, H heads, T_q queries and T_k keys.

    Parameters
    ----------
    mask_mod : function ``(b, h, q_idx, kv_idx) -> bool``
        True where a query may attend a key; called with NumPy integer arrays
        that broadcast to (B, H, block_size, T_k), one query block at a time.
    B, H : int or None
        None (as in torch) for a mask that is the same for every batch entry or
        head: the block mask then has size 1 there and broadcasts.
    T_q, T_k : int
    block_size : int
        Queries and keys per tile (torch's default, 128).

    Returns
    -------
    BlockMask
    """
    from .backends.flex import evaluate_mask_mod

    if not callable(mask_mod):
        raise TypeError(f"mask_mod must be a function (b, h, q_idx, kv_idx) -> bool, got "
                        f"{type(mask_mod).__name__}")
    B, H = _check_size("B", B, allow_none=True), _check_size("H", H, allow_none=True)
    T_q, T_k = _check_size("T_q", T_q), _check_size("T_k", T_k)
    block_size = _check_size("block_size", block_size)
    n_q, n_k = -(-T_q // block_size), -(-T_k // block_size)
    partial = np.zeros((B, H, n_q, n_k), dtype=bool)
    full = np.zeros((B, H, n_q, n_k), dtype=bool)
    b = np.arange(B).reshape(B, 1, 1, 1)
    h = np.arange(H).reshape(1, H, 1, 1)
    kv = np.arange(T_k).reshape(1, 1, 1, T_k)
    pad = n_k * block_size - T_k
    for i in range(n_q):
        rows = np.arange(i * block_size, min((i + 1) * block_size, T_q)).reshape(1, 1, -1, 1)
        allowed = evaluate_mask_mod(mask_mod, b, h, rows, kv, (B, H, rows.shape[2], T_k))
        allowed = np.pad(allowed, ((0, 0), (0, 0), (0, block_size - rows.shape[2]), (0, pad)))
        tiles = allowed.reshape(B, H, block_size, n_k, block_size)
        any_allowed = tiles.any(axis=(2, 4))
        full[:, :, i] = tiles.all(axis=(2, 4))
        partial[:, :, i] = any_allowed & ~full[:, :, i]
    return BlockMask(partial, full, (B, H, T_q, T_k), block_size, mask_mod)


def as_numpy_block_mask(bm):
    """A BlockMask, or refuse with a clear error (torch's own BlockMask is a different class)."""
    if not isinstance(bm, BlockMask):
        hint = (" (a torch BlockMask: make one with attnlib.block_mask instead)"
                if type(bm).__name__ == "BlockMask" else "")
        raise TypeError(f"block_mask must be an attnlib.BlockMask from attnlib.block_mask(...), got "
                        f"{type(bm).__name__}{hint}")
    return bm

