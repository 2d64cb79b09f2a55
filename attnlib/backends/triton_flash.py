"""FlashAttention-2 forward pass, written from scratch in Triton.

Algorithm (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism
and Work Partitioning", which builds on Dao et al. 2022, "FlashAttention: Fast
and Memory-Efficient Exact Attention with IO-Awareness"):

Each program owns one tile of ``BLOCK_M`` queries of one (batch, head) and
keeps it in registers. It streams the keys and values past it ``BLOCK_N`` at a
time and never writes a score to memory. Per query row it keeps, in fp32:

    m_i   the running maximum of the scores, in log2 units
    l_i   the running sum of 2 ** (score - m_i)
    acc   the running sum of 2 ** (score - m_i) * v_j, shape (BLOCK_M, d_v)

For each key tile: ``qk = (q @ k^T) * scale * log2(e)``;
``m_new = max(m_i, rowmax(qk))``; ``p = exp2(qk - m_new)``;
``alpha = exp2(m_i - m_new)``; ``l_i = alpha * l_i + rowsum(p)``;
``acc = alpha * acc + p @ v``. After the last tile the program writes
``acc / l_i``. Folding log2(e) into the scale turns every exp into exp2,
since ``exp(x) == exp2(x * log2(e))``; exp2 is the instruction the GPU has.

The key tiles are visited in two stages, as in Triton's fused-attention
tutorial: first the tiles that every query of the tile may see whole, with no
masking at all, then the tiles that need an element-wise mask (the one that
crosses the causal diagonal, the ragged last tile when T_k is not a multiple
of BLOCK_N, and every tile when the caller passes a mask). With ``causal``,
tiles above the diagonal are never loaded.

Inputs are (B, H, T, d) in fp16, bf16, fp32 or fp64; other ranks are reshaped
by :func:`forward`. T_q and T_k may differ and need not be multiples of the
tile sizes; head dimensions up to 128 are padded to a power of two (16, 32, 64
and 128 need no padding). A mask may be boolean (True = may attend) or
additive; broadcast over batch and head dimensions, it is read through stride-0
views, not copied (for inputs with at most two leading dimensions).

fp32 inputs use exact fp32 products (``input_precision="ieee"``), not TF32, so
the result matches the other backends to fp32 tolerance; fp64 inputs keep
fp64 accumulators. On a CPU the same kernel runs under Triton's interpreter
(``TRITON_INTERPRET=1`` set before triton is imported). The interpreter has no
bf16 arithmetic, so there the tiles are cast to fp32 after loading, and bf16
outputs are written in fp32 and rounded by torch (the interpreter's own cast
truncates).
"""

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


ARRAY_KIND = "torch"

LOG2_E = 1.4426950408889634  # exp(x) == exp2(x * LOG2_E)
MAX_HEAD_DIM = 128
NO_MASK, BOOL_MASK, ADDITIVE_MASK = 0, 1, 2


@triton.jit
def _attend_key_tiles(acc, l_i, m_i, q, K, V, Mask, offs_m, lo, hi, T_q, T_k, qk_scale,
                      stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn,
                      HEAD_DK: tl.constexpr, HEAD_DV: tl.constexpr,
                      BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
                      MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
                      UPCAST: tl.constexpr, ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold key tiles ``lo, lo + BLOCK_N, ..., < hi`` into (acc, l_i, m_i) for one query tile."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_n in range(lo, hi, BLOCK_N):
        keys = start_n + offs_n  # (BLOCK_N,) key indices of this tile
        if MASKED:  # the tile may run past T_k
            k_mask = (offs_dk[:, None] < HEAD_DK) & (keys[None, :] < T_k)
            v_mask = (keys[:, None] < T_k) & (offs_dv[None, :] < HEAD_DV)
        else:  # a whole tile: only a padded head dimension can be out of range
            k_mask = offs_dk[:, None] < HEAD_DK
            v_mask = offs_dv[None, :] < HEAD_DV
        # K^T tile (BLOCK_DK, BLOCK_N) and V tile (BLOCK_N, BLOCK_DV); out-of-range entries read as 0
        k = tl.load(K + offs_dk[:, None] * stride_kd + keys[None, :] * stride_kn, mask=k_mask, other=0.0)
        v = tl.load(V + keys[:, None] * stride_vn + offs_dv[None, :] * stride_vd, mask=v_mask, other=0.0)
        if UPCAST:  # the interpreter has no bf16 arithmetic
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        # (BLOCK_M, BLOCK_DK) @ (BLOCK_DK, BLOCK_N) -> (BLOCK_M, BLOCK_N) scores, in log2 units
        qk = tl.dot(q, k, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION) * qk_scale
        if MASKED:
            keep = (keys[None, :] < T_k) & (offs_m[:, None] < T_q)  # (BLOCK_M, BLOCK_N)
            if CAUSAL:
                keep = keep & (keys[None, :] <= offs_m[:, None])  # key j <= query i
            mask_ptrs = Mask + offs_m[:, None] * stride_mm + keys[None, :] * stride_mn
            if MASK_KIND == 1:  # boolean, stored as uint8: nonzero = may attend
                keep = keep & (tl.load(mask_ptrs, mask=keep, other=0) != 0)
            qk = tl.where(keep, qk, float("-inf"))
            if MASK_KIND == 2:  # additive, in natural-log units like the scores before LOG2_E
                qk += tl.load(mask_ptrs, mask=keep, other=0.0).to(ACC_DTYPE) * 1.4426950408889634
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # a row with no allowed key yet has m_new = -inf; shift it by 0 so exp2(-inf) stays 0, not NaN
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            shift = m_new
        p = tl.exp2(qk - shift[:, None])  # (BLOCK_M, BLOCK_N), every entry in [0, 1]
        alpha = tl.exp2(m_i - shift)  # rescales what was summed under the old maximum
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        # acc += (BLOCK_M, BLOCK_N) @ (BLOCK_N, BLOCK_DV); p in the values' dtype, as FlashAttention does
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _flash_attention_forward(
    Q, K, V, Mask, Out,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_mz, stride_mh, stride_mm, stride_mn,
    stride_oz, stride_oh, stride_om, stride_od,
    H, T_q, T_k, qk_scale,
    HEAD_DK: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
    UPCAST: tl.constexpr, ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One program: query tile ``program_id(0)`` of (batch, head) ``program_id(1)``."""
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    Q += off_z * stride_qz + off_h * stride_qh
    K += off_z * stride_kz + off_h * stride_kh
    V += off_z * stride_vz + off_h * stride_vh
    Mask += off_z * stride_mz + off_h * stride_mh
    Out += off_z * stride_oz + off_h * stride_oh

    m0 = start_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query indices of this tile
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_dk[None, :] * stride_qd,
                mask=(offs_m[:, None] < T_q) & (offs_dk[None, :] < HEAD_DK), other=0.0)  # (BLOCK_M, BLOCK_DK)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.zeros([BLOCK_M], dtype=ACC_DTYPE) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=ACC_DTYPE)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=ACC_DTYPE)

    if CAUSAL:
        hi = tl.minimum(T_k, m0 + BLOCK_M)  # keys past the tile's last query: skipped, never loaded
        n_whole = tl.minimum((m0 + 1) // BLOCK_N, T_k // BLOCK_N) * BLOCK_N  # tiles every query sees whole
    else:
        hi = T_k
        n_whole = (T_k // BLOCK_N) * BLOCK_N  # all but a ragged last tile
    if MASK_KIND != 0:
        n_whole = 0  # a caller's mask is applied to every tile

    # stage 1: whole tiles, no masking
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, K, V, Mask, offs_m, 0, n_whole, T_q, T_k, qk_scale,
                                      stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn,
                                      HEAD_DK, HEAD_DV, BLOCK_DK, BLOCK_DV, BLOCK_N,
                                      False, CAUSAL, MASK_KIND, UPCAST, ACC_DTYPE, DOT_PRECISION)
    # stage 2: the diagonal tile(s), the ragged last tile, or every tile under a caller's mask
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, K, V, Mask, offs_m, n_whole, hi, T_q, T_k, qk_scale,
                                      stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn,
                                      HEAD_DK, HEAD_DV, BLOCK_DK, BLOCK_DV, BLOCK_N,
                                      True, CAUSAL, MASK_KIND, UPCAST, ACC_DTYPE, DOT_PRECISION)

    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # only padding rows (past T_q) can have no key
    out = acc / l_i[:, None]
    tl.store(Out + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od, out.to(Out.dtype.element_ty),
             mask=(offs_m[:, None] < T_q) & (offs_dv[None, :] < HEAD_DV))


# On a GPU: a short list of tile shapes, tuned per (T_q, T_k, head dims, causal, mask kind, dtype).
_CUDA_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 32}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2),
]
_flash_attention_forward_tuned = triton.autotune(
    configs=_CUDA_CONFIGS, key=["T_q", "T_k", "HEAD_DK", "HEAD_DV", "CAUSAL", "MASK_KIND"]
)(_flash_attention_forward)
# Small problems on a GPU: one fixed tile; compiling and timing every config would cost more than it saves.
AUTOTUNE_MIN_SCORES = 2**20  # T_q * T_k from which the GPU autotunes
SMALL_PROBLEM_TILE = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
# In the interpreter: one small fixed tile, so that tests at small T still cross several tiles.
INTERPRETER_TILE = {"BLOCK_M": 16, "BLOCK_N": 16}

RUNS_ON_CPU = isinstance(_flash_attention_forward, InterpretedFunction)  # TRITON_INTERPRET=1 at import


def _as_4d(x, batch_shape):
    """Broadcast x to (*batch_shape, rows, cols) and view it as (B, H, rows, cols).

    Broadcast dimensions keep stride 0 (no copy) when there are at most two of
    them; more leading dimensions are flattened into B, which may copy.
    """
    x = x.expand(*batch_shape, *x.shape[-2:])
    if len(batch_shape) <= 2:
        return x.reshape(*(1,) * (2 - len(batch_shape)), *x.shape)
    return x.reshape(-1, batch_shape[-1], *x.shape[-2:])


def _check_supported(q, k, v):
    if q.device.type != "cuda" and not RUNS_ON_CPU:
        raise RuntimeError(
            f"the triton backend runs on CUDA tensors (got a tensor on {q.device}); to run it on a CPU, "
            "set TRITON_INTERPRET=1 before triton is first imported"
        )
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"the triton backend computes in float16, bfloat16, float32 or float64, "
                        f"got {q.dtype}")
    for name, d in (("d_k", q.shape[-1]), ("d_v", v.shape[-1])):
        if d > MAX_HEAD_DIM:
            raise ValueError(
                f"the triton backend supports head dimensions up to {MAX_HEAD_DIM}, got {name}={d}; "
                "use backend='sdpa' or 'torch'"
            )


def forward(q, k, v, mask, causal, scale):
    """FlashAttention-2 forward on validated torch tensors (..., T, d); the backend entry point.

    Parameters
    ----------
    q : tensor, shape (..., T_q, d_k); k : (..., T_k, d_k); v : (..., T_k, d_v)
        fp16, bf16, fp32 or fp64, on CUDA (or on CPU under TRITON_INTERPRET=1).
    mask : tensor or None
        Broadcastable to (..., T_q, T_k): boolean (True = may attend) or additive float.
    causal : bool
        Query i attends to keys j <= i (top-left aligned).
    scale : float

    Returns
    -------
    tensor, shape (..., T_q, d_v), the dtype and device of q.
    """
    _check_supported(q, k, v)
    batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    t_q, t_k, d_k, d_v = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    q4, k4, v4 = (_as_4d(x, batch_shape) for x in (q, k, v))
    n_batch, n_heads = q4.shape[:2]
    interpreted = RUNS_ON_CPU
    # the interpreter casts fp32 -> bf16 by truncation; there the kernel writes fp32 and torch rounds
    out_dtype = torch.float32 if interpreted and q.dtype == torch.bfloat16 else q.dtype
    out = torch.empty((n_batch, n_heads, t_q, d_v), dtype=out_dtype, device=q.device)
    if out.numel() == 0:  # no query or no (batch, head): nothing to launch
        return out.to(q.dtype).reshape(*batch_shape, t_q, d_v)

    if mask is None:
        mask_kind, mask4, mask_strides = NO_MASK, q4, (0, 0, 0, 0)  # never read
    else:
        mask_kind = BOOL_MASK if mask.dtype == torch.bool else ADDITIVE_MASK
        if mask_kind == BOOL_MASK:
            mask = mask.view(torch.uint8)  # same bytes; triton reads it as 0 / 1
        mask4 = _as_4d(mask.expand(*mask.shape[:-2], t_q, t_k), batch_shape)
        mask_strides = mask4.stride()

    if interpreted:
        kernel, tile = _flash_attention_forward, INTERPRETER_TILE
    elif t_q * t_k < AUTOTUNE_MIN_SCORES:
        kernel, tile = _flash_attention_forward, SMALL_PROBLEM_TILE
    else:
        kernel, tile = _flash_attention_forward_tuned, {}

    def grid(meta):
        return (triton.cdiv(t_q, meta["BLOCK_M"]), n_batch * n_heads)

    exact = q.dtype in (torch.float32, torch.float64)
    kernel[grid](
        q4, k4, v4, mask4, out,
        *q4.stride(), *k4.stride(), *v4.stride(), *mask_strides, *out.stride(),
        n_heads, t_q, t_k, scale * LOG2_E,
        HEAD_DK=d_k, HEAD_DV=d_v,
        BLOCK_DK=max(16, triton.next_power_of_2(d_k)), BLOCK_DV=max(16, triton.next_power_of_2(d_v)),
        CAUSAL=bool(causal), MASK_KIND=mask_kind,
        UPCAST=interpreted and q.dtype != torch.float64,
        ACC_DTYPE=tl.float64 if q.dtype == torch.float64 else tl.float32,
        DOT_PRECISION="ieee" if exact else None,  # fp16/bf16: the default tensor-core path
        **tile,
    )
    return out.to(q.dtype).reshape(*batch_shape, t_q, d_v)
