import warnings

import numpy as np
import pytest

import attnlib
from attnlib.errors import SequenceTooLongError


def test_weights_are_seeded_and_shaped():
    a, b = attnlib.SelfAttention(8, 4, 3, max_seq_len=16, seed=7), attnlib.SelfAttention(8, 4, 3, 16, seed=7)
    assert a.w_q.shape == (8, 4) and a.w_v.shape == (8, 3)
    np.testing.assert_array_equal(a.w_k, b.w_k)
    assert not np.array_equal(a.w_k, attnlib.SelfAttention(8, 4, 3, 16, seed=8).w_k)


def test_output_is_attention_over_its_own_projections():
    layer = attnlib.SelfAttention(6, 4, 5, max_seq_len=10)
    x = np.random.default_rng(0).standard_normal((7, 6))
    np.testing.assert_allclose(layer(x), attnlib.attention(x @ layer.w_q, x @ layer.w_k, x @ layer.w_v))
    np.testing.assert_allclose(layer.weights(x, causal=True).sum(axis=-1), 1.0)


def test_too_long_a_sequence_raises_an_error_naming_both_lengths():
    layer = attnlib.SelfAttention(4, 4, 4, max_seq_len=5)
    with pytest.raises(SequenceTooLongError, match=r"T=8.*max_seq_len=5"):
        layer(np.zeros((8, 4)))


def test_truncate_keeps_the_first_max_seq_len_tokens_and_warns():
    layer = attnlib.SelfAttention(4, 4, 4, max_seq_len=5)
    x = np.random.default_rng(1).standard_normal((8, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = layer(x, truncate=True)
    assert any("T=8 to max_seq_len=5" in str(w.message) for w in caught)
    assert out.shape == (5, 4)
    np.testing.assert_allclose(out, layer(x[:5]))


def test_a_sequence_of_exactly_max_seq_len_is_fine():
    layer = attnlib.SelfAttention(4, 4, 4, max_seq_len=5)
    assert layer(np.ones((5, 4))).shape == (5, 4)


def test_wrong_embedding_width_is_named():
    with pytest.raises(ValueError, match=r"d_model=4.*\(3, 5\)"):
        attnlib.SelfAttention(4, 4, 4, max_seq_len=5)(np.zeros((3, 5)))
