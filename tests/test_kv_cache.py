"""attnlib.kv_cache: the cache's arithmetic, and decoding with it on every backend.

Decoding one token at a time, each new query attending over the cache with
``causal="bottom-right"``, must give the rows of the full causal forward pass:
checked here on every backend, in chunks and one token at a time, with
grouped-query heads and with a sliding window whose cache keeps W positions.
"""

import numpy as np
import pytest
import torch

import attnlib
from backend_inputs import as_numpy, for_backend
from attnlib import errors
from attnlib.kv_cache import CacheFullError, KVCache, kv_cache_bytes

BACKENDS = [name for name in attnlib.backends() if not name.startswith("triton")]
CHUNKS = [[1] * 12, [5, 1, 1, 1, 4], [12], [3, 3, 3, 3]]  # prefill sizes, then the steps


def test_a_llama_sized_cache_takes_half_a_mebibyte_per_token_and_two_gibibytes_at_4096():
    assert kv_cache_bytes(32, 32, 128, "float16") == 2**19  # 2 x 32 x 32 x 128 x 2 bytes
    assert kv_cache_bytes(32, 32, 128, "float16", seq_len=4096) == 2 * 2**30
    assert kv_cache_bytes(32, 8, 128, "bfloat16", seq_len=4096) == 2**30 // 2  # GQA: 8 KV heads
    assert kv_cache_bytes(32, 32, 128, torch.float16) == kv_cache_bytes(32, 32, 128, np.float16)
    assert kv_cache_bytes(2, 2, 16, "float64", seq_len=10, batch=3) == 2 * 2 * 2 * 16 * 8 * 10 * 3


@pytest.mark.parametrize("name, value, fragment", [
    ("n_layers", 0, "n_layers must be a positive int, got 0"),
    ("n_kv_heads", 2.0, "n_kv_heads must be a positive int, got 2.0"),
    ("head_dim", True, "head_dim must be a positive int, got True"),
    ("seq_len", -1, "seq_len must be a positive int, got -1"),
])
def test_kv_cache_bytes_refuses_sizes_that_are_not_positive_ints(name, value, fragment):
    sizes = dict(n_layers=2, n_kv_heads=2, head_dim=16, seq_len=1)
    sizes[name] = value
    with pytest.raises(ValueError, match=fragment):
        kv_cache_bytes(sizes["n_layers"], sizes["n_kv_heads"], sizes["head_dim"], "float16",
                       seq_len=sizes["seq_len"])


@pytest.mark.parametrize("dtype", ["int8", "float17", np.int32, object])
def test_kv_cache_bytes_refuses_a_dtype_that_is_not_a_float(dtype):
    with pytest.raises(errors.DTypeError, match="dtype"):
        kv_cache_bytes(2, 2, 16, dtype)


def _decode(q, k, v, chunks, backend, cache, **options):
    """Feed k and v to the cache chunk by chunk; each chunk's queries attend over what it returns."""
    outputs, t = [], 0
    for n in chunks:
        keys, values = cache.update(k[..., t:t + n, :], v[..., t:t + n, :])
        outputs.append(attnlib.attention(q[..., t:t + n, :], keys, values, causal="bottom-right",
                                         backend=backend, **options))
        t += n
    cat = torch.cat if isinstance(outputs[0], torch.Tensor) else np.concatenate
    return cat(outputs, -2)




@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunks", CHUNKS, ids=lambda c: "-".join(map(str, c[:5])))
def test_cached_decoding_gives_the_rows_of_the_full_causal_pass(backend, chunks, rng):
    q, k, v = (rng.standard_normal((2, 3, 12, 4)) for _ in range(3))
    full = attnlib.attention(q, k, v, causal=True)
    q, k, v = for_backend(backend, q, k, v)
    decoded = _decode(q, k, v, chunks, backend, KVCache())
    np.testing.assert_allclose(as_numpy(decoded), full, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cached_decoding_with_grouped_query_heads(backend, rng):
    q = rng.standard_normal((2, 6, 12, 4))
    k, v = (rng.standard_normal((2, 2, 12, 4)) for _ in range(2))
    full = attnlib.attention(q, k, v, causal=True, enable_gqa=True)
    cache = KVCache(max_len=12)
    decoded = _decode(*for_backend(backend, q, k, v), [4] + [1] * 8, backend, cache, enable_gqa=True)
    np.testing.assert_allclose(as_numpy(decoded), full, atol=1e-12)
    assert cache.nbytes == 2 * 2 * 2 * 12 * 4 * 8  # K and V, B=2, H_kv=2, 12 positions, d=4, float64


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", [1, 3, 5])
@pytest.mark.parametrize("chunks", CHUNKS, ids=lambda c: "-".join(map(str, c[:5])))
def test_a_windowed_cache_keeps_w_positions_and_gives_windowed_attention(backend, window, chunks, rng):
    q, k, v = (rng.standard_normal((2, 12, 4)) for _ in range(3))
    full = attnlib.attention(q, k, v, causal=True, window=window)
    cache = KVCache(window=window)
    decoded = _decode(*for_backend(backend, q, k, v), chunks, backend, cache, window=window)
    np.testing.assert_allclose(as_numpy(decoded), full, atol=1e-12)
    assert len(cache) == window and cache.seen == 12
    np.testing.assert_array_equal(as_numpy(cache.keys), k[..., -window:, :])


def test_a_windowed_cache_never_holds_more_than_w_positions(rng):
    cache = KVCache(window=4)
    k = rng.standard_normal((1, 100, 2))
    for t in range(100):
        keys, _ = cache.update(k[:, t:t + 1], k[:, t:t + 1])
        assert len(cache) == min(t + 1, 4) and keys.shape[-2] == min(t + 1, 5)
        assert cache._k.shape[-2] <= 8  # the buffer itself stays at 2 W
    assert cache.nbytes == 2 * 4 * 2 * 8


def test_update_returns_the_held_positions_then_the_new_ones(rng):
    cache = KVCache()
    assert cache.keys is None and len(cache) == 0 and cache.nbytes == 0
    k, v = rng.standard_normal((3, 10, 4)), rng.standard_normal((3, 10, 2))
    cache.update(k[:, :7], v[:, :7])
    keys, values = cache.update(k[:, 7:], v[:, 7:])
    np.testing.assert_array_equal(keys, k)
    np.testing.assert_array_equal(values, v)
    assert len(cache) == cache.seen == 10 and cache.nbytes == k.nbytes + v.nbytes
    cache.truncate(6)
    np.testing.assert_array_equal(cache.keys, k[:, :6])
    assert cache.seen == 6


def test_a_torch_cache_stays_on_its_device_and_dtype():
    cache = KVCache()
    k = torch.randn(1, 2, 3, 4, dtype=torch.float16)
    keys, _ = cache.update(k, k)
    assert keys.dtype == torch.float16 and keys.device == k.device
    assert cache.nbytes == 2 * k.numel() * 2


def test_a_cache_full_error_says_how_many_positions_and_what_to_do(rng):
    cache = KVCache(max_len=8)
    k = rng.standard_normal((2, 6, 4))
    cache.update(k, k)
    with pytest.raises(CacheFullError) as caught:
        cache.update(k[:, :3], k[:, :3])
    message = str(caught.value)
    for fragment in ("max_len=8", "holds 6", "3 more", "(2, 3, 4)", "makes 9", "window=W"):
        assert fragment in message, fragment
    assert isinstance(caught.value, ValueError)
    assert len(cache) == 6  # nothing was written


BAD_UPDATES = {
    # name: (first k, k of the failing update, v of the failing update, error, fragments)
    "other heads": ((2, 3, 4), (4, 1, 4), (4, 1, 4), errors.ShapeError, ["k of shape (4, 1, 4)", "(2, 'T_new', 4)"]),
    "other width": ((2, 3, 4), (2, 1, 5), (2, 1, 4), errors.ShapeError, ["k of shape (2, 1, 5)"]),
    "k and v of different lengths": (None, (2, 3, 4), (2, 2, 4), errors.ShapeError, ["k (2, 3, 4)", "v (2, 2, 4)"]),
    "rank 1": (None, (4,), (4,), errors.ShapeError, ["at least 2 dimensions", "(4,)"]),
}


@pytest.mark.parametrize("case", BAD_UPDATES, ids=list(BAD_UPDATES))
def test_an_update_that_does_not_fit_names_the_shapes(case):
    first, k_shape, v_shape, error, fragments = BAD_UPDATES[case]
    cache = KVCache()
    if first is not None:
        cache.update(np.zeros(first), np.zeros(first))
    with pytest.raises(error) as caught:
        cache.update(np.zeros(k_shape), np.zeros(v_shape))
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))


def test_an_update_of_another_kind_or_dtype_is_refused():
    cache = KVCache()
    cache.update(np.zeros((2, 1, 4)), np.zeros((2, 1, 4)))
    with pytest.raises(TypeError, match="holds numpy arrays but update got torch"):
        cache.update(torch.zeros(2, 1, 4, dtype=torch.float64), torch.zeros(2, 1, 4, dtype=torch.float64))
    with pytest.raises(errors.DTypeError, match="holds float64 but update got float32"):
        cache.update(np.zeros((2, 1, 4), np.float32), np.zeros((2, 1, 4), np.float32))
    with pytest.raises(errors.DTypeError, match="floating-point"):
        KVCache().update(np.zeros((2, 1, 4), int), np.zeros((2, 1, 4), int))


@pytest.mark.parametrize("kwargs, fragment", [
    ({"max_len": 0}, "max_len must be a positive int or None, got 0"),
    ({"window": 2.0}, "window must be a positive int or None, got 2.0"),
    ({"max_len": 8, "window": 4}, "either max_len"),
])
def test_bad_cache_settings_are_refused(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        KVCache(**kwargs)


@pytest.mark.parametrize("dtype", ["int8", np.int32, None, "torch.int8", "torch.bool", "torch.complex64"])
def test_kv_cache_bytes_refuses_a_dtype_that_is_not_floating_point(dtype):
    import torch

    from attnlib.errors import DTypeError

    if isinstance(dtype, str) and dtype.startswith("torch."):
        dtype = getattr(torch, dtype.removeprefix("torch."))
    with pytest.raises(DTypeError, match="floating-point"):
        attnlib.kv_cache_bytes(2, 4, 16, dtype)


def test_cache_full_error_is_with_the_other_errors():
    from attnlib import errors, kv_cache

    assert errors.CacheFullError is kv_cache.CacheFullError
    cache = attnlib.KVCache(max_len=2)
    cache.update(np.zeros((1, 2, 4)), np.zeros((1, 2, 4)))
    with pytest.raises(errors.CacheFullError):
        cache.update(np.zeros((1, 1, 4)), np.zeros((1, 1, 4)))
