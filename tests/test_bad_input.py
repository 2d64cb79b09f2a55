"""Bad input raises a ValueError or TypeError that names the argument and the shapes."""

import numpy as np
import pytest
import torch

import attnlib
from attnlib import errors

BACKENDS = [name for name in attnlib.backends() if not name.startswith("triton")]


def _qkv(t_q=4, t_k=4, d_k=3, d_v=2, dtype=np.float64):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((t_q, d_k)).astype(dtype), rng.standard_normal((t_k, d_k)).astype(dtype),
            rng.standard_normal((t_k, d_v)).astype(dtype))


def _with(index, value):
    args = list(_qkv())
    args[index] = value
    return args


def _nan_in_k():
    q, k, v = _qkv()
    k[2, 1] = np.nan
    return q, k, v


def _inf_in_v():
    q, k, v = _qkv()
    v[0, 0] = np.inf
    return q, k, v


CASES = {
    # name: (args, kwargs, error class, fragments the message must contain)
    "q and k with different d_k": (_with(1, np.zeros((4, 5))), {}, errors.ShapeError, ["d_k=5", "d_k=3", "(4, 3)", "(4, 5)"]),
    "k and v with different lengths": (_with(2, np.zeros((6, 2))), {}, errors.ShapeError, ["v has T_k=6", "k has T_k=4"]),
    "q of rank 1": (_with(0, np.zeros(3)), {}, errors.ShapeError, ["q must have at least 2 dimensions", "(3,)"]),
    "batch dims that do not broadcast": (
        [np.zeros((2, 4, 3)), np.zeros((3, 4, 3)), np.zeros((3, 4, 2))], {}, errors.ShapeError, ["broadcast", "(2, 4, 3)"]),
    "mask that does not broadcast": (list(_qkv()), {"mask": np.ones((3, 4), bool)}, errors.MaskError,
                                     ["mask of shape (3, 4)", "(4, 4)"]),
    "integer q": (_with(0, np.ones((4, 3), dtype=np.int64)), {}, errors.DTypeError, ["q must be a floating-point", "int64", "(4, 3)"]),
    "complex k": (_with(1, np.ones((4, 3), dtype=np.complex128)), {}, errors.DTypeError, ["k must be", "complex128"]),
    "integer mask": (list(_qkv()), {"mask": np.ones((4, 4), dtype=np.int64)}, errors.DTypeError, ["mask must be boolean"]),
    "mixed dtypes": (_with(2, np.zeros((4, 2), np.float32)), {}, errors.DTypeError, ["v is float32", "q is float64"]),
    "NaN in k": (list(_nan_in_k()), {}, errors.NonFiniteError, ["k (shape (4, 3)) contains NaN"]),
    "inf in v": (list(_inf_in_v()), {}, errors.NonFiniteError, ["v (shape (4, 2))"]),
    "NaN in a float mask": (list(_qkv()), {"mask": np.full((4, 4), np.nan)}, errors.MaskError, ["NaN or +inf"]),
    "a query row with no allowed key": (
        list(_qkv()), {"mask": np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]], bool)},
        errors.MaskError, ["query row 1", "no key"]),
    "a float mask that is -inf across a row": (
        list(_qkv()), {"mask": np.where(np.arange(4)[:, None] == 3, -np.inf, 0.0) * np.ones((4, 4))},
        errors.MaskError, ["query row 3"]),
    "causal plus a mask that keeps only future keys": (
        list(_qkv()), {"causal": True, "mask": np.array([[0, 1, 1, 1]] * 4, bool)}, errors.MaskError, ["query row 0"]),
    "numpy and torch mixed": (_with(1, torch.zeros(4, 3, dtype=torch.float64)), {}, errors.MixedArrayTypesError,
                              ["k is a torch array", "q is a numpy array"]),
    "negative scale": (list(_qkv()), {"scale": -1.0}, ValueError, ["scale must be a positive"]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_a_clear_error(case, backend):
    args, kwargs, error, fragments = CASES[case]
    with pytest.raises(error) as info:
        attnlib.attention(*args, backend=backend, **kwargs)
    assert isinstance(info.value, (ValueError, TypeError))
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("backend", ["torch", "sdpa"])
def test_torch_inputs_get_the_same_errors(backend):
    q, k, v = (torch.from_numpy(a) for a in _qkv())
    with pytest.raises(errors.ShapeError, match="d_k=5"):
        attnlib.attention(q, torch.zeros(4, 5, dtype=torch.float64), v, backend=backend)
    with pytest.raises(errors.DTypeError, match="int64"):
        attnlib.attention(q.long(), k, v, backend=backend)
    bad = k.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(errors.NonFiniteError, match="k"):
        attnlib.attention(q, bad, v, backend=backend)
    empty_row = torch.ones(4, 4, dtype=torch.bool)
    empty_row[2] = False
    with pytest.raises(errors.MaskError, match="query row 2"):
        attnlib.attention(q, k, v, mask=empty_row, backend=backend)
    with pytest.raises(errors.MaskError, match="does not broadcast"):
        attnlib.attention(q, k, v, mask=torch.ones(2, 4, dtype=torch.bool), backend=backend)


def test_attention_weights_and_score_matrix_validate_too():
    q, k, _ = _qkv()
    with pytest.raises(errors.ShapeError, match="d_k"):
        attnlib.score_matrix(q, np.zeros((4, 5)))
    with pytest.raises(errors.MaskError, match="query row"):
        attnlib.attention_weights(q, k, mask=np.zeros((4, 4), bool))


def test_project_qkv_names_the_weight_with_the_wrong_shape():
    x = np.zeros((5, 6))
    with pytest.raises(errors.ShapeError, match=r"w_k must be \(d_model, d_out\) with d_model=6.*\(4, 3\)"):
        attnlib.project_qkv(x, np.zeros((6, 3)), np.zeros((4, 3)), np.zeros((6, 3)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_sequences_and_zero_widths_are_refused(backend):
    q, k, v = _qkv()
    with pytest.raises(errors.ShapeError, match=r"k has shape \(0, 3\)"):
        attnlib.attention(q, np.zeros((0, 3)), np.zeros((0, 2)), backend=backend)
    with pytest.raises(errors.ShapeError, match="at least 1"):
        attnlib.attention(np.zeros((4, 0)), np.zeros((4, 0)), v, backend=backend)


@pytest.mark.parametrize("mask_rows", [1, 4])
def test_causal_with_a_mask_that_drops_early_keys_names_the_empty_row(mask_rows):
    q, k, v = _qkv()
    mask = np.ones((mask_rows, 4), bool)
    mask[:, :2] = False  # only keys 2 and 3: rows 0 and 1 see nothing under causal
    with pytest.raises(errors.MaskError, match="query row 0"):
        attnlib.attention(q, k, v, mask=mask, causal=True)
    with pytest.raises(errors.MaskError, match="query row 0"):
        attnlib.attention(*(torch.from_numpy(a) for a in (q, k, v)), mask=torch.from_numpy(mask), causal=True)
    mask[:, 0] = True
    assert np.isfinite(attnlib.attention(q, k, v, mask=mask, causal=True)).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_the_finiteness_check_finds_one_bad_value_anywhere(bad, dtype):
    import torch

    from attnlib.validation import all_finite

    rng = np.random.default_rng(0)
    for _ in range(20):
        x = torch.from_numpy(rng.standard_normal((2, 3, 5, 4))).to(getattr(torch, dtype))
        assert all_finite(x, "torch") and all_finite(x.requires_grad_(), "torch")
        x = x.detach().clone()
        x.view(-1)[rng.integers(x.numel())] = bad
        assert not all_finite(x, "torch")
        assert not all_finite(x.numpy() if dtype != "float16" else x.float().numpy(), "numpy")
    assert all_finite(torch.empty(0, 4), "torch") and all_finite(torch.ones(3, dtype=torch.int64), "torch")
    z = torch.zeros(4, dtype=torch.complex128)
    z[2] = complex(0, bad)
    assert not all_finite(z, "torch")


def test_the_finiteness_checks_keep_nothing_alive_for_autograd():
    """The checks of the inputs and the result run outside autograd: the torch backend saves P and the
    scaled queries for its backward, not the output (an abs() on it inside the graph would keep it)."""
    import torch

    import attnlib

    q, k, v = (torch.randn(8, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    saved = []

    def pack(x):
        saved.append(x)
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = attnlib.attention(q, k, v, backend="torch")
    assert not any(x.untyped_storage().data_ptr() == out.untyped_storage().data_ptr() for x in saved)
    assert any(x.shape == (8, 8) for x in saved)  # P is kept, so the hook did see the graph
