"""The gallery's mods inside a Triton kernel, with block skipping: FlexAttention's idea, by hand.

FlexAttention compiles each ``score_mod`` and ``mask_mod`` into its kernel.
Here the gallery of :mod:`attnlib.mods` is written into one kernel instead,
each mod switched on by a constant and fed its numbers (window, document ids,
prefix length, sink count, ALiBi slopes, cap) as arguments:

    keep = causal: j <= i                 window W: i - W < j <= i
           document: doc_q[i] == doc_k[j]  prefix P: j < P or j <= i
           sinks S, W: j <= i and (j < S or i - j < W)
           packed sequences (attnlib.varlen_attention): seq_q[i] == seq_k[j], and causal
           bottom-right within each, j <= i + shift[i] (and > that - W)     (all listed ones, and-ed)
    s    = q . k * scale;  ALiBi: s += slope[h] * (j - i);  soft cap c: s = c * tanh(s / c)

A program owns one query tile and walks only the key tiles the block mask
(:func:`attnlib.block_mask`) lists for it: first the *full* tiles, with no mask
at all, then the *partial* ones, masked entry by entry. A tile the block mask
leaves out is never loaded. The online softmax is that of :mod:`.triton_flash`;
a row with no key gets output 0 and log-sum-exp -inf, as in FlexAttention.

The backward pass walks the same lists in two kernels, as :mod:`.triton_backward`
does without mods: ``_flex_bwd_dq`` (one program per query tile, over the key
blocks listed for its query block) and ``_flex_bwd_dkdv`` (one program per key
tile, over the query blocks listed for its key block: the block mask's
``q_num_blocks`` / ``q_indices``). Each recomputes the weights from the
forward's log-sum-exp and multiplies dS by the score_mod's derivative (the soft
cap's ``1 - tanh^2``; 1 for ALiBi). A row with no key sends no gradient.
"""

import numpy as np
import torch
import triton
import triton.language as tl

from . import triton_flash

LOG2_E = triton_flash.LOG2_E
TILES = (16, 32, 64, 128, 256, 512)  # block-mask block sizes the kernel takes (a multiple of its tile)


@triton.jit
def _keep(offs_m, keys, b, T_q, T_k, DocQ, DocK, stride_doc, prefix, window, n_sinks, sink_window,
          Shift, shift_window, HAS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr,
          HAS_PREFIX: tl.constexpr, HAS_SINKS: tl.constexpr, HAS_SHIFT: tl.constexpr):
    """(BLOCK_M, BLOCK_N) booleans: the keys the gallery's mask_mods (and-ed) leave each query."""
    i = offs_m[:, None]
    j = keys[None, :]
    keep = (j < T_k) & (i < T_q)
    if HAS_CAUSAL:
        keep = keep & (j <= i)
    if HAS_WINDOW:
        keep = keep & (j <= i) & (i - j < window)
    if HAS_DOC:
        doc_q = tl.load(DocQ + b * stride_doc + offs_m, mask=offs_m < T_q, other=-1)
        doc_k = tl.load(DocK + b * stride_doc + keys, mask=keys < T_k, other=-2)
        keep = keep & (doc_q[:, None] == doc_k[None, :])
    if HAS_PREFIX:
        keep = keep & ((j < prefix) | (j <= i))
    if HAS_SINKS:
        keep = keep & (j <= i) & ((j < n_sinks) | (i - j < sink_window))
    if HAS_SHIFT:  # packed sequences: causal bottom-right within each, j <= i + shift[i]
        last = offs_m[:, None] + tl.load(Shift + offs_m, mask=offs_m < T_q, other=0)[:, None]
        keep = keep & (j <= last)
        if shift_window > 0:
            keep = keep & (j > last - shift_window)
    return keep


@triton.jit
def _flex_fwd_inner(acc, l_i, m_i, q, K, V, Idx, n_blocks, offs_m, b, slope, T_q, T_k, scale,
                    stride_kn, stride_kd, stride_vn, stride_vd,
                    DocQ, DocK, stride_doc, prefix, window, n_sinks, sink_window, cap, Shift, shift_window,
                    HEAD_DK: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_DK: tl.constexpr,
                    BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, BS: tl.constexpr, MASKED: tl.constexpr,
                    HAS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr,
                    HAS_PREFIX: tl.constexpr, HAS_SINKS: tl.constexpr, HAS_SHIFT: tl.constexpr,
                    ALIBI: tl.constexpr,
                    SOFTCAP: tl.constexpr, UPCAST: tl.constexpr, ACC_DTYPE: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    """Fold the ``n_blocks`` key blocks listed at ``Idx`` (``BS`` keys each, ``BLOCK_N`` at a time) into
    (acc, l_i, m_i)."""
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    for n in range(0, n_blocks * (BS // BLOCK_N)):
        block = tl.load(Idx + n // (BS // BLOCK_N)).to(tl.int64)  # the listed key block
        keys = block * BS + (n % (BS // BLOCK_N)) * BLOCK_N + offs_n  # (BLOCK_N,) key indices of this tile
        k = tl.load(K + offs_dk[:, None] * stride_kd + keys[None, :] * stride_kn,
                    mask=(offs_dk[:, None] < HEAD_DK) & (keys[None, :] < T_k), other=0.0)
        v = tl.load(V + keys[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                    mask=(keys[:, None] < T_k) & (offs_dv[None, :] < HEAD_DV), other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, k, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION) * scale  # natural units
        if ALIBI:
            s += slope * (keys[None, :] - offs_m[:, None]).to(ACC_DTYPE)
        if SOFTCAP:  # cap * tanh(s / cap), with tanh(x) = 1 - 2 / (exp(2x) + 1) (no libdevice needed)
            s = cap * (1.0 - 2.0 / (tl.exp(2.0 * s / cap) + 1.0))
        s = s * 1.4426950408889634  # log2 units: exp(x) == exp2(x * log2(e))
        if MASKED:
            keep = _keep(offs_m, keys, b, T_q, T_k, DocQ, DocK, stride_doc, prefix, window, n_sinks,
                         sink_window, Shift, shift_window, HAS_CAUSAL, HAS_WINDOW, HAS_DOC, HAS_PREFIX,
                         HAS_SINKS, HAS_SHIFT)
        else:  # a full tile: every key allowed (padding rows past T_q are never stored)
            keep = keys[None, :] < T_k
        s = tl.where(keep, s, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(s, 1))
        shift = tl.where(m_ij == float("-inf"), 0.0, m_ij)  # a row with no key yet: exp2(-inf) = 0
        p = tl.exp2(s - shift[:, None])
        alpha = tl.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _flex_fwd(Q, K, V, Out, Lse, KvNum, KvIdx, FullNum, FullIdx, DocQ, DocK, Prefix, Slopes, Shift,
              stride_qz, stride_qh, stride_qm, stride_qd,
              stride_kz, stride_kh, stride_kn, stride_kd,
              stride_vz, stride_vh, stride_vn, stride_vd,
              stride_oz, stride_oh, stride_om, stride_od,
              stride_nz, stride_nh, stride_iz, stride_ih, stride_doc, stride_prefix,
              H, n_kv, T_q, T_k, n_kv_blocks, scale, window, n_sinks, sink_window, cap, shift_window,
              HEAD_DK: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BS: tl.constexpr,
              HAS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
              HAS_DOC: tl.constexpr, HAS_PREFIX: tl.constexpr, HAS_SINKS: tl.constexpr, HAS_SHIFT: tl.constexpr,
              ALIBI: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr, ACC_DTYPE: tl.constexpr,
              DOT_PRECISION: tl.constexpr, SCALES_IN_MEMORY: tl.constexpr):
    """One program: query tile ``pid % n_m`` of (batch, head) ``pid // n_m``, over the key blocks the block
    mask (of ``BS`` x ``BS`` blocks; BLOCK_M and BLOCK_N divide BS) lists for the query block it lies in."""
    pid = tl.program_id(0).to(tl.int64)
    n_m = tl.cdiv(T_q, BLOCK_M)
    start_m = pid % n_m
    off_hz = pid // n_m
    if SCALES_IN_MEMORY:  # fp64: a float argument would reach the kernel as fp32
        scale = tl.load(scale)
        cap = tl.load(cap)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    b = off_z // n_kv  # the mods' batch entry and query head (grouped heads: off_z = b * n_kv + h_kv)
    head = (off_z % n_kv) * H + off_h
    Q += off_z * stride_qz + off_h * stride_qh
    K += off_z * stride_kz + off_h * stride_kh
    V += off_z * stride_vz + off_h * stride_vh
    Out += off_z * stride_oz + off_h * stride_oh
    Lse += off_hz * T_q
    q_block = start_m * BLOCK_M // BS  # this tile's query block in the block mask
    lists = b * stride_nz + head * stride_nh + q_block
    rows = b * stride_iz + head * stride_ih + q_block * n_kv_blocks
    prefix = tl.load(Prefix + b * stride_prefix) if HAS_PREFIX else 0
    slope = tl.load(Slopes + head).to(ACC_DTYPE) if ALIBI else 0.0

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_dk[None, :] * stride_qd,
                mask=(offs_m[:, None] < T_q) & (offs_dk[None, :] < HEAD_DK), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.zeros([BLOCK_M], dtype=ACC_DTYPE) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=ACC_DTYPE)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=ACC_DTYPE)
    # the full tiles: no mask; then the partial ones: the mask_mods entry by entry
    acc, l_i, m_i = _flex_fwd_inner(acc, l_i, m_i, q, K, V, FullIdx + rows, tl.load(FullNum + lists), offs_m,
                                    b, slope, T_q, T_k, scale, stride_kn, stride_kd, stride_vn, stride_vd,
                                    DocQ, DocK, stride_doc, prefix, window, n_sinks, sink_window, cap,
                                    Shift, shift_window, HEAD_DK, HEAD_DV, BLOCK_DK, BLOCK_DV, BLOCK_N, BS, False,
                                    HAS_CAUSAL, HAS_WINDOW, HAS_DOC, HAS_PREFIX, HAS_SINKS, HAS_SHIFT,
                                    ALIBI, SOFTCAP,
                                    UPCAST, ACC_DTYPE, DOT_PRECISION)
    acc, l_i, m_i = _flex_fwd_inner(acc, l_i, m_i, q, K, V, KvIdx + rows, tl.load(KvNum + lists), offs_m,
                                    b, slope, T_q, T_k, scale, stride_kn, stride_kd, stride_vn, stride_vd,
                                    DocQ, DocK, stride_doc, prefix, window, n_sinks, sink_window, cap,
                                    Shift, shift_window, HEAD_DK, HEAD_DV, BLOCK_DK, BLOCK_DV, BLOCK_N, BS, True,
                                    HAS_CAUSAL, HAS_WINDOW, HAS_DOC, HAS_PREFIX, HAS_SINKS, HAS_SHIFT,
                                    ALIBI, SOFTCAP,
                                    UPCAST, ACC_DTYPE, DOT_PRECISION)
    empty = l_i == 0.0  # a row with no key: output 0, log-sum-exp -inf
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    tl.store(Lse + offs_m, tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i))),
             mask=offs_m < T_q)
    tl.store(Out + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od, out.to(Out.dtype.element_ty),
             mask=(offs_m[:, None] < T_q) & (offs_dv[None, :] < HEAD_DV))


# ---------------------------------------------------------------- which mods the kernel runs

MASK_PRIMITIVES = ("causal", "sliding_window", "document", "prefix_lm", "attention_sinks")
SCORE_PRIMITIVES = ("alibi", "soft_cap")


def _flatten(mask_mod):
    """The gallery mask_mods and-ed in ``mask_mod`` (a list), or None if any part is something else."""
    if mask_mod is None:
        return []
    name = getattr(mask_mod, "name", None)
    if name == "and_masks":
        parts = [_flatten(m) for m in mask_mod.params["mods"]]
        return None if any(p is None for p in parts) else [m for p in parts for m in p]
    if name in MASK_PRIMITIVES and type(mask_mod).__module__ == "attnlib.mods" or getattr(
            mask_mod, "params", {}).get("varlen_tables"):
        return [mask_mod]
    return None


def kernel_spec(score_mod, mask_mod, causal, window, t_q, t_k, group):
    """The kernel's constants and numbers for these mods, or None when the kernel cannot run them (a
    user's own function, a bottom-right causal mask with T_q != T_k, a repeated mod). Grouped heads
    (``group``) are fine: the kernels are told how many key/value heads the batch dimension holds."""
    parts = _flatten(mask_mod)
    if parts is None:
        return None
    if score_mod is not None and (getattr(score_mod, "name", None) not in SCORE_PRIMITIVES
                                  or type(score_mod).__module__ != "attnlib.mods"):
        return None
    spec = {"HAS_CAUSAL": False, "HAS_WINDOW": False, "HAS_DOC": False, "HAS_PREFIX": False, "HAS_SINKS": False,
            "ALIBI": False, "SOFTCAP": False, "window": 1, "n_sinks": 0, "sink_window": 1, "cap": 1.0,
            "doc": None, "doc_k": None, "prefix": None, "slopes": None,
            "HAS_SHIFT": False, "shift": None, "shift_window": 0}
    if causal:
        if causal == "bottom-right" and t_q != t_k:
            return None
        spec["HAS_CAUSAL"] = True
        if window is not None:
            spec["HAS_WINDOW"], spec["window"] = True, window
    for mod in parts:
        name = mod.name
        if name == "causal":
            spec["HAS_CAUSAL"] = True
        elif name == "sliding_window":
            if spec["HAS_WINDOW"]:
                return None
            spec["HAS_WINDOW"], spec["window"] = True, mod.params["window"]
        elif name == "document":
            if spec["HAS_DOC"] or mod.params.get("doc_ids_k") is not None:
                return None
            spec["HAS_DOC"], spec["doc"] = True, mod.params["doc_ids"].numpy
        elif name == "prefix_lm":
            if spec["HAS_PREFIX"]:
                return None
            spec["HAS_PREFIX"], spec["prefix"] = True, np.atleast_1d(np.asarray(mod.params["prefix_length"]))
        elif name == "varlen":  # attnlib.varlen_attention's packed sequences
            if spec["HAS_DOC"] or spec["HAS_SHIFT"]:
                return None
            spec["HAS_DOC"], spec["doc"], spec["doc_k"] = True, mod.params["seq_q"], mod.params["seq_k"]
            if mod.params["causal"]:
                spec["HAS_SHIFT"], spec["shift"] = True, mod.params["shift"]
                spec["shift_window"] = mod.params["window"] or 0
        elif name == "attention_sinks":
            if spec["HAS_SINKS"]:
                return None
            spec["HAS_SINKS"], spec["n_sinks"], spec["sink_window"] = (True, mod.params["n_sinks"],
                                                                        mod.params["window"])
    if score_mod is not None:
        if score_mod.name == "alibi":
            spec["ALIBI"], spec["slopes"] = True, score_mod.params["slopes"]
        else:
            spec["SOFTCAP"], spec["cap"] = True, score_mod.params["cap"]
    if spec["HAS_DOC"]:
        spec["doc_k"] = spec["doc"] if spec["doc_k"] is None else spec["doc_k"]
        if spec["doc"].shape[-1] != t_q or spec["doc_k"].shape[-1] != t_k:
            return None
    return spec


def tile_for(dtype):
    """``(BLOCK_M, BLOCK_N, num_warps)``, the kernel's tile: 16 x 16 under the interpreter; on a GPU
    128 x 64 with 8 warps for fp16/bf16, 32 x 32 for fp32 and 16 x 16 for fp64 (the largest that
    compiled for sm_90 without a register spill with every mod on; tests/test_triton_flex.py compiles
    each). A block mask's blocks must be a multiple of the tile: smaller tiles walk each block."""
    if triton_flash.RUNS_ON_CPU:
        return 16, 16, 4
    return {torch.float16: (128, 64, 8), torch.bfloat16: (128, 64, 8), torch.float32: (32, 32, 4)}.get(
        dtype, (16, 16, 4))


BACKWARD_TILES = {  # (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel on a GPU: the largest that compiled
    # for sm_90 without a spill at d = 64 and 128 with every mod on (a sweep of 9 tiles, 2026-11-28); fp64 dQ
    # at d = 128 spills 72 bytes even at 16 x 16 (tests/test_triton_flex.py holds it to that)
    torch.float16: {"dq": (64, 32, 4, 2), "dkdv": (32, 32, 4, 2)},
    torch.bfloat16: {"dq": (64, 32, 4, 2), "dkdv": (32, 32, 4, 2)},
    torch.float32: {"dq": (16, 16, 4, 1), "dkdv": (16, 16, 4, 1)},
    torch.float64: {"dq": (16, 16, 4, 1), "dkdv": (16, 16, 4, 1)},
}


def backward_tile(dtype, kernel, block_size):
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of backward ``kernel`` ("dq" or "dkdv"), each side at
    most the block mask's block size; 16 x 16 under the interpreter."""
    block_m, block_n, warps, stages = (16, 16, 4, 1) if triton_flash.RUNS_ON_CPU else BACKWARD_TILES[dtype][kernel]
    return min(block_m, block_size), min(block_n, block_size), warps, stages


def kernel_tile(dtype, block_size):
    """The tile for a block mask of ``block_size`` blocks: :func:`tile_for`, shrunk to divide the blocks."""
    block_m, block_n, warps = tile_for(dtype)
    return min(block_m, block_size), min(block_n, block_size), warps


def _lists(array, device, dims):
    """A block-mask array as an int32 tensor on ``device``, with stride 0 over its broadcast (size-1) B and H."""
    t = torch.from_numpy(np.ascontiguousarray(array, dtype=np.int32)).to(device)
    strides = [0 if t.shape[d] == 1 else t.stride(d) for d in dims]
    return t, strides


def forward_with_lse(q4, k4, v4, spec, bm, scale, n_kv=1):
    """Run the kernel on (B, H, T, d) tensors with block mask ``bm`` (its block size is the tile);
    return ``(out, lse)``, lse in log2 units (-inf for a row with no key)."""
    n_batch, n_heads, t_q, d_k = q4.shape
    t_k, d_v = k4.shape[2], v4.shape[3]
    device = q4.device
    out_dtype = torch.float32 if triton_flash.RUNS_ON_CPU and q4.dtype == torch.bfloat16 else q4.dtype
    out = torch.empty((n_batch, n_heads, t_q, d_v), dtype=out_dtype, device=device)
    lse = torch.empty((n_batch, n_heads, t_q), dtype=torch.float64 if q4.dtype == torch.float64 else torch.float32,
                      device=device)
    block_m, block_n, warps = kernel_tile(q4.dtype, bm.block_size)
    kv_num, (snz, snh) = _lists(bm.kv_num_blocks, device, (0, 1))
    full_num, _ = _lists(bm.full_kv_num_blocks, device, (0, 1))
    kv_idx, (siz, sih) = _lists(bm.kv_indices, device, (0, 1))
    full_idx, _ = _lists(bm.full_kv_indices, device, (0, 1))
    if (kv_num.shape[0] != 1) != (full_num.shape[0] != 1):  # pragma: no cover - one BlockMask, one shape
        raise AssertionError("block mask arrays disagree")
    doc = doc_k = shift = torch.zeros(1, dtype=torch.int64, device=device)
    stride_doc = 0
    if spec["doc"] is not None:
        doc, doc_k = (torch.from_numpy(np.ascontiguousarray(spec[name], dtype=np.int64)).to(device)
                      for name in ("doc", "doc_k"))
        stride_doc = doc.stride(0) if doc.ndim == 2 else 0
    if spec["shift"] is not None:
        shift = torch.from_numpy(np.ascontiguousarray(spec["shift"], dtype=np.int64)).to(device)
    prefix = torch.zeros(1, dtype=torch.int64, device=device)
    if spec["prefix"] is not None:
        prefix = torch.from_numpy(np.ascontiguousarray(spec["prefix"], dtype=np.int64)).to(device)
    slopes = torch.zeros(1, dtype=torch.float64, device=device)
    if spec["slopes"] is not None:
        slopes = torch.from_numpy(np.ascontiguousarray(spec["slopes"], dtype=np.float64)).to(device)
    upcast, acc_dtype, dot_precision = triton_flash.kernel_dtypes(q4.dtype)
    scale_arg, cap_arg = triton_flash.scale_arguments(q4.dtype, device, scale, spec["cap"])
    grid = (triton.cdiv(t_q, block_m) * n_batch * n_heads,)
    _flex_fwd[grid](
        q4, k4, v4, out, lse, kv_num, kv_idx, full_num, full_idx, doc, doc_k, prefix, slopes, shift,
        *q4.stride(), *k4.stride(), *v4.stride(), *out.stride(),
        snz, snh, siz, sih, stride_doc, 0 if prefix.numel() == 1 else 1,
        n_heads, n_kv, t_q, t_k, bm.kv_indices.shape[-1], scale_arg, spec["window"], spec["n_sinks"],
        spec["sink_window"], cap_arg, spec["shift_window"],
        HEAD_DK=d_k, HEAD_DV=d_v, BLOCK_DK=triton_flash.padded_head_dim(d_k),
        BLOCK_DV=triton_flash.padded_head_dim(d_v), BLOCK_M=block_m, BLOCK_N=block_n, BS=bm.block_size,
        HAS_CAUSAL=spec["HAS_CAUSAL"], HAS_WINDOW=spec["HAS_WINDOW"], HAS_DOC=spec["HAS_DOC"],
        HAS_PREFIX=spec["HAS_PREFIX"], HAS_SINKS=spec["HAS_SINKS"], HAS_SHIFT=spec["HAS_SHIFT"],
        ALIBI=spec["ALIBI"], SOFTCAP=spec["SOFTCAP"],
        UPCAST=upcast, ACC_DTYPE=acc_dtype, DOT_PRECISION=dot_precision,
        SCALES_IN_MEMORY=q4.dtype == torch.float64, num_warps=warps,
    )
    return out, lse


# ---------------------------------------------------------------- the backward pass, over the same tiles

@triton.jit
def _flex_scores(q, kT, offs_m, keys, b, slope, lse, T_q, T_k, scale,
                 DocQ, DocK, stride_doc, prefix, window, n_sinks, sink_window, cap, Shift, shift_window,
                 MASKED: tl.constexpr, HAS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr,
                 HAS_PREFIX: tl.constexpr, HAS_SINKS: tl.constexpr, HAS_SHIFT: tl.constexpr,
                 ALIBI: tl.constexpr, SOFTCAP: tl.constexpr, ACC_DTYPE: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """``(P, dS/dS_raw)`` of one (BLOCK_M, BLOCK_N) tile: the forward's weights from its log-sum-exp
    (log2 units), and the score_mod's derivative (1 unless soft-capped)."""
    s = tl.dot(q, kT, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION) * scale
    if ALIBI:
        s += slope * (keys[None, :] - offs_m[:, None]).to(ACC_DTYPE)
    slope_of_mod = tl.full(s.shape, 1.0, ACC_DTYPE)
    if SOFTCAP:
        t = 1.0 - 2.0 / (tl.exp(2.0 * s / cap) + 1.0)  # tanh(s / cap)
        s = cap * t
        slope_of_mod = 1.0 - t * t
    if MASKED:
        keep = _keep(offs_m, keys, b, T_q, T_k, DocQ, DocK, stride_doc, prefix, window, n_sinks,
                     sink_window, Shift, shift_window, HAS_CAUSAL, HAS_WINDOW, HAS_DOC, HAS_PREFIX,
                     HAS_SINKS, HAS_SHIFT)
    else:
        keep = (keys[None, :] < T_k) & (offs_m[:, None] < T_q)
    p = tl.where(keep, tl.exp2(s * 1.4426950408889634 - lse[:, None]), 0.0)
    return p, slope_of_mod


@triton.jit
def _flex_bwd_dq(Q, K, V, DO, Lse, Delta, DQ, KvNum, KvIdx, FullNum, FullIdx, DocQ, DocK, Prefix, Slopes,
                 Shift,
                 stride_qz, stride_qh, stride_qm, stride_qd,
                 stride_kz, stride_kh, stride_kn, stride_kd,
                 stride_vz, stride_vh, stride_vn, stride_vd,
                 stride_doz, stride_doh, stride_dom, stride_dod,
                 stride_dqz, stride_dqh, stride_dqm, stride_dqd,
                 stride_nz, stride_nh, stride_iz, stride_ih, stride_doc, stride_prefix,
                 H, n_kv, T_q, T_k, n_kv_blocks, scale, window, n_sinks, sink_window, cap, shift_window,
                 HEAD_DK: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BS: tl.constexpr,
                 HAS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr,
                 HAS_PREFIX: tl.constexpr, HAS_SINKS: tl.constexpr, HAS_SHIFT: tl.constexpr,
                 ALIBI: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr, ACC_DTYPE: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, SCALES_IN_MEMORY: tl.constexpr):
    """One program: dQ of one query tile, over the key blocks listed for its query block."""
    pid = tl.program_id(0).to(tl.int64)
    n_m = tl.cdiv(T_q, BLOCK_M)
    start_m = pid % n_m
    off_hz = pid // n_m
    if SCALES_IN_MEMORY:
        scale = tl.load(scale)
        cap = tl.load(cap)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    b = off_z // n_kv  # the mods' batch entry and query head (grouped heads: off_z = b * n_kv + h_kv)
    head = (off_z % n_kv) * H + off_h
    Q += off_z * stride_qz + off_h * stride_qh
    K += off_z * stride_kz + off_h * stride_kh
    V += off_z * stride_vz + off_h * stride_vh
    DO += off_z * stride_doz + off_h * stride_doh
    DQ += off_z * stride_dqz + off_h * stride_dqh
    Lse += off_hz * T_q
    Delta += off_hz * T_q
    q_block = start_m * BLOCK_M // BS
    lists = b * stride_nz + head * stride_nh + q_block
    rows = b * stride_iz + head * stride_ih + q_block * n_kv_blocks
    prefix = tl.load(Prefix + b * stride_prefix) if HAS_PREFIX else 0
    slope = tl.load(Slopes + head).to(ACC_DTYPE) if ALIBI else 0.0
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    in_q = offs_m < T_q
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_dk[None, :] * stride_qd,
                mask=in_q[:, None] & (offs_dk[None, :] < HEAD_DK), other=0.0)
    do = tl.load(DO + offs_m[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                 mask=in_q[:, None] & (offs_dv[None, :] < HEAD_DV), other=0.0)
    lse = tl.load(Lse + offs_m, mask=in_q, other=0.0)
    delta = tl.load(Delta + offs_m, mask=in_q, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    dq = tl.zeros([BLOCK_M, BLOCK_DK], dtype=ACC_DTYPE)
    for stage in tl.static_range(2):  # the full key blocks, then the partial ones
        Idx = (FullIdx if stage == 0 else KvIdx) + rows
        n_blocks = tl.load((FullNum if stage == 0 else KvNum) + lists)
        for n in range(0, n_blocks * (BS // BLOCK_N)):
            keys = tl.load(Idx + n // (BS // BLOCK_N)).to(tl.int64) * BS + (n % (BS // BLOCK_N)) * BLOCK_N + offs_n
            in_k = keys < T_k
            kT = tl.load(K + offs_dk[:, None] * stride_kd + keys[None, :] * stride_kn,
                         mask=(offs_dk[:, None] < HEAD_DK) & in_k[None, :], other=0.0)
            vT = tl.load(V + offs_dv[:, None] * stride_vd + keys[None, :] * stride_vn,
                         mask=(offs_dv[:, None] < HEAD_DV) & in_k[None, :], other=0.0)
            if UPCAST:
                kT = kT.to(tl.float32)
                vT = vT.to(tl.float32)
            p, mod_slope = _flex_scores(q, kT, offs_m, keys, b, slope, lse, T_q, T_k, scale,
                                        DocQ, DocK, stride_doc, prefix, window, n_sinks, sink_window, cap,
                                        Shift, shift_window, stage == 1, HAS_CAUSAL, HAS_WINDOW, HAS_DOC,
                                        HAS_PREFIX, HAS_SINKS, HAS_SHIFT, ALIBI, SOFTCAP, ACC_DTYPE,
                                        DOT_PRECISION)
            dp = tl.dot(do, vT, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
            ds = p * (dp - delta[:, None]) * mod_slope  # dS of the raw scores
            dq = tl.dot(ds.to(kT.dtype), tl.trans(kT), dq, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
    dq *= scale
    tl.store(DQ + offs_m[:, None] * stride_dqm + offs_dk[None, :] * stride_dqd, dq.to(DQ.dtype.element_ty),
             mask=in_q[:, None] & (offs_dk[None, :] < HEAD_DK))


@triton.jit
def _flex_bwd_dkdv(Q, K, V, DO, Lse, Delta, DK, DV, QNum, QIdx, FullNum, FullIdx, DocQ, DocK, Prefix, Slopes,
                   Shift,
                   stride_qz, stride_qh, stride_qm, stride_qd,
                   stride_kz, stride_kh, stride_kn, stride_kd,
                   stride_vz, stride_vh, stride_vn, stride_vd,
                   stride_doz, stride_doh, stride_dom, stride_dod,
                   stride_dkz, stride_dkh, stride_dkn, stride_dkd,
                   stride_dvz, stride_dvh, stride_dvn, stride_dvd,
                   stride_nz, stride_nh, stride_iz, stride_ih, stride_doc, stride_prefix,
                   H, n_kv, T_q, T_k, n_q_blocks, scale, window, n_sinks, sink_window, cap, shift_window,
                   HEAD_DK: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_DK: tl.constexpr,
                   BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BS: tl.constexpr,
                   HAS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr,
                   HAS_PREFIX: tl.constexpr, HAS_SINKS: tl.constexpr, HAS_SHIFT: tl.constexpr,
                   ALIBI: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr, ACC_DTYPE: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, SCALES_IN_MEMORY: tl.constexpr):
    """One program: dK and dV of one key tile, over the query blocks listed for its key block."""
    pid = tl.program_id(0).to(tl.int64)
    n_n = tl.cdiv(T_k, BLOCK_N)
    start_n = pid % n_n
    off_hz = pid // n_n
    if SCALES_IN_MEMORY:
        scale = tl.load(scale)
        cap = tl.load(cap)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    b = off_z // n_kv  # the mods' batch entry and query head (grouped heads: off_z = b * n_kv + h_kv)
    head = (off_z % n_kv) * H + off_h
    Q += off_z * stride_qz + off_h * stride_qh
    K += off_z * stride_kz + off_h * stride_kh
    V += off_z * stride_vz + off_h * stride_vh
    DO += off_z * stride_doz + off_h * stride_doh
    DK += off_z * stride_dkz + off_h * stride_dkh
    DV += off_z * stride_dvz + off_h * stride_dvh
    Lse += off_hz * T_q
    Delta += off_hz * T_q
    k_block = start_n * BLOCK_N // BS
    lists = b * stride_nz + head * stride_nh + k_block
    cols = b * stride_iz + head * stride_ih + k_block * n_q_blocks
    prefix = tl.load(Prefix + b * stride_prefix) if HAS_PREFIX else 0
    slope = tl.load(Slopes + head).to(ACC_DTYPE) if ALIBI else 0.0
    keys = start_n * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M).to(tl.int64)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    in_k = keys < T_k
    kT = tl.load(K + offs_dk[:, None] * stride_kd + keys[None, :] * stride_kn,
                 mask=(offs_dk[:, None] < HEAD_DK) & in_k[None, :], other=0.0)
    v = tl.load(V + keys[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                mask=in_k[:, None] & (offs_dv[None, :] < HEAD_DV), other=0.0)
    if UPCAST:
        kT = kT.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_DK], dtype=ACC_DTYPE)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=ACC_DTYPE)
    for stage in tl.static_range(2):  # the query blocks that see this key block whole, then the partial ones
        Idx = (FullIdx if stage == 0 else QIdx) + cols
        n_blocks = tl.load((FullNum if stage == 0 else QNum) + lists)
        for n in range(0, n_blocks * (BS // BLOCK_M)):
            rows = tl.load(Idx + n // (BS // BLOCK_M)).to(tl.int64) * BS + (n % (BS // BLOCK_M)) * BLOCK_M + offs_m
            in_q = rows < T_q
            q = tl.load(Q + rows[:, None] * stride_qm + offs_dk[None, :] * stride_qd,
                        mask=in_q[:, None] & (offs_dk[None, :] < HEAD_DK), other=0.0)
            do = tl.load(DO + rows[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                         mask=in_q[:, None] & (offs_dv[None, :] < HEAD_DV), other=0.0)
            lse = tl.load(Lse + rows, mask=in_q, other=0.0)
            delta = tl.load(Delta + rows, mask=in_q, other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
                do = do.to(tl.float32)
            p, mod_slope = _flex_scores(q, kT, rows, keys, b, slope, lse, T_q, T_k, scale,
                                        DocQ, DocK, stride_doc, prefix, window, n_sinks, sink_window, cap,
                                        Shift, shift_window, stage == 1, HAS_CAUSAL, HAS_WINDOW, HAS_DOC,
                                        HAS_PREFIX, HAS_SINKS, HAS_SHIFT, ALIBI, SOFTCAP, ACC_DTYPE,
                                        DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
            dv = tl.dot(tl.trans(p).to(do.dtype), do, dv, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
            dp = tl.dot(do, tl.trans(v), out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
            ds = p * (dp - delta[:, None]) * mod_slope
            dk = tl.dot(tl.trans(ds).to(q.dtype), q, dk, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
    dk *= scale
    tl.store(DK + keys[:, None] * stride_dkn + offs_dk[None, :] * stride_dkd, dk.to(DK.dtype.element_ty),
             mask=in_k[:, None] & (offs_dk[None, :] < HEAD_DK))
    tl.store(DV + keys[:, None] * stride_dvn + offs_dv[None, :] * stride_dvd, dv.to(DV.dtype.element_ty),
             mask=in_k[:, None] & (offs_dv[None, :] < HEAD_DV))


def _tables(spec, device):
    """The mods' tables as kernel arguments: doc_q, doc_k, prefix, slopes, shift, and the two strides."""
    def tensor(x, dtype):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=dtype)).to(device)

    zeros = torch.zeros(1, dtype=torch.int64, device=device)
    doc = tensor(spec["doc"], np.int64) if spec["doc"] is not None else zeros
    doc_k = tensor(spec["doc_k"], np.int64) if spec["doc"] is not None else zeros
    prefix = tensor(spec["prefix"], np.int64) if spec["prefix"] is not None else zeros
    slopes = tensor(spec["slopes"], np.float64) if spec["slopes"] is not None else zeros.double()
    shift = tensor(spec["shift"], np.int64) if spec["shift"] is not None else zeros
    stride_doc = doc.stride(0) if doc.ndim == 2 else 0
    return (doc, doc_k, prefix, slopes, shift), (stride_doc, 0 if prefix.numel() == 1 else 1)


def grads_from_lse(q4, k4, v4, out, lse, d_out4, spec, bm, scale, n_kv=1):
    """``(dq, dk, dv)``, each (B, H, T, d), from the forward's output and log-sum-exp, over the tiles the
    block mask lists; a row with no key (lse -inf) sends no gradient."""
    n_batch, n_heads, t_q, d_k = q4.shape
    t_k, d_v = k4.shape[2], v4.shape[3]
    device = q4.device
    empty = lse == float("-inf")
    lse = lse.masked_fill(empty, 0.0).contiguous()
    d_out4 = d_out4.masked_fill(empty[..., None], 0.0)
    delta = (d_out4.to(lse.dtype) * out.to(lse.dtype)).sum(-1).contiguous()
    grad_dtype = torch.float32 if triton_flash.RUNS_ON_CPU and q4.dtype == torch.bfloat16 else q4.dtype
    tables, (stride_doc, stride_prefix) = _tables(spec, device)
    upcast, acc_dtype, dot_precision = triton_flash.kernel_dtypes(q4.dtype)
    scale_arg, cap_arg = triton_flash.scale_arguments(q4.dtype, device, scale, spec["cap"])
    numbers = (n_heads, n_kv, t_q, t_k)
    after = (scale_arg, spec["window"], spec["n_sinks"], spec["sink_window"], cap_arg, spec["shift_window"])
    constants = dict(
        HEAD_DK=d_k, HEAD_DV=d_v, BLOCK_DK=triton_flash.padded_head_dim(d_k),
        BLOCK_DV=triton_flash.padded_head_dim(d_v), BS=bm.block_size,
        HAS_CAUSAL=spec["HAS_CAUSAL"], HAS_WINDOW=spec["HAS_WINDOW"], HAS_DOC=spec["HAS_DOC"],
        HAS_PREFIX=spec["HAS_PREFIX"], HAS_SINKS=spec["HAS_SINKS"], HAS_SHIFT=spec["HAS_SHIFT"],
        ALIBI=spec["ALIBI"], SOFTCAP=spec["SOFTCAP"], UPCAST=upcast, ACC_DTYPE=acc_dtype,
        DOT_PRECISION=dot_precision, SCALES_IN_MEMORY=q4.dtype == torch.float64)

    def tile(kernel):
        block_m, block_n, warps, stages = backward_tile(q4.dtype, kernel, bm.block_size)
        return block_m, block_n, dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)

    dq = torch.empty((n_batch, n_heads, t_q, d_k), dtype=grad_dtype, device=device)
    kv_num, (snz, snh) = _lists(bm.kv_num_blocks, device, (0, 1))
    kv_idx, (siz, sih) = _lists(bm.kv_indices, device, (0, 1))
    full_num, _ = _lists(bm.full_kv_num_blocks, device, (0, 1))
    full_idx, _ = _lists(bm.full_kv_indices, device, (0, 1))
    block_m, _, options = tile("dq")
    _flex_bwd_dq[(triton.cdiv(t_q, block_m) * n_batch * n_heads,)](
        q4, k4, v4, d_out4, lse, delta, dq, kv_num, kv_idx, full_num, full_idx, *tables,
        *q4.stride(), *k4.stride(), *v4.stride(), *d_out4.stride(), *dq.stride(),
        snz, snh, siz, sih, stride_doc, stride_prefix, *numbers, bm.kv_indices.shape[-1], *after, **constants,
        **options)
    dk = torch.empty((n_batch, n_heads, t_k, d_k), dtype=grad_dtype, device=device)
    dv = torch.empty((n_batch, n_heads, t_k, d_v), dtype=grad_dtype, device=device)
    q_num, (snz, snh) = _lists(bm.q_num_blocks, device, (0, 1))
    q_idx, (siz, sih) = _lists(bm.q_indices, device, (0, 1))
    full_q_num, _ = _lists(bm.full_q_num_blocks, device, (0, 1))
    full_q_idx, _ = _lists(bm.full_q_indices, device, (0, 1))
    _, block_n, options = tile("dkdv")
    _flex_bwd_dkdv[(triton.cdiv(t_k, block_n) * n_batch * n_heads,)](
        q4, k4, v4, d_out4, lse, delta, dk, dv, q_num, q_idx, full_q_num, full_q_idx, *tables,
        *q4.stride(), *k4.stride(), *v4.stride(), *d_out4.stride(), *dk.stride(), *dv.stride(),
        snz, snh, siz, sih, stride_doc, stride_prefix, *numbers, bm.q_indices.shape[-1], *after, **constants,
        **options)
    return dq, dk, dv
