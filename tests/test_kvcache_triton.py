"""attention_with_kvcache's triton backend (attnlib.backends.triton_decode): the split-KV decode kernel
and its merge, against the numpy backend in float64, under Triton's CPU interpreter without a GPU
(small shapes: the interpreter is slow), and compiled for the H100 (sm_90) with no spill."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from test_triton import DEVICE, ON_GPU, interpreter  # noqa: F401  (the fixture is autouse)

_SAVED = os.environ.get("TRITON_INTERPRET")
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
from attnlib.backends import triton_decode  # noqa: E402  (its kernels are defined here)

if _SAVED is None:
    os.environ.pop("TRITON_INTERPRET", None)
else:
    os.environ["TRITON_INTERPRET"] = _SAVED

from attnlib import PagedKVCache, attention_with_kvcache  # noqa: E402
from attnlib.errors import DTypeError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

if not ON_GPU and not triton_decode.RUNS_ON_CPU:
    pytest.fail("attnlib.backends.triton_decode was imported before TRITON_INTERPRET=1 was set; run "
                "tests/test_kvcache_triton.py in a fresh process", pytrace=False)


def _case(rng, batch, n_new, n_heads, n_kv_heads, d, t_max, d_v=None):
    q = rng.standard_normal((batch, n_new, n_heads, d))
    k = rng.standard_normal((batch, t_max, n_kv_heads, d))
    v = rng.standard_normal((batch, t_max, n_kv_heads, d_v or d))
    return q, k, v, rng.integers(n_new, t_max + 1, size=batch)


def _paged(k, v, seqlens, page_size, rng):
    batch, t_max = k.shape[:2]
    max_blocks = -(-t_max // page_size)
    order = rng.permutation(batch * max_blocks + 2)
    k_pages = rng.standard_normal((order.size, page_size) + k.shape[2:]) * 100
    v_pages = rng.standard_normal((order.size, page_size) + v.shape[2:]) * 100
    table = np.full((batch, max_blocks), -1, dtype=np.int32)
    for b in range(batch):
        for i in range(-(-int(seqlens[b]) // page_size)):
            table[b, i] = page = order[b * max_blocks + i]
            n = min(page_size, int(seqlens[b]) - i * page_size)
            rows = slice(i * page_size, i * page_size + n)
            k_pages[page, :n], v_pages[page, :n] = k[b, rows], v[b, rows]
    return k_pages, v_pages, table


def _t(x, dtype=torch.float32):
    return torch.from_numpy(np.asarray(x)).to(DEVICE) if np.asarray(x).dtype.kind in "iu" else \
        torch.from_numpy(np.asarray(x)).to(dtype).to(DEVICE)


CASES = [  # batch, n_new, n_heads, n_kv_heads, d, t_max, window, d_v
    (1, 1, 8, 2, 16, 70, None, None),  # GQA, one query, several key blocks
    (3, 1, 4, 4, 8, 40, None, 12),  # MHA, d 8 and d_v 12 (padded tiles)
    (2, 3, 6, 2, 16, 37, 5, None),  # three new tokens, a window
    (2, 2, 4, 1, 32, 50, None, None),  # MQA
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("num_splits", [1, 3, 0])
def test_triton_equals_the_numpy_backend_contiguous_and_paged(case, num_splits):
    batch, n_new, n_heads, n_kv_heads, d, t_max, window, d_v = case
    rng = np.random.default_rng(sum(case[:6]) + num_splits)
    q, k, v, seqlens = _case(rng, batch, n_new, n_heads, n_kv_heads, d, t_max, d_v)
    rounded = [_t(x).double().cpu().numpy() for x in (q, k, v)]  # what the fp32 kernel sees
    expected = attention_with_kvcache(*rounded, cache_seqlens=seqlens, window=window)
    out = attention_with_kvcache(_t(q), _t(k), _t(v), cache_seqlens=_t(seqlens), window=window,
                                 num_splits=num_splits, backend="triton")
    assert out.dtype == torch.float32 and out.shape == expected.shape
    np.testing.assert_allclose(out.cpu().numpy(), expected, rtol=0, atol=2e-6)
    k_pages, v_pages, table = _paged(k, v, seqlens, 4, rng)
    paged = attention_with_kvcache(_t(q), _t(k_pages), _t(v_pages), cache_seqlens=_t(seqlens),
                                   block_table=_t(table), window=window, num_splits=num_splits,
                                   backend="triton")
    np.testing.assert_allclose(paged.cpu().numpy(), expected, rtol=0, atol=2e-6)


def test_splits_agree_with_no_split_and_the_keys_past_each_length_are_never_read():
    rng = np.random.default_rng(1)
    q, k, v, _ = _case(rng, 2, 1, 4, 2, 16, 64)
    seqlens = np.array([64, 21])
    k[1, 21:], v[1, 21:] = np.nan, np.inf
    one = attention_with_kvcache(_t(q), _t(k), _t(v), cache_seqlens=_t(seqlens), backend="triton")
    assert torch.isfinite(one).all()
    for num_splits in (2, 4, 8):  # 8 splits of 64 keys in blocks of 16: some splits have no key
        split = attention_with_kvcache(_t(q), _t(k), _t(v), cache_seqlens=_t(seqlens), num_splits=num_splits,
                                       backend="triton")
        torch.testing.assert_close(split, one, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype, atol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_half_precision_keeps_its_dtype_and_stays_close(dtype, atol):
    rng = np.random.default_rng(2)
    q, k, v, seqlens = _case(rng, 2, 1, 4, 2, 16, 40)
    tensors = [_t(x, dtype) for x in (q, k, v)]
    out = attention_with_kvcache(*tensors, cache_seqlens=_t(seqlens), num_splits=2, backend="triton")
    expected = attention_with_kvcache(*(x.double().cpu().numpy() for x in tensors), cache_seqlens=seqlens)
    assert out.dtype == dtype
    np.testing.assert_allclose(out.double().cpu().numpy(), expected, rtol=0, atol=atol)


def test_a_paged_cache_pool_on_triton():
    rng = np.random.default_rng(3)
    cache = PagedKVCache(10, 5, 2, 16, dtype=torch.float32, device=DEVICE)
    for seq_id, n in (("a", 12), ("b", 3), ("c", 20)):
        cache.add(seq_id)
        cache.append(seq_id, _t(rng.standard_normal((n, 2, 16))), _t(rng.standard_normal((n, 2, 16))))
    cache.release("b")
    cache.add("d")
    cache.append("d", _t(rng.standard_normal((4, 2, 16))), _t(rng.standard_normal((4, 2, 16))))
    ids = ["c", "d", "a"]
    q = _t(rng.standard_normal((3, 1, 4, 16)))
    args = dict(cache_seqlens=cache.seqlens(ids), block_table=cache.block_table(ids), num_splits=2)
    out = attention_with_kvcache(q, cache.k_cache, cache.v_cache, backend="triton", **args)
    expected = attention_with_kvcache(q, cache.k_cache, cache.v_cache, backend="torch", **args)
    torch.testing.assert_close(out, expected, rtol=0, atol=2e-6)


def test_numpy_input_comes_back_as_numpy_and_float64_is_refused():
    rng = np.random.default_rng(4)
    q, k, v, seqlens = _case(rng, 1, 1, 2, 2, 16, 10)
    q, k, v = (x.astype(np.float32) for x in (q, k, v))
    out = attention_with_kvcache(q, k, v, cache_seqlens=seqlens, backend="triton")
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    with pytest.raises(DTypeError, match="float16, bfloat16 or float32"):
        attention_with_kvcache(_t(q, torch.float64), _t(k, torch.float64), _t(v, torch.float64),
                               cache_seqlens=_t(seqlens), backend="triton")


COMPILE = textwrap.dedent('''
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
    from attnlib.backends import triton_decode as td
    from attnlib.bench.sm90 import _resource_usage
    assert not td.RUNS_ON_CPU
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)

    def compile_one(fn, values, warps):
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        opts = {"num_warps": warps, "num_stages": 3}
        bound, spec, options = binder(**{n: values[n] for n in fn.arg_names}, **opts)
        options, signature, constexprs, attrs = fn._pack_args(backend, opts, bound, spec, options)
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                  options=options.__dict__)
        return _resource_usage(compiled.asm["cubin"]) + (compiled.metadata.shared,)

    i32, f32 = torch.empty(16, dtype=torch.int32), torch.empty(16, dtype=torch.float32)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        data = torch.empty(16, dtype=dtype)
        for d in (64, 128):
            for paged in (False, True):
                values = dict(Q=data, K=data, V=data, Seqlens=i32, BlockTable=i32, OutPart=f32, LsePart=f32,
                              stride_qb=32 * d, stride_qt=32 * d, stride_qh=d, stride_kb=16 * 8 * d,
                              stride_kt=8 * d, stride_kh=d, stride_vb=16 * 8 * d, stride_vt=8 * d,
                              stride_vh=d,
                              stride_bt=2048, T_NEW=1, qk_scale=0.1, window=4096, NUM_SPLITS=16, GROUP=4,
                              PAGE_SIZE=16 if paged else 1, HEAD_DK=d, HEAD_DV=d, BLOCK_DK=d, BLOCK_DV=d,
                              BLOCK_M=16, BLOCK_N=td.GPU_BLOCK_N, PAGED=paged, CAUSAL=True, HAS_WINDOW=True,
                              UPCAST=False, DOT_PRECISION=td.dot_precision(dtype))
                regs, spill, shared = compile_one(td._decode_split, values, td.NUM_WARPS)
                print("compiled split", str(dtype), d, paged, regs, spill, shared)
            out = torch.empty(16, dtype=dtype)
            for splits in (1, 16):
                values = dict(OutPart=f32, LsePart=f32, Out=out, NUM_SPLITS=splits, BLOCK_S=splits, HEAD_DV=d,
                              BLOCK_DV=d)
                regs, spill, shared = compile_one(td._decode_merge, values, 4)
                print("compiled merge", str(dtype), d, splits, regs, spill, shared)
''')


def test_the_decode_kernels_compile_for_sm90_without_spill():
    """fp16, bf16 and fp32 at d 64 and 128, contiguous and paged (16-position pages), causal with a window,
    the group of an H = 32 over H_kv = 8 model (4 query heads, one new token), 16 splits (the merge also
    with 1): compiled ahead of
    time for the H100 with the ptxas the triton wheel bundles, in a subprocess without TRITON_INTERPRET."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", COMPILE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith("compiled")]
    assert run.returncode == 0 and len(rows) == 24, run.stdout[-2000:] + run.stderr[-3000:]
    for row in rows:
        assert int(row[-2]) == 0, f"register spill: {row}"
        assert int(row[-1]) <= 232_448, row
