"""The backward pass without the (T_q, T_k) matrix: FlashAttention-2's Algorithm 2, in NumPy.

The matrix form (:mod:`attnlib.backends.numpy_backward`) needs the whole weight
matrix P. Here the forward keeps only each query row's log-sum-exp

    lse_i = log sum_j exp(s_ij)        (T_q numbers, not T_q x T_k)

and the backward recomputes any block of weights from it in one step,
``P_blk = exp(S_blk - lse)``: no running maximum is needed the second time. With
``delta_i = rowsum(dO * O)_i``, each block of keys walks over the query blocks
and accumulates (Dao 2023, Algorithm 2):

    S    = (scale * Q_i) K_j^T          (n_q, n_k)
    P    = exp(S - lse_i)               (n_q, n_k), the forward's weights
    dV_j += P^T dO_i
    dP   = dO_i V_j^T
    dS   = P * (dP - delta_i)
    dQ_i += scale * dS K_j
    dK_j += dS^T (scale * Q_i)

Five block products per block pair where the forward had two: the backward does
about 2.5 times the forward's matrix-product work (see
:func:`attnlib.bench.flops.attention_backward_flops`).

Memory: a handful of (block_size, block_size) blocks per thread, plus O(T * d)
for the gradients, the forward's output and the log-sum-exp. With ``causal``,
query blocks that see none of a key block are skipped, as in the forward.

Threads: (batch, head) slices are independent, so large problems spread them
over the tiled forward's thread pool; each slice writes only its own rows of
dQ, dK and dV, so the result does not depend on the order they finish in.
"""

import numpy as np

from ..masks import causal_offset
from .tiled import BLOCK_SIZE, INLINE_FLOPS, run_tasks
from .tiled import forward as tiled_forward

ARRAY_KIND = "numpy"


def query_blocks(j0, n_k, t_q, t_k, block_size, causal=None):
    """The query blocks that see keys ``j0 : j0 + n_k``, as ``(i0, i1, on_diagonal)``.

    Query i sees key j iff ``j <= i + offset`` (see :func:`attnlib.masks.causal_offset`),
    so queries before ``j0 - offset`` see none of these keys and their blocks are
    skipped. ``on_diagonal`` is True for a visited block that still holds some
    masked pair, ``j > i + offset``.
    """
    offset = causal_offset(t_q, t_k, causal) if causal else None
    first = 0 if offset is None else max(0, j0 - offset) // block_size * block_size
    for i0 in range(first, t_q, block_size):
        yield i0, min(i0 + block_size, t_q), offset is not None and j0 + n_k - 1 > i0 + offset


def _key_block_grads(q_scaled, k_blk, v_blk, d_out, lse, delta, mask, d_q, j0, t_k, causal,
                     scale, block_size):
    """``(dK_j, dV_j)`` of keys ``j0 : j0 + n_k``, adding their share of dQ into ``d_q``.

    q_scaled, d_out, d_q: (..., T_q, d); lse, delta: (..., T_q); k_blk, v_blk:
    (..., n_k, d); mask: (..., T_q, T_k) or None; t_k: the number of keys in all.
    """
    t_q, n_k = q_scaled.shape[-2], k_blk.shape[-2]
    offset = causal_offset(t_q, t_k, causal) if causal else 0
    keys = slice(j0, j0 + n_k)
    d_k = np.zeros(k_blk.shape, dtype=q_scaled.dtype)  # (n_k, d_k)
    d_v = np.zeros(v_blk.shape, dtype=q_scaled.dtype)  # (n_k, d_v)
    for i0, i1, on_diagonal in query_blocks(j0, n_k, t_q, t_k, block_size, causal):
        rows = slice(i0, i1)
        s = q_scaled[..., rows, :] @ k_blk.swapaxes(-2, -1)  # (n_q, d_k) @ (d_k, n_k)
        if on_diagonal:  # drop keys j > i + offset
            future = np.arange(j0, j0 + n_k) > np.arange(i0 + offset, i1 + offset)[:, None]
            np.copyto(s, -np.inf, where=future)
        if mask is not None:
            if mask.dtype == np.bool_:
                np.copyto(s, -np.inf, where=~mask[..., rows, keys])  # True = may attend
            else:
                s += mask[..., rows, keys]  # additive: 0 keeps, -inf drops
        # P = exp(S - lse), the forward's weights, computed in place over the scores
        p = np.exp(np.subtract(s, lse[..., rows, None], out=s), out=s)  # (n_q, n_k)
        d_v += p.swapaxes(-2, -1) @ d_out[..., rows, :]  # (n_k, n_q) @ (n_q, d_v)
        d_p = d_out[..., rows, :] @ v_blk.swapaxes(-2, -1)  # (n_q, d_v) @ (d_v, n_k)
        # dS~ = P * (dP - delta), delta = rowsum(dO * O) per query; in place over dP
        d_s = np.multiply(p, np.subtract(d_p, delta[..., rows, None], out=d_p), out=d_p)
        d_q[..., rows, :] += scale * (d_s @ k_blk)  # (n_q, n_k) @ (n_k, d_k)
        d_k += d_s.swapaxes(-2, -1) @ q_scaled[..., rows, :]  # q_scaled holds scale * Q
    return d_k, d_v


def _grads(q_scaled, k, v, d_out, lse, delta, mask, causal, scale, block_size):
    """``(dq, dk, dv)`` of one (batch, head) slice, or of all at once: key blocks outside."""
    t_k = k.shape[-2]
    d_q = np.zeros(q_scaled.shape, dtype=q_scaled.dtype)
    d_k = np.empty(k.shape, dtype=q_scaled.dtype)
    d_v = np.empty(v.shape, dtype=q_scaled.dtype)
    for j0 in range(0, t_k, block_size):
        keys = slice(j0, j0 + block_size)
        d_k[..., keys, :], d_v[..., keys, :] = _key_block_grads(
            q_scaled, k[..., keys, :], v[..., keys, :], d_out, lse, delta, mask, d_q, j0, t_k,
            causal, scale, block_size)
    return d_q, d_k, d_v


def backward(q, k, v, d_out, mask, causal, scale, *, out=None, lse=None, block_size=BLOCK_SIZE,
             workers=None):
    """Gradients of attention on validated NumPy inputs, block by block; the entry point.

    Parameters
    ----------
    q, k, v, d_out, mask, causal, scale
        As for :func:`attnlib.attention_backward`, already checked.
    out, lse : arrays, optional
        The forward's output (..., T_q, d_v) and log-sum-exp (..., T_q), from
        ``tiled.forward(..., return_lse=True)``; computed here when not given.
    block_size : int
        Queries per query block and keys per key block.
    workers : int, optional
        Threads over (batch, head) slices; as for :func:`attnlib.backends.tiled.forward`.

    Returns
    -------
    ``(dq, dk, dv)`` with the broadcast batch shape, in the compute dtype
    (float16 -> float32).
    """
    if int(block_size) != block_size or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    block_size = int(block_size)
    if lse is None:
        out, lse = tiled_forward(q, k, v, mask, causal, scale, block_size=block_size,
                                 workers=workers, return_lse=True)
    compute = lse.dtype
    batch_shape = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    t_q, t_k = q.shape[-2], k.shape[-2]
    # O(T * d) copies and views, never (T_q, T_k)
    q_scaled = q.astype(compute) * compute.type(scale)
    q_scaled = np.broadcast_to(q_scaled, (*batch_shape, t_q, q.shape[-1]))
    k, v = (np.broadcast_to(x.astype(compute, copy=False), (*batch_shape, t_k, x.shape[-1]))
            for x in (k, v))
    d_out = d_out.astype(compute, copy=False)
    delta = np.sum(d_out * out, axis=-1, dtype=compute)  # (..., T_q): rowsum(dO * O)
    if mask is not None:
        mask = np.broadcast_to(mask, (*batch_shape, t_q, t_k))  # a view
    flops = 5 * 2 * int(np.prod(batch_shape)) * t_q * t_k * max(q.shape[-1], v.shape[-1])
    if flops < INLINE_FLOPS:  # small: every (batch, head) at once, in this thread
        return _grads(q_scaled, k, v, d_out, lse, delta, mask, causal, scale, block_size)
    grads = [np.empty((*batch_shape, *x.shape[-2:]), dtype=compute) for x in (q_scaled, k, v)]

    def run(b):  # b: the index tuple of one (batch, head) slice
        mask_b = None if mask is None else mask[b]
        parts = _grads(q_scaled[b], k[b], v[b], d_out[b], lse[b], delta[b], mask_b, causal, scale,
                       block_size)
        for grad, part in zip(grads, parts):
            grad[b] = part

    run_tasks(run, list(np.ndindex(*batch_shape)), workers)
    return tuple(grads)
