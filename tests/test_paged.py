"""PagedKVCache: pages from a free list, block tables, memory, errors that change nothing, and reuse
that never leaks one sequence's keys into another's attention."""

import math

import numpy as np
import pytest
import torch

import attnlib
from attnlib import PagedKVCache, attention_with_kvcache
from attnlib.errors import CacheFullError, DTypeError, ShapeError


def dense(q, k, v):
    """Float64 attention of one sequence's last q.shape[0] tokens over its keys.

    q (T_new, H, d), k (n, H_kv, d), v (n, H_kv, d_v)."""
    group = q.shape[1] // k.shape[1]
    out = np.zeros(q.shape[:2] + v.shape[-1:])
    n, n_new = k.shape[0], q.shape[0]
    for t in range(n_new):
        for h in range(q.shape[1]):
            scores = k[: n - n_new + t + 1, h // group] @ q[t, h] / math.sqrt(q.shape[-1])
            weights = np.exp(scores - scores.max())
            out[t, h] = weights / weights.sum() @ v[: n - n_new + t + 1, h // group]
    return out


def test_pages_come_from_the_free_list_only_when_a_page_fills():
    rng = np.random.default_rng(0)
    cache = PagedKVCache(6, 4, 2, 3, dtype=np.float64)
    cache.add("a")
    assert cache.seqlens(["a"]).tolist() == [0] and cache.bytes_reserved() == 0
    cache.append("a", rng.standard_normal((5, 2, 3)), rng.standard_normal((5, 2, 3)))
    cache.add("b")
    cache.append("b", rng.standard_normal((1, 2, 3)), rng.standard_normal((1, 2, 3)))
    cache.append("a", rng.standard_normal((3, 2, 3)), rng.standard_normal((3, 2, 3)))  # 8: still 2 pages
    table = cache.block_table(["a", "b"])
    assert table.dtype == np.int32 and table.tolist() == [[0, 1], [2, -1]]
    assert cache.seqlens(["b", "a"]).tolist() == [1, 8]
    per_position = 2 * 2 * 3 * 8
    assert cache.bytes_used() == 9 * per_position
    assert cache.bytes_reserved() == 3 * 4 * per_position
    assert cache.bytes_total() == 6 * 4 * per_position and cache.free_blocks == 3
    assert cache.block_table(["b"], max_blocks=3).tolist() == [[2, -1, -1]]
    assert cache.seq_ids == ["a", "b"] and "a" in cache and len(cache) == 2


def test_the_pages_hold_the_keys_in_order_and_attention_reads_them():
    rng = np.random.default_rng(1)
    cache = PagedKVCache(20, 3, 2, 4, dtype=np.float64)
    keys, values = {}, {}
    for seq_id, chunks in (("x", [4, 1, 1]), ("y", [7]), ("z", [2, 2, 2, 1])):
        cache.add(seq_id)
        keys[seq_id], values[seq_id] = [], []
        for n in chunks:
            k, v = rng.standard_normal((n, 2, 4)), rng.standard_normal((n, 2, 4))
            cache.append(seq_id, k, v)
            keys[seq_id].append(k)
            values[seq_id].append(v)
    ids = ["z", "x", "y"]
    q = rng.standard_normal((3, 1, 4, 4))
    for num_splits in (1, 2, 0):
        out = attention_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=cache.seqlens(ids),
                                     block_table=cache.block_table(ids), num_splits=num_splits)
        for b, seq_id in enumerate(ids):
            k, v = np.concatenate(keys[seq_id]), np.concatenate(values[seq_id])
            np.testing.assert_allclose(out[b], dense(q[b], k, v), rtol=0, atol=1e-12)


def test_a_full_pool_raises_and_the_failed_call_changes_nothing():
    rng = np.random.default_rng(2)
    cache = PagedKVCache(3, 2, 1, 2, dtype=np.float32)
    cache.add(0)
    cache.append(0, rng.standard_normal((3, 1, 2)), rng.standard_normal((3, 1, 2)))
    before = (cache.k_cache.copy(), cache.v_cache.copy(), cache.free_blocks, cache.block_table([0]).tolist(),
              cache.seqlens([0]).tolist(), cache.bytes_reserved())
    assert cache.can_append(0, 3) and not cache.can_append(0, 4)
    with pytest.raises(CacheFullError, match=r"needs 2 more pages of 2, and 1 of 3 are free"):
        cache.append(0, rng.standard_normal((4, 1, 2)), rng.standard_normal((4, 1, 2)))
    after = (cache.k_cache, cache.v_cache, cache.free_blocks, cache.block_table([0]).tolist(),
             cache.seqlens([0]).tolist(), cache.bytes_reserved())
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[1], before[1])
    assert after[2:] == before[2:]
    cache.append(0, rng.standard_normal((3, 1, 2)), rng.standard_normal((3, 1, 2)))  # exactly fits
    assert cache.free_blocks == 0


def test_released_pages_are_reused_and_never_leak_the_old_keys():
    rng = np.random.default_rng(3)
    cache = PagedKVCache(4, 4, 1, 4, dtype=np.float64)
    cache.add("old")
    cache.append("old", np.full((16, 1, 4), 50.0), np.full((16, 1, 4), 1e6))  # the whole pool
    assert cache.free_blocks == 0
    cache.release("old")
    assert cache.free_blocks == 4 and "old" not in cache and cache.bytes_reserved() == 0
    cache.add("new")
    k, v = rng.standard_normal((6, 1, 4)), rng.standard_normal((6, 1, 4))
    cache.append("new", k, v)  # 2 pages, the second half full of the old sequence's keys
    assert cache.block_table(["new"]).tolist() == [[0, 1]]  # the released pages, first ones first
    q = rng.standard_normal((1, 2, 2, 4))
    for backend in ("numpy", "torch"):
        out = attention_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=cache.seqlens(["new"]),
                                     block_table=cache.block_table(["new"]), backend=backend, num_splits=2)
        np.testing.assert_allclose(out[0], dense(q[0], k, v), rtol=0, atol=1e-12)


def test_continuous_batching_gives_each_sequence_what_it_gets_alone():
    """Sequences arrive and finish at different steps; every step decodes whoever is running."""
    rng = np.random.default_rng(4)
    cache = PagedKVCache(12, 3, 2, 4, dtype=np.float64)
    arrivals = {0: ["a", "b"], 2: ["c"], 5: ["d"]}
    lengths = {"a": 4, "b": 9, "c": 6, "d": 5}  # steps each one runs
    history, running, steps_left = {}, [], {}
    for step in range(16):
        for seq_id in arrivals.get(step, []):
            cache.add(seq_id)
            running.append(seq_id)
            steps_left[seq_id] = lengths[seq_id]
            history[seq_id] = ([], [])
        if not running:
            break
        q = rng.standard_normal((len(running), 1, 4, 4))
        for seq_id in running:
            k, v = rng.standard_normal((1, 2, 4)), rng.standard_normal((1, 2, 4))
            cache.append(seq_id, k, v)
            history[seq_id][0].append(k)
            history[seq_id][1].append(v)
        out = attention_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=cache.seqlens(running),
                                     block_table=cache.block_table(running), num_splits=2)
        for b, seq_id in enumerate(running):
            k, v = (np.concatenate(x) for x in history[seq_id])
            np.testing.assert_allclose(out[b], dense(q[b], k, v), rtol=0, atol=1e-12)
            steps_left[seq_id] -= 1
        for seq_id in [s for s in running if steps_left[s] == 0]:
            cache.release(seq_id)
            running.remove(seq_id)
    assert len(cache) == 0 and cache.free_blocks == 12


def test_a_torch_pool_gives_tensors_on_its_device():
    generator = torch.Generator().manual_seed(5)
    cache = PagedKVCache(8, 4, 2, 8, dtype=torch.float16, device="cpu")
    cache.add(1)
    k, v = torch.randn(6, 2, 8, generator=generator), torch.randn(6, 2, 8, generator=generator)
    cache.append(1, k, v)  # float32 in, stored as float16
    assert cache.k_cache.dtype == torch.float16
    table, seqlens = cache.block_table([1]), cache.seqlens([1])
    assert table.dtype == torch.int32 and seqlens.dtype == torch.int32 and table.tolist() == [[0, 1]]
    q = torch.randn(1, 1, 4, 8, generator=generator, dtype=torch.float16)
    out = attention_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=seqlens, block_table=table)
    expected = dense(q[0].double().numpy(), k.half().double().numpy(), v.half().double().numpy())
    np.testing.assert_allclose(out[0].double().numpy(), expected, atol=2e-3)
    assert cache.bytes_used() == 6 * 2 * 2 * 8 * 2


def test_bad_use_is_named_and_changes_nothing():
    cache = PagedKVCache(2, 2, 2, 4, dtype="float32")
    with pytest.raises(ValueError, match=r"unknown sequence 'x'.*cache.add"):
        cache.append("x", np.zeros((1, 2, 4)), np.zeros((1, 2, 4)))
    cache.add("x")
    with pytest.raises(ValueError, match="already in the cache"):
        cache.add("x")
    with pytest.raises(TypeError, match="seq_id must be hashable"):
        cache.add(["x"])
    with pytest.raises(ShapeError,
                       match=r"k must have shape \(T_new, n_kv_heads, head_dim\) = \(T_new, 2, 4\)"):
        cache.append("x", np.zeros((1, 4, 2)), np.zeros((1, 2, 4)))
    with pytest.raises(ShapeError, match="same number of new positions"):
        cache.append("x", np.zeros((2, 2, 4)), np.zeros((1, 2, 4)))
    with pytest.raises(DTypeError, match="v must hold floats"):
        cache.append("x", np.zeros((1, 2, 4)), np.zeros((1, 2, 4), dtype=int))
    with pytest.raises(TypeError, match="must be a NumPy array"):
        cache.append("x", torch.zeros(1, 2, 4), np.zeros((1, 2, 4)))
    with pytest.raises(ValueError, match="unknown sequence 'y'"):
        cache.block_table(["x", "y"])
    with pytest.raises(ValueError, match="unknown sequence 'y'"):
        cache.release("y")
    with pytest.raises(ValueError, match="max_blocks must be an int >= 0"):
        cache.block_table(["x"], max_blocks=-1)
    assert cache.seqlens(["x"]).tolist() == [0] and cache.free_blocks == 2
    for kwargs, error, match in [
        (dict(dtype="int8"), DTypeError, "floating-point"),
        (dict(dtype=torch.int32), DTypeError, "floating-point"),
        (dict(dtype="float32", device="cpu"), ValueError, "device='cpu' needs a torch dtype"),
    ]:
        with pytest.raises(error, match=match):
            PagedKVCache(2, 2, 2, 4, **kwargs)
    with pytest.raises(ValueError, match="page_size must be a positive int"):
        PagedKVCache(2, 0, 2, 4, dtype="float32")


def test_the_api_is_exported():
    assert attnlib.PagedKVCache is PagedKVCache and attnlib.attention_with_kvcache is attention_with_kvcache
    assert {"PagedKVCache", "attention_with_kvcache"} <= set(attnlib.__all__)


def test_append_batch_appends_one_step_for_every_sequence_or_none():
    rng = np.random.default_rng(6)
    cache = PagedKVCache(3, 2, 1, 2, dtype=np.float64)
    for seq_id in ("a", "b"):
        cache.add(seq_id)
    k, v = rng.standard_normal((2, 2, 1, 2)), rng.standard_normal((2, 2, 1, 2))
    cache.append_batch(["a", "b"], k, v)
    assert cache.seqlens(["a", "b"]).tolist() == [2, 2] and cache.free_blocks == 1
    np.testing.assert_array_equal(cache.k_cache[cache.block_table(["b"])[0, 0]], k[1])
    before = cache.k_cache.copy()
    with pytest.raises(CacheFullError,
                       match=r"this step needs 2 more pages of 2 for 2 sequences, and 1 of 3"):
        cache.append_batch(["a", "b"], k[:, :1], v[:, :1])
    assert cache.seqlens(["a", "b"]).tolist() == [2, 2] and cache.free_blocks == 1
    np.testing.assert_array_equal(cache.k_cache, before)
    with pytest.raises(ShapeError, match=r"k must have shape \(B, T_new, n_kv_heads, head_dim\) with B = 2"):
        cache.append_batch(["a", "b"], k[:1], v[:1])
    with pytest.raises(ValueError, match="must not repeat"):
        cache.append_batch(["a", "a"], k, v)
    with pytest.raises(ValueError, match="unknown sequence 'c'"):
        cache.append_batch(["a", "c"], k, v)
