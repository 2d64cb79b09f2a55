"""Inputs a held-out QA pass found mistreated (issue 18), each now refused or explained clearly.

A scale that is not a positive real number, tensors on the meta device, NumPy masked arrays,
big-endian and long-double arrays, a float mask that requires grad on the triton backend, a
timer exercise that only read one call, and a mask in nn.MultiheadAttention's convention.
"""

import importlib.util

import numpy as np
import pytest
import torch

import attnlib
from attnlib import errors
from attnlib.exercises import check
from attnlib.exercises.ch11_timing import _sync_after
from attnlib.validation import check_mask_gradient, check_scale

BACKENDS = [name for name in attnlib.backends() if name not in ("triton", "triton-simple")]


def _qkv(t=4, d=3, dtype=np.float64):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((t, d)).astype(dtype) for _ in range(3))


def _torch_qkv(device="cpu", dtype=torch.float64):
    return tuple(torch.from_numpy(a).to(device=device, dtype=dtype) for a in _qkv())


# --- scale: a real, positive, finite number ------------------------------------------------------

NOT_A_REAL_NUMBER = {
    "a string": ("0.5", "got str '0.5'"),
    "True": (True, "got the bool True"),
    "np.True_": (np.bool_(True), "got the bool"),
    "a complex number": (0.5 + 1j, "got the complex number"),
    "a NumPy complex number": (np.complex128(0.5 + 1j), "got the complex number"),
    "a 1-d array": (np.array([0.5]), "an array of shape (1,)"),
    "a complex 0-d tensor": (torch.tensor(0.5 + 1j), "dtype complex"),
    "a bool 0-d tensor": (torch.tensor(True), "dtype bool"),
    "a list": ([0.5], "got list"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(NOT_A_REAL_NUMBER))
def test_a_scale_that_is_not_a_real_number_is_refused_on_every_backend(case, backend):
    scale, fragment = NOT_A_REAL_NUMBER[case]
    with pytest.raises(TypeError, match="scale must be a real number") as info:
        attnlib.attention(*_qkv(), scale=scale, backend=backend)
    assert fragment in str(info.value)


@pytest.mark.parametrize("scale, fragment", [
    (0, "every key the same weight"),
    (0.0, "scale=None"),
    (-0.5, "reverses the ranking"),
    (float("inf"), "infinite"),
    (-np.inf, "infinite"),
    (float("nan"), "scale is NaN"),
    (np.float32("nan"), "scale is NaN"),
    (torch.tensor(0.0), "every key the same weight"),
])
@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_negative_infinite_and_nan_scales_each_get_their_own_answer(scale, fragment, backend):
    with pytest.raises(ValueError) as info:
        attnlib.attention(*_qkv(), scale=scale, backend=backend)
    assert fragment in str(info.value)


@pytest.mark.parametrize("scale", [0.5, 1, np.float32(0.5), np.int64(1), np.array(0.5), torch.tensor(0.5),
                                   torch.tensor(1, dtype=torch.int32)])
def test_every_kind_of_real_scale_is_taken_at_its_value(scale):
    q, k, v = _qkv()
    expected = attnlib.attention(q, k, v, scale=float(scale))
    np.testing.assert_array_equal(attnlib.attention(q, k, v, scale=scale), expected)
    assert check_scale(scale, d_k=3) == float(scale) and type(check_scale(scale, 3)) is float


def test_the_scale_rules_are_documented():
    doc = check_scale.__doc__
    for words in ("real number", "strings", "bools", "complex", "0", "negative", "inf and NaN"):
        assert words in doc


# --- meta tensors, masked arrays, big-endian and long-double arrays -------------------------------


@pytest.mark.parametrize("call", ["attention", "attention_weights", "attention_backward"])
def test_meta_tensors_are_refused_with_the_argument_named(call):
    q, k, v = _torch_qkv("meta")
    args = {"attention": (q, k, v), "attention_weights": (q, k),
            "attention_backward": (q, k, v, torch.empty(4, 3, device="meta", dtype=torch.float64))}[call]
    with pytest.raises(errors.DeviceError, match=r"q \(shape \(4, 3\)\) is on the meta device"):
        getattr(attnlib, call)(*args)


def test_a_meta_mask_d_out_or_scale_is_named_too():
    q, k, v = _torch_qkv()
    with pytest.raises(errors.DeviceError, match="mask .* meta device"):
        attnlib.attention(q, k, v, mask=torch.ones(4, 4, dtype=torch.bool, device="meta"))
    with pytest.raises(errors.DeviceError, match="d_out .* meta device"):
        attnlib.attention_backward(q, k, v, torch.empty(4, 3, dtype=torch.float64, device="meta"))
    with pytest.raises(errors.DeviceError, match="scale .* meta device"):
        attnlib.attention(q, k, v, scale=torch.tensor(0.5, device="meta"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("argument", ["q", "k", "v"])
def test_a_numpy_masked_array_is_refused_with_a_way_to_pass_its_mask(argument, backend):
    arrays = dict(zip("qkv", _qkv()))
    arrays[argument] = np.ma.masked_array(arrays[argument], mask=np.eye(4, 3, dtype=bool))
    with pytest.raises(TypeError, match=f"{argument} is a NumPy masked array") as info:
        attnlib.attention(arrays["q"], arrays["k"], arrays["v"], backend=backend)
    assert "mask=" in str(info.value) and "True = may attend" in str(info.value)


def test_a_masked_mask_and_a_masked_d_out_are_refused_too():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="mask is a NumPy masked array"):
        attnlib.attention(q, k, v, mask=np.ma.masked_array(np.ones((4, 4), bool)))
    with pytest.raises(TypeError, match="d_out is a NumPy masked array"):
        attnlib.attention_backward(q, k, v, np.ma.masked_array(np.ones((4, 3))))


@pytest.mark.parametrize("backend", BACKENDS)
def test_big_endian_arrays_are_refused_with_the_conversion_to_use(backend):
    q, k, v = _qkv()
    with pytest.raises(errors.DTypeError, match=r"k has dtype >f8 .* k\.astype\(k\.dtype\.newbyteorder\('='\)\)"):
        attnlib.attention(q, k.astype(">f8"), v, backend=backend)
    converted = k.astype(">f8").astype(k.astype(">f8").dtype.newbyteorder("="))
    np.testing.assert_allclose(attnlib.attention(q, converted, v, backend=backend), attnlib.attention(q, k, v))


@pytest.mark.skipif(np.dtype(np.longdouble).itemsize <= 8, reason="np.longdouble is float64 here")
@pytest.mark.parametrize("backend", BACKENDS)
def test_long_double_arrays_are_refused_on_every_backend(backend):
    q, k, v = (a.astype(np.longdouble) for a in _qkv())
    with pytest.raises(errors.DTypeError, match=r"q has dtype float128 \(np\.longdouble.*q\.astype\(np\.float64\)"):
        attnlib.attention(q, k, v, backend=backend)
    with pytest.raises(errors.DTypeError, match="d_out has dtype"):
        attnlib.attention_backward(*_qkv(), np.ones((4, 3), dtype=np.longdouble))


# --- a float mask that requires grad, on the triton backend ---------------------------------------


@pytest.mark.parametrize("q_requires_grad", [False, True])
def test_a_float_mask_that_requires_grad_gets_one_clear_error_on_triton(q_requires_grad):
    mask = torch.zeros(4, 4, dtype=torch.float64, requires_grad=True)
    q = torch.zeros(4, 3, dtype=torch.float64, requires_grad=q_requires_grad)
    with pytest.raises(ValueError, match=r"mask \(shape \(4, 4\)\) requires grad, but backend='triton'"):
        check_mask_gradient(mask, "triton")
    check_mask_gradient(mask.detach(), "triton")  # detached: fine
    check_mask_gradient(mask, "torch")  # torch differentiates through the mask
    with torch.no_grad():
        check_mask_gradient(mask, "triton")  # nothing is recorded, nothing is lost
    assert q.requires_grad is q_requires_grad


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.parametrize("q_requires_grad", [False, True])
def test_attention_on_triton_refuses_a_mask_that_requires_grad(q_requires_grad, monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # as tests/test_triton.py: the kernels run on CPU
    q, k, v = (x.float().requires_grad_(q_requires_grad) for x in _torch_qkv())
    mask = torch.zeros(4, 4, requires_grad=True)
    with pytest.raises(ValueError, match="computes no gradient for a mask"):
        attnlib.attention(q, k, v, mask=mask, backend="triton")


def test_the_torch_backend_does_differentiate_through_a_float_mask():
    q, k, v = _torch_qkv()
    mask = torch.zeros(4, 4, dtype=torch.float64, requires_grad=True)
    attnlib.attention(q, k, v, mask=mask, backend="torch").sum().backward()
    assert mask.grad is not None and mask.grad.abs().sum() > 0


# --- the timer exercise reads every timed call ----------------------------------------------------


@pytest.mark.parametrize("which, index", [("first", 0), ("last", -1)])
def test_a_timer_that_returns_one_timed_call_fails_and_is_told_which(which, index):
    def one_call(fn, sync, warmup=1, repeats=5):
        return _sync_after(fn, sync, warmup, repeats)[index]

    result = check("ch11.median_timer", one_call)
    assert not result.passed
    assert f"you returned the {which} call's time only" in result.message


def test_the_median_timer_still_passes():
    def median_timer(fn, sync, warmup=1, repeats=5):
        import statistics

        return statistics.median(_sync_after(fn, sync, warmup, repeats))

    assert check("ch11.median_timer", median_timer).passed


# --- a mask in the other convention ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_mask_in_multihead_attentions_convention_gets_the_invert_hint(kind):
    blocked = np.triu(np.ones((4, 4), bool), k=1)  # nn.MultiheadAttention's causal mask: True = blocked
    q, k, v = _qkv() if kind == "numpy" else _torch_qkv()
    mask = blocked if kind == "numpy" else torch.from_numpy(blocked)
    with pytest.raises(errors.MaskError) as info:
        attnlib.attention(q, k, v, mask=mask)
    message = str(info.value)
    assert "query row 3" in message
    assert "Did you mean `~mask`? attnlib's True means may attend" in message
    assert attnlib.attention(q, k, v, mask=~mask).shape == (4, 3)


def test_the_hint_is_given_only_when_the_inverted_mask_would_work():
    q, k, v = _qkv()
    one_empty_row = np.ones((4, 4), bool)
    one_empty_row[1] = False  # ~mask would empty the three other rows
    with pytest.raises(errors.MaskError) as info:
        attnlib.attention(q, k, v, mask=one_empty_row)
    assert "~mask" not in str(info.value)
    padding = np.array([False, False, False, True])  # key_padding_mask style: True = padding
    with pytest.raises(errors.MaskError, match="no key to attend to") as info:
        attnlib.attention(q, k, v, mask=padding, causal=True)
    assert "Did you mean `~mask`?" in str(info.value)
    float_mask = np.full((4, 4), -np.inf)
    with pytest.raises(errors.MaskError) as info:
        attnlib.attention(q, k, v, mask=float_mask)
    assert "~mask" not in str(info.value)
