"""FlashAttention-2 forward pass, written from scratch in Triton.

Algorithm (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism
and Work Partitioning", which builds on Dao et al. 2022, "FlashAttention: Fast
and Memory-Efficient Exact Attention with IO-Awareness"), shaped like Triton's
fused-attention tutorial: an outer kernel, ``_attn_fwd``, and the loop over key
tiles in a function of its own, ``_attn_fwd_inner``.

Each program owns one tile of ``BLOCK_M`` queries of one (batch, head) and
keeps it in registers. It streams the keys and values past it ``BLOCK_N`` at a
time and never writes a score to memory. Per query row it keeps, in fp32:

    m_i   the running maximum of the scores, in log2 units
    l_i   the running sum of 2 ** (score - m_i)
    acc   the running sum of 2 ** (score - m_i) * v_j, shape (BLOCK_M, d_v)

For each key tile, with ``qk = q @ k^T`` and ``qk_scale = scale * log2(e)``:
``m_ij = max(m_i, rowmax(qk) * qk_scale)``; ``p = exp2(qk * qk_scale - m_ij)``
(the scale and the shift in one fused multiply-add, as in the tutorial);
``alpha = exp2(m_i - m_ij)``; ``l_i = alpha * l_i + rowsum(p)``;
``acc = alpha * acc + p @ v``. After the last tile the program writes
``acc / l_i`` and, for the backward pass, the log-sum-exp ``m_i + log2(l_i)``
of every row (in log2 units). Folding log2(e) into the scale turns every exp
into exp2, since ``exp(x) == exp2(x * log2(e))``; exp2 is the instruction the
GPU has.

The key tiles are visited in two stages, as in the tutorial: first the tiles
that every query of the tile may see whole, with no masking at all, then the
tiles that need an element-wise mask (the ones that cross the causal diagonal,
the ragged last tile when T_k is not a multiple of BLOCK_N, and every tile when
the caller passes a mask). With ``causal``, query i sees key j iff
``j <= i + offset`` (offset 0 for "top-left", ``T_k - T_q`` for
"bottom-right"), and tiles past the diagonal are never loaded.

Inputs are (B, H, T, d) in fp16, bf16, fp32 or fp64; other ranks are reshaped
by :func:`forward`. T_q and T_k may differ and need not be multiples of the
tile sizes; head dimensions up to 128 are padded to a power of two (16, 32, 64
and 128 need no padding). A mask may be boolean (True = may attend) or
additive; broadcast over batch and head dimensions, it is read through stride-0
views, not copied (for inputs with at most two leading dimensions). Row offsets
are int64, so a (T_q, T_k) mask with 2**31 entries or more is addressed
correctly.

This file computes the forward pass only. The ``triton`` backend
(:mod:`.triton_autograd`) runs it through a ``torch.autograd.Function`` whose
backward pass is made of Triton kernels too (:mod:`.triton_backward`), when an
input requires grad.

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
from triton.runtime.errors import OutOfResources
from triton.runtime.interpreter import InterpretedFunction

from ..masks import causal_offset

ARRAY_KIND = "torch"

LOG2_E = 1.4426950408889634  # exp(x) == exp2(x * LOG2_E)
MAX_HEAD_DIM = 128
NO_MASK, BOOL_MASK, ADDITIVE_MASK = 0, 1, 2


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, K, V, Mask, offs_m, lo, hi, T_q, T_k, offset, qk_scale,
                    stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn,
                    HEAD_DK: tl.constexpr, HEAD_DV: tl.constexpr,
                    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
                    UPCAST: tl.constexpr, ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold key tiles ``lo, lo + BLOCK_N, ..., < hi`` into (acc, l_i, m_i) for one query tile."""
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)  # int64: keys * stride_kn may pass 2**31
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
        # K^T tile (BLOCK_DK, BLOCK_N) and V tile (BLOCK_N, BLOCK_DV); out of range reads 0
        k = tl.load(K + offs_dk[:, None] * stride_kd + keys[None, :] * stride_kn,
                    mask=k_mask, other=0.0)
        v = tl.load(V + keys[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                    mask=v_mask, other=0.0)
        if UPCAST:  # the interpreter has no bf16 arithmetic
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        # (BLOCK_M, BLOCK_DK) @ (BLOCK_DK, BLOCK_N) -> (BLOCK_M, BLOCK_N), unscaled q . k
        qk = tl.dot(q, k, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
        if MASKED:
            keep = (keys[None, :] < T_k) & (offs_m[:, None] < T_q)  # (BLOCK_M, BLOCK_N)
            if CAUSAL:
                keep = keep & (keys[None, :] <= offs_m[:, None] + offset)  # j <= i + offset
            mask_ptrs = Mask + offs_m[:, None] * stride_mm + keys[None, :] * stride_mn
            if MASK_KIND == 1:  # boolean, stored as uint8: nonzero = may attend
                keep = keep & (tl.load(mask_ptrs, mask=keep, other=0) != 0)
            qk = tl.where(keep, qk * qk_scale, float("-inf"))  # scores in log2 units
            if MASK_KIND == 2:  # additive, in natural-log units like the scores
                qk += tl.load(mask_ptrs, mask=keep, other=0.0).to(ACC_DTYPE) * 1.4426950408889634
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            # a row with no allowed key yet has m_ij = -inf: shift it by 0, so exp2(-inf) = 0
            shift = tl.where(m_ij == float("-inf"), 0.0, m_ij)
            qk -= shift[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # qk_scale > 0
            shift = m_ij
            qk = qk * qk_scale - m_ij[:, None]  # one FMA: scale, and shift by the row max
        p = tl.exp2(qk)  # (BLOCK_M, BLOCK_N), every entry in [0, 1]
        alpha = tl.exp2(m_i - shift)  # rescales what was summed under the old maximum
        l_ij = tl.sum(p, 1)
        acc = acc * alpha[:, None]
        # acc += (BLOCK_M, BLOCK_N) @ (BLOCK_N, BLOCK_DV); p in v's dtype, as FlashAttention does
        acc = tl.dot(p.to(v.dtype), v, acc, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)
        l_i = l_i * alpha + l_ij
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(
    Q, K, V, Mask, Out, Lse,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_mz, stride_mh, stride_mm, stride_mn,
    stride_oz, stride_oh, stride_om, stride_od,
    H, T_q, T_k, offset, qk_scale,
    T_Q_BUCKET, T_K_BUCKET,  # next powers of two of T_q and T_k: read by the autotuner only
    HEAD_DK: tl.constexpr, HEAD_DV: tl.constexpr,
    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
    UPCAST: tl.constexpr, ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SCALES_IN_MEMORY: tl.constexpr,
):
    """One program: query tile ``pid % n_m`` of (batch, head) ``pid // n_m``, for ``n_m`` query tiles."""
    pid = tl.program_id(0).to(tl.int64)  # a 1-D grid: B * H may exceed the 65,535 of grid axis 1
    n_m = tl.cdiv(T_q, BLOCK_M)
    start_m = pid % n_m
    off_hz = pid // n_m
    if SCALES_IN_MEMORY:  # fp64: a float argument would reach the kernel as fp32
        qk_scale = tl.load(qk_scale)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    Q += off_z * stride_qz + off_h * stride_qh
    K += off_z * stride_kz + off_h * stride_kh
    V += off_z * stride_vz + off_h * stride_vh
    Mask += off_z * stride_mz + off_h * stride_mh
    Out += off_z * stride_oz + off_h * stride_oh
    Lse += off_hz.to(tl.int64) * T_q

    m0 = start_m * BLOCK_M
    # (BLOCK_M,) query indices of this tile; int64, since offs_m * stride_mm may pass 2**31
    offs_m = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_dk[None, :] * stride_qd,
                mask=(offs_m[:, None] < T_q) & (offs_dk[None, :] < HEAD_DK), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.zeros([BLOCK_M], dtype=ACC_DTYPE) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=ACC_DTYPE)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=ACC_DTYPE)

    if CAUSAL:  # query i sees keys j <= i + offset; later key tiles are never loaded
        hi = tl.minimum(T_k, m0 + BLOCK_M + offset)
        n_whole = tl.minimum((m0 + offset + 1) // BLOCK_N, T_k // BLOCK_N) * BLOCK_N
    else:
        hi = T_k
        n_whole = (T_k // BLOCK_N) * BLOCK_N  # all but a ragged last tile
    if MASK_KIND != 0:
        n_whole = 0  # a caller's mask is applied to every tile

    # stage 1: key tiles that every query of the tile sees whole, no masking
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K, V, Mask, offs_m, 0, n_whole,
                                    T_q, T_k, offset, qk_scale,
                                    stride_kn, stride_kd, stride_vn, stride_vd,
                                    stride_mm, stride_mn,
                                    HEAD_DK, HEAD_DV, BLOCK_DK, BLOCK_DV, BLOCK_N,
                                    False, CAUSAL, MASK_KIND, UPCAST, ACC_DTYPE, DOT_PRECISION)
    # stage 2: the diagonal tile(s), the ragged last tile, or every tile under a mask
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K, V, Mask, offs_m, n_whole, hi,
                                    T_q, T_k, offset, qk_scale,
                                    stride_kn, stride_kd, stride_vn, stride_vd,
                                    stride_mm, stride_mn,
                                    HEAD_DK, HEAD_DV, BLOCK_DK, BLOCK_DV, BLOCK_N,
                                    True, CAUSAL, MASK_KIND, UPCAST, ACC_DTYPE, DOT_PRECISION)

    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # only padding rows (past T_q) can have no key
    out = acc / l_i[:, None]
    tl.store(Lse + offs_m, m_i + tl.log2(l_i), mask=offs_m < T_q)  # log-sum-exp, log2 units
    tl.store(Out + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od,
             out.to(Out.dtype.element_ty),
             mask=(offs_m[:, None] < T_q) & (offs_dv[None, :] < HEAD_DV))


# On a GPU: a short list of tile shapes, tuned per (bucketed T_q and T_k, head dims,
# causal, mask kind) and dtype. tests/test_triton.py runs each one under the interpreter.
# Each shape is offered only at the head dimensions where it compiles for sm_90 (H100)
# without spilling registers (python -m attnlib.bench.sm90 checks every one, in make test).
# The limits follow the ptxas of Triton 3.9 (13.4), which spills in several tiles that the
# ptxas of Triton 3.6 (12.8) compiled clean; the small 16 x 16 tiles keep exact fp32 and
# fp64 at d = 128 free of spills. Under 3.6 (run on an H200, 2026-11-26) the 64 x 32 tile
# with 8 warps spilled 136 bytes in fp64 at d = 64, so it is offered to exact fp32, not fp64:
# (config, largest padded head dimension, kind): kind "tc" for tensor-core dtypes only,
# "fp32" for those and exact fp32, "any" for every dtype, fp64 included.
FWD_TILES = [
    (triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=3), 32, "tc"),
    (triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=3), 64, "tc"),
    (triton.Config({"BLOCK_M": 128, "BLOCK_N": 32}, num_warps=4, num_stages=4), 64, "tc"),
    (triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3), 128, "tc"),
    (triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2), 128, "tc"),
    (triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3), 128, "tc"),
    (triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=4), 64, "tc"),
    # exact fp32 and fp64 products run on the FMA units and hold their tiles in registers
    (triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2), 64, "any"),
    (triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=8, num_stages=2), 64, "fp32"),
    (triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1), 128, "any"),
]
CUDA_CONFIGS = [config for config, _, _ in FWD_TILES]


TILE_KINDS = ("tc", "fp32", "any")


def tile_offered(kind, tensor_cores, fp64):
    """Whether a tile of ``kind`` ("tc", "fp32" or "any") is offered to a dtype.

    ``tensor_cores``: fp16, bf16 and TF32 products, which every tile is offered to.
    Exact fp32 (``"ieee"``) products get the "fp32" and "any" tiles, which are
    small enough for the FMA units; fp64 (``fp64=True``) only the "any" tiles.
    """
    if kind not in TILE_KINDS:
        raise ValueError(f"tile kind must be one of {TILE_KINDS}, got {kind!r}")
    return tensor_cores or kind == "any" or (kind == "fp32" and not fp64)


def usable_configs(tiles, block_d, tensor_cores, fp64=False):
    """The configs of ``tiles`` that autotuning may pick at padded head dim ``block_d``
    (see :func:`tile_offered` for ``tensor_cores`` and ``fp64``)."""
    return [config for config, max_d, kind in tiles
            if block_d <= max_d and tile_offered(kind, tensor_cores, fp64)]


def uses_tensor_cores(acc_dtype, dot_precision):
    """Whether the products run on tensor cores: fp16/bf16 (precision None) or TF32."""
    return acc_dtype != tl.float64 and dot_precision in (None, "tf32")


def pruner(tiles):
    """An ``early_config_prune`` for :func:`triton.autotune` that keeps :func:`usable_configs`."""
    def prune(configs, named_args, **kwargs):
        arg = {**named_args, **kwargs}
        block_d = max(arg["BLOCK_DK"], arg["BLOCK_DV"])
        kept = usable_configs(tiles, block_d, uses_tensor_cores(arg["ACC_DTYPE"], arg["DOT_PRECISION"]),
                              fp64=arg["ACC_DTYPE"] == tl.float64)
        return [c for c in configs if any(c is k for k in kept)] or configs[-1:]
    return prune


AUTOTUNE_KEY = ["T_Q_BUCKET", "T_K_BUCKET", "HEAD_DK", "HEAD_DV", "CAUSAL", "MASK_KIND"]
_attn_fwd_tuned = triton.autotune(configs=CUDA_CONFIGS, key=AUTOTUNE_KEY,
                                  prune_configs_by={"early_config_prune": pruner(FWD_TILES)})(_attn_fwd)
# Small problems on a GPU: one fixed tile; compiling and timing every config costs more.
AUTOTUNE_MIN_SCORES = 2**20  # T_q * T_k from which the GPU autotunes
SMALL_PROBLEM_TILE = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
# In the interpreter: one small fixed tile, so that tests at small T still cross tiles.
INTERPRETER_TILE = {"BLOCK_M": 16, "BLOCK_N": 16}

RUNS_ON_CPU = isinstance(_attn_fwd, InterpretedFunction)  # TRITON_INTERPRET=1 at import


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
            f"the triton backend runs on CUDA tensors (got a tensor on {q.device}); to run "
            "it on a CPU, set TRITON_INTERPRET=1 before triton is first imported"
        )
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"the triton backend computes in float16, bfloat16, float32 or float64, "
                        f"got {q.dtype}")
    for name, d in (("d_k", q.shape[-1]), ("d_v", v.shape[-1])):
        if d > MAX_HEAD_DIM:
            raise ValueError(
                f"the triton backend supports head dimensions up to {MAX_HEAD_DIM}, got "
                f"{name}={d}; use backend='sdpa' or 'torch'"
            )


def mask_arguments(mask, batch_shape, t_q, t_k, like):
    """``(MASK_KIND, mask as (B, H, T_q, T_k) view, its four strides)`` for the kernels.

    With no mask, ``like`` (any tensor) stands in for the pointer, which is never read.
    For float64 inputs a boolean mask travels as an additive one (0 or -inf, float64):
    Triton 3.6 fails to compile the fp64 kernels with a boolean mask for sm_90
    ("fp64 don't support largeK MMA").
    """
    if mask is None:
        return NO_MASK, like, (0, 0, 0, 0)
    if mask.dtype == torch.bool and like.dtype == torch.float64:
        mask = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device).masked_fill(~mask, float("-inf"))
    kind = BOOL_MASK if mask.dtype == torch.bool else ADDITIVE_MASK
    if kind == BOOL_MASK:
        mask = mask.view(torch.uint8)  # same bytes; triton reads it as 0 / 1
    mask4 = _as_4d(mask.expand(*mask.shape[:-2], t_q, t_k), batch_shape)
    return kind, mask4, mask4.stride()


def kernel_dtypes(dtype):
    """``(UPCAST, ACC_DTYPE, DOT_PRECISION)`` for inputs of torch ``dtype``.

    fp32 products are exact ("ieee", on the FMA units) unless
    ``torch.backends.cuda.matmul.allow_tf32`` is on (the benchmark's ``--tf32 on``);
    then they run on the tensor cores in TF32, as torch's own fp32 matmuls do.
    """
    if dtype == torch.float32:
        precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 and not RUNS_ON_CPU else "ieee"
    else:
        precision = "ieee" if dtype == torch.float64 else None  # fp16/bf16: tensor cores
    return (RUNS_ON_CPU and dtype != torch.float64,
            tl.float64 if dtype == torch.float64 else tl.float32,
            precision)


def scale_arguments(dtype, device, *values):
    """The kernel arguments for float ``values``: Python floats, or one-element fp64 tensors.

    Triton passes a Python float to a kernel as fp32 (a relative error of about
    1e-8), so for fp64 inputs each value travels as a float64 tensor on
    ``device`` that the kernel loads (``SCALES_IN_MEMORY``).
    """
    if dtype != torch.float64:
        return tuple(float(x) for x in values)
    return tuple(torch.full((1,), float(x), dtype=torch.float64, device=device) for x in values)


def choose_kernel(jitted, tuned, t_q, t_k, tile, small_tile=SMALL_PROBLEM_TILE):
    """``(kernel, launch options)``: a fixed tile, or the autotuned kernel on a big GPU problem."""
    if tile is not None:
        return jitted, tile
    if RUNS_ON_CPU:
        return jitted, INTERPRETER_TILE
    if t_q * t_k < AUTOTUNE_MIN_SCORES:
        return jitted, small_tile
    return tuned, {}


LAST_TILES = {}  # {"fwd" | "dkdv" | "dq": "128x64 w4 s3"}: the tile of each kernel's last launch


def record_tile(name, kernel, options):
    """Note the tile kernel ``name`` just ran with: the autotuner's choice, or the fixed one."""
    config = getattr(kernel, "best_config", None)
    if config is not None and not options:
        block, warps, stages = config.kwargs, config.num_warps, config.num_stages
    else:
        block, warps, stages = options, options.get("num_warps", 4), options.get("num_stages", 3)
    LAST_TILES[name] = f"{block['BLOCK_M']}x{block['BLOCK_N']} w{warps} s{stages}"


def launch(name, kernel, grid, args, constants, options, tile):
    """``kernel[grid](*args, **constants, **options)``; a fixed ``tile`` that does not fit gets a clear error.

    The autotuner drops a configuration that needs more shared memory than the
    GPU has; a tile the caller chose is reported instead, with the tile and the limit.
    """
    try:
        kernel[grid](*args, **constants, **options)
    except OutOfResources as exc:
        if tile is None:
            raise
        raise ValueError(f"tile={tile} does not fit the {name} kernel on this GPU: it needs "
                         f"{exc.required:,} bytes of {exc.name}, and the limit is {exc.limit:,}; choose "
                         "smaller BLOCK_M / BLOCK_N or fewer num_stages, or leave tile=None") from None
    record_tile(name, kernel, options)


def padded_head_dim(d):
    """The tile width for a head dimension: a power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, triton.next_power_of_2(d))


def forward_with_lse(q4, k4, v4, mask, causal, scale, batch_shape, tile=None):
    """Run the forward kernel on (B, H, T, d) views; return ``(out, lse)``.

    ``out`` is (B, H, T_q, d_v) (float32 for bf16 under the interpreter), ``lse``
    (B, H, T_q), each row's log-sum-exp of its scaled scores in log2 units (the
    scores times log2(e)), kept for the backward pass.
    """
    n_batch, n_heads, t_q, d_k = q4.shape
    t_k, d_v = k4.shape[2], v4.shape[3]
    # the interpreter casts fp32 -> bf16 by truncation; there the kernel writes fp32
    out_dtype = torch.float32 if RUNS_ON_CPU and q4.dtype == torch.bfloat16 else q4.dtype
    out = torch.empty((n_batch, n_heads, t_q, d_v), dtype=out_dtype, device=q4.device)
    lse_dtype = torch.float64 if q4.dtype == torch.float64 else torch.float32
    lse = torch.empty((n_batch, n_heads, t_q), dtype=lse_dtype, device=q4.device)
    if out.numel() == 0:  # no query or no (batch, head): nothing to launch
        return out, lse
    mask_kind, mask4, mask_strides = mask_arguments(mask, batch_shape, t_q, t_k, like=q4)
    kernel, options = choose_kernel(_attn_fwd, _attn_fwd_tuned, t_q, t_k, tile)
    upcast, acc_dtype, dot_precision = kernel_dtypes(q4.dtype)

    def grid(meta):
        return (triton.cdiv(t_q, meta["BLOCK_M"]) * n_batch * n_heads,)

    args = (
        q4, k4, v4, mask4, out, lse,
        *q4.stride(), *k4.stride(), *v4.stride(), *mask_strides, *out.stride(),
        n_heads, t_q, t_k, causal_offset(t_q, t_k, causal) if causal else 0,
        *scale_arguments(q4.dtype, q4.device, scale * LOG2_E),
        triton.next_power_of_2(t_q), triton.next_power_of_2(t_k),
    )
    constants = dict(
        HEAD_DK=d_k, HEAD_DV=d_v, BLOCK_DK=padded_head_dim(d_k), BLOCK_DV=padded_head_dim(d_v),
        CAUSAL=bool(causal), MASK_KIND=mask_kind,
        UPCAST=upcast, ACC_DTYPE=acc_dtype, DOT_PRECISION=dot_precision,
        SCALES_IN_MEMORY=q4.dtype == torch.float64,
    )
    launch("fwd", kernel, grid, args, constants, options, tile)
    return out, lse


def forward(q, k, v, mask, causal, scale, *, tile=None):
    """FlashAttention-2 forward on validated torch tensors (..., T, d).

    Parameters
    ----------
    q : tensor, shape (..., T_q, d_k); k : (..., T_k, d_k); v : (..., T_k, d_v)
        fp16, bf16, fp32 or fp64, on CUDA (or on CPU under TRITON_INTERPRET=1).
        No gradient flows through this function (see :mod:`.triton_autograd`).
    mask : tensor or None
        Broadcastable to (..., T_q, T_k): boolean (True = may attend) or additive float.
    causal : None, "top-left" or "bottom-right"
        Query i attends to keys j <= i + offset (offset 0, or T_k - T_q).
    scale : float
    tile : dict, optional
        ``{"BLOCK_M": ..., "BLOCK_N": ...}``: run this tile instead of the default
        choice (the tests use it to run every autotuned configuration).

    Returns
    -------
    tensor, shape (..., T_q, d_v), the dtype and device of q.
    """
    _check_supported(q, k, v)
    batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q4, k4, v4 = (_as_4d(x, batch_shape) for x in (q, k, v))
    out, _ = forward_with_lse(q4, k4, v4, mask, causal, scale, batch_shape, tile)
    return out.to(q.dtype).reshape(*batch_shape, q.shape[-2], v.shape[-1])
