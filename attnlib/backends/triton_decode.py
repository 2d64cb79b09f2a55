"""A split-KV decode kernel (flash-decoding) for :func:`attnlib.attention_with_kvcache`, in Triton.

Two kernels:

- ``_decode_split``: one program per (sequence, key/value head, split). It loads the queries
  of every query head of the group (G = H / H_kv heads x T_new new tokens, one tile of rows)
  once, walks its chunk of the sequence's keys, reading each key and value block once for
  the whole group, through the block table when the cache is paged, and writes the chunk's
  output and log-sum-exp (fp32) for each row.
- ``_decode_merge``: one program per (sequence, new token, query head); merges the splits'
  partial outputs by their log-sum-exps into the output.

With B x H_kv programs alone (8 for one sequence with 8 KV heads), an H100's 132 SMs sit
mostly idle; ``num_splits`` multiplies the programs. Forward only; fp16, bf16 and fp32
(fp64 is refused: Triton 3.6's ``tl.dot`` does not compile it for the GPU). Under
``TRITON_INTERPRET=1`` it runs on the CPU (slowly), with half-precision tiles upcast.
"""

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ..errors import DTypeError

LOG2_E = 1.4426950408889634
GPU_BLOCK_N = 64  # keys per block on the GPU (the sm_90 compile checks it)
CPU_BLOCK_N = 16  # under the interpreter: small blocks test the block loop
NUM_WARPS = 4


@triton.jit
def _decode_split(Q, K, V, Seqlens, BlockTable, OutPart, LsePart,
                  stride_qb, stride_qt, stride_qh,
                  stride_kb, stride_kt, stride_kh,
                  stride_vb, stride_vt, stride_vh,
                  stride_bt,
                  T_NEW, qk_scale, window,
                  NUM_SPLITS: tl.constexpr, GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr,
                  HEAD_DK: tl.constexpr, HEAD_DV: tl.constexpr,
                  BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  PAGED: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, UPCAST: tl.constexpr,
                  DOT_PRECISION: tl.constexpr):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    n_heads = tl.num_programs(1) * GROUP
    seqlen = tl.load(Seqlens + b).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(seqlen, NUM_SPLITS), BLOCK_N) * BLOCK_N  # whole blocks per split
    start = split * chunk
    stop = tl.minimum(start + chunk, seqlen)

    rows = tl.arange(0, BLOCK_M)  # row r: new token r // GROUP, query head kv_head * GROUP + r % GROUP
    token = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = token < T_NEW
    position = seqlen - T_NEW + token  # where each new token sits in its sequence
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + token[:, None] * stride_qt + head[:, None] * stride_qh
                + dk[None, :], mask=row_ok[:, None] & (dk[None, :] < HEAD_DK), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    for block_start in range(start, stop, BLOCK_N):
        keys = block_start + tl.arange(0, BLOCK_N)
        key_ok = keys < stop
        if PAGED:  # position p of sequence b: page BlockTable[b, p // PAGE_SIZE], row p % PAGE_SIZE
            page = tl.load(BlockTable + b * stride_bt + keys // PAGE_SIZE, mask=key_ok, other=0).to(tl.int64)
            k_base = page * stride_kb + (keys % PAGE_SIZE) * stride_kt
            v_base = page * stride_vb + (keys % PAGE_SIZE) * stride_vt
        else:
            k_base = b.to(tl.int64) * stride_kb + keys.to(tl.int64) * stride_kt
            v_base = b.to(tl.int64) * stride_vb + keys.to(tl.int64) * stride_vt
        k = tl.load(K + k_base[:, None] + kv_head * stride_kh + dk[None, :],
                    mask=key_ok[:, None] & (dk[None, :] < HEAD_DK), other=0.0)
        v = tl.load(V + v_base[:, None] + kv_head * stride_vh + dv[None, :],
                    mask=key_ok[:, None] & (dv[None, :] < HEAD_DV), other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        # (BLOCK_M, BLOCK_N), in log2 units
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        allowed = key_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            allowed &= keys[None, :] <= position[:, None]
        if HAS_WINDOW:
            allowed &= keys[None, :] > position[:, None] - window
        scores = tl.where(allowed, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    has_key = l_i > 0
    out = acc / tl.where(has_key, l_i, 1.0)[:, None]
    lse = tl.where(has_key, m_i + tl.log2(tl.where(has_key, l_i, 1.0)), float("-inf"))
    # partials: OutPart (B, T_new, H, NUM_SPLITS, HEAD_DV), LsePart (B, T_new, H, NUM_SPLITS), contiguous
    row = ((b * T_NEW + token) * n_heads + head).to(tl.int64) * NUM_SPLITS + split
    tl.store(LsePart + row, lse, mask=row_ok)
    tl.store(OutPart + row[:, None] * HEAD_DV + dv[None, :], out,
             mask=row_ok[:, None] & (dv[None, :] < HEAD_DV))


@triton.jit
def _decode_merge(OutPart, LsePart, Out, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                  HEAD_DV: tl.constexpr, BLOCK_DV: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # (sequence, new token, query head), as Out (B, T_new, H, d_v)
    splits = tl.arange(0, BLOCK_S)
    dv = tl.arange(0, BLOCK_DV)
    lse = tl.load(LsePart + row * NUM_SPLITS + splits, mask=splits < NUM_SPLITS, other=float("-inf"))
    top = tl.max(lse, 0)  # finite: every row sees a key in some split
    weights = tl.exp2(lse - top)
    weights = weights / tl.sum(weights, 0)
    parts = tl.load(OutPart + (row * NUM_SPLITS + splits)[:, None] * HEAD_DV + dv[None, :],
                    mask=(splits[:, None] < NUM_SPLITS) & (dv[None, :] < HEAD_DV), other=0.0)
    out = tl.sum(weights[:, None] * parts, 0)
    tl.store(Out + row * HEAD_DV + dv, out.to(Out.dtype.element_ty), mask=dv < HEAD_DV)


RUNS_ON_CPU = isinstance(_decode_split, InterpretedFunction)  # TRITON_INTERPRET=1 at import


def dot_precision(dtype):
    """fp32 products exact ("ieee": Triton's default would be TF32 on the GPU); fp16 and bf16 on tensor
    cores."""
    return "ieee" if dtype == torch.float32 else None


def padded(n):
    return max(16, triton.next_power_of_2(n))


def attention_with_kvcache(args):
    """The triton backend of :func:`attnlib.attention_with_kvcache`, on its checked arguments."""
    q, k_cache, v_cache = args["q"], args["k_cache"], args["v_cache"]
    if not isinstance(q, torch.Tensor):  # NumPy in, NumPy out
        device = "cpu" if RUNS_ON_CPU else "cuda"
        tensors = [torch.from_numpy(x.copy()).to(device) for x in (q, k_cache, v_cache)]
        as_tensors = dict(args, q=tensors[0], k_cache=tensors[1], v_cache=tensors[2])
        return attention_with_kvcache(as_tensors).cpu().numpy()
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise DTypeError(f"the triton backend of attention_with_kvcache takes float16, bfloat16 or float32, "
                         f"got "
                         f"{q.dtype}; use backend='torch'")
    if not RUNS_ON_CPU and q.device.type != "cuda":
        raise ValueError("the triton backend needs CUDA tensors (or TRITON_INTERPRET=1 set before attnlib's "
                         "triton modules are imported)")
    batch, n_new, n_heads, d = q.shape
    n_kv_heads, d_v = k_cache.shape[2], v_cache.shape[3]
    group = n_heads // n_kv_heads
    num_splits = args["num_splits"]
    device = q.device
    seqlens = torch.as_tensor(args["seqlens"], dtype=torch.int32, device=device)
    paged = args["table"] is not None
    table = (torch.as_tensor(args["table"], dtype=torch.int32, device=device).contiguous() if paged
             else seqlens)  # never read when not paged
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    out_part = torch.empty((batch, n_new, n_heads, num_splits, d_v), dtype=torch.float32, device=device)
    lse_part = torch.empty((batch, n_new, n_heads, num_splits), dtype=torch.float32, device=device)
    block_m = padded(n_new * group)
    _decode_split[(batch, n_kv_heads, num_splits)](
        q, k_cache, v_cache, seqlens, table, out_part, lse_part,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        table.stride(0) if paged else 0,
        n_new, args["scale"] * LOG2_E, args["window"] or 0,
        NUM_SPLITS=num_splits, GROUP=group, PAGE_SIZE=k_cache.shape[1] if paged else 1,
        HEAD_DK=d, HEAD_DV=d_v, BLOCK_DK=padded(d), BLOCK_DV=padded(d_v),
        BLOCK_M=block_m, BLOCK_N=CPU_BLOCK_N if RUNS_ON_CPU else GPU_BLOCK_N,
        PAGED=paged, CAUSAL=args["causal"], HAS_WINDOW=args["window"] is not None,
        UPCAST=RUNS_ON_CPU, DOT_PRECISION=dot_precision(q.dtype), num_warps=NUM_WARPS)
    out = torch.empty((batch, n_new, n_heads, d_v), dtype=q.dtype, device=device)
    _decode_merge[(batch * n_new * n_heads,)](out_part, lse_part, out, NUM_SPLITS=num_splits,
                                               BLOCK_S=triton.next_power_of_2(num_splits), HEAD_DV=d_v,
                                               BLOCK_DV=padded(d_v))
    return out
