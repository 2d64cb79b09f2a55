"""Packed sequences: flash_attn's ``flash_attn_varlen_func`` layout, on attnlib's backends.

A batch of sequences of different lengths is stored without padding, one after
the other: q is (total_q, H, d), k and v are (total_k, H_kv, d), and
``cu_seqlens_q`` (the cumulative lengths, starting at 0, one more entry than
sequences) says where each sequence starts and ends. Sequence s holds queries
``cu_seqlens_q[s] : cu_seqlens_q[s + 1]`` and keys ``cu_seqlens_k[s] : cu_seqlens_k[s + 1]``,
and attends to nothing outside them.

Here that is the document mask of :mod:`attnlib.mods` on one long sequence
(``mask_mod``), with causal alignment bottom-right *within* each sequence (the
last query of a sequence lines up with its last key, as flash_attn aligns it),
and a block mask (:func:`attnlib.block_mask`) so that the ``tiled`` backend
visits only the tiles on the diagonal of sequences. The ``triton`` backend runs
this mask_mod inside its kernels (:mod:`attnlib.backends.triton_flex`), forward
and backward, with the same skipping.
"""

import numpy as np

from .arrays import as_array, is_tensor, torch_module
from .block_mask import block_mask
from .errors import ShapeError
from .mods import Mod, _Table


def _offsets(name, cu):
    """``cu`` as an int64 NumPy array, checked: 1-D integers starting at 0 and never decreasing."""
    if is_tensor(cu):
        torch = torch_module()
        if cu.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must hold int32 or int64 offsets, got dtype {cu.dtype}")
        cu = cu.detach().cpu().numpy()
    else:
        cu = np.asarray(cu)
        if cu.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold int32 or int64 offsets, got dtype {cu.dtype}")
    if cu.ndim != 1 or cu.shape[0] < 2:
        raise ShapeError(f"{name} must be 1-D with one entry more than there are sequences, got shape {cu.shape}")
    if cu[0] != 0 or (np.diff(cu) < 0).any():
        raise ValueError(f"{name} must start at 0 and never decrease (cumulative sequence lengths), got "
                         f"{cu.tolist()}")
    return cu.astype(np.int64)


def varlen_mask_mod(cu_seqlens_q, cu_seqlens_k, causal=False, window=None):
    """The mask_mod of packed sequences: same sequence, and (optionally) causal bottom-right within it."""
    cu_q, cu_k = _offsets("cu_seqlens_q", cu_seqlens_q), _offsets("cu_seqlens_k", cu_seqlens_k)
    seq_q = np.repeat(np.arange(len(cu_q) - 1), np.diff(cu_q))  # sequence of each query
    seq_k = np.repeat(np.arange(len(cu_k) - 1), np.diff(cu_k))
    # query i of sequence s sees key j of s iff j - cu_k[s] <= i - cu_q[s] + (len_k - len_q), i.e.
    # j <= i + shift[s] with shift = cu_k[s + 1] - cu_q[s + 1] (bottom-right, per sequence)
    shift_q = (cu_k[1:] - cu_q[1:])[seq_q]
    tables = {name: _Table(x) for name, x in (("seq_q", seq_q), ("seq_k", seq_k), ("shift", shift_q))}

    def mask_mod(b, h, q_idx, kv_idx):
        same = tables["seq_q"].like(q_idx)[q_idx] == tables["seq_k"].like(kv_idx)[kv_idx]
        if not causal:
            return same
        last = q_idx + tables["shift"].like(q_idx)[q_idx]  # the last key this query may see
        keep = same & (kv_idx <= last)
        if window is not None:
            keep = keep & (kv_idx > last - window)
        return keep

    return Mod("varlen", mask_mod, sequences=len(cu_q) - 1, causal=causal, window=window, varlen_tables=True,
               seq_q=seq_q, seq_k=seq_k, shift=shift_q)


def _check(q, k, v, cu_q, cu_k, causal, window):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 3:
            raise ShapeError(f"{name} must be (total, heads, d) as flash_attn_varlen_func takes it, got shape "
                             f"{tuple(int(n) for n in x.shape)}")
    if len(cu_q) != len(cu_k):
        raise ShapeError(f"cu_seqlens_q has {len(cu_q) - 1} sequences and cu_seqlens_k {len(cu_k) - 1}; they must "
                         "describe the same sequences")
    if cu_q[-1] != q.shape[0] or cu_k[-1] != k.shape[0]:
        raise ShapeError(f"cu_seqlens_q ends at {cu_q[-1]} and cu_seqlens_k at {cu_k[-1]}, but q has "
                         f"total_q={q.shape[0]} rows and k total_k={k.shape[0]}: the last offset is the total")
    if window is not None and not causal:
        raise ValueError(f"window={window} needs causal=True: it counts back from the last key a query may see")


def _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, backend, block_size):
    q, k, v = (as_array(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
    cu_q, cu_k = _offsets("cu_seqlens_q", cu_seqlens_q), _offsets("cu_seqlens_k", cu_seqlens_k)
    _check(q, k, v, cu_q, cu_k, causal, window)
    mask_mod = varlen_mask_mod(cu_q, cu_k, bool(causal), window)
    kwargs = {"mask_mod": mask_mod, "enable_gqa": int(q.shape[1]) != int(k.shape[1])}
    if backend == "tiled":  # visit only the tiles of the sequences' diagonal blocks
        kwargs = {**kwargs, "block_mask": block_mask(mask_mod, None, None, int(q.shape[0]), int(k.shape[0]),
                                                     block_size=block_size)}
    heads_first = [x.swapaxes(0, 1) if not is_tensor(x) else x.transpose(0, 1) for x in (q, k, v)]
    return heads_first, kwargs


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, window=None, scale=None,
                     backend=None, empty_rows="raise", block_size=128):
    """Attention over packed sequences, with flash_attn's ``flash_attn_varlen_func`` layout and meaning.

    Parameters
    ----------
    q : array or tensor, shape (total_q, H, d_k)
    k : shape (total_k, H_kv, d_k); v : shape (total_k, H_kv, d_v)
        H divisible by H_kv (grouped-query attention when they differ).
    cu_seqlens_q, cu_seqlens_k : int32 or int64, shape (n_sequences + 1,)
        Offsets of each sequence, starting at 0 and ending at total_q (total_k).
    causal : bool
        Causal within each sequence, aligned bottom-right: query i of a sequence
        with L_q queries and L_k keys sees its keys j <= i + L_k - L_q.
    window : int, optional
        With ``causal``, each query sees at most its ``window`` most recent keys.
    scale, backend, empty_rows
        As for :func:`attnlib.attention`. With ``backend="tiled"`` a block mask of
        ``block_size`` tiles skips every tile outside the sequences.

    Returns
    -------
    shape (total_q, H, d_v), the kind of the inputs.
    """
    from .attention import attention

    (qh, kh, vh), kwargs = _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, backend, block_size)
    out = attention(qh, kh, vh, scale=scale, backend=backend, empty_rows=empty_rows, **kwargs)
    return out.transpose(0, 1) if is_tensor(out) else out.swapaxes(0, 1)


def varlen_attention_backward(q, k, v, d_out, cu_seqlens_q, cu_seqlens_k, *, causal=False, window=None,
                              scale=None, backend=None, empty_rows="raise", block_size=128):
    """``(dq, dk, dv)`` of :func:`varlen_attention` for the upstream gradient ``d_out`` (total_q, H, d_v)."""
    from .backward import attention_backward

    (qh, kh, vh), kwargs = _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, backend, block_size)
    d_out = as_array(d_out, "d_out")
    if d_out.ndim != 3:
        raise ShapeError(f"d_out must be (total_q, H, d_v) like the output, got shape {tuple(d_out.shape)}")
    d_h = d_out.transpose(0, 1) if is_tensor(d_out) else d_out.swapaxes(0, 1)
    grads = attention_backward(qh, kh, vh, d_h, scale=scale, backend=backend, empty_rows=empty_rows, **kwargs)
    return tuple(g.transpose(0, 1) if is_tensor(g) else g.swapaxes(0, 1) for g in grads)
