"""The triton backend's own mod kernel (attnlib.backends.triton_flex): block skipping, gradients, rows
with no key, dtypes, and an ahead-of-time compile for the H100 (sm_90) without a GPU."""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

ON_GPU = torch.cuda.is_available()
_saved = os.environ.get("TRITON_INTERPRET")
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
from attnlib.backends import triton_flash, triton_flex  # noqa: E402  (kernels defined under the interpreter)

if _saved is None:
    os.environ.pop("TRITON_INTERPRET", None)
else:
    os.environ["TRITON_INTERPRET"] = _saved

import attnlib  # noqa: E402
from attnlib import mods  # noqa: E402
from attnlib.errors import MaskError  # noqa: E402

if not ON_GPU and not triton_flash.RUNS_ON_CPU:
    pytest.skip("triton_flash was imported without TRITON_INTERPRET=1 in this process", allow_module_level=True)
DEVICE = "cuda" if ON_GPU else "cpu"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="module")
def interpreter():
    saved = os.environ.get("TRITON_INTERPRET")
    if not ON_GPU:
        os.environ["TRITON_INTERPRET"] = "1"
    yield
    if saved is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = saved


T = 70
DOC = np.repeat([0, 1, 2, 3], [16, 22, 20, 12])


def tensors(*shape, n=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(DEVICE) for _ in range(n)]


def test_tiles_the_block_mask_leaves_out_are_never_loaded(monkeypatch):
    """For each query tile, NaN in the values of every key tile the block mask leaves out for it: a kernel
    that loaded them would return NaN there (0 * NaN); the mod kernel returns the right finite numbers for
    that tile's rows. The dense route (SDPA with the mask) does read them."""
    mask_mod = mods.and_masks(mods.causal(), mods.document(DOC))
    bm = attnlib.block_mask(mask_mod, None, None, T, T, block_size=16)
    q, k, v, _ = tensors(1, 2, T, 8)
    skipped_tiles = torch.from_numpy(~bm.visited[0, 0])  # (query tile, key tile) pairs never computed
    expected = attnlib.attention(q, k, v, mask_mod=mask_mod, backend="torch")
    calls = []
    real = triton_flex.forward_with_lse
    monkeypatch.setattr(triton_flex, "forward_with_lse", lambda *a: calls.append(1) or real(*a))
    # one query tile at a time: poison the key tiles that tile skips
    for i in range(skipped_tiles.shape[0]):
        rows = slice(i * 16, min((i + 1) * 16, T))
        poisoned = v.clone()
        for j in torch.nonzero(skipped_tiles[i]).flatten().tolist():
            poisoned[..., j * 16:(j + 1) * 16, :] = float("nan")
        with attnlib.unchecked():
            out = attnlib.attention(q, k, poisoned, block_mask=bm, backend="triton")
            dense = attnlib.attention(q, k, poisoned, mask_mod=mask_mod, backend="sdpa")
        torch.testing.assert_close(out[..., rows, :], expected[..., rows, :], atol=1e-13, rtol=0)
        if skipped_tiles[i].any():
            assert dense[..., rows, :].isnan().any()  # the dense route reads the poisoned tiles
    assert len(calls) == skipped_tiles.shape[0]  # every call ran the mod kernel


def test_backward_never_loads_skipped_tiles():
    """dQ of a query tile with NaN in the values of the key tiles it skips, and dK, dV of a key tile with NaN
    in the upstream gradients of the query tiles that skip it: still right (a loaded tile would give
    0 * NaN = NaN)."""
    mask_mod = mods.and_masks(mods.causal(), mods.document(DOC))
    bm = attnlib.block_mask(mask_mod, None, None, T, T, block_size=16)
    q, k, v, d_out = tensors(1, 2, T, 8, seed=8)
    expected = attnlib.attention_backward(q, k, v, d_out, mask_mod=mask_mod, backend="torch")
    skipped = torch.from_numpy(~bm.visited[0, 0])  # (query tile, key tile)
    for i in range(skipped.shape[0]):
        v2 = v.clone()
        for j in torch.nonzero(skipped[i]).flatten().tolist():
            v2[..., j * 16:(j + 1) * 16, :] = float("nan")
        with attnlib.unchecked():
            dq = attnlib.attention_backward(q, k, v2, d_out, block_mask=bm, backend="triton")[0]
        rows = slice(i * 16, (i + 1) * 16)
        torch.testing.assert_close(dq[..., rows, :], expected[0][..., rows, :], atol=1e-12, rtol=0)
    for j in range(skipped.shape[1]):
        d2 = d_out.clone()
        for i in torch.nonzero(skipped[:, j]).flatten().tolist():
            d2[..., i * 16:(i + 1) * 16, :] = float("nan")
        with attnlib.unchecked():
            _, dk, dv = attnlib.attention_backward(q, k, v, d2, block_mask=bm, backend="triton")
        keys = slice(j * 16, (j + 1) * 16)
        torch.testing.assert_close(dk[..., keys, :], expected[1][..., keys, :], atol=1e-12, rtol=0)
        torch.testing.assert_close(dv[..., keys, :], expected[2][..., keys, :], atol=1e-12, rtol=0)


GALLERY = {
    "causal": dict(mask_mod=mods.causal()),
    "sliding_window": dict(mask_mod=mods.sliding_window(9)),
    "packed_causal": dict(mask_mod=mods.and_masks(mods.causal(), mods.document(DOC))),
    "prefix_lm_per_batch": dict(mask_mod=mods.prefix_lm(np.array([5, 30]))),
    "attention_sinks": dict(mask_mod=mods.attention_sinks(3, 8)),
    "alibi_in_window": dict(score_mod=mods.alibi(3), causal=True, window=12),
    "alibi_document": dict(score_mod=mods.alibi(3), mask_mod=mods.document(np.stack([DOC, DOC[::-1]]))),
}


@pytest.mark.parametrize("name", list(GALLERY))
def test_autograd_through_the_mod_kernel(name):
    kw = GALLERY[name]
    q, k, v, d_out = tensors(2, 3, T, 8, seed=1)
    expected = attnlib.attention(q, k, v, backend="torch", **kw)
    expected_grads = attnlib.attention_backward(q, k, v, d_out, backend="torch", **kw)
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    out = attnlib.attention(*xs, backend="triton", **kw)
    torch.testing.assert_close(out.detach(), expected, atol=1e-13, rtol=0)
    out.backward(d_out)
    for x, e in zip(xs, expected_grads):
        torch.testing.assert_close(x.grad, e, atol=1e-12, rtol=0)


def test_soft_cap_forward_and_backward_in_the_kernels():
    q, k, v, d_out = tensors(1, 2, T, 8, seed=2)
    kw = dict(score_mod=mods.soft_cap(0.7), mask_mod=mods.sliding_window(10))
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    out = attnlib.attention(*xs, backend="triton", **kw)
    torch.testing.assert_close(out.detach(), attnlib.attention(q, k, v, backend="torch", **kw), atol=1e-13, rtol=0)
    out.backward(d_out)
    expected = attnlib.attention_backward(q, k, v, d_out, backend="torch", **kw)
    direct = attnlib.attention_backward(q, k, v, d_out, backend="triton", **kw)
    for x, d, e in zip(xs, direct, expected):
        torch.testing.assert_close(x.grad, e, atol=1e-12, rtol=0)
        torch.testing.assert_close(d, e, atol=1e-12, rtol=0)


def test_rows_with_no_key_in_the_kernel():
    """causal top-left with a window and T_q >= T_k + W: the last rows see no key."""
    q, _, _, d_out = tensors(1, 2, 40, 8, seed=3)
    _, k, v, _ = tensors(1, 2, 20, 8, seed=4)
    kw = dict(causal=True, window=6, score_mod=mods.alibi(2))
    with pytest.raises(MaskError, match="window=6"):
        attnlib.attention(q, k, v, backend="triton", **kw)
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    out = attnlib.attention(*xs, backend="triton", empty_rows="zero", **kw)
    expected = attnlib.attention(q, k, v, backend="torch", empty_rows="zero", **kw)
    assert (out[..., 25:, :] == 0).all()
    torch.testing.assert_close(out.detach(), expected, atol=1e-13, rtol=0)
    out.backward(d_out)
    expected_grads = attnlib.attention_backward(q, k, v, d_out, backend="torch", empty_rows="zero", **kw)
    for x, e in zip(xs, expected_grads):
        torch.testing.assert_close(x.grad, e, atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
def test_low_precision(dtype, tol):
    q, k, v, _ = tensors(2, 2, T, 16, seed=5, dtype=dtype)
    kw = dict(score_mod=mods.alibi(2), mask_mod=mods.and_masks(mods.causal(), mods.document(DOC)))
    out = attnlib.attention(q, k, v, backend="triton", **kw)
    expected = attnlib.attention(*(x.double() for x in (q, k, v)), backend="torch", **kw)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=0)


def test_a_users_own_function_is_refused_naming_the_backends_that_take_it():
    q, k, v, d_out = tensors(1, 4, T, 8, seed=6)
    own = lambda b, h, i, j: (i - j) % 2 == 0  # noqa: E731  not in the gallery
    assert triton_flex.kernel_spec(None, own, None, None, T, T, None) is None
    for kw in (dict(mask_mod=own), dict(mask_mod=mods.and_masks(mods.causal(), own)),
               dict(score_mod=lambda s, b, h, i, j: s * 0.5)):
        with pytest.raises(ValueError, match="cannot run; backends that take it: numpy, loop, torch and tiled"):
            attnlib.attention(q, k, v, backend="triton", **kw)
        with pytest.raises(ValueError, match="cannot run; backends that take it"):
            attnlib.attention_backward(q, k, v, d_out, backend="triton", **kw)
    out = attnlib.attention(q, k, v, mask_mod=own, backend="torch")  # which takes it
    assert out.shape == q.shape


def test_grouped_heads_run_in_the_kernel(monkeypatch):
    """enable_gqa: ALiBi's slope follows the query head and the per-batch documents the batch entry,
    though the kernels see (batch x H_kv, G) views."""
    q, _, _, d_out = tensors(2, 6, T, 8, seed=7)
    _, k, v, _ = tensors(2, 2, T, 8, seed=8)
    kw = dict(score_mod=mods.alibi(6), mask_mod=mods.and_masks(mods.causal(), mods.document(np.stack([DOC, DOC[::-1]]))),
              enable_gqa=True)
    calls = []
    real = triton_flex.forward_with_lse
    monkeypatch.setattr(triton_flex, "forward_with_lse", lambda *a: calls.append(1) or real(*a))
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    out = attnlib.attention(*xs, backend="triton", **kw)
    torch.testing.assert_close(out.detach(), attnlib.attention(q, k, v, backend="torch", **kw), atol=1e-13, rtol=0)
    out.backward(d_out)
    expected = attnlib.attention_backward(q, k, v, d_out, backend="torch", **kw)
    direct = attnlib.attention_backward(q, k, v, d_out, backend="triton", **kw)
    for x, d, e in zip(xs, direct, expected):
        torch.testing.assert_close(x.grad, e, atol=1e-12, rtol=0)
        torch.testing.assert_close(d, e, atol=1e-12, rtol=0)
    assert len(calls) == 2  # autograd's forward and attention_backward's


COMPILE = textwrap.dedent('''
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
    from attnlib.backends import triton_flash, triton_flex
    from attnlib.bench.sm90 import _resource_usage
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    for fn, dtype, d in [(fn, dtype, d) for fn in (triton_flex._flex_fwd, triton_flex._flex_bwd_dq,
                                                     triton_flex._flex_bwd_dkdv)
                         for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
                         for d in (64, 128)]:
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        if fn is triton_flex._flex_fwd:  # the GPU's tiles: no interpreter here
            (block_m, block_n, warps), stages = triton_flex.tile_for(dtype), 3
        else:
            block_m, block_n, warps, stages = triton_flex.BACKWARD_TILES[dtype][fn.__name__.split("_")[-1]]
        data, i32 = torch.empty(16, dtype=dtype), torch.empty(16, dtype=torch.int32)
        stats = torch.empty(16, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
        upcast, acc, precision = triton_flash.kernel_dtypes(dtype)
        scale, cap = triton_flash.scale_arguments(dtype, "cpu", 0.125, 30.0)
        values = dict(Q=data, K=data, V=data, Out=data, Lse=stats, DO=data, DQ=data, DK=data, DV=data, Delta=stats,
                      QNum=i32, QIdx=i32, n_q_blocks=64, KvNum=i32, KvIdx=i32, FullNum=i32, FullIdx=i32,
                      DocQ=torch.empty(16, dtype=torch.int64), DocK=torch.empty(16, dtype=torch.int64),
                      Prefix=torch.empty(16, dtype=torch.int64), Slopes=torch.empty(16, dtype=torch.float64),
                      Shift=torch.empty(16, dtype=torch.int64), shift_window=256, HAS_SHIFT=True,
                      H=32, T_q=4096, T_k=4096, n_kv_blocks=64, scale=scale, window=256, n_sinks=4,
                      sink_window=256, cap=cap, HEAD_DK=d, HEAD_DV=d, BLOCK_DK=d, BLOCK_DV=d, BLOCK_M=block_m, BLOCK_N=block_n, BS=128,
                      HAS_CAUSAL=True, HAS_WINDOW=True, HAS_DOC=True, HAS_PREFIX=True, HAS_SINKS=True, ALIBI=True,
                      SOFTCAP=True, UPCAST=False, ACC_DTYPE=acc, DOT_PRECISION=precision,
                      SCALES_IN_MEMORY=dtype == torch.float64)
        args = {n: values.get(n, 1 if n.endswith("d") else 64) for n in fn.arg_names}
        opts = {"num_warps": warps, "num_stages": stages}
        bound, spec, options = binder(**args, **opts)
        options, signature, constexprs, attrs = fn._pack_args(backend, opts, bound, spec, options)
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                  options=options.__dict__)
        regs, spill = _resource_usage(compiled.asm["cubin"])
        print("compiled", fn.__name__, str(dtype), f"{block_m}x{block_n}", d, regs, spill, compiled.metadata.shared)
''')


def test_the_mod_kernel_compiles_for_sm90():
    """Every flag on, at the GPU's tiles (triton_flex.tile_for: fp16 and bf16 128 x 64 with 8 warps, fp32
    32 x 32, fp64 16 x 16), d 64 and 128, over 128-key blocks, forward and both backward kernels: compiled
    ahead of time
    for the H100 with the ptxas the triton wheel bundles, in a subprocess without TRITON_INTERPRET."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", COMPILE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith("compiled")]
    assert run.returncode == 0 and len(rows) == 24, run.stdout[-2000:] + run.stderr[-3000:]
    known = {("_flex_bwd_dq", "torch.float64", "128"): 72}  # no 16 x 16 fp64 dQ tile is clean at d = 128
    for row in rows:
        assert int(row[-1]) <= 232_448, row  # shared memory within the H100's limit
        assert int(row[-2]) <= known.get((row[1], row[2], row[4]), 0), f"register spill: {row}"


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, 4)])
def test_packed_sequences_run_in_the_kernel(causal, window, monkeypatch):
    """varlen_attention's mask_mod (sequences of different lengths, causal bottom-right in each) runs in
    the mod kernel on triton, and agrees with the torch backend, forward and through autograd."""
    cu_q = torch.tensor([0, 5, 6, 15, 18], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 11, 20, 23], dtype=torch.int32)
    g = torch.Generator().manual_seed(9)
    q, d_out = (torch.randn(18, 2, 8, generator=g, dtype=torch.float64).to(DEVICE) for _ in range(2))
    k, v = (torch.randn(23, 2, 8, generator=g, dtype=torch.float64).to(DEVICE) for _ in range(2))
    calls = []
    real = triton_flex.forward_with_lse
    monkeypatch.setattr(triton_flex, "forward_with_lse", lambda *a: calls.append(1) or real(*a))
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    out = attnlib.varlen_attention(*xs, cu_q, cu_k, causal=causal, window=window, backend="triton")
    expected = attnlib.varlen_attention(q, k, v, cu_q, cu_k, causal=causal, window=window, backend="torch")
    assert calls == [1]
    torch.testing.assert_close(out.detach(), expected, atol=1e-13, rtol=0)
    out.backward(d_out)
    grads = attnlib.varlen_attention_backward(q, k, v, d_out, cu_q, cu_k, causal=causal, window=window,
                                              backend="torch")
    for x, e in zip(xs, grads):
        torch.testing.assert_close(x.grad, e, atol=1e-12, rtol=0)
