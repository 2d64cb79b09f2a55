"""FlashAttention's forward pass in its shortest form: one Triton kernel, for teaching.

The algorithm of :mod:`.triton_flash` (Dao 2023, "FlashAttention-2"; shaped like
Triton's fused-attention tutorial) with everything that is not the algorithm
left out. One program owns ``BLOCK_M`` queries of one (batch, head), walks over
the keys ``BLOCK_N`` at a time and keeps, per query row, the running maximum
``m_i``, the running sum ``l_i`` and the running output ``acc`` (in fp32). Each
step is the online softmax of chapter 12: ``m_new = max(m_i, rowmax(s))``,
``p = exp2(s - m_new)``, ``alpha = exp2(m_i - m_new)``, ``l_i = alpha * l_i +
rowsum(p)``, ``acc = alpha * acc + p @ v``; at the end ``out = acc / l_i``.
Scores are in log2 units (the scale times log2(e)), so every exponential is the
GPU's exp2.

What it leaves out, and :mod:`.triton_flash` has: masks, fp64, head widths that
are not a power of two, strided inputs without a copy, two loop stages (whole
tiles without any masking), the log-sum-exp for a backward pass, int64 key
offsets, more than 65,535 (batch, head) pairs and autotuned tiles.
The benchmark times both (``triton-simple`` and ``triton``).

Inputs: fp16, bf16 or fp32, d = 16, 32, 64 or 128, no mask or causal (either
alignment, as long as every query sees at least one key). On a CPU it runs under
Triton's interpreter (``TRITON_INTERPRET=1``), where bf16 is computed in fp32.
"""

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ..masks import causal_offset
from .triton_flash import LOG2_E, kernel_dtypes

ARRAY_KIND = "torch"


@triton.jit
def _simple_attn_fwd(Q, K, V, Out, T_q, T_k, offset, qk_scale,
                     HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """One program: queries ``program_id(0) * BLOCK_M ...`` of (batch, head) ``program_id(1)``."""
    start_m = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)  # q, k, v and out are contiguous (B * H, T, HEAD_D)
    Q += head * T_q * HEAD_D
    K += head * T_k * HEAD_D
    V += head * T_k * HEAD_D
    Out += head * T_q * HEAD_D
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query indices
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    q = tl.load(Q + offs_m[:, None] * HEAD_D + offs_d[None, :], mask=offs_m[:, None] < T_q, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the scores (log2 units)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)  # running sum of exp2(score - m_i) * v
    hi = T_k
    if CAUSAL:  # key tiles past the diagonal are never loaded
        hi = tl.minimum(T_k, (start_m + 1) * BLOCK_M + offset)
    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n  # (BLOCK_N,) key indices of this tile
        k = tl.load(K + keys[:, None] * HEAD_D + offs_d[None, :], mask=keys[:, None] < T_k, other=0.0)
        v = tl.load(V + keys[:, None] * HEAD_D + offs_d[None, :], mask=keys[:, None] < T_k, other=0.0)
        # (BLOCK_M, HEAD_D) @ (HEAD_D, BLOCK_N) -> (BLOCK_M, BLOCK_N) scores, in log2 units
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        keep = keys[None, :] < T_k
        if CAUSAL:
            keep = keep & (keys[None, :] <= offs_m[:, None] + offset)  # j <= i + offset
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])  # (BLOCK_M, BLOCK_N), each in [0, 1]
        alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old maximum
        l_i = l_i * alpha + tl.sum(p, 1)
        # (BLOCK_M, BLOCK_N) @ (BLOCK_N, HEAD_D) -> (BLOCK_M, HEAD_D)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(Out + offs_m[:, None] * HEAD_D + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=offs_m[:, None] < T_q)


RUNS_ON_CPU = isinstance(_simple_attn_fwd, InterpretedFunction)  # TRITON_INTERPRET=1 at import
HEAD_DIMS = (16, 32, 64, 128)
MAX_PROGRAMS_PER_AXIS = 65_535  # CUDA's limit on grid axis 1, which holds B * H here
LAST_TILES = {}  # {"fwd": "128x64 w4"}: the tile of the last launch, for the benchmark's records


def tile_for(d):
    """``(BLOCK_M, BLOCK_N, num_warps)``: one fixed tile, no autotuning."""
    if RUNS_ON_CPU:
        return 16, 16, 1
    return 128, 64, 8 if d == 128 else 4  # 4 warps would spill registers at d = 128


def _check_supported(q, k, v, mask, causal):
    if q.device.type != "cuda" and not RUNS_ON_CPU:
        raise RuntimeError(f"the triton-simple backend runs on CUDA tensors (got a tensor on {q.device}); "
                           "to run it on a CPU, set TRITON_INTERPRET=1 before triton is first imported")
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise ValueError("the triton-simple backend has no backward pass, and q, k or v requires grad: its "
                         "output would carry no gradient; use backend='triton' (or wrap the call in "
                         "torch.no_grad(), or pass detached tensors)")
    if mask is not None:
        raise ValueError(f"the triton-simple backend takes no mask (got one of shape {tuple(mask.shape)}); "
                         "use causal=, or backend='triton'")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"the triton-simple backend computes in float16, bfloat16 or float32, got {q.dtype}")
    if q.shape[-1] not in HEAD_DIMS or v.shape[-1] != q.shape[-1]:
        raise ValueError(f"the triton-simple backend needs d_k = d_v in {HEAD_DIMS}, got q of shape "
                         f"{tuple(q.shape)} and v of shape {tuple(v.shape)}; use backend='triton'")
    if causal and causal_offset(q.shape[-2], k.shape[-2], causal) < 0:
        raise ValueError(f"with causal={causal!r}, q of shape {tuple(q.shape)} and k of shape "
                         f"{tuple(k.shape)} leave the first queries no key; use backend='triton'")


def forward(q, k, v, mask, causal, scale):
    """Attention on validated torch tensors (..., T, d); the backend entry point (no autograd)."""
    _check_supported(q, k, v, mask, causal)
    batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    (t_q, d), t_k = q.shape[-2:], k.shape[-2]
    compute_dtype = torch.float32 if RUNS_ON_CPU and q.dtype == torch.bfloat16 else q.dtype

    def packed(x, t):  # (B * H, T, d), contiguous
        return x.expand(*batch_shape, t, d).reshape(-1, t, d).to(compute_dtype).contiguous()

    q3, k3, v3 = packed(q, t_q), packed(k, t_k), packed(v, t_k)
    out = torch.empty_like(q3)
    if out.numel() == 0 or t_k == 0:
        return out.to(q.dtype).reshape(*batch_shape, t_q, d)
    if q3.shape[0] > MAX_PROGRAMS_PER_AXIS:
        raise ValueError(f"the triton-simple backend runs at most {MAX_PROGRAMS_PER_AXIS} (batch, head) "
                         f"pairs, got {q3.shape[0]} for batch shape {tuple(batch_shape)}; use backend='triton'")
    block_m, block_n, num_warps = tile_for(d)
    _simple_attn_fwd[(triton.cdiv(t_q, block_m), q3.shape[0])](
        q3, k3, v3, out, t_q, t_k, causal_offset(t_q, t_k, causal) if causal else 0, scale * LOG2_E,
        HEAD_D=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal),
        PRECISION=kernel_dtypes(q.dtype)[2] or "tf32", num_warps=num_warps,
    )
    LAST_TILES["fwd"] = f"{block_m}x{block_n} w{num_warps}"
    return out.to(q.dtype).reshape(*batch_shape, t_q, d)
