import numpy as np
import pytest
import torch

import attnlib
from attnlib.errors import MaskError, NonFiniteError


def test_softmax_matches_the_textbook_formula_on_small_inputs():
    x = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    expected = np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(attnlib.softmax(x), expected, rtol=1e-14)


def test_two_four_six_scaled_by_two():
    weights = attnlib.softmax(np.array([2, 4, 6]) / np.sqrt(4))
    np.testing.assert_allclose(weights, [0.09, 0.24, 0.67], atol=0.005)


def test_softmax_does_not_overflow_where_the_naive_formula_does():
    x = np.array([1000.0, 1001.0, 1002.0])
    with np.errstate(over="ignore", invalid="ignore"):
        naive = np.exp(x) / np.exp(x).sum()
    assert np.isnan(naive).all()
    np.testing.assert_allclose(attnlib.softmax(x), attnlib.softmax(x - 1000.0), rtol=1e-15)


def test_minus_infinity_gets_exactly_zero_weight():
    weights = attnlib.softmax(np.array([[0.0, -np.inf, 1.0]]))
    assert weights[0, 1] == 0.0
    np.testing.assert_allclose(weights.sum(), 1.0)


def test_softmax_along_another_axis_normalises_that_axis():
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(attnlib.softmax(x, axis=0).sum(axis=0), 1.0)


@pytest.mark.parametrize("bad, error", [([np.nan, 1.0], NonFiniteError), ([np.inf, 1.0], NonFiniteError),
                                        ([-np.inf, -np.inf], MaskError)])
def test_softmax_refuses_input_it_cannot_normalise(bad, error):
    with pytest.raises(error, match="softmax"):
        attnlib.softmax(np.array(bad))
    with pytest.raises(error, match="softmax"):
        attnlib.softmax(torch.tensor(bad))


def test_softmax_on_tensors_matches_torch():
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(attnlib.softmax(x), torch.softmax(x, dim=-1))
