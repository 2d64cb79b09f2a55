"""Where position comes from (chapter 8): attention alone ignores order, sinusoidal position vectors,
and RoPE, checked against independent implementations and its relative-offset property."""

import math

import numpy as np
import pytest

import attnlib
from attnlib.errors import DTypeError, MixedArrayTypesError, ShapeError

RNG = np.random.default_rng(11)


# --- Attention by itself ignores order -------------------------------------------------------


def test_permuting_the_tokens_permutes_the_outputs_of_attention():
    x = RNG.standard_normal((7, 8))
    w_q, w_k, w_v, w_o = (RNG.standard_normal((8, 8)) for _ in range(4))
    order = RNG.permutation(7)
    out = attnlib.multi_head_attention(x, w_q, w_k, w_v, w_o, n_heads=2)
    permuted = attnlib.multi_head_attention(x[order], w_q, w_k, w_v, w_o, n_heads=2)
    np.testing.assert_allclose(permuted, out[order], rtol=1e-12, atol=1e-12)


def test_with_positions_added_the_outputs_no_longer_just_permute():
    x = RNG.standard_normal((7, 8))
    w_q, w_k, w_v, w_o = (RNG.standard_normal((8, 8)) for _ in range(4))
    order = np.roll(np.arange(7), 1)
    positions = attnlib.sinusoidal_positions(7, 8)
    out = attnlib.multi_head_attention(x + positions, w_q, w_k, w_v, w_o, n_heads=2)
    permuted = attnlib.multi_head_attention(x[order] + positions, w_q, w_k, w_v, w_o, n_heads=2)
    assert not np.allclose(permuted, out[order])


# --- Sinusoidal positions ----------------------------------------------------------------------


def _sinusoidal_by_loops(T, d, base=10000.0):
    table = np.zeros((T, d))
    for t in range(T):
        for feature in range(d):
            i = feature // 2
            angle = t / base ** (2 * i / d)
            table[t, feature] = math.sin(angle) if feature % 2 == 0 else math.cos(angle)
    return table


@pytest.mark.parametrize("T, d, base", [(12, 16, 10000.0), (5, 7, 10000.0), (9, 6, 100.0), (1, 2, 10000.0)])
def test_sinusoidal_positions_match_the_formula_of_the_paper(T, d, base):
    table = attnlib.sinusoidal_positions(T, d, base=base)
    assert table.shape == (T, d) and table.dtype == np.float64
    np.testing.assert_allclose(table, _sinusoidal_by_loops(T, d, base), rtol=0, atol=1e-12)


def test_sinusoidal_position_zero_is_sin_0_cos_0():
    np.testing.assert_array_equal(attnlib.sinusoidal_positions(3, 8)[0], [0, 1, 0, 1, 0, 1, 0, 1])


def test_each_sinusoidal_pair_lies_on_the_unit_circle():
    table = attnlib.sinusoidal_positions(50, 16)
    assert np.abs(table).max() <= 1.0
    np.testing.assert_allclose(table[:, 0::2] ** 2 + table[:, 1::2] ** 2, 1.0, rtol=1e-12)


def test_every_position_gets_its_own_sinusoidal_vector():
    table = attnlib.sinusoidal_positions(64, 16)
    distances = np.linalg.norm(table[:, None] - table[None], axis=-1)  # (T, T)
    assert distances[~np.eye(64, dtype=bool)].min() > 0.1


def test_a_shift_of_k_positions_is_the_same_rotation_of_every_sinusoidal_vector():
    T, d, k = 40, 8, 5
    table = attnlib.sinusoidal_positions(T, d)
    frequencies = 10000.0 ** (-np.arange(0, d, 2) / d)
    for i, w in enumerate(frequencies):
        c, s = math.cos(k * w), math.sin(k * w)
        rotation = np.array([[c, -s], [s, c]])  # row (sin, cos)(t) @ rotation = (sin, cos)(t + k), every t
        pair = table[:, 2 * i: 2 * i + 2]  # (T, 2)
        np.testing.assert_allclose(pair[:-k] @ rotation, pair[k:], atol=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    (dict(T=0, d=8), r"T must be a positive integer, got 0"),
    (dict(T=4.0, d=8), r"T must be a positive integer, got 4.0"),
    (dict(T=4, d=-2), r"d must be a positive integer, got -2"),
    (dict(T=4, d=8, base=1.0), r"base must be a real number greater than 1, got 1.0"),
])
def test_bad_sinusoidal_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        attnlib.sinusoidal_positions(**kwargs)


# --- RoPE ---------------------------------------------------------------------------------------------


def _rope_by_loops(x, positions, style, base=10000.0):
    """An independent RoPE: every pair turned by an explicit 2 x 2 rotation, one row at a time."""
    *lead, T, d = x.shape
    rows = x.reshape(-1, T, d)
    out = np.empty_like(rows)
    half = d // 2
    pairs = [(i, i + half) for i in range(half)] if style == "half" else [(2 * i, 2 * i + 1) for i in range(half)]
    for b in range(rows.shape[0]):
        for t in range(T):
            for i, (first, second) in enumerate(pairs):
                angle = positions[t] * base ** (-2 * i / d)
                rotation = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
                out[b, t, [first, second]] = rotation @ rows[b, t, [first, second]]
    return out.reshape(x.shape)


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("shape", [(6, 8), (2, 3, 5, 4), (1, 2)])
def test_rope_matches_an_independent_rotation_of_each_pair(style, shape):
    x = RNG.standard_normal(shape)
    T = shape[-2]
    np.testing.assert_allclose(attnlib.rope(x, style=style), _rope_by_loops(x, np.arange(T), style), atol=1e-12)
    positions = RNG.uniform(0, 50, size=T)
    np.testing.assert_allclose(attnlib.rope(x, positions, style=style, base=500.0),
                               _rope_by_loops(x, positions, style, base=500.0), atol=1e-12)


def test_interleaved_rope_is_a_complex_multiplication():
    x = RNG.standard_normal((9, 8))
    z = x[:, 0::2] + 1j * x[:, 1::2]  # (T, d/2): pair (2i, 2i + 1) as one complex number
    angles = np.arange(9)[:, None] * 10000.0 ** (-np.arange(0, 8, 2) / 8)
    turned = z * np.exp(1j * angles)
    expected = np.stack([turned.real, turned.imag], axis=-1).reshape(9, 8)
    np.testing.assert_allclose(attnlib.rope(x, style="interleaved"), expected, atol=1e-12)


def test_the_two_styles_are_one_rotation_with_the_features_in_another_order():
    x = RNG.standard_normal((2, 7, 8))
    to_interleaved = np.stack([np.arange(4), np.arange(4, 8)], axis=-1).reshape(8)  # 0, 4, 1, 5, ...
    np.testing.assert_allclose(attnlib.rope(x[..., to_interleaved], style="interleaved"),
                               attnlib.rope(x, style="half")[..., to_interleaved], atol=1e-12)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rope_scores_depend_only_on_the_offset_between_query_and_key(style):
    d = 16
    q, k = RNG.standard_normal((1, d)), RNG.standard_normal((1, d))

    def score(m, n):
        return (attnlib.rope(q, [m], style=style) @ attnlib.rope(k, [n], style=style).T).item()

    for m, n in [(0, 0), (3, 7), (9, 2), (20, 20)]:
        for shift in (1, 5, 100, 1000):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-10)
    rotated_key_only = (q @ attnlib.rope(k, [4], style=style).T).item()  # offset n - m = 4
    assert score(3, 7) == pytest.approx(rotated_key_only, abs=1e-12)
    assert abs(score(3, 7) - score(7, 3)) > 1e-3  # the offset's sign matters


def test_rope_scores_at_every_pair_of_positions_form_a_toeplitz_matrix():
    q = np.repeat(RNG.standard_normal((1, 8)), 10, axis=0)  # one query at positions 0 ... 9
    k = np.repeat(RNG.standard_normal((1, 8)), 10, axis=0)  # one key at positions 0 ... 9
    scores = attnlib.rope(q) @ attnlib.rope(k).T  # (10, 10): constant along each diagonal
    for offset in range(-9, 10):
        diagonal = np.diagonal(scores, offset)
        np.testing.assert_allclose(diagonal, diagonal[0], atol=1e-12)
    assert np.ptp(scores[0]) > 1e-3  # ... and not the same everywhere


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rope_preserves_every_vectors_norm(style):
    x = RNG.standard_normal((3, 20, 8))
    np.testing.assert_allclose(np.linalg.norm(attnlib.rope(x, style=style), axis=-1),
                               np.linalg.norm(x, axis=-1), rtol=1e-12)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rope_is_the_identity_at_position_zero(style):
    x = RNG.standard_normal((4, 1, 6))
    np.testing.assert_array_equal(attnlib.rope(x, style=style), x)
    np.testing.assert_array_equal(attnlib.rope(x[:, 0], np.zeros(4), style=style), x[:, 0])


def test_rope_positions_broadcast_over_the_leading_axes():
    x = RNG.standard_normal((2, 3, 5, 4))  # (B, H, T, d)
    per_sequence = np.array([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]])[:, None]  # (B, 1, T)
    out = attnlib.rope(x, per_sequence)
    np.testing.assert_allclose(out[0], attnlib.rope(x[0]))
    np.testing.assert_allclose(out[1], attnlib.rope(x[1], np.arange(10, 15)))


def test_rope_keeps_the_dtype_and_accepts_lists():
    x32 = RNG.standard_normal((5, 4)).astype(np.float32)
    assert attnlib.rope(x32).dtype == np.float32
    np.testing.assert_allclose(attnlib.rope(x32.tolist(), [0, 1, 2, 3, 4]), attnlib.rope(x32), rtol=1e-6)


def test_rope_in_torch_matches_numpy_and_returns_a_tensor():
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((2, 6, 8))
    for style in ("half", "interleaved"):
        out = attnlib.rope(torch.from_numpy(x), torch.arange(3, 9), style=style)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
        np.testing.assert_allclose(out.numpy(), attnlib.rope(x, np.arange(3, 9), style=style), atol=1e-12)
    assert attnlib.rope(torch.from_numpy(x), [0, 1, 2, 3, 4, 5]).shape == (2, 6, 8)  # list positions


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_gradients_flow_through_rope_in_torch(style):
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: attnlib.rope(t, style=style), (x,))
    attnlib.rope(x, style=style).pow(2).sum().backward()  # a rotation keeps |x|^2, so its gradient is 2x
    torch.testing.assert_close(x.grad, 2 * x.detach())


@pytest.mark.parametrize("x, kwargs, error, message", [
    (np.zeros((4, 5)), {}, ShapeError, r"d must be even; x has shape \(4, 5\), d=5"),
    (np.zeros(4), {}, ShapeError, r"x must be \(\.\.\., T, d\), got shape \(4,\)"),
    (np.zeros((4, 6)), dict(positions=[0, 1, 2]), ShapeError,
     r"positions must have shape \(T,\) = \(4,\).*got positions of shape \(3,\) for x of shape \(4, 6\)"),
    (np.zeros((2, 4, 6)), dict(positions=np.zeros((3, 4))), ShapeError,
     r"broadcasts to x.shape\[:-1\] = \(2, 4\); got positions of shape \(3, 4\)"),
    (np.zeros((4, 6)), dict(style="llama"), ValueError, r"style must be one of \('half', 'interleaved'\), got 'llama'"),
    (np.zeros((4, 6)), dict(base=0.5), ValueError, r"base must be a real number greater than 1, got 0.5"),
    (np.zeros((4, 6)), dict(positions=[0, 1, np.nan, 3]), ValueError, r"positions \(shape \(4,\)\) contains NaN"),
    (np.zeros((4, 6), dtype=np.int64), {}, DTypeError, r"x must be a floating-point array, got dtype int64"),
    (np.zeros((4, 6)), dict(positions=np.array([True, False, True, False])), TypeError,
     r"positions must hold real numbers, got dtype bool"),
])
def test_bad_rope_input_gets_a_clear_error(x, kwargs, error, message):
    with pytest.raises(error, match=message):
        attnlib.rope(x, **kwargs)


def test_rope_refuses_numpy_mixed_with_torch():
    torch = pytest.importorskip("torch")
    with pytest.raises(MixedArrayTypesError, match="x is a numpy array, positions is a torch array"):
        attnlib.rope(np.zeros((3, 4)), torch.arange(3))


# --- Positions in the decoder -----------------------------------------------------------------------


def test_without_positions_one_causal_layer_reads_the_earlier_tokens_as_a_bag():
    torch = pytest.importorskip("torch")
    from attnlib.learn.transformer import Decoder

    tokens = torch.randint(10, (1, 8), generator=torch.Generator().manual_seed(0))
    shuffled = torch.cat([tokens[:, :7].flip(1), tokens[:, 7:]], dim=1)  # same last token, others reversed
    for positions, same in (("none", True), ("learned", False), ("sinusoidal", False), ("rope", False)):
        model = Decoder(10, 16, 2, 1, positions=positions, max_len=8)
        last, last_shuffled = model(tokens)[0, -1], model(shuffled)[0, -1]
        assert torch.allclose(last, last_shuffled) is same, positions
    two_layers = Decoder(10, 16, 2, 2, positions="none")  # the causal mask lets layer 1 count tokens
    assert not torch.allclose(two_layers(tokens)[0, -1], two_layers(shuffled)[0, -1])


def test_half_style_with_permuted_weights_gives_the_interleaved_scores():
    """Hugging Face-format Llama: W_Q and W_K's columns of each head permuted, then style="half"."""
    rng = np.random.default_rng(7)
    d_model, d = 16, 8
    x = rng.standard_normal((2, 6, d_model))
    w_q, w_k = rng.standard_normal((d_model, d)), rng.standard_normal((d_model, d))
    permutation = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])  # pairs (2i, 2i+1) -> (i, i + d/2)
    q_meta, k_meta = (attnlib.rope(x @ w, style="interleaved") for w in (w_q, w_k))
    q_hf, k_hf = (attnlib.rope(x @ w[:, permutation], style="half") for w in (w_q, w_k))
    np.testing.assert_allclose(q_hf, q_meta[..., permutation], atol=1e-12)
    np.testing.assert_allclose(q_hf @ k_hf.swapaxes(-1, -2), q_meta @ k_meta.swapaxes(-1, -2), atol=1e-10)
    q_wrong, k_wrong = (attnlib.rope(x @ w, style="half") for w in (w_q, w_k))  # unpermuted: other scores
    assert np.abs(q_wrong @ k_wrong.swapaxes(-1, -2) - q_meta @ k_meta.swapaxes(-1, -2)).max() > 1
