"""Properties attention must have whatever its inputs: the behaviour the book relies on."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from conftest import random_bool_mask, random_qkv, reference_attention

BACKENDS = [name for name in attnlib.backends() if not name.startswith("triton")]


@settings(max_examples=60, deadline=None)
@given(t_q=st.integers(1, 10), t_k=st.integers(1, 10), d_k=st.integers(1, 9),
       kind=st.sampled_from(["none", "causal", "bool"]), seed=st.integers(0, 10**6))
def test_rows_of_the_attention_matrix_sum_to_one(t_q, t_k, d_k, kind, seed):
    rng = np.random.default_rng(seed)
    q, k, _ = random_qkv(rng, (2,), t_q, t_k, d_k, 1)
    mask = random_bool_mask(rng, (t_q, t_k)) if kind == "bool" else None
    weights = attnlib.attention_weights(q, k, mask=mask, causal=kind == "causal")
    assert weights.shape == (2, t_q, t_k)
    assert (weights >= 0).all()
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-12)
    if mask is not None:
        assert (weights[..., ~mask] == 0).all()
    if kind == "causal":
        assert (np.triu(weights[0], k=1) == 0).all()


def test_attention_weights_agree_for_numpy_and_torch(rng):
    q, k, _ = random_qkv(rng, (3,), 4, 6, 5, 1)
    mask = random_bool_mask(rng, (4, 6))
    a_np = attnlib.attention_weights(q, k, mask=mask, causal=True)
    a_t = attnlib.attention_weights(torch.from_numpy(q), torch.from_numpy(k), mask=torch.from_numpy(mask), causal=True)
    np.testing.assert_allclose(a_t.numpy(), a_np, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_future_tokens_do_not_change_past_outputs(backend, rng):
    T, cut = 9, 4
    q, k, v = random_qkv(rng, (2,), T, T, 4, 3)
    before = attnlib.attention(q, k, v, causal=True, backend=backend)
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for a in (q2, k2, v2):
        a[..., cut:, :] = rng.standard_normal(a[..., cut:, :].shape) * 5
    after = attnlib.attention(q2, k2, v2, causal=True, backend=backend)
    np.testing.assert_allclose(after[..., :cut, :], before[..., :cut, :], rtol=0, atol=1e-12)
    assert not np.allclose(after[..., cut:, :], before[..., cut:, :])


@pytest.mark.parametrize("backend", BACKENDS)
def test_permuting_the_tokens_permutes_the_outputs(backend, rng):
    q, k, v = random_qkv(rng, (), 7, 7, 4, 5)
    perm = rng.permutation(7)
    out = attnlib.attention(q, k, v, backend=backend)
    out_perm = attnlib.attention(q[perm], k[perm], v[perm], backend=backend)
    np.testing.assert_allclose(out_perm, out[perm], atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_scale_is_one_over_sqrt_d_k_not_sqrt_t(backend, rng):
    T, d_k = 5, 16  # d_k != T, so scaling by the wrong size gives a different answer
    q, k, v = random_qkv(rng, (), T, T, d_k, 3)
    got = attnlib.attention(q, k, v, backend=backend)
    np.testing.assert_allclose(got, reference_attention(q, k, v, scale=1 / np.sqrt(d_k)), atol=1e-10)
    assert not np.allclose(got, reference_attention(q, k, v, scale=1 / np.sqrt(T)), atol=1e-4)
    explicit = attnlib.attention(q, k, v, scale=0.5, backend=backend)
    np.testing.assert_allclose(explicit, reference_attention(q, k, v, scale=0.5), atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scores_of_ten_thousand_still_give_finite_correct_weights(backend, dtype):
    q = np.array([[100.0, 0.0], [-100.0, 0.0]], dtype=dtype)
    k = np.array([[100.0, 0.0], [99.0, 0.0], [-100.0, 0.0]], dtype=dtype)  # scores of +-1e4
    v = np.eye(3, dtype=dtype)
    out = attnlib.attention(q, k, v, scale=1.0, backend=backend)
    assert np.isfinite(out).all()
    # query 0: scores 1e4, 9900, -1e4 -> all weight on key 0; query 1: all on key 2
    np.testing.assert_allclose(out, [[1, 0, 0], [0, 0, 1]], atol=1e-6)


def test_weights_are_exactly_zero_where_masked_and_additive_equals_boolean(rng):
    q, k, v = random_qkv(rng, (), 4, 5, 3, 2)
    mask = random_bool_mask(rng, (4, 5))
    additive = attnlib.masks.to_additive(mask)
    np.testing.assert_array_equal(attnlib.attention(q, k, v, mask=mask), attnlib.attention(q, k, v, mask=additive))


def test_causal_mask_is_lower_triangular_including_the_diagonal():
    mask = attnlib.causal_mask(4)
    assert mask.dtype == np.bool_ and mask.shape == (4, 4)
    assert mask[2, 2] and mask[3, 0] and not mask[0, 1]
    assert mask.sum() == 4 * 5 // 2
    np.testing.assert_array_equal(attnlib.causal_mask(2, 3), [[True, False, False], [True, True, False]])
    with pytest.raises(ValueError, match="T_k"):
        attnlib.causal_mask(3, 0)


def test_causal_flag_equals_passing_the_causal_mask(rng):
    q, k, v = random_qkv(rng, (2,), 5, 6, 3, 2)
    np.testing.assert_allclose(attnlib.attention(q, k, v, causal=True),
                               attnlib.attention(q, k, v, mask=attnlib.causal_mask(5, 6)), atol=1e-14)


def test_score_matrix_is_the_unscaled_dot_product(rng):
    q, k, _ = random_qkv(rng, (2,), 3, 4, 5, 1)
    s = attnlib.score_matrix(q, k)
    assert s.shape == (2, 3, 4)
    assert s[1, 2, 3] == pytest.approx(float(q[1, 2] @ k[1, 3]))


def test_project_qkv_multiplies_on_the_right(rng):
    x = rng.standard_normal((2, 5, 6))
    w_q, w_k, w_v = rng.standard_normal((6, 4)), rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
    q, k, v = attnlib.project_qkv(x, w_q, w_k, w_v)
    assert q.shape == (2, 5, 4) and v.shape == (2, 5, 3)
    np.testing.assert_allclose(q[1, 2], x[1, 2] @ w_q)


def test_mask_conversions_between_conventions():
    mask = attnlib.causal_mask(3)
    additive = attnlib.masks.to_additive(mask, dtype=np.float32)
    assert additive.dtype == np.float32 and additive[0, 1] == -np.inf and additive[1, 0] == 0
    t_mask = torch.from_numpy(mask)
    assert attnlib.masks.to_additive(t_mask, dtype=torch.float64).dtype == torch.float64
    np.testing.assert_array_equal(attnlib.masks.to_ignore_mask(mask), ~mask)
