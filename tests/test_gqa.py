"""Grouped-query attention (``enable_gqa=True``): H query heads share H_kv key/value heads.

Checked on every backend against multi-head attention with each key/value head
repeated, against PyTorch's own ``scaled_dot_product_attention(..., enable_gqa=True)``,
through the backward pass, for copies it must not make, and for bad input. The
Triton paths are in test_decoding_triton.py (they need the interpreter on a CPU).
"""

import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlib
from backend_inputs import NUMPY_BACKENDS, as_numpy, for_backend
from attnlib import errors
from attnlib.gqa import group_heads, repeat_kv

BACKENDS = [name for name in attnlib.backends() if not name.startswith("triton")]
BACKWARD_BACKENDS = [name for name in attnlib.backward_backends() if not name.startswith("triton")]
HEADS = [(4, 4), (4, 2), (6, 2), (8, 1)]  # (H, H_kv): MHA, GQA, GQA, MQA


def _inputs(rng, n_heads, n_kv_heads, t_q=5, t_k=9, d=8, batch=(2,)):
    q = rng.standard_normal((*batch, n_heads, t_q, d))
    k = rng.standard_normal((*batch, n_kv_heads, t_k, d))
    v = rng.standard_normal((*batch, n_kv_heads, t_k, d - 2))
    return q, k, v




@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"H{h[0]}-Hkv{h[1]}")
@pytest.mark.parametrize("causal", [False, "top-left", "bottom-right"])
def test_gqa_equals_multi_head_attention_with_repeated_kv_heads(backend, heads, causal, rng):
    n_heads, n_kv_heads = heads
    q, k, v = _inputs(rng, n_heads, n_kv_heads)
    group = n_heads // n_kv_heads
    expected = attnlib.attention(q, repeat_kv(k, group), repeat_kv(v, group), causal=causal)
    out = attnlib.attention(*for_backend(backend, q, k, v), causal=causal, enable_gqa=True, backend=backend)
    assert tuple(out.shape) == (2, n_heads, 5, 6)
    np.testing.assert_allclose(as_numpy(out), expected, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask_shape", [(9,), (5, 9), (1, 5, 9), (6, 5, 9), (2, 1, 5, 9), (2, 6, 5, 9)])
@pytest.mark.parametrize("float_mask", [False, True])
def test_gqa_with_masks_of_every_broadcastable_shape(backend, mask_shape, float_mask, rng):
    q, k, v = _inputs(rng, 6, 2)
    mask = rng.random(mask_shape) < 0.6
    mask[..., 0] = True
    if float_mask:
        mask = np.where(mask, rng.standard_normal(mask_shape), -np.inf)
    expected = attnlib.attention(q, repeat_kv(k, 3), repeat_kv(v, 3), mask=mask)
    q_b, k_b, v_b, mask_b = for_backend(backend, q, k, v, mask)
    out = attnlib.attention(q_b, k_b, v_b, mask=mask_b, enable_gqa=True, backend=backend)
    np.testing.assert_allclose(as_numpy(out), expected, atol=1e-12)


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"H{h[0]}-Hkv{h[1]}")
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_matches_torch_sdpa_enable_gqa(heads, causal, rng):
    q, k, v = (torch.from_numpy(a) for a in _inputs(rng, *heads, t_q=7, t_k=7))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    for backend in BACKENDS:
        q_b, k_b, v_b = (q, k, v) if backend not in NUMPY_BACKENDS else (q.numpy(), k.numpy(), v.numpy())
        out = attnlib.attention(q_b, k_b, v_b, causal=causal, enable_gqa=True, backend=backend)
        np.testing.assert_allclose(as_numpy(out), expected.numpy(), atol=1e-12, err_msg=backend)


def test_attention_weights_with_gqa_are_those_of_the_repeated_heads(rng):
    q, k, _ = _inputs(rng, 6, 3)
    weights = attnlib.attention_weights(q, k, causal="bottom-right", enable_gqa=True)
    assert weights.shape == (2, 6, 5, 9)
    np.testing.assert_allclose(weights, attnlib.attention_weights(q, repeat_kv(k, 2), causal="bottom-right"),
                               atol=1e-15)


@pytest.mark.parametrize("backend", BACKWARD_BACKENDS)
@pytest.mark.parametrize("heads", [(4, 2), (6, 1)], ids=["GQA", "MQA"])
@pytest.mark.parametrize("causal", [False, "bottom-right"])
def test_gqa_gradients_match_autograd_through_sdpa(backend, heads, causal, rng):
    q, k, v = _inputs(rng, *heads)
    d_out = rng.standard_normal((2, heads[0], 5, 6))
    leaves = [torch.from_numpy(a).requires_grad_() for a in (q, k, v)]
    mask = torch.from_numpy(attnlib.causal_mask(5, 9, causal)) if causal else None
    out = F.scaled_dot_product_attention(*leaves, attn_mask=mask, enable_gqa=True)
    expected = torch.autograd.grad(out, leaves, torch.from_numpy(d_out))
    grads = attnlib.attention_backward(*for_backend(backend, q, k, v, d_out), causal=causal, enable_gqa=True,
                                       backend=backend)
    for name, grad, reference, x in zip("qkv", grads, expected, (q, k, v)):
        assert tuple(grad.shape) == x.shape, name
        np.testing.assert_allclose(as_numpy(grad), reference.numpy(), atol=1e-12, err_msg=name)


def test_grouping_views_the_inputs_without_copying_them(rng):
    q, k, v = _inputs(rng, 8, 2)
    q_g, k_g, v_g, _, _, ungroup = group_heads(q, k, v)
    assert q_g.shape == (2, 2, 4, 5, 8) and k_g.shape == (2, 2, 1, 9, 8)
    assert all(np.shares_memory(a, b) for a, b in ((q_g, q), (k_g, k), (v_g, v)))
    tensors = [torch.from_numpy(a) for a in (q, k, v)]
    grouped = group_heads(*tensors)[:3]
    assert all(g.data_ptr() == t.data_ptr() for g, t in zip(grouped, tensors))
    # query head h of group g is head g * G + h: the order of repeat_interleave
    assert np.array_equal(ungroup(q_g), q) and np.array_equal(q_g[:, 1, 3], q[:, 7])


def test_the_tiled_backend_reads_a_shared_head_in_place():
    """One query per head over a long cache (decoding with MQA): the tiled backend's extra memory stays
    far below one copy of k, which repeating the head for 16 queries would take 16 times over."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((16, 1, 64)).astype(np.float32)  # (H, T_q, d)
    k, v = (rng.standard_normal((1, 8192, 64)).astype(np.float32) for _ in range(2))  # (H_kv, T_k, d)
    attnlib.attention(q, k, v, causal="bottom-right", enable_gqa=True, backend="tiled")  # warm up
    tracemalloc.start()
    out = attnlib.attention(q, k, v, causal="bottom-right", enable_gqa=True, backend="tiled")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    np.testing.assert_allclose(out, attnlib.attention(q, repeat_kv(k, 16), repeat_kv(v, 16)), atol=1e-5)
    assert peak < k.nbytes / 2, f"peak {peak} bytes: k ({k.nbytes} bytes) was copied"


def test_repeat_kv_repeats_each_head_in_place_like_repeat_interleave(rng):
    k = rng.standard_normal((2, 3, 4, 5))
    expected = torch.repeat_interleave(torch.from_numpy(k), 2, dim=-3).numpy()
    np.testing.assert_array_equal(repeat_kv(k, 2), expected)
    np.testing.assert_array_equal(repeat_kv(torch.from_numpy(k), 2).numpy(), expected)
    with pytest.raises(ValueError, match="n_rep must be a positive integer"):
        repeat_kv(k, 0)
    with pytest.raises(errors.ShapeError, match=r"dimension -3.*\(4, 5\)"):
        repeat_kv(k[0, 0], 2)


BAD_GQA = {
    # name: (q shape, k shape, v shape, kwargs, error, fragments of the message)
    "indivisible heads": ((2, 6, 4, 8), (2, 4, 4, 8), (2, 4, 4, 8), {}, errors.ShapeError,
                          ["H=6", "H_kv=4", "(2, 6, 4, 8)", "(2, 4, 4, 8)", "not divisible"]),
    "k and v with different heads": ((2, 4, 4, 8), (2, 2, 4, 8), (2, 1, 4, 8), {}, errors.ShapeError,
                                     ["k has H_kv=2", "v has 1", "(2, 1, 4, 8)"]),
    "no head dimension": ((4, 8), (4, 8), (4, 8), {}, errors.ShapeError, ["dimension -3", "q has shape (4, 8)"]),
    "more kv heads than query heads": ((2, 2, 4, 8), (2, 4, 4, 8), (2, 4, 4, 8), {}, errors.ShapeError,
                                       ["H=2", "H_kv=4"]),
    "a mask of the wrong head count": ((2, 6, 4, 8), (2, 2, 4, 8), (2, 2, 4, 8),
                                       {"mask": np.ones((2, 4, 4), bool)}, errors.MaskError,
                                       ["mask of shape (2, 4, 4)", "(2, 6, 4, 4)"]),
    "enable_gqa given as a string": ((2, 4, 4, 8), (2, 2, 4, 8), (2, 2, 4, 8), {"enable_gqa": "False"},
                                     TypeError, ["enable_gqa must be True or False", "'False'"]),
}


@pytest.mark.parametrize("case", BAD_GQA, ids=list(BAD_GQA))
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_bad_gqa_input_names_the_argument_and_the_shapes(case, kind):
    q_shape, k_shape, v_shape, kwargs, error, fragments = BAD_GQA[case]
    arrays = [np.ones(shape) for shape in (q_shape, k_shape, v_shape)]
    kwargs = {"enable_gqa": True, **kwargs}
    if kind == "torch":
        arrays = [torch.from_numpy(a) for a in arrays]
        if "mask" in kwargs:
            kwargs["mask"] = torch.from_numpy(kwargs["mask"])
    with pytest.raises(error) as caught:
        attnlib.attention(*arrays, **kwargs)
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))
    if error is errors.ShapeError and "mask" not in kwargs:  # the backward pass checks the same
        d_out = np.ones((*q_shape[:-1], v_shape[-1]))
        with pytest.raises(error):
            attnlib.attention_backward(*arrays, torch.from_numpy(d_out) if kind == "torch" else d_out, **kwargs)


def test_a_d_out_of_the_wrong_shape_is_refused_with_gqa(rng):
    q, k, v = _inputs(rng, 4, 2)
    with pytest.raises(errors.ShapeError, match=r"d_out has shape \(2, 2, 5, 6\).*\(2, 4, 5, 6\)"):
        attnlib.attention_backward(q, k, v, np.ones((2, 2, 5, 6)), enable_gqa=True)
