"""Inputs a careful user would try: each used to crash obscurely, return NaN or a wrong answer.

Every test here pins one defect found by trying to break attnlib, on every
backend that can run on this machine (Triton's are in test_triton.py).
"""

import numpy as np
import pytest
import torch

import attnlib
from attnlib import errors
from attnlib.masks import causal_alignment, causal_mask, causal_offset

from conftest import reference_attention

BACKENDS = [name for name in attnlib.backends() if not name.startswith("triton")]
NUMPY_BACKENDS = ["numpy", "loop", "tiled"]


def _run(backend, q, k, v, **kwargs):
    """attention() on NumPy inputs, or on tensors for the torch backends, back as float64 NumPy."""
    if backend in ("torch", "sdpa"):
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v)]
        mask = kwargs.get("mask")
        if isinstance(mask, np.ndarray):
            kwargs = {**kwargs, "mask": torch.from_numpy(mask)}
        out = attnlib.attention(*tensors, backend=backend, **kwargs)
        return out.numpy().astype(np.float64)
    return attnlib.attention(q, k, v, backend=backend, **kwargs).astype(np.float64)


# --- a 1-D boolean mask with 4-D inputs (sdpa used to raise IndexError) ------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_dimensional_mask_broadcasts_over_4d_inputs(backend, rng):
    q = rng.standard_normal((1, 2, 5, 4))
    mask = np.array([True, True, False, True, True])
    out = _run(backend, q, q, q, mask=mask)
    np.testing.assert_allclose(out, reference_attention(q, q, q, mask=mask), atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_dimensional_float_mask_broadcasts_with_causal(backend, rng):
    q = rng.standard_normal((2, 1, 5, 4))
    mask = np.array([0.0, -1.0, -np.inf, 0.5, 0.0])
    out = _run(backend, q, q, q, mask=mask, causal=True)
    np.testing.assert_allclose(out, reference_attention(q, q, q, mask=mask, causal=True), atol=1e-10)


# --- float16: the scale is applied before the scores can overflow ------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_float16_raw_scores_beyond_range_give_the_right_answer(backend, rng):
    # entries of about 100 with d_k=16: raw q . k about 1.6e5 (float16 tops out at 65504),
    # but the scaled score, about 4e4, fits
    q = (100 + rng.random((6, 16))).astype(np.float16)
    v = rng.standard_normal((6, 3)).astype(np.float16)
    raw = q.astype(np.float64) @ q.astype(np.float64).T
    assert raw.max() > np.finfo(np.float16).max > raw.max() / 4
    out = _run(backend, q, q, v)
    assert np.isfinite(out).all()
    if backend == "torch":
        # the readable torch path keeps its scores in float16, spaced 32 apart near 4e4:
        # finite, and each output row still a weighted mean of the values
        assert (out >= v.min(axis=0) - 1e-3).all() and (out <= v.max(axis=0) + 1e-3).all()
    else:
        np.testing.assert_allclose(out, reference_attention(q, q, v), atol=2e-2)


def test_float16_attention_weights_do_not_overflow(rng):
    q = (100 + rng.random((6, 16))).astype(np.float16)
    expected = attnlib.attention_weights(q.astype(np.float64), q.astype(np.float64))
    weights = attnlib.attention_weights(q, q)
    assert weights.dtype == np.float16
    np.testing.assert_allclose(weights.astype(np.float64), expected, atol=2e-3)
    weights = attnlib.attention_weights(torch.from_numpy(q), torch.from_numpy(q))
    assert weights.dtype == torch.float16 and bool(torch.isfinite(weights).all())
    np.testing.assert_allclose(weights.double().sum(dim=-1).numpy(), 1.0, atol=2e-3)


# --- masks are checked in the dtype the backends compute with ----------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_mask_row_that_becomes_minus_inf_in_float16_is_refused(backend, rng):
    q, k, v = (rng.standard_normal((4, 8)).astype(np.float16) for _ in range(3))
    mask = np.zeros((4, 4), dtype=np.float32)
    mask[2] = -1e5  # finite in float32, -inf in float16: row 2 would have no key
    with pytest.raises(errors.MaskError, match=r"query row 2.*no key|conversion to the dtype"):
        _run(backend, q, k, v, mask=mask)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float16_mask_entries_that_become_minus_inf_just_drop_their_keys(backend, rng):
    q, k, v = (rng.standard_normal((4, 8)).astype(np.float16) for _ in range(3))
    mask = np.zeros((4, 4), dtype=np.float32)
    mask[:, 1] = -1e5  # every row keeps three keys
    out = _run(backend, q, k, v, mask=mask)
    with np.errstate(over="ignore"):
        expected = reference_attention(q, k, v, mask=np.isfinite(mask.astype(np.float16)))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, expected, atol=1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_mask_beyond_float32_range_is_refused(backend, rng):
    q, k, v = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3))
    row_dropped = np.zeros((3, 3))
    row_dropped[1] = -1e40
    with pytest.raises(errors.MaskError, match="query row 1"):
        _run(backend, q, k, v, mask=row_dropped)
    too_big = np.zeros((3, 3))
    too_big[0, 0] = 1e40
    with pytest.raises(errors.MaskError, match="too large for float32"):
        _run(backend, q, k, v, mask=too_big)


# --- finite inputs whose scores overflow: a clear error, not NaN -------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_scores_beyond_float32_range_raise_instead_of_nan(backend, rng):
    q = (rng.random((3, 4)) + 1).astype(np.float32) * np.float32(1e20)  # q . k about 1e40 * scale
    with pytest.raises(errors.NonFiniteError, match="overflow float32"):
        _run(backend, q, q, q)


def test_attention_weights_and_score_matrix_raise_on_overflow(rng):
    q = (rng.random((3, 4)) + 1).astype(np.float32) * np.float32(1e20)
    with pytest.raises(errors.NonFiniteError, match="attention_weights.*overflow float32"):
        attnlib.attention_weights(q, q)
    with pytest.raises(errors.NonFiniteError, match="score_matrix.*overflow float32"):
        attnlib.score_matrix(q, q)


# --- one rule for Python lists across the public API --------------------------------------

Q_LIST = [[1.0, 0.0], [0.0, 1.0], [1, 1]]  # whole numbers too: a list has no dtype


def test_lists_are_accepted_by_every_public_function():
    q = np.array(Q_LIST, dtype=np.float64)
    expected = reference_attention(q, q, q)
    np.testing.assert_allclose(attnlib.attention(Q_LIST, Q_LIST, Q_LIST), expected)
    np.testing.assert_allclose(attnlib.attention_weights(Q_LIST, Q_LIST), attnlib.attention_weights(q, q))
    np.testing.assert_allclose(attnlib.score_matrix(Q_LIST, Q_LIST), q @ q.T)
    eye = np.eye(2).tolist()
    np.testing.assert_allclose(attnlib.multi_head_attention(Q_LIST, eye, eye, eye, eye, 1), expected)
    mask = [[True, False, False], [True, True, False], [True, True, True]]
    np.testing.assert_allclose(
        attnlib.attention(Q_LIST, Q_LIST, Q_LIST, mask=mask), reference_attention(q, q, q, causal=True)
    )
    np.testing.assert_allclose(attnlib.softmax([2, 4, 6]), attnlib.softmax(np.array([2.0, 4.0, 6.0])))


@pytest.mark.parametrize("bad", ["abc", None, {"a": 1}, [[1.0, 2.0], [3.0]], [["a", "b"]]])
def test_non_numeric_inputs_raise_a_type_error_naming_the_argument(bad):
    q = np.ones((2, 2))
    with pytest.raises(TypeError, match=r"\bk\b"):
        attnlib.attention(q, bad, q)


# --- small API holes ---------------------------------------------------------------------


@pytest.mark.parametrize("causal", ["False", "true", "causal", 1, 0.5, "bottom_right"])
def test_causal_must_be_a_bool_or_an_alignment_name(causal):
    q = np.ones((2, 2))
    with pytest.raises(ValueError, match="causal must be"):
        attnlib.attention(q, q, q, causal=causal)


@pytest.mark.parametrize("backend", ["", "NUMPY", 3])
def test_backend_must_be_none_or_a_real_name(backend):
    q = np.ones((2, 2))
    with pytest.raises(ValueError, match="backend"):
        attnlib.attention(q, q, q, backend=backend)


def test_softmax_refuses_complex_and_empty_input():
    with pytest.raises(errors.DTypeError, match="complex"):
        attnlib.softmax(np.array([1 + 1j, 2.0]))
    with pytest.raises(errors.DTypeError, match="complex"):
        attnlib.softmax(torch.tensor([1 + 1j, 2.0]))
    with pytest.raises(errors.ShapeError, match=r"empty array \(shape \(0,\)\)"):
        attnlib.softmax(np.array([]))
    with pytest.raises(errors.ShapeError, match=r"shape \(3, 0\)"):
        attnlib.softmax(np.zeros((3, 0)))
    with pytest.raises(errors.ShapeError, match="axis=2"):
        attnlib.softmax(np.zeros((3, 2)), axis=2)


def test_multi_head_attention_refuses_a_rank_one_weight():
    x = np.ones((3, 4))
    w = np.eye(4)
    with pytest.raises(errors.ShapeError, match=r"w_v must be a 2-D weight matrix, got shape \(4,\)"):
        attnlib.multi_head_attention(x, w, w, np.ones(4), w, 2)


def test_torch_mask_with_numpy_inputs_is_a_mixed_array_types_error():
    q = np.ones((2, 2))
    with pytest.raises(errors.MixedArrayTypesError, match="mask is a torch array"):
        attnlib.attention(q, q, q, mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(errors.MixedArrayTypesError):
        attnlib.attention(torch.ones(2, 2), torch.ones(2, 2), torch.ones(2, 2), mask=np.ones((2, 2), bool))


# --- causal alignment: top-left and bottom-right -----------------------------------------


def test_causal_alignment_names():
    assert causal_alignment(True) == causal_alignment("top-left") == "top-left"
    assert causal_alignment(False) is causal_alignment(None) is None
    assert causal_alignment(np.bool_(True)) == "top-left"
    assert causal_alignment("bottom-right") == "bottom-right"
    assert causal_offset(3, 5, "top-left") == 0
    assert causal_offset(3, 5, "bottom-right") == 2


def test_bottom_right_mask_lines_up_the_last_query_with_the_last_key():
    mask = causal_mask(2, 4, "bottom-right")
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(causal_mask(2, 4), [[1, 0, 0, 0], [1, 1, 0, 0]])
    np.testing.assert_array_equal(causal_mask(3, 3, "bottom-right"), causal_mask(3, 3))


ALIGNED_SHAPES = [  # bottom-right with T_q > T_k is refused (tested below)
    (alignment, t_q, t_k)
    for alignment in ("top-left", "bottom-right")
    for t_q, t_k in [(1, 6), (3, 7), (5, 5), (7, 4)]
    if not (alignment == "bottom-right" and t_q > t_k)
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("alignment, t_q, t_k", ALIGNED_SHAPES)
def test_causal_alignment_matches_an_explicit_mask(backend, alignment, t_q, t_k, rng):
    q = rng.standard_normal((2, t_q, 3))
    k = rng.standard_normal((2, t_k, 3))
    v = rng.standard_normal((2, t_k, 4))
    explicit = causal_mask(t_q, t_k, alignment)
    expected = reference_attention(q, k, v, mask=explicit)
    np.testing.assert_allclose(_run(backend, q, k, v, causal=alignment), expected, atol=1e-10)
    np.testing.assert_allclose(reference_attention(q, k, v, causal=alignment), expected, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bottom_right_combines_with_a_user_mask(backend, rng):
    q = rng.standard_normal((3, 4))
    k = rng.standard_normal((6, 4))
    v = rng.standard_normal((6, 2))
    mask = np.ones((3, 6), dtype=bool)
    mask[:, 0] = False
    expected = reference_attention(q, k, v, mask=mask & causal_mask(3, 6, "bottom-right"))
    np.testing.assert_allclose(_run(backend, q, k, v, mask=mask, causal="bottom-right"), expected, atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_new_query_over_a_kv_cache_sees_every_key_bottom_right_and_only_the_first_top_left(
    backend, rng
):
    q = rng.standard_normal((1, 4))
    k = rng.standard_normal((9, 4))
    v = rng.standard_normal((9, 3))
    np.testing.assert_allclose(_run(backend, q, k, v, causal="bottom-right"), reference_attention(q, k, v),
                               atol=1e-10)
    np.testing.assert_allclose(_run(backend, q, k, v, causal=True), np.broadcast_to(v[0], (1, 3)), atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bottom_right_with_more_queries_than_keys_is_refused(backend, rng):
    q = rng.standard_normal((5, 4))
    k = rng.standard_normal((3, 4))
    with pytest.raises(errors.MaskError, match="first 2 query rows"):
        _run(backend, q, k, k, causal="bottom-right")


def test_bottom_right_mask_that_empties_a_row_is_refused(rng):
    q = rng.standard_normal((2, 4))
    k = rng.standard_normal((4, 4))
    mask = np.array([False, False, False, True])  # only the last key; query 0 sees keys 0..2
    with pytest.raises(errors.MaskError, match="query row 0"):
        attnlib.attention(q, k, k, mask=mask, causal="bottom-right")
    attnlib.attention(q[1:], k, k, mask=mask, causal="bottom-right")  # the last query does see key 3


@pytest.mark.parametrize("block_size", [1, 2, 3, 5])
@pytest.mark.parametrize("t_q, t_k", [(4, 11), (9, 9), (10, 3)])
def test_tiled_block_skipping_follows_both_alignments(block_size, t_q, t_k, rng):
    from attnlib.backends.tiled import tiled_attention

    q = rng.standard_normal((t_q, 3))
    k = rng.standard_normal((t_k, 3))
    v = rng.standard_normal((t_k, 2))
    for alignment in ("top-left", "bottom-right"):
        if alignment == "bottom-right" and t_q > t_k:
            continue
        expected = reference_attention(q, k, v, mask=causal_mask(t_q, t_k, alignment))
        got = tiled_attention(q, k, v, causal=alignment, block_size=block_size, workers=1)
        np.testing.assert_allclose(got, expected, atol=1e-10)
