"""The tiled NumPy backend: online softmax over key blocks, never the (T_q, T_k) matrix."""

import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnlib
from attnlib import errors
from attnlib.backends.tiled import forward, key_blocks, tiled_attention
from conftest import random_bool_mask, reference_attention


@st.composite
def tiled_problems(draw):
    """Shapes chosen so that the blocks rarely divide T: ragged last blocks in both directions."""
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    t_q, t_k = draw(st.integers(1, 23)), draw(st.integers(1, 23))
    d_k, d_v = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    block_size = draw(st.integers(1, 9))
    mask_kind = draw(st.sampled_from(["none", "bool", "additive"]))
    causal = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal((*batch, t_q, d_k))
    k = rng.standard_normal((*batch, t_k, d_k))
    v = rng.standard_normal((*batch, t_k, d_v))
    mask = None
    if mask_kind != "none":
        mask_batch = batch[draw(st.integers(0, len(batch))):]  # broadcast over some leading dims
        mask = random_bool_mask(rng, (*mask_batch, t_q, t_k))
        if mask_kind == "additive":
            mask = np.where(mask, rng.uniform(-2, 2, mask.shape), -np.inf)
    return q, k, v, mask, causal, block_size


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=tiled_problems())
def test_tiled_matches_the_float64_reference_for_any_block_size(problem):
    q, k, v, mask, causal, block_size = problem
    expected = reference_attention(q, k, v, mask=mask, causal=causal)
    got = tiled_attention(q, k, v, mask=mask, causal=causal, block_size=block_size)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    got32 = tiled_attention(*(a.astype(np.float32) for a in (q, k, v)), mask=mask, causal=causal,
                            block_size=block_size)
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_attention_backend_tiled_equals_the_matrix_form(causal, mask_kind, rng):
    q, k, v = (rng.standard_normal((2, 3, t, 8)).astype(np.float32) for t in (1100, 700, 700))
    mask = None if mask_kind == "none" else random_bool_mask(rng, (1100, 700))
    if mask_kind == "additive":
        mask = np.where(mask, 0.0, -np.inf).astype(np.float32)
    matrix = attnlib.attention(q, k, v, mask=mask, causal=causal, backend="numpy")
    tiled = attnlib.attention(q, k, v, mask=mask, causal=causal, backend="tiled")  # default block: 512
    assert tiled.dtype == np.float32 and tiled.shape == matrix.shape
    np.testing.assert_allclose(tiled, matrix, rtol=1e-5, atol=1e-6)


def test_float16_error_is_at_most_twice_torch_math_backend_error(rng):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (rng.standard_normal((2, 2, t, 32)).astype(np.float16) for t in (45, 61, 61))
    for causal in (False, True):
        expected = reference_attention(q, k, v, causal=causal)
        with sdpa_kernel(SDPBackend.MATH):
            math = torch.nn.functional.scaled_dot_product_attention(
                *(torch.from_numpy(a) for a in (q, k, v)), is_causal=causal).numpy()
        tiled = tiled_attention(q, k, v, causal=causal, block_size=16)
        assert tiled.dtype == np.float16
        math_error = np.abs(math.astype(np.float64) - expected).max()
        tiled_error = np.abs(tiled.astype(np.float64) - expected).max()
        assert tiled_error <= 2 * math_error + 1e-6, (causal, tiled_error, math_error)


def test_causal_visits_no_block_above_the_diagonal_and_masks_only_the_diagonal_ones():
    t_q, t_k, block_size = 23, 19, 5
    allowed = np.tri(t_q, t_k, dtype=bool)
    covered = np.zeros((t_q, t_k), dtype=bool)
    visited = 0
    for i0 in range(0, t_q, block_size):
        i1 = min(i0 + block_size, t_q)
        for j0, j1, on_diagonal in key_blocks(i0, i1 - i0, t_k, block_size, causal=True):
            block = allowed[i0:i1, j0:j1]
            assert block.any(), f"visited block ({i0}, {j0}) has no allowed score"
            assert on_diagonal == (not block.all())
            covered[i0:i1, j0:j1] = True
            visited += 1
    assert (covered | ~allowed).all(), "every allowed score lies in a visited block"
    assert visited < -(-t_q // block_size) * -(-t_k // block_size)  # fewer than all blocks


def test_future_keys_do_not_change_past_outputs(rng):
    q, k, v = (rng.standard_normal((40, 8)) for _ in range(3))
    before = tiled_attention(q, k, v, causal=True, block_size=7)
    k[30:], v[30:] = rng.standard_normal((2, 10, 8))
    after = tiled_attention(q, k, v, causal=True, block_size=7)
    np.testing.assert_array_equal(after[:30], before[:30])
    assert not np.allclose(after[30:], before[30:])


def test_peak_memory_is_far_below_one_score_matrix(rng):
    t, d = 2048, 16
    q, k, v = (rng.standard_normal((t, d)).astype(np.float32) for _ in range(3))
    mask = np.ones((1, t), dtype=bool)  # broadcast over the rows: must stay a view
    forward(q, k, v, mask, True, 0.25, block_size=128)  # warm-up: one-off allocations
    tracemalloc.start()
    try:  # the backend alone, after attention() has validated the inputs
        forward(q, k, v, mask, True, 0.25, block_size=128)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    score_matrix_bytes = t * t * 4
    assert peak < score_matrix_bytes / 8, f"peak {peak} bytes, one score matrix is {score_matrix_bytes}"


def test_threads_give_the_same_bits_as_one_thread(rng):
    q, k, v = (rng.standard_normal((2, 3, 300, 16)).astype(np.float32) for _ in range(3))
    one = tiled_attention(q, k, v, causal=True, block_size=64, workers=1)
    two = tiled_attention(q, k, v, causal=True, block_size=64, workers=2)
    np.testing.assert_array_equal(one, two)


def test_a_row_that_meets_its_first_allowed_key_late_gets_no_nan(rng):
    q, k, v = (rng.standard_normal((6, 4)) for _ in range(3))
    mask = np.zeros((6, 6), dtype=bool)
    mask[:, 5] = True  # only the last key, in the last block
    got = tiled_attention(q, k, v, mask=mask, block_size=2)
    np.testing.assert_allclose(got, np.broadcast_to(v[5], (6, 4)), atol=1e-12)


BAD_INPUTS = {
    "d_k mismatch": (lambda q, k, v: (q, k[:, :2], v), {}),
    "T_k mismatch": (lambda q, k, v: (q, k, v[:3]), {}),
    "integer q": (lambda q, k, v: (q.astype(np.int64), k, v), {}),
    "NaN in v": (lambda q, k, v: (q, k, np.where(np.arange(4)[:, None] == 1, np.nan, v)), {}),
    "mask of the wrong shape": (lambda q, k, v: (q, k, v), {"mask": np.ones((3, 4), dtype=bool)}),
    "a query with no key": (lambda q, k, v: (q, k, v), {"mask": np.eye(5, 4, k=1, dtype=bool)}),
    "scale of zero": (lambda q, k, v: (q, k, v), {"scale": 0.0}),
}


def _error_of(call):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_raise_the_same_errors_as_the_numpy_backend(case, rng):
    make, kwargs = BAD_INPUTS[case]
    args = make(rng.standard_normal((5, 3)), rng.standard_normal((4, 3)), rng.standard_normal((4, 2)))
    expected = _error_of(lambda: attnlib.attention(*args, backend="numpy", **kwargs))
    assert issubclass(expected[0], (errors.ShapeError, errors.MaskError, errors.DTypeError,
                                    errors.NonFiniteError, ValueError))
    assert _error_of(lambda: attnlib.attention(*args, backend="tiled", **kwargs)) == expected
    assert _error_of(lambda: tiled_attention(*args, **kwargs)) == expected


def test_tiled_attention_refuses_tensors_and_bad_block_sizes(rng):
    q = rng.standard_normal((4, 3))
    with pytest.raises(TypeError, match="NumPy"):
        tiled_attention(torch.from_numpy(q), torch.from_numpy(q), torch.from_numpy(q))
    with pytest.raises(ValueError, match="block_size"):
        tiled_attention(q, q, q, block_size=0)
    with pytest.raises(ValueError, match="block_size"):
        forward(q, q, q, None, False, 1.0, block_size=2.5)


def test_threads_live_in_one_pool_kept_between_calls(rng, monkeypatch):
    from attnlib.backends import tiled

    monkeypatch.setattr(tiled, "INLINE_FLOPS", 0)  # thread even this small problem
    q, k, v = (rng.standard_normal((2, 128, 8)) for _ in range(3))
    tiled_attention(q, k, v, block_size=32, workers=2)
    pool = tiled._POOLS[2]
    tiled_attention(q, k, v, block_size=32, workers=2)
    assert tiled._POOLS[2] is pool  # no new pool, no new threads


def test_workers_caps_the_threads_that_run_tasks(rng, monkeypatch):
    import threading

    from attnlib.backends import tiled

    monkeypatch.setattr(tiled, "INLINE_FLOPS", 0)
    seen = set()
    inner = tiled._attend_query_block

    def spy(*args):
        seen.add(threading.get_ident())
        return inner(*args)

    monkeypatch.setattr(tiled, "_attend_query_block", spy)
    q, k, v = (rng.standard_normal((4, 96, 8)) for _ in range(3))
    tiled_attention(q, k, v, block_size=16, workers=1)
    assert seen == {threading.get_ident()}  # one worker: the caller's thread, no pool
    seen.clear()
    tiled_attention(q, k, v, block_size=16, workers=3)
    assert threading.get_ident() not in seen and 1 <= len(seen) <= 3


def test_small_problems_run_in_the_callers_thread_all_heads_at_once(rng, monkeypatch):
    from attnlib.backends import tiled

    calls = []
    inner = tiled._attend_query_block

    def spy(q_blk, *args):
        calls.append(q_blk.shape)
        return inner(q_blk, *args)

    monkeypatch.setattr(tiled, "_attend_query_block", spy)
    q, k, v = (rng.standard_normal((2, 3, 40, 8)) for _ in range(3))
    out = tiled_attention(q, k, v, causal=True, block_size=16, workers=2)
    assert calls == [(2, 3, 16, 8), (2, 3, 16, 8), (2, 3, 8, 8)]  # three query blocks, every head in each
    np.testing.assert_allclose(out, reference_attention(q, k, v, causal=True), atol=1e-10)


def test_workers_must_be_a_positive_integer(rng):
    q = rng.standard_normal((4, 8))
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="workers must be a positive integer"):
            tiled_attention(q, q, q, workers=bad)


def test_tiled_cost_tool_runs_and_its_full_loop_is_the_products_plus_softmax():
    """tools/tiled_cost.py (the per-step cost breakdown quoted in the notes) still runs, and its
    loop with every step left in computes the unnormalised attention of the last query block."""
    import subprocess
    import sys
    from pathlib import Path

    from tools.tiled_cost import block_loop

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "tools/tiled_cost.py", "--T", "1024", "--heads", "1",
                           "--rounds", "1"], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "products + exp" in done.stdout and "/ SDPA" in done.stdout
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 64, 8)).astype(np.float32) for _ in range(3))
    acc = block_loop(q, k, v, ("exp", "max"), block=64)  # one block: exp(s - rowmax) @ v
    s = q[0, 0] @ k[0, 0].T
    expected = np.exp(s - s.max(axis=-1, keepdims=True)) @ v[0, 0]
    np.testing.assert_allclose(acc, expected, rtol=1e-5, atol=1e-5)
