"""attention_with_kvcache and split-KV: against an independent float64 reference, SDPA, and each other.

The reference (``reference``) is written here, not imported: a double loop over sequences and
query heads, the softmax over exactly the keys each new token may see.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlib
from attnlib import attention_with_kvcache
from attnlib.errors import DTypeError, MixedArrayTypesError, NonFiniteError, ShapeError
from attnlib.split_kv import (attend_chunk, choose_num_splits, decode_one_sequence, merge_chunks,
                              split_bounds)


def reference(q, k, v, seqlens, *, causal=True, window=None, scale=None):
    """Dense float64 attention of each sequence's new tokens over its valid keys (contiguous k, v)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    batch, n_new, n_heads, d = q.shape
    group = n_heads // k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = np.zeros(q.shape[:3] + v.shape[-1:])
    for b in range(batch):
        n = int(seqlens[b])
        for t in range(n_new):
            position = n - n_new + t
            keys = [j for j in range(n) if (not causal or j <= position)
                    and (window is None or j > position - window)]
            for h in range(n_heads):
                scores = np.array([q[b, t, h] @ k[b, j, h // group] for j in keys]) * scale
                weights = np.exp(scores - scores.max())
                weights /= weights.sum()
                out[b, t, h] = weights @ v[b, keys, h // group]
    return out


def random_case(rng, batch, n_new, n_heads, n_kv_heads, d, t_max, d_v=None):
    q = rng.standard_normal((batch, n_new, n_heads, d))
    k = rng.standard_normal((batch, t_max, n_kv_heads, d))
    v = rng.standard_normal((batch, t_max, n_kv_heads, d_v or d))
    seqlens = rng.integers(n_new, t_max + 1, size=batch)
    return q, k, v, seqlens


def to_paged(k, v, seqlens, page_size, rng, n_spare=3):
    """The same keys and values in a shuffled pool of pages, and its block table (-1 past each sequence)."""
    batch, t_max = k.shape[:2]
    max_blocks = -(-t_max // page_size)
    n_blocks = batch * max_blocks + n_spare
    order = rng.permutation(n_blocks)
    k_pages = rng.standard_normal((n_blocks, page_size) + k.shape[2:]) * 100  # garbage where unused
    v_pages = rng.standard_normal((n_blocks, page_size) + v.shape[2:]) * 100
    table = np.full((batch, max_blocks), -1, dtype=np.int32)
    for b in range(batch):
        n = int(seqlens[b])
        for i in range(-(-n // page_size)):
            page = order[b * max_blocks + i]
            table[b, i] = page
            rows = slice(i * page_size, min((i + 1) * page_size, n))
            k_pages[page, : rows.stop - rows.start] = k[b, rows]
            v_pages[page, : rows.stop - rows.start] = v[b, rows]
    return k_pages, v_pages, table


# --- the split and the merge, step by step ------------------------------------------------------


@pytest.mark.parametrize("n_keys", [1, 5, 17, 256])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 300])
def test_split_bounds_cover_every_key_once_with_no_empty_chunk(n_keys, num_splits):
    bounds = split_bounds(n_keys, num_splits)
    assert bounds[0][0] == 0 and bounds[-1][1] == n_keys
    assert all(stop > start for start, stop in bounds)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert len(bounds) <= num_splits


def test_merge_is_exact_to_1e_12_in_float64_for_every_num_splits():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((3, 8, 16)) * 2
    k = rng.standard_normal((200, 2, 16)) * 2
    v = rng.standard_normal((200, 2, 16))
    whole = decode_one_sequence(q, k, v, scale=0.25, num_splits=1)
    for num_splits in (2, 3, 8, 64, 200, 500):
        split = decode_one_sequence(q, k, v, scale=0.25, num_splits=num_splits)
        np.testing.assert_allclose(split, whole, rtol=0, atol=1e-12)


def test_a_chunk_a_query_cannot_see_gets_lse_minus_inf_and_no_weight_in_the_merge():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 1, 1, 4))
    k, v = rng.standard_normal((6, 1, 4)), rng.standard_normal((6, 1, 4))
    allowed = np.array([[True] * 3 + [False] * 3, [False] * 6])
    out, lse = attend_chunk(q, k, v, allowed, 0.5)
    assert np.isneginf(lse[1]).all() and (out[1] == 0).all() and np.isfinite(lse[0]).all()
    first, lse_first = attend_chunk(q[:1], k[:3], v[:3], np.ones((1, 3), bool), 0.5)
    nothing, lse_nothing = attend_chunk(q[:1], k[3:], v[3:], np.zeros((1, 3), bool), 0.5)
    merged, merged_lse = merge_chunks([first, nothing], [lse_first, lse_nothing])
    np.testing.assert_array_equal(merged, first)
    np.testing.assert_array_equal(merged_lse, lse_first)


def test_the_lse_of_a_chunk_is_the_log_of_its_softmax_denominator():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 1, 1, 8))
    k, v = rng.standard_normal((5, 1, 8)), rng.standard_normal((5, 1, 8))
    _, lse = attend_chunk(q, k, v, np.ones((1, 5), bool), 0.3)
    np.testing.assert_allclose(lse[0, 0, 0], np.log(np.exp(0.3 * k[:, 0] @ q[0, 0, 0]).sum()), rtol=1e-14)


def test_choose_num_splits_fills_the_sms_only_when_few_programs_run():
    assert choose_num_splits(1, 8, 32768, num_sms=132) == 17  # 8 programs -> 136
    assert choose_num_splits(64, 8, 32768, num_sms=132) == 1  # 512 programs already
    assert choose_num_splits(1, 8, 1000, num_sms=132) == 3  # chunks of at least 256 keys
    assert choose_num_splits(1, 1, 10**6, num_sms=1000) == 128  # at most 128
    assert choose_num_splits(1, 8, 100, num_sms=132) == 1
    with pytest.raises(ValueError, match="batch"):
        choose_num_splits(0, 8, 100)


# --- attention_with_kvcache against the reference ------------------------------------------------


CASES = [  # batch, n_new, n_heads, n_kv_heads, d, t_max, window
    (1, 1, 4, 4, 8, 30, None),
    (3, 1, 8, 2, 16, 50, None),  # GQA
    (2, 3, 4, 1, 8, 40, None),  # MQA, several new tokens
    (4, 2, 6, 3, 4, 33, 7),  # window
    (2, 1, 2, 2, 8, 64, 1),
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("num_splits", [1, 2, 5, 0])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_contiguous_and_paged_equal_the_reference(case, num_splits, backend):
    batch, n_new, n_heads, n_kv_heads, d, t_max, window = case
    rng = np.random.default_rng(hash(case) % 2**32)
    q, k, v, seqlens = random_case(rng, batch, n_new, n_heads, n_kv_heads, d, t_max)
    expected = reference(q, k, v, seqlens, window=window)
    convert = torch.from_numpy if backend == "torch" else np.asarray
    out = attention_with_kvcache(convert(q), convert(k), convert(v), cache_seqlens=convert(seqlens),
                                 window=window, num_splits=num_splits, backend=backend)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=0, atol=1e-12)
    for page_size in (1, 4, 16):
        k_pages, v_pages, table = to_paged(k, v, seqlens, page_size, rng)
        paged = attention_with_kvcache(convert(q), convert(k_pages), convert(v_pages),
                                       cache_seqlens=convert(seqlens), block_table=convert(table),
                                       window=window, num_splits=num_splits, backend=backend)
        np.testing.assert_array_equal(np.asarray(paged), np.asarray(out))  # the same data: the same bits


def test_random_shapes_lengths_page_sizes_and_splits_equal_the_reference():
    rng = np.random.default_rng(33)
    for _ in range(25):
        n_kv_heads = int(rng.integers(1, 4))
        n_heads = n_kv_heads * int(rng.integers(1, 4))
        n_new = int(rng.integers(1, 4))
        t_max = int(rng.integers(n_new, 70))
        window = None if rng.random() < 0.5 else int(rng.integers(1, 20))
        q, k, v, seqlens = random_case(rng, int(rng.integers(1, 5)), n_new, n_heads, n_kv_heads,
                                       int(rng.choice([4, 8])), t_max, d_v=int(rng.choice([4, 6])))
        expected = reference(q, k, v, seqlens, window=window)
        for b, n in enumerate(seqlens):  # the reference is attention(causal="bottom-right") over each alone
            alone = attnlib.attention(q[b].transpose(1, 0, 2), k[b, :n].transpose(1, 0, 2),
                                      v[b, :n].transpose(1, 0, 2), causal="bottom-right", window=window,
                                      enable_gqa=True)
            np.testing.assert_allclose(alone.transpose(1, 0, 2), expected[b], rtol=0, atol=1e-12)
        num_splits = int(rng.integers(0, 9))
        page_size = int(rng.integers(1, 20))
        k_pages, v_pages, table = to_paged(k, v, seqlens, page_size, rng)
        for backend in ("numpy", "torch"):
            out = attention_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table,
                                         window=window, num_splits=num_splits, backend=backend)
            np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)


def test_equals_attention_bottom_right_over_each_sequence_alone():
    rng = np.random.default_rng(4)
    q, k, v, seqlens = random_case(rng, 3, 2, 4, 2, 8, 25)
    out = attention_with_kvcache(q, k, v, cache_seqlens=seqlens, window=6, num_splits=3)
    for b, n in enumerate(seqlens):
        alone = attnlib.attention(q[b].transpose(1, 0, 2), k[b, :n].transpose(1, 0, 2),
                                  v[b, :n].transpose(1, 0, 2),
                                  causal="bottom-right", window=6, enable_gqa=True)
        np.testing.assert_allclose(out[b], alone.transpose(1, 0, 2), rtol=0, atol=1e-12)


def test_not_causal_sees_every_valid_key():
    rng = np.random.default_rng(5)
    q, k, v, seqlens = random_case(rng, 2, 3, 2, 2, 4, 12)
    out = attention_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=False, num_splits=2)
    np.testing.assert_allclose(out, reference(q, k, v, seqlens, causal=False), rtol=0, atol=1e-12)


def test_one_query_equals_torch_sdpa_with_gqa():
    generator = torch.Generator().manual_seed(6)
    q = torch.randn(3, 1, 8, 16, generator=generator)
    k, v = torch.randn(3, 40, 2, 16, generator=generator), torch.randn(3, 40, 2, 16, generator=generator)
    seqlens = torch.tensor([40, 9, 23], dtype=torch.int32)
    out = attention_with_kvcache(q, k, v, cache_seqlens=seqlens, num_splits=4)
    for b, n in enumerate(seqlens.tolist()):
        sdpa = F.scaled_dot_product_attention(q[b:b + 1].transpose(1, 2), k[b:b + 1, :n].transpose(1, 2),
                                              v[b:b + 1, :n].transpose(1, 2), enable_gqa=True)
        torch.testing.assert_close(out[b:b + 1], sdpa.transpose(1, 2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_torch_half_precision_stays_close_to_float64_and_keeps_its_dtype(dtype):
    rng = np.random.default_rng(7)
    q, k, v, seqlens = random_case(rng, 2, 1, 4, 2, 16, 64)
    out = attention_with_kvcache(*(torch.from_numpy(x).to(dtype) for x in (q, k, v)),
                                 cache_seqlens=torch.from_numpy(seqlens), num_splits=3)
    assert out.dtype == dtype and out.shape == (2, 1, 4, 16)
    rounded = [torch.from_numpy(x).to(dtype).double().numpy() for x in (q, k, v)]
    tolerance = {torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5}[dtype]
    np.testing.assert_allclose(out.double().numpy(), reference(*rounded, seqlens), atol=tolerance)


def test_numpy_input_on_the_torch_backend_comes_back_as_numpy():
    rng = np.random.default_rng(8)
    q, k, v, seqlens = random_case(rng, 2, 1, 2, 2, 4, 10)
    out = attention_with_kvcache(q, k, v, cache_seqlens=seqlens, backend="torch")
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, reference(q, k, v, seqlens), atol=1e-12)


def test_keys_past_a_sequence_length_are_never_read():
    rng = np.random.default_rng(9)
    q, k, v, seqlens = random_case(rng, 2, 1, 2, 1, 4, 10)
    seqlens = np.array([4, 7])
    k_bad, v_bad = k.copy(), v.copy()
    for b, n in enumerate(seqlens):
        k_bad[b, n:], v_bad[b, n:] = np.nan, np.inf
    for backend in ("numpy", "torch"):
        out = attention_with_kvcache(q, k_bad, v_bad, cache_seqlens=seqlens, backend=backend, num_splits=3)
        np.testing.assert_allclose(out, reference(q, k, v, seqlens), atol=1e-12)


# --- bad input ---------------------------------------------------------------------------------------


def _good():
    rng = np.random.default_rng(10)
    q = rng.standard_normal((2, 1, 4, 8))
    k = rng.standard_normal((2, 16, 2, 8))
    return q, k, k.copy(), np.array([5, 16])


@pytest.mark.parametrize("change, error, match", [
    (dict(q=np.zeros((2, 4, 8))), ShapeError, "q must have 4 dimensions"),
    (dict(k_cache=np.zeros((2, 16, 2, 4)), v_cache=np.zeros((2, 16, 2, 4))), ShapeError, "d = 8"),
    (dict(v_cache=np.zeros((2, 15, 2, 8))), ShapeError, "first three dimensions"),
    (dict(k_cache=np.zeros((2, 16, 3, 8)), v_cache=np.zeros((2, 16, 3, 8))), ShapeError, "multiple of"),
    (dict(k_cache=np.zeros((3, 16, 2, 8)), v_cache=np.zeros((3, 16, 2, 8))), ShapeError, "batch B = 2"),
    (dict(cache_seqlens=np.array([5, 17])), ValueError, r"cache_seqlens\[1\] = 17 is beyond.*T_max = 16"),
    (dict(cache_seqlens=np.array([0, 3])), ValueError, r"cache_seqlens\[0\] = 0 must be at least"),
    (dict(cache_seqlens=np.array([5])), ShapeError, r"cache_seqlens must have shape \(B,\) = \(2,\)"),
    (dict(cache_seqlens=np.array([5.0, 3.0])), DTypeError, "cache_seqlens must hold integers"),
    (dict(cache_seqlens=None), ValueError, "cache_seqlens is required"),
    (dict(q=np.zeros((2, 1, 4, 8), dtype=np.int64)), DTypeError, "q must be a floating-point"),
    (dict(q=np.zeros((2, 1, 4, 8), dtype=np.float32)), DTypeError, "share a dtype"),
    (dict(num_splits=-1), ValueError, "num_splits must be an int >= 0"),
    (dict(num_splits=1.5), ValueError, "num_splits"),
    (dict(window=0), ValueError, "window must be at least 1"),
    (dict(window=3, causal=False), ValueError, "needs causal"),
    (dict(backend="sdpa"), ValueError, "backend must be one of"),
    (dict(scale=-1.0), ValueError, "scale"),
    (dict(cache_seqlens=torch.tensor([5, 16])), MixedArrayTypesError, "cannot be mixed"),
])
def test_bad_input_names_the_argument_and_shapes(change, error, match):
    q, k, v, seqlens = _good()
    args = dict(q=q, k_cache=k, v_cache=v, cache_seqlens=seqlens)
    args.update(change)
    options = {name: args.pop(name) for name in list(args) if name not in ("q", "k_cache", "v_cache")}
    with pytest.raises(error, match=match):
        attention_with_kvcache(args["q"], args["k_cache"], args["v_cache"], **options)


def test_causal_needs_at_least_t_new_keys():
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 3, 2, 4))
    k = rng.standard_normal((1, 8, 2, 4))
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = 2 must be at least T_new = 3"):
        attention_with_kvcache(q, k, k, cache_seqlens=np.array([2]))
    attention_with_kvcache(q, k, k, cache_seqlens=np.array([2]), causal=False)  # fine without causal


def test_bad_block_tables_name_the_sequence_and_entry():
    q, _, _, _ = _good()
    pages = np.zeros((6, 4, 2, 8))
    table = np.array([[0, 1, -1, -1], [2, 3, 4, 5]], dtype=np.int32)
    out = attention_with_kvcache(q, pages, pages, cache_seqlens=np.array([5, 16]), block_table=table)
    assert out.shape == (2, 1, 4, 8)  # -1 past a sequence's pages is never read
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = 7 is not a page of the pool \(0..5"):
        attention_with_kvcache(q, pages, pages, cache_seqlens=np.array([5, 16]),
                               block_table=np.array([[0, 7, -1, -1], [2, 3, 4, 5]]))
    with pytest.raises(ValueError, match=r"block_table\[1, 3\] = -1"):
        attention_with_kvcache(q, pages, pages, cache_seqlens=np.array([5, 16]),
                               block_table=np.array([[0, 1, -1, -1], [2, 3, 4, -1]]))
    with pytest.raises(ValueError, match=r"beyond the cache's capacity: block_table's 4 pages of 4"):
        attention_with_kvcache(q, pages, pages, cache_seqlens=np.array([5, 17]), block_table=table)
    with pytest.raises(ShapeError, match=r"block_table must have shape \(B, max_blocks\)"):
        attention_with_kvcache(q, pages, pages, cache_seqlens=np.array([5, 16]), block_table=table[:1])
    with pytest.raises(DTypeError, match="block_table must hold integers"):
        attention_with_kvcache(q, pages, pages, cache_seqlens=np.array([5, 16]), block_table=table * 1.0)


def test_tensors_on_the_numpy_backend_are_refused():
    q, k, v, seqlens = (torch.from_numpy(x) for x in _good())
    with pytest.raises(TypeError, match="backend 'numpy' computes on NumPy arrays"):
        attention_with_kvcache(q, k, v, cache_seqlens=seqlens, backend="numpy")


def test_lists_of_lengths_and_pages_are_accepted_and_nan_in_q_is_refused():
    q, k, v, _ = _good()
    out = attention_with_kvcache(q, k, v, cache_seqlens=[5, 16])
    np.testing.assert_array_equal(out, attention_with_kvcache(q, k, v, cache_seqlens=np.array([5, 16])))
    pages = k.reshape(8, 4, 2, 8)
    paged = attention_with_kvcache(q, pages, pages, cache_seqlens=[5, 16],
                                   block_table=[[0, 1, 2, 3], [4, 5, 6, 7]])
    np.testing.assert_array_equal(paged, out)
    q[1, 0, 2, 3] = np.nan
    with pytest.raises(NonFiniteError, match=r"q \(shape \(2, 1, 4, 8\)\) contains NaN"):
        attention_with_kvcache(q, k, v, cache_seqlens=[5, 16])
    with attnlib.unchecked():
        assert np.isnan(attention_with_kvcache(q, k, v, cache_seqlens=[5, 16])[1, 0, 2]).all()


def test_numpy_input_never_imports_torch():
    import subprocess
    import sys
    code = ("import sys, numpy as np, attnlib\n"
            "q = np.ones((1, 1, 2, 4)); k = np.ones((1, 600, 2, 4))\n"
            "attnlib.attention_with_kvcache(q, k, k, cache_seqlens=np.array([600]), num_splits=0)\n"
            "c = attnlib.PagedKVCache(2, 4, 2, 4, dtype='float32'); c.add(0)\n"
            "print('torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "False", run.stderr[-2000:]
