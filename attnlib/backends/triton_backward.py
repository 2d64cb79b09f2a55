"""FlashAttention-2 backward pass, written from scratch in Triton.

Algorithm (Dao 2023, "FlashAttention-2", Algorithm 2), shaped like the backward
of Triton's fused-attention tutorial. The forward (:mod:`.triton_flash`) saved
the output O and each query row's log-sum-exp ``lse`` (in log2 units), not the
weights. With ``delta_i = rowsum(dO * O)_i``, any tile of weights comes back in
one step, ``P = exp2(q . k * qk_scale - lse)``, and

    dV_j = sum_i P_ij^T dO_i           dP = dO V^T
    dS   = P * (dP - delta)            dQ = scale * dS K      dK = scale * dS^T Q

Two kernels, so that no two programs ever add into the same memory:

- ``_attn_bwd_dkdv``: one program per tile of ``BLOCK_N`` keys of one (batch,
  head). It keeps k, v, dk and dv in registers and walks over the query tiles
  (``_attn_bwd_dkdv_inner``), accumulating ``dV += P^T dO`` and ``dK += dS^T Q``.
- ``_attn_bwd_dq``: one program per tile of ``BLOCK_M`` queries. It keeps q, dO
  and dq and walks over the key tiles (``_attn_bwd_dq_inner``), accumulating
  ``dQ += dS K``.

FlashAttention-2's paper kernel instead adds each key tile's share of dQ into
memory with atomic adds from the dK/dV programs; that needs dQ in fp32 and
gives sums whose rounding depends on the order the programs run in. The second
kernel recomputes P and dP once more (7 tile products where the paper's loop
does 5) and gives the same bits on every run.

As in the forward, tiles are visited in two stages: whole tiles with no mask
(the scale folded into one multiply-add with ``lse``), then the tiles that
cross the causal diagonal, the ragged ones and every tile under a caller's
mask; with ``causal``, tiles that no query may see are never loaded, for both
alignments (key j is visible to query i iff ``j <= i + offset``). Row offsets are
int64. dO and O enter as ``delta``, computed by torch before the kernels run.

The autograd Function that joins the forward kernel and these kernels lives in
:mod:`.triton_autograd`, which imports both kernel files; this file imports only
the forward's helpers (:mod:`.triton_flash`), so each kernel file reads alone.
"""

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from . import triton_flash
from ..masks import causal_offset
from .triton_flash import (
    _as_4d,
    _check_supported,
    choose_kernel,
    forward_with_lse,
    kernel_dtypes,
    mask_arguments,
    padded_head_dim,
    scale_arguments,
)

ARRAY_KIND = "torch"


@triton.jit
def _attn_bwd_dkdv_inner(dk, dv, k, v, Q, DO, Lse, Delta, Mask, offs_n, lo, hi,
                         T_q, T_k, offset, qk_scale,
                         stride_qm, stride_qd, stride_dom, stride_dod, stride_mm, stride_mn,
                         HEAD_DK: tl.constexpr, HEAD_DV: tl.constexpr,
                         BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                         MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
                         UPCAST: tl.constexpr, ACC_DTYPE: tl.constexpr,
                         DOT_PRECISION: tl.constexpr):
    """Fold query tiles ``lo, lo + BLOCK_M, ..., < hi`` into (dk, dv) of one key tile."""
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M).to(tl.int64)  # (BLOCK_M,) query indices
        in_q = rows < T_q
        # Q^T tile (BLOCK_DK, BLOCK_M), dO tile (BLOCK_M, BLOCK_DV); out of range reads 0
        qT = tl.load(Q + offs_dk[:, None] * stride_qd + rows[None, :] * stride_qm,
                     mask=(offs_dk[:, None] < HEAD_DK) & in_q[None, :], other=0.0)
        do = tl.load(DO + rows[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                     mask=in_q[:, None] & (offs_dv[None, :] < HEAD_DV), other=0.0)
        lse = tl.load(Lse + rows, mask=in_q, other=0.0)
        delta = tl.load(Delta + rows, mask=in_q, other=0.0)
        if UPCAST:  # the interpreter has no bf16 arithmetic
            qT = qT.to(tl.float32)
            do = do.to(tl.float32)
        # (BLOCK_N, BLOCK_DK) @ (BLOCK_DK, BLOCK_M) -> (BLOCK_N, BLOCK_M): scores, transposed
        qkT = tl.dot(k, qT, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
        if MASKED:
            keep = (offs_n[:, None] < T_k) & in_q[None, :]
            if CAUSAL:
                keep = keep & (offs_n[:, None] <= rows[None, :] + offset)  # j <= i + offset
            mask_ptrs = Mask + rows[None, :] * stride_mm + offs_n[:, None] * stride_mn
            if MASK_KIND == 1:  # boolean, stored as uint8: nonzero = may attend
                keep = keep & (tl.load(mask_ptrs, mask=keep, other=0) != 0)
            qkT = tl.where(keep, qkT * qk_scale, float("-inf"))
            if MASK_KIND == 2:  # additive, in natural-log units like the scores
                qkT += tl.load(mask_ptrs, mask=keep, other=0.0).to(ACC_DTYPE) * 1.4426950408889634
            pT = tl.exp2(qkT - lse[None, :])
        else:  # keys past T_k read as 0; their rows of dk and dv are never stored
            pT = tl.exp2(qkT * qk_scale - lse[None, :])  # P^T, the forward's weights
        # dV += P^T dO: (BLOCK_N, BLOCK_M) @ (BLOCK_M, BLOCK_DV)
        dv = tl.dot(pT.to(do.dtype), do, dv, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
        # dP^T = V dO^T: (BLOCK_N, BLOCK_DV) @ (BLOCK_DV, BLOCK_M)
        dpT = tl.dot(v, tl.trans(do), out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
        dsT = pT * (dpT - delta[None, :])  # dS^T, (BLOCK_N, BLOCK_M)
        # dK += dS^T Q: (BLOCK_N, BLOCK_M) @ (BLOCK_M, BLOCK_DK); the scale comes at the end
        dk = tl.dot(dsT.to(qT.dtype), tl.trans(qT), dk, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(
    Q, K, V, DO, Lse, Delta, Mask, DK, DV,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_doz, stride_doh, stride_dom, stride_dod,
    stride_mz, stride_mh, stride_mm, stride_mn,
    stride_dkz, stride_dkh, stride_dkn, stride_dkd,
    stride_dvz, stride_dvh, stride_dvn, stride_dvd,
    H, T_q, T_k, offset, qk_scale, scale,
    T_Q_BUCKET, T_K_BUCKET,  # next powers of two of T_q and T_k: read by the autotuner only
    HEAD_DK: tl.constexpr, HEAD_DV: tl.constexpr,
    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
    UPCAST: tl.constexpr, ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SCALES_IN_MEMORY: tl.constexpr,
):
    """One program: dK and dV of key tile ``pid % n_n`` of (batch, head) ``pid // n_n``."""
    pid = tl.program_id(0).to(tl.int64)  # a 1-D grid: B * H may exceed the 65,535 of grid axis 1
    n_n = tl.cdiv(T_k, BLOCK_N)
    start_n = pid % n_n
    off_hz = pid // n_n
    if SCALES_IN_MEMORY:  # fp64: a float argument would reach the kernel as fp32
        qk_scale = tl.load(qk_scale)
        scale = tl.load(scale)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    Q += off_z * stride_qz + off_h * stride_qh
    K += off_z * stride_kz + off_h * stride_kh
    V += off_z * stride_vz + off_h * stride_vh
    DO += off_z * stride_doz + off_h * stride_doh
    Mask += off_z * stride_mz + off_h * stride_mh
    DK += off_z * stride_dkz + off_h * stride_dkh
    DV += off_z * stride_dvz + off_h * stride_dvh
    Lse += off_hz.to(tl.int64) * T_q
    Delta += off_hz.to(tl.int64) * T_q

    n0 = start_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N).to(tl.int64)  # (BLOCK_N,) key indices of this tile
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    in_k = offs_n < T_k
    k = tl.load(K + offs_n[:, None] * stride_kn + offs_dk[None, :] * stride_kd,
                mask=in_k[:, None] & (offs_dk[None, :] < HEAD_DK), other=0.0)
    v = tl.load(V + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                mask=in_k[:, None] & (offs_dv[None, :] < HEAD_DV), other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_DK], dtype=ACC_DTYPE)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=ACC_DTYPE)

    q_whole = (T_q // BLOCK_M) * BLOCK_M  # query tiles before this one have no padding row
    if CAUSAL:  # query i sees key j iff i >= j - offset
        lo = (tl.maximum(n0 - offset, 0) // BLOCK_M) * BLOCK_M  # earlier queries: skipped
        m_whole = (tl.maximum(n0 + BLOCK_N - 1 - offset, 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    else:
        lo = 0
        m_whole = 0  # from here on, every query sees the whole key tile
    if MASK_KIND != 0:
        m_whole = q_whole  # a caller's mask is applied to every tile
    mid = tl.maximum(lo, tl.minimum(m_whole, q_whole))

    # stage 1: query tiles that cross the diagonal (or every tile under a mask)
    dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, Q, DO, Lse, Delta, Mask, offs_n, lo, mid,
                                  T_q, T_k, offset, qk_scale,
                                  stride_qm, stride_qd, stride_dom, stride_dod, stride_mm, stride_mn,
                                  HEAD_DK, HEAD_DV, BLOCK_DK, BLOCK_DV, BLOCK_M,
                                  True, CAUSAL, MASK_KIND, UPCAST, ACC_DTYPE, DOT_PRECISION)
    # stage 2: query tiles that see the whole key tile, no masking
    dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, Q, DO, Lse, Delta, Mask, offs_n, mid, q_whole,
                                  T_q, T_k, offset, qk_scale,
                                  stride_qm, stride_qd, stride_dom, stride_dod, stride_mm, stride_mn,
                                  HEAD_DK, HEAD_DV, BLOCK_DK, BLOCK_DV, BLOCK_M,
                                  False, CAUSAL, MASK_KIND, UPCAST, ACC_DTYPE, DOT_PRECISION)
    # stage 3: the ragged last query tile
    dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, Q, DO, Lse, Delta, Mask, offs_n,
                                  tl.maximum(mid, q_whole), T_q,
                                  T_q, T_k, offset, qk_scale,
                                  stride_qm, stride_qd, stride_dom, stride_dod, stride_mm, stride_mn,
                                  HEAD_DK, HEAD_DV, BLOCK_DK, BLOCK_DV, BLOCK_M,
                                  True, CAUSAL, MASK_KIND, UPCAST, ACC_DTYPE, DOT_PRECISION)

    dk *= scale  # dK = scale * dS^T Q
    tl.store(DK + offs_n[:, None] * stride_dkn + offs_dk[None, :] * stride_dkd,
             dk.to(DK.dtype.element_ty), mask=in_k[:, None] & (offs_dk[None, :] < HEAD_DK))
    tl.store(DV + offs_n[:, None] * stride_dvn + offs_dv[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=in_k[:, None] & (offs_dv[None, :] < HEAD_DV))


@triton.jit
def _attn_bwd_dq_inner(dq, q, do, lse, delta, K, V, Mask, offs_m, lo, hi,
                       T_q, T_k, offset, qk_scale,
                       stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn,
                       HEAD_DK: tl.constexpr, HEAD_DV: tl.constexpr,
                       BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
                       MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
                       UPCAST: tl.constexpr, ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold key tiles ``lo, lo + BLOCK_N, ..., < hi`` into dq of one query tile."""
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)  # int64: keys * stride_kn may pass 2**31
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_n in range(lo, hi, BLOCK_N):
        keys = start_n + offs_n  # (BLOCK_N,) key indices of this tile
        in_k = keys < T_k
        # K^T tile (BLOCK_DK, BLOCK_N) and V^T tile (BLOCK_DV, BLOCK_N); out of range reads 0
        kT = tl.load(K + offs_dk[:, None] * stride_kd + keys[None, :] * stride_kn,
                     mask=(offs_dk[:, None] < HEAD_DK) & in_k[None, :], other=0.0)
        vT = tl.load(V + offs_dv[:, None] * stride_vd + keys[None, :] * stride_vn,
                     mask=(offs_dv[:, None] < HEAD_DV) & in_k[None, :], other=0.0)
        if UPCAST:
            kT = kT.to(tl.float32)
            vT = vT.to(tl.float32)
        qk = tl.dot(q, kT, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        if MASKED:
            keep = in_k[None, :] & (offs_m[:, None] < T_q)
            if CAUSAL:
                keep = keep & (keys[None, :] <= offs_m[:, None] + offset)  # j <= i + offset
            mask_ptrs = Mask + offs_m[:, None] * stride_mm + keys[None, :] * stride_mn
            if MASK_KIND == 1:
                keep = keep & (tl.load(mask_ptrs, mask=keep, other=0) != 0)
            qk = tl.where(keep, qk * qk_scale, float("-inf"))
            if MASK_KIND == 2:
                qk += tl.load(mask_ptrs, mask=keep, other=0.0).to(ACC_DTYPE) * 1.4426950408889634
            p = tl.exp2(qk - lse[:, None])
        else:
            p = tl.exp2(qk * qk_scale - lse[:, None])  # P, the forward's weights
        # dP = dO V^T: (BLOCK_M, BLOCK_DV) @ (BLOCK_DV, BLOCK_N)
        dp = tl.dot(do, vT, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])  # dS, (BLOCK_M, BLOCK_N)
        # dQ += dS K: (BLOCK_M, BLOCK_N) @ (BLOCK_N, BLOCK_DK); the scale comes at the end
        dq = tl.dot(ds.to(kT.dtype), tl.trans(kT), dq, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _attn_bwd_dq(
    Q, K, V, DO, Lse, Delta, Mask, DQ,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_doz, stride_doh, stride_dom, stride_dod,
    stride_mz, stride_mh, stride_mm, stride_mn,
    stride_dqz, stride_dqh, stride_dqm, stride_dqd,
    H, T_q, T_k, offset, qk_scale, scale,
    T_Q_BUCKET, T_K_BUCKET,  # next powers of two of T_q and T_k: read by the autotuner only
    HEAD_DK: tl.constexpr, HEAD_DV: tl.constexpr,
    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
    UPCAST: tl.constexpr, ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SCALES_IN_MEMORY: tl.constexpr,
):
    """One program: dQ of query tile ``pid % n_m`` of (batch, head) ``pid // n_m``."""
    pid = tl.program_id(0).to(tl.int64)  # a 1-D grid: B * H may exceed the 65,535 of grid axis 1
    n_m = tl.cdiv(T_q, BLOCK_M)
    start_m = pid % n_m
    off_hz = pid // n_m
    if SCALES_IN_MEMORY:  # fp64: a float argument would reach the kernel as fp32
        qk_scale = tl.load(qk_scale)
        scale = tl.load(scale)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    Q += off_z * stride_qz + off_h * stride_qh
    K += off_z * stride_kz + off_h * stride_kh
    V += off_z * stride_vz + off_h * stride_vh
    DO += off_z * stride_doz + off_h * stride_doh
    Mask += off_z * stride_mz + off_h * stride_mh
    DQ += off_z * stride_dqz + off_h * stride_dqh
    Lse += off_hz.to(tl.int64) * T_q
    Delta += off_hz.to(tl.int64) * T_q

    m0 = start_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M).to(tl.int64)  # (BLOCK_M,) query indices of this tile
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

    if CAUSAL:  # as in the forward: later key tiles are never loaded
        hi = tl.minimum(T_k, m0 + BLOCK_M + offset)
        n_whole = tl.minimum((m0 + offset + 1) // BLOCK_N, T_k // BLOCK_N) * BLOCK_N
    else:
        hi = T_k
        n_whole = (T_k // BLOCK_N) * BLOCK_N
    if MASK_KIND != 0:
        n_whole = 0

    # stage 1: key tiles every query of the tile sees whole; stage 2: the rest
    dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, K, V, Mask, offs_m, 0, n_whole,
                            T_q, T_k, offset, qk_scale,
                            stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn,
                            HEAD_DK, HEAD_DV, BLOCK_DK, BLOCK_DV, BLOCK_N,
                            False, CAUSAL, MASK_KIND, UPCAST, ACC_DTYPE, DOT_PRECISION)
    dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, K, V, Mask, offs_m, n_whole, hi,
                            T_q, T_k, offset, qk_scale,
                            stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn,
                            HEAD_DK, HEAD_DV, BLOCK_DK, BLOCK_DV, BLOCK_N,
                            True, CAUSAL, MASK_KIND, UPCAST, ACC_DTYPE, DOT_PRECISION)

    dq *= scale  # dQ = scale * dS K
    tl.store(DQ + offs_m[:, None] * stride_dqm + offs_dk[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=in_q[:, None] & (offs_dk[None, :] < HEAD_DK))


# On a GPU: tile shapes to tune among. The dK/dV programs hold a tall key tile and
# step through short query tiles; the dQ programs the other way round. As in the
# forward (triton_flash.FWD_TILES): (config, largest padded head dim, "tc", "fp32" or "any").
# The 16 x 32 dK/dV tile spilled 24-120 bytes in fp64 at d = 64 under Triton 3.6: "fp32".
# The 32 x 64 dK/dV tile spills at causal d = 128 (56 bytes under Triton 3.6, 8-64 under
# 3.9), so it stops at d = 64, although on an H200 under 3.6 it ran causal fwd+bwd at
# B=4, H=32, d=128, T=16384 in 0.91 of SDPA-flash's time where 32 x 128 with 8 warps took
# 1.01 (tools/gpu_dkdv_tiles.py, attnlib/data/gpu/h200/dkdv_tiles_d128.csv; no difference
# without a mask). A per-mask head-dim limit would win that 10 % back.
DKDV_TILES = [
    (triton.Config({"BLOCK_M": 32, "BLOCK_N": 128}, num_warps=8, num_stages=3), 128, "tc"),
    (triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4, num_stages=3), 64, "tc"),
    (triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=2), 64, "tc"),
    (triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=8, num_stages=2), 64, "tc"),
    (triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2), 32, "any"),
    (triton.Config({"BLOCK_M": 16, "BLOCK_N": 32}, num_warps=4, num_stages=1), 64, "fp32"),
    (triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=8, num_stages=1), 128, "any"),
]
DQ_TILES = [
    (triton.Config({"BLOCK_M": 128, "BLOCK_N": 32}, num_warps=8, num_stages=3), 128, "tc"),
    (triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=3), 128, "tc"),
    (triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=2), 128, "tc"),
    (triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=2), 128, "tc"),
    (triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2), 64, "any"),
    (triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=8, num_stages=1), 128, "any"),
]
DKDV_CONFIGS = [config for config, _, _ in DKDV_TILES]
DQ_CONFIGS = [config for config, _, _ in DQ_TILES]
_attn_bwd_dkdv_tuned = triton.autotune(
    configs=DKDV_CONFIGS, key=triton_flash.AUTOTUNE_KEY,
    prune_configs_by={"early_config_prune": triton_flash.pruner(DKDV_TILES)})(_attn_bwd_dkdv)
_attn_bwd_dq_tuned = triton.autotune(
    configs=DQ_CONFIGS, key=triton_flash.AUTOTUNE_KEY,
    prune_configs_by={"early_config_prune": triton_flash.pruner(DQ_TILES)})(_attn_bwd_dq)
SMALL_PROBLEM_TILES = {  # one fixed tile each on a GPU below triton_flash.AUTOTUNE_MIN_SCORES
    "dkdv": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    "dq": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
}

RUNS_ON_CPU = isinstance(_attn_bwd_dq, InterpretedFunction)


def _check_same_mode():
    if RUNS_ON_CPU != triton_flash.RUNS_ON_CPU:
        raise RuntimeError(
            "attnlib.backends.triton_flash and triton_backward were imported with different "
            "TRITON_INTERPRET settings; set TRITON_INTERPRET before either is first imported"
        )


def grads_from_lse(q4, k4, v4, out, lse, d_out, mask, causal, scale, batch_shape, tiles=None,
                   need_dq=True):
    """Run the backward kernels on (B, H, T, d) tensors; return ``(dq, dk, dv)``, each (B, H, T, d).

    ``out`` and ``lse`` are the forward's (:func:`.triton_flash.forward_with_lse`);
    ``tiles``, optionally, ``{"dkdv": {"BLOCK_M": .., "BLOCK_N": ..}, "dq": {...}}``.
    ``dq`` is None when ``need_dq`` is False (the dQ kernel is not launched).
    """
    _check_same_mode()
    n_batch, n_heads, t_q, d_k = q4.shape
    t_k, d_v = k4.shape[2], v4.shape[3]
    tiles = tiles or {}
    grad_dtype = torch.float32 if RUNS_ON_CPU and q4.dtype == torch.bfloat16 else q4.dtype
    d_out = _as_4d(d_out, batch_shape)
    delta = (d_out.to(lse.dtype) * out.to(lse.dtype)).sum(-1).contiguous()  # (B, H, T_q)
    lse = lse.contiguous()
    mask_kind, mask4, mask_strides = mask_arguments(mask, batch_shape, t_q, t_k, like=q4)
    upcast, acc_dtype, dot_precision = kernel_dtypes(q4.dtype)
    common = dict(
        HEAD_DK=d_k, HEAD_DV=d_v, BLOCK_DK=padded_head_dim(d_k), BLOCK_DV=padded_head_dim(d_v),
        CAUSAL=bool(causal), MASK_KIND=mask_kind,
        UPCAST=upcast, ACC_DTYPE=acc_dtype, DOT_PRECISION=dot_precision,
        SCALES_IN_MEMORY=q4.dtype == torch.float64,
    )
    sizes = (n_heads, t_q, t_k, causal_offset(t_q, t_k, causal) if causal else 0,
             *scale_arguments(q4.dtype, q4.device, scale * triton_flash.LOG2_E, scale),
             triton.next_power_of_2(t_q), triton.next_power_of_2(t_k))

    dk = torch.empty((n_batch, n_heads, t_k, d_k), dtype=grad_dtype, device=q4.device)
    dv = torch.empty((n_batch, n_heads, t_k, d_v), dtype=grad_dtype, device=q4.device)
    kernel, options = choose_kernel(_attn_bwd_dkdv, _attn_bwd_dkdv_tuned, t_q, t_k, tiles.get("dkdv"),
                                    SMALL_PROBLEM_TILES["dkdv"])
    triton_flash.launch(
        "dkdv", kernel, lambda meta: (triton.cdiv(t_k, meta["BLOCK_N"]) * n_batch * n_heads,),
        (q4, k4, v4, d_out, lse, delta, mask4, dk, dv,
         *q4.stride(), *k4.stride(), *v4.stride(), *d_out.stride(), *mask_strides,
         *dk.stride(), *dv.stride(), *sizes), common, options, tiles.get("dkdv"))
    if not need_dq:
        return None, dk, dv
    dq = torch.empty((n_batch, n_heads, t_q, d_k), dtype=grad_dtype, device=q4.device)
    kernel, options = choose_kernel(_attn_bwd_dq, _attn_bwd_dq_tuned, t_q, t_k, tiles.get("dq"),
                                    SMALL_PROBLEM_TILES["dq"])
    triton_flash.launch(
        "dq", kernel, lambda meta: (triton.cdiv(t_q, meta["BLOCK_M"]) * n_batch * n_heads,),
        (q4, k4, v4, d_out, lse, delta, mask4, dq,
         *q4.stride(), *k4.stride(), *v4.stride(), *d_out.stride(), *mask_strides,
         *dq.stride(), *sizes), common, options, tiles.get("dq"))
    return dq, dk, dv


def _to_input_shapes(grads, shapes, batch_shape, dtype):
    """(B, H, T, d) gradients -> the shapes of q, k and v, summed over broadcast dimensions."""
    from ..backward import sum_to_shape

    return tuple(None if g is None else sum_to_shape(g.to(dtype).reshape(*batch_shape, *g.shape[-2:]),
                                                     shape)
                 for g, shape in zip(grads, shapes))


def backward(q, k, v, d_out, mask, causal, scale, *, tiles=None):
    """Gradients of attention on validated tensors; the backward entry point.

    Runs the forward kernel for the log-sum-exp, then the two backward kernels.
    ``tiles`` as for :func:`grads_from_lse` (the tests run every configuration), and
    optionally ``tiles["fwd"]`` for the forward kernel.
    Returns ``(dq, dk, dv)`` shaped like q, k and v, in q's dtype.
    """
    _check_supported(q, k, v)
    batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q4, k4, v4 = (_as_4d(x, batch_shape) for x in (q, k, v))
    out, lse = forward_with_lse(q4, k4, v4, mask, causal, scale, batch_shape, (tiles or {}).get("fwd"))
    grads = grads_from_lse(q4, k4, v4, out, lse, d_out, mask, causal, scale, batch_shape, tiles)
    return _to_input_shapes(grads, (q.shape, k.shape, v.shape), batch_shape, q.dtype)
