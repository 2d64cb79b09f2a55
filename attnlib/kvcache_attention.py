"""Attention over a batch of KV caches, contiguous or paged: flash_attn's ``flash_attn_with_kvcache``.

:func:`attention_with_kvcache` takes the queries of the newest tokens of B sequences
and the caches that hold every sequence's keys and values, each sequence with its own
length. The cache is either one contiguous block per sequence, (B, T_max, H_kv, d),
or a pool of pages, (num_blocks, page_size, H_kv, d), that a ``block_table`` maps each
sequence's positions onto (see :class:`attnlib.PagedKVCache`).

Backends: ``numpy`` (step by step, sequence by sequence, with the split and merge of
:mod:`attnlib.split_kv`), ``torch`` (the batch at once) and ``triton`` (a decode
kernel and a merge kernel, :mod:`attnlib.backends.triton_decode`). Forward only.
"""

import numpy as np

from .arrays import array_kind, as_array, is_tensor, torch_module
from .errors import DTypeError, ShapeError
from .masks import causal_alignment, check_window
from .split_kv import choose_num_splits, decode_one_sequence
from .validation import check_finite, check_scale

BACKENDS = ("numpy", "torch", "triton")


def attention_with_kvcache(q, k_cache, v_cache, *, cache_seqlens, block_table=None, causal=True,
                           window=None, scale=None, num_splits=1, backend=None):
    """Attention of the newest tokens' queries over each sequence's cached keys and values.

    Parameters
    ----------
    q : array or tensor, shape (B, T_new, H, d)
        The queries of each sequence's T_new newest tokens (T_new = 1 when decoding).
    k_cache, v_cache : shape (B, T_max, H_kv, d) and (B, T_max, H_kv, d_v), or paged
        (num_blocks, page_size, H_kv, d) and (num_blocks, page_size, H_kv, d_v) with
        ``block_table``. Grouped-query attention when H_kv < H (H divisible by H_kv):
        query head h reads key/value head h // (H / H_kv). Positions past a sequence's
        length are never read, whatever they hold.
    cache_seqlens : integer array or tensor, shape (B,)
        How many keys sequence b has, its new tokens' included (they are its last T_new).
        Each between 1 (T_new when causal) and the cache's capacity: T_max, or
        max_blocks * page_size when paged.
    block_table : integer array or tensor, shape (B, max_blocks), optional
        Paged cache: sequence b's position p lives in page ``block_table[b, p // page_size]``
        at row ``p % page_size``. Only the first ceil(cache_seqlens[b] / page_size)
        entries of a row are read; they must lie in 0..num_blocks-1.
    causal : bool
        Bottom-right causal (flash_attn's): new token t, at position
        cache_seqlens[b] - T_new + t, sees the keys up to its own position.
    window : int, optional
        Each new token sees only its ``window`` most recent keys (itself included).
        Needs ``causal``.
    scale : float, optional
        Defaults to 1/sqrt(d).
    num_splits : int
        Split each sequence's keys into this many chunks, computed independently and
        merged exactly by log-sum-exp (flash-decoding). 0: chosen from the shape and the
        GPU's SM count (:func:`attnlib.split_kv.choose_num_splits`). The result does not
        depend on it beyond rounding.
    backend : "numpy", "torch" or "triton", optional
        Defaults to "numpy" for NumPy input and "torch" for tensors.

    Returns
    -------
    Same kind and dtype as q, shape (B, T_new, H, d_v).

    Raises ShapeError for shapes that do not fit, ValueError for lengths outside the cache
    or page indices outside the pool (naming the sequence), NonFiniteError for NaN or inf in
    q (the caches' values are not read by the checks: positions past a length may hold
    anything), DTypeError for integer or mismatched dtypes, MixedArrayTypesError for NumPy
    and torch mixed. Python lists of lengths and page indices are accepted.
    """
    args = check_kvcache_arguments(q, k_cache, v_cache, cache_seqlens, block_table, causal, window,
                                   scale, num_splits, backend)
    if args["backend"] == "numpy":
        return _numpy_backend(args)
    if args["backend"] == "torch":
        return _torch_backend(args)
    from .backends import triton_decode
    return triton_decode.attention_with_kvcache(args)


# --- checks ---------------------------------------------------------------------------------


def _shape(x):
    return tuple(int(n) for n in x.shape)


def _dtype_kind(x, kind):
    if kind == "torch":
        return "f" if x.dtype.is_floating_point else ("c" if x.dtype.is_complex else "i")
    return x.dtype.kind


def _integers(name, x, kind, shape_text):
    """An integer array's values as a NumPy int64 array (read once, for the checks)."""
    if kind == "torch":
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch_module().bool:
            raise DTypeError(f"{name} must hold integers ({shape_text}), got dtype {x.dtype}")
        return x.detach().cpu().numpy().astype(np.int64)
    if x.dtype.kind not in "iu":
        raise DTypeError(f"{name} must hold integers ({shape_text}), got dtype {x.dtype}")
    return x.astype(np.int64)


def check_kvcache_arguments(q, k_cache, v_cache, cache_seqlens, block_table, causal, window, scale,
                            num_splits, backend):
    """Every check of :func:`attention_with_kvcache`; returns its arguments, normalised."""
    q, k_cache, v_cache = (as_array(x, name) for x, name in
                           ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")))
    if isinstance(cache_seqlens, (list, tuple)):  # a list of lengths stays integers (as_array makes floats)
        cache_seqlens = np.asarray(cache_seqlens)
    kind = array_kind(q=q, k_cache=k_cache, v_cache=v_cache)
    seqlen_kind = array_kind(cache_seqlens=cache_seqlens) if cache_seqlens is not None else None
    if seqlen_kind is None:
        raise ValueError("cache_seqlens is required: the number of valid keys of each sequence, shape (B,)")
    if block_table is not None and isinstance(block_table, (list, tuple)):
        block_table = np.asarray(block_table)
    if kind == "numpy" and (seqlen_kind == "torch" or (block_table is not None and
                                                         array_kind(block_table=block_table) == "torch")):
        array_kind(q=q, cache_seqlens=cache_seqlens, block_table=block_table)  # raises, naming them
    causal = causal_alignment(causal) is not None
    window = check_window(window, causal)
    if backend is None:
        backend = "numpy" if kind == "numpy" else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} for attention_with_kvcache, got {backend!r}")
    if backend == "numpy" and kind == "torch":
        raise TypeError("backend 'numpy' computes on NumPy arrays but got torch tensors; use backend='torch' "
                        "or 'triton', or pass tensor.numpy()")
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if _dtype_kind(x, kind) != "f":
            raise DTypeError(f"{name} must be a floating-point array, got dtype {x.dtype}")
        if x.ndim != 4:
            raise ShapeError(f"{name} must have 4 dimensions, got shape {_shape(x)}; expected "
                             "q (B, T_new, H, d), "
                             "k_cache/v_cache (B, T_max, H_kv, d) or paged (num_blocks, page_size, H_kv, d)")
    check_finite("q", q, kind)  # the caches may hold anything past each sequence's length
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise DTypeError(f"q, k_cache and v_cache must share a dtype, got {q.dtype}, {k_cache.dtype} and "
                         f"{v_cache.dtype}")
    batch, n_new, n_heads, d = _shape(q)
    kshape, vshape = _shape(k_cache), _shape(v_cache)
    if kshape[:3] != vshape[:3]:
        raise ShapeError(f"k_cache {kshape} and v_cache {vshape} must agree in their first three dimensions")
    if kshape[3] != d:
        raise ShapeError(f"k_cache's last dimension must be q's d = {d}, got k_cache {kshape}, q {_shape(q)}")
    if 0 in (batch, n_new, n_heads, d) or 0 in kshape or 0 in vshape:
        raise ShapeError(f"empty dimension: q {_shape(q)}, k_cache {kshape}, v_cache {vshape}")
    n_kv_heads = kshape[2]
    if n_heads % n_kv_heads:
        raise ShapeError(f"q's H = {n_heads} heads must be a multiple of the cache's H_kv = {n_kv_heads} "
                         f"(q {_shape(q)}, k_cache {kshape})")
    if block_table is None:
        if kshape[0] != batch:
            raise ShapeError(f"a contiguous k_cache must have q's batch B = {batch} in dimension 0, got "
                             f"k_cache {kshape}, q {_shape(q)} (for a paged cache pass block_table)")
        page_size, capacity, table = None, kshape[1], None
    else:
        table_kind = array_kind(block_table=block_table)
        table = _integers("block_table", block_table, table_kind, "page indices, shape (B, max_blocks)")
        if table.ndim != 2 or table.shape[0] != batch:
            raise ShapeError(f"block_table must have shape (B, max_blocks) = ({batch}, max_blocks), got "
                             f"{tuple(table.shape)}")
        page_size, capacity = kshape[1], table.shape[1] * kshape[1]
    seqlens = _integers("cache_seqlens", cache_seqlens, seqlen_kind, "valid keys per sequence, shape (B,)")
    if seqlens.shape != (batch,):
        raise ShapeError(f"cache_seqlens must have shape (B,) = ({batch},), got {tuple(seqlens.shape)}")
    least = n_new if causal else 1
    for b, n in enumerate(seqlens):
        if n < least:
            why = (f"at least T_new = {n_new} (its new tokens are its last T_new keys)" if causal
                   else "at least 1")
            raise ValueError(f"cache_seqlens[{b}] = {n} must be {why}")
        if n > capacity:
            where = (f"the contiguous cache holds T_max = {capacity} positions (k_cache {kshape})"
                     if table is None else f"block_table's {table.shape[1]} pages of {page_size} positions "
                     f"hold {capacity}")
            raise ValueError(f"cache_seqlens[{b}] = {n} is beyond the cache's capacity: {where}")
    if table is not None:
        n_blocks = kshape[0]
        for b, n in enumerate(seqlens):
            used = table[b, :-(-n // page_size)]
            bad = np.flatnonzero((used < 0) | (used >= n_blocks))
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"block_table[{b}, {i}] = {used[i]} is not a page of the pool "
                                 f"(0..{n_blocks - 1}, "
                                 f"k_cache {kshape}); sequence {b} has {n} keys, so it reads its first "
                                 f"{used.size} entries")
    if (isinstance(num_splits, (bool, np.bool_)) or not isinstance(num_splits, (int, np.integer))
            or num_splits < 0):
        raise ValueError(f"num_splits must be an int >= 0 (0: chosen from the shape), got {num_splits!r}")
    if num_splits == 0:
        num_splits = choose_num_splits(batch, n_kv_heads, int(seqlens.max()))
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, seqlens=seqlens, table=table, block_table=block_table,
                cache_seqlens=cache_seqlens, page_size=page_size, causal=causal, window=window,
                scale=check_scale(scale, d), num_splits=int(num_splits), backend=backend, kind=kind)


# --- numpy: sequence by sequence, the split and merge of attnlib.split_kv ------------------------------


def gather_sequence(cache, b, n_keys, table=None):
    """Sequence b's first n_keys positions of a cache: (n_keys, H_kv, d).

    Contiguous: cache[b, :n_keys]. Paged: its pages, in the order block_table lists them.
    """
    if table is None:
        return cache[b, :n_keys]
    page_size = cache.shape[1]
    pages = table[b, :-(-n_keys // page_size)]  # the pages holding positions 0..n_keys-1
    return cache[pages].reshape(-1, *cache.shape[2:])[:n_keys]


def _numpy_backend(args):
    q, table = args["q"], args["table"]
    out = np.empty(q.shape[:3] + args["v_cache"].shape[-1:], dtype=q.dtype)
    for b, n_keys in enumerate(args["seqlens"]):
        k = gather_sequence(args["k_cache"], b, int(n_keys), table)
        v = gather_sequence(args["v_cache"], b, int(n_keys), table)
        out[b] = decode_one_sequence(q[b], k, v, scale=args["scale"], causal=args["causal"],
                                     window=args["window"], num_splits=args["num_splits"])
    return out


# --- torch: the batch at once ---------------------------------------------------------------------------


def _torch_backend(args):
    torch = torch_module()
    q, k_cache, v_cache = args["q"], args["k_cache"], args["v_cache"]
    if not is_tensor(q):  # NumPy input on the torch backend
        q, k_cache, v_cache = (torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k_cache, v_cache))
        back = True
    else:
        back = False
    device = q.device
    seqlens = torch.as_tensor(args["seqlens"], device=device)
    batch, n_new, n_heads, d = q.shape
    n_kv_heads = k_cache.shape[2]
    group = n_heads // n_kv_heads
    longest = int(args["seqlens"].max())
    if args["table"] is None:
        k, v = k_cache[:, :longest], v_cache[:, :longest]
    else:
        page_size = args["page_size"]
        n_pages = -(-longest // page_size)
        pages = torch.as_tensor(args["table"][:, :n_pages], device=device).clamp(0, k_cache.shape[0] - 1)
        k = k_cache[pages].reshape(batch, n_pages * page_size, n_kv_heads, d)[:, :longest]
        v = v_cache[pages].reshape(batch, n_pages * page_size, n_kv_heads, -1)[:, :longest]
    compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    key = torch.arange(longest, device=device)  # (L,)
    valid = (key[None, :] < seqlens[:, None])[:, :, None, None]  # (B, L, 1, 1)
    k = torch.where(valid, k.to(compute), 0)  # positions past a sequence's length may hold anything
    v = torch.where(valid, v.to(compute), 0)
    qg = q.to(compute).reshape(batch, n_new, n_kv_heads, group, d)
    position = seqlens[:, None] - n_new + torch.arange(n_new, device=device)[None, :]  # (B, T_new)
    allowed = key[None, None, :] < seqlens[:, None, None]  # (B, T_new, L)
    if args["causal"]:
        allowed = allowed & (key[None, None, :] <= position[:, :, None])
    if args["window"] is not None:
        allowed = allowed & (key[None, None, :] > position[:, :, None] - args["window"])
    chunk = -(-longest // args["num_splits"])
    outs, lses = [], []
    for start in range(0, longest, chunk):
        stop = min(start + chunk, longest)
        scores = torch.einsum("btkgd,bskd->btkgs", qg, k[:, start:stop].to(compute)) * args["scale"]
        scores = scores.masked_fill(~allowed[:, :, None, None, start:stop], float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # (B, T_new, H_kv, G); -inf where no key
        weights = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0)[..., None])
        outs.append(torch.einsum("btkgs,bskd->btkgd", weights, v[:, start:stop].to(compute)))
        lses.append(lse)
    lses = torch.stack(lses)  # (S, B, T_new, H_kv, G)
    total = torch.logsumexp(lses, dim=0)
    out = (torch.exp(lses - total)[..., None] * torch.stack(outs)).sum(dim=0)
    out = out.reshape(batch, n_new, n_heads, -1).to(q.dtype)
    return out.numpy() if back else out
