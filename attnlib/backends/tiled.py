"""Attention without the (T_q, T_k) score matrix: online softmax over key blocks, in NumPy.

The matrix form (:mod:`attnlib.backends.numpy_matrix`) builds every score
``S = Q K^T * scale`` at once, T_q x T_k numbers, and only then takes each
row's softmax. Here the queries are cut into blocks of ``block_size`` rows, and
each query block walks over the keys ``block_size`` at a time, keeping three
running quantities per query row i (online softmax, Milakov and Gimelshein
2018, as FlashAttention uses it):

    m_i   the largest score seen so far                          (block_q,)
    l_i   sum over the keys seen so far of exp(s_ij - m_i)        (block_q,)
    acc   sum over the keys seen so far of exp(s_ij - m_i) v_j    (block_q, d_v)

When the scores ``S_blk`` of the next key block arrive::

    m_new = max(m_i, rowmax(S_blk))
    P     = exp(S_blk - m_new)
    alpha = exp(m_i - m_new)            # moves the old sums onto the new maximum
    l_i   = alpha * l_i + rowsum(P)
    acc   = alpha * acc + P @ V_blk
    m_i   = m_new

and after the last key block the output rows are ``acc / l_i``. Multiplying by
``alpha`` is exact, not an approximation: every term already in ``l_i`` and
``acc`` carries a factor ``exp(-m_i)``, and ``alpha * exp(-m_i)`` is
``exp(-m_new)``. So the result is softmax(S) V, the same numbers as the matrix
form up to rounding.

This is the algorithm of FlashAttention (Dao et al. 2022), with the loop order
of FlashAttention-2 (Dao 2023): query blocks outside, key blocks inside, and
the division by ``l_i`` once at the end.

Memory: each worker holds one (block_size, block_size) block of scores, and the
whole call O(T * d) more (the scaled queries and the output), never a
(T_q, T_k) matrix. A
user's mask is read block by block (a (T_q, T_k) mask is the user's memory, not
the backend's).

Masks: with ``causal``, key blocks entirely above the diagonal are skipped and
only blocks that cross it are masked entry by entry. With a sliding ``window``
of W keys, key blocks entirely before every row's window are skipped too, so a
query block visits about (W + block_size) / block_size key blocks whatever T is:
the cost grows as T * W, not T^2. A boolean mask (True = may
attend) sets dropped scores to -inf; a float mask is added to the scores.

Speed: NumPy runs element-wise operations (max, exp) on one core and matrix
products on all of them. To use every core, independent (batch, head, query
block) tasks go to a small thread pool, with the matrix-product library held to
one thread per task (``threadpoolctl``); NumPy releases the GIL inside
``exp`` and ``matmul``, so the tasks really run in parallel.
"""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import ThreadpoolController

from ..arrays import as_arrays
from ..masks import causal_alignment, causal_offset, check_window
from ..validation import check_mask, check_qkv, check_scale

ARRAY_KIND = "numpy"
SKIPS_WINDOW_BLOCKS = True  # forward(..., window=W) visits only the key blocks inside the window

BLOCK_SIZE = 1024  # queries and keys per block: 4 MiB of float32 scores per worker; 512 was a few % slower
INLINE_FLOPS = 2**24  # below this much work, threads cost more than they save: run in the caller


def key_blocks(i0, n_q, t_k, block_size, causal=False, t_q=None, window=None):
    """The key blocks that query rows ``i0 : i0 + n_q`` visit, as ``(j0, j1, on_diagonal)``.

    Without ``causal`` that is every block of ``block_size`` keys. With it,
    query i may attend key j only if ``j <= i + offset`` (offset 0 for
    ``True``/"top-left"; ``T_k - T_q`` for "bottom-right", which needs ``t_q``,
    the number of queries, defaulting to ``t_k``). So a block whose first key
    comes after the last row's last allowed key (``j0 > i0 + n_q - 1 + offset``)
    is skipped: every score in it would be masked. With a ``window`` of W keys,
    row i also drops keys ``j <= i + offset - W``, so the blocks that end before
    the first row's window (``j1 - 1 <= i0 + offset - W``) are skipped as well.
    ``on_diagonal`` is True for a visited block that still holds some key a row
    may not see (after its diagonal, or before its window), so it needs the mask
    entry by entry; the blocks in between need none.
    """
    offset = causal_offset(t_k if t_q is None else t_q, t_k, causal) if causal else None
    end = t_k if offset is None else max(0, min(t_k, i0 + n_q + offset))
    start = 0
    if window is not None:  # the first row's oldest key is i0 + offset - W + 1
        start = max(0, i0 + offset - window + 1) // block_size * block_size
    for j0 in range(start, end, block_size):
        j1 = min(j0 + block_size, t_k)
        after_diagonal = offset is not None and j1 - 1 > i0 + offset
        before_window = window is not None and j0 <= i0 + n_q - 1 + offset - window
        yield j0, j1, after_diagonal or before_window


def _attend_query_block(q_blk, k, v, mask, i0, causal, t_q, block_size, window=None):
    """Output rows ``i0 : i0 + n_q`` by online softmax over blocks of keys, and their log-sum-exp.

    Parameters
    ----------
    q_blk : array, shape (..., n_q, d_k)
        The query block, already multiplied by ``scale``. Leading dimensions,
        if any, must match those of ``k``, ``v`` and ``mask``: small inputs run
        every (batch, head) at once.
    k : array, shape (..., T_k, d_k)
    v : array, shape (..., T_k, d_v)
    mask : array or None, shape (..., n_q, T_k)
        The mask rows of this query block: boolean (True = may attend) or additive.
    i0 : int
        Index of the block's first query, for the causal mask.
    causal : None, "top-left" or "bottom-right"
    t_q : int
        The number of queries in the whole sequence, for "bottom-right".
    window : int or None
        Row i sees only keys ``i + offset - window < j <= i + offset``.

    Returns
    -------
    The output rows, shape (..., n_q, d_v), and each row's log-sum-exp of its
    scores ``m_i + log(l_i)``, shape (..., n_q), which the backward pass uses.
    """
    n_q, t_k = q_blk.shape[-2], k.shape[-2]
    m_i = np.full(q_blk.shape[:-1], -np.inf, dtype=q_blk.dtype)  # running max of each row's scores
    l_i = np.zeros(q_blk.shape[:-1], dtype=q_blk.dtype)  # running sum of exp(score - m_i)
    acc = np.zeros((*q_blk.shape[:-1], v.shape[-1]), dtype=q_blk.dtype)  # ... of exp(score - m_i) v_j
    offset = causal_offset(t_q, t_k, causal) if causal else 0
    n_k = min(block_size, t_k)
    scores = np.empty((*q_blk.shape[:-1], n_k), dtype=q_blk.dtype)  # one block's scores, reused
    ones = np.ones(n_k, dtype=q_blk.dtype)  # p @ ones sums each row, faster than p.sum(axis=-1)
    for j0, j1, on_diagonal in key_blocks(i0, n_q, t_k, block_size, causal, t_q, window):
        s = np.matmul(q_blk, k[..., j0:j1, :].swapaxes(-2, -1), out=scores[..., : j1 - j0])  # (n_q, n_k)
        if on_diagonal:  # drop keys j > i + offset (and, with a window, j <= i + offset - window)
            last = np.arange(i0 + offset, i0 + offset + n_q)[:, None]  # (n_q, 1): each row's last key
            dropped = np.arange(j0, j1) > last  # (n_q, n_k)
            if window is not None:
                dropped |= np.arange(j0, j1) <= last - window
            np.copyto(s, -np.inf, where=dropped)
        if mask is not None:
            if mask.dtype == np.bool_:
                np.copyto(s, -np.inf, where=~mask[..., j0:j1])  # True = may attend
            else:
                s += mask[..., j0:j1]  # additive: 0 keeps, -inf drops
        m_new = np.maximum(m_i, s.max(axis=-1))  # (n_q,)
        shift = m_new
        if on_diagonal or mask is not None:
            # a row that has met no allowed key yet has m_new = -inf; shifting it by 0 keeps exp(-inf) = 0
            shift = np.where(np.isneginf(m_new), 0.0, m_new)
        p = np.exp(np.subtract(s, shift[..., None], out=s), out=s)  # in place: (n_q, n_k), all <= 1
        alpha = np.exp(m_i - shift)  # rescales what was summed under the old max
        l_i = alpha * l_i + p @ ones[: j1 - j0]
        acc *= alpha[..., None]
        acc += p @ v[..., j0:j1, :]  # (n_q, n_k) @ (n_k, d_v) -> (n_q, d_v)
        m_i = m_new
    return acc / l_i[..., None], m_i + np.log(l_i)  # (n_q, d_v), (n_q,)


def _default_workers():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


_POOLS = {}  # workers -> ThreadPoolExecutor, made once and kept: a new pool costs about 0.5 ms
_CONTROLLER = []  # the ThreadpoolController, made once: finding the BLAS libraries costs about 0.3 ms
_LOCK = threading.Lock()


def _pool(workers):
    with _LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="attnlib-tiled")
        return _POOLS[workers]


def run_tasks(run, tasks, workers=None):
    """Call ``run(task)`` for every task: in this thread with one worker, else in the kept pool.

    In the pool the BLAS library runs single-threaded, since the workers already
    share the cores. ``workers`` defaults to the cores this process may use.
    """
    workers = min(workers or _default_workers(), len(tasks))
    if workers <= 1:
        for task in tasks:
            run(task)
    else:
        with _one_blas_thread():
            list(_pool(workers).map(run, tasks))  # list() re-raises any task's exception here


def _one_blas_thread():
    """A context in which the BLAS library runs single-threaded (our threads share the cores)."""
    with _LOCK:
        if not _CONTROLLER:
            _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=1, user_api="blas")


def forward(q, k, v, mask, causal, scale, *, window=None, block_size=BLOCK_SIZE, workers=None,
            return_lse=False):
    """Tiled attention on validated NumPy inputs; the backend entry point.

    Parameters
    ----------
    q, k, v, mask, causal, scale
        As for :func:`attnlib.attention`, already checked.
    window : int, optional
        A sliding window (needs ``causal``): key blocks outside every row's window are skipped.
    block_size : int
        Queries per query block and keys per key block.
    workers : int, optional
        Threads to spread (batch, head, query block) tasks over; defaults to the
        number of cores this process may use. With one task, one worker, or
        less than ``INLINE_FLOPS`` of work, the tasks run in this thread and the
        matrix-product library keeps its own threads. The threads live in a pool
        kept between calls, so a small call pays no start-up.
    return_lse : bool
        Also return each query row's log-sum-exp (the backward pass recomputes the
        weights from it), shape (..., T_q), in the compute dtype.

    Returns
    -------
    array, shape (..., T_q, d_v), the dtype of q. float16 is computed in float32.
    """
    if int(block_size) != block_size or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if workers is not None and (int(workers) != workers or workers < 1):
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    block_size = int(block_size)
    compute = np.result_type(q.dtype, np.float32)  # float16 -> float32, float64 stays
    batch_shape = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    t_q, t_k = q.shape[-2], k.shape[-2]
    # O(T * d) copies; broadcast_to makes views, never copies of the batch
    q_scaled = np.broadcast_to(q.astype(compute) * compute.type(scale), (*batch_shape, *q.shape[-2:]))
    k = np.broadcast_to(k.astype(compute, copy=False), (*batch_shape, *k.shape[-2:]))
    v = np.broadcast_to(v.astype(compute, copy=False), (*batch_shape, *v.shape[-2:]))
    if mask is not None:
        mask = np.broadcast_to(mask, (*batch_shape, t_q, t_k))  # a view: no (T_q, T_k) copy
    output = np.empty((*batch_shape, t_q, v.shape[-1]), dtype=q.dtype)
    lse = np.empty((*batch_shape, t_q), dtype=compute) if return_lse else None

    def run(task):
        b, i0 = task  # b: a batch index tuple (or (...,) for all of it), i0: the block's first query
        rows = (*b, slice(i0, min(i0 + block_size, t_q)), slice(None))
        mask_rows = None if mask is None else mask[rows]
        output[rows], lse_rows = _attend_query_block(q_scaled[rows], k[b], v[b], mask_rows, i0, causal, t_q,
                                                     block_size, window)
        if lse is not None:
            lse[rows[:-1]] = lse_rows

    keys_seen = t_k if window is None else min(t_k, window + block_size)  # per query, about
    flops = 2 * int(np.prod(batch_shape)) * t_q * keys_seen * (q.shape[-1] + v.shape[-1])
    if flops < INLINE_FLOPS:  # small: every (batch, head) at once, in this thread
        for i0 in range(0, t_q, block_size):
            run(((...,), i0))
        return (output, lse) if return_lse else output
    tasks = [(b, i0) for b in np.ndindex(*batch_shape) for i0 in range(0, t_q, block_size)]
    run_tasks(run, tasks, workers)
    return (output, lse) if return_lse else output


def tiled_attention(q, k, v, *, mask=None, causal=False, scale=None, window=None, block_size=BLOCK_SIZE,
                    workers=None):
    """Scaled dot-product attention by online softmax, never holding the (T_q, T_k) matrix.

    The same inputs, checks, errors and results as
    ``attnlib.attention(q, k, v, backend="tiled")``, with the block size and the
    number of threads exposed.

    Parameters
    ----------
    q : array, shape (..., T_q, d_k)
    k : array, shape (..., T_k, d_k)
    v : array, shape (..., T_k, d_v)
        NumPy arrays; leading (batch, head) dimensions broadcast.
    mask : array, optional
        Broadcastable to (..., T_q, T_k). Boolean: True where a query may
        attend to a key. Float: added to the scores (0 keeps, -inf drops).
    causal : bool or str
        As for :func:`attnlib.attention`: True or "top-left", "bottom-right", or False.
    scale : float, optional
        Multiplies the scores; defaults to ``1 / sqrt(d_k)``.
    window : int, optional
        As for :func:`attnlib.attention`: each query sees at most the ``window``
        most recent keys; the key blocks outside the window are skipped.
    block_size : int
        Queries per query block and keys per key block. Peak extra memory is
        about ``workers * block_size**2`` scores plus copies of q, k and v.
    workers : int, optional
        Threads; defaults to the number of cores this process may use.

    Returns
    -------
    array, shape (..., T_q, d_v)
    """
    from ..attention import window_arguments

    q, k, v, mask = as_arrays(q=q, k=k, v=v, mask=mask)
    causal = causal_alignment(causal)
    window = check_window(window, causal)
    kind, shapes = check_qkv(q, k, v)
    mask = check_mask(mask, shapes, kind, causal=causal, dtype=q.dtype)
    scale = check_scale(scale, shapes.d_k)
    if kind != ARRAY_KIND:
        raise TypeError(
            "tiled_attention computes on NumPy arrays but got torch tensors; "
            "pass tensor.numpy(), or use attention(..., backend='triton') on a GPU"
        )
    mask, window_option = window_arguments(mask, shapes, kind, causal, window, q, native=True)
    return forward(q, k, v, mask, causal, scale, **window_option, block_size=block_size, workers=workers)
