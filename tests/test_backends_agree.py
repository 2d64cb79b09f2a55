"""Every backend of attnlib.attention against an independent float64 reference."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnlib
from conftest import random_bool_mask, reference_attention

# "triton" runs under Triton's slow CPU interpreter here; tests/test_triton.py covers it.
BACKENDS = [name for name in attnlib.backends() if not name.startswith("triton")]
TOLERANCE = {np.float64: 1e-10, np.float32: 2e-5}


@st.composite
def attention_problems(draw):
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    t_q, t_k = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    d_k, d_v = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    mask_kind = draw(st.sampled_from(["none", "causal", "bool", "bool+causal", "additive"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*batch, t_q, d_k))
    k = rng.standard_normal((*batch, t_k, d_k))
    v = rng.standard_normal((*batch, t_k, d_v))
    mask = None
    if mask_kind in ("bool", "bool+causal", "additive"):
        mask_batch = batch[draw(st.integers(0, len(batch))):]  # masks broadcast over leading dims too
        mask = random_bool_mask(rng, (*mask_batch, t_q, t_k))
        if mask_kind == "additive":
            mask = np.where(mask, rng.uniform(-1, 1, mask.shape), -np.inf)
    return q, k, v, mask, mask_kind.endswith("causal")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=attention_problems())
def test_backend_matches_float64_reference(backend, dtype, problem):
    q, k, v, mask, causal = problem
    expected = reference_attention(q, k, v, mask=mask, causal=causal)
    if mask is not None and mask.dtype != np.bool_:
        mask = mask.astype(dtype)
    got = attnlib.attention(q.astype(dtype), k.astype(dtype), v.astype(dtype), mask=mask,
                            causal=causal, backend=backend)
    assert isinstance(got, np.ndarray) and got.dtype == dtype
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("backend", BACKENDS)
def test_numpy_in_numpy_out_and_tensor_in_tensor_out(backend, rng):
    q, k, v = (rng.standard_normal((2, 4, 3)).astype(np.float32) for _ in range(3))
    out = attnlib.attention(q, k, v, backend=backend)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    if backend in ("torch", "sdpa", "triton"):
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        out_t = attnlib.attention(tq, tk, tv, backend=backend)
        assert isinstance(out_t, torch.Tensor)
        assert out_t.dtype == torch.float32 and out_t.device == tq.device
        np.testing.assert_allclose(out_t.numpy(), out, atol=1e-6)
    else:
        with pytest.raises(TypeError, match="NumPy"):
            attnlib.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), backend=backend)


def test_default_backend_follows_the_input_kind(rng):
    q, k, v = (rng.standard_normal((3, 2)) for _ in range(3))
    assert isinstance(attnlib.attention(q, k, v), np.ndarray)
    assert isinstance(attnlib.attention(*(torch.from_numpy(a) for a in (q, k, v))), torch.Tensor)


def test_backends_lists_the_core_backends():
    assert {"numpy", "loop", "torch", "sdpa"} <= set(attnlib.backends())


def test_unknown_backend_names_the_valid_ones(rng):
    q, k, v = (rng.standard_normal((3, 2)) for _ in range(3))
    with pytest.raises(ValueError, match="available here"):
        attnlib.attention(q, k, v, backend="cuda-magic")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_path_agrees_with_pytorch_fused_sdpa(causal, dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 8, dtype=dtype) for _ in range(3))
    mask = torch.rand(2, 3, 6, 6) < 0.7
    mask[..., 0] = True
    for m in (None, mask):
        expected = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=None if m is None else (m & torch.ones(6, 6, dtype=torch.bool).tril() if causal else m),
            is_causal=causal and m is None)
        got = attnlib.attention(q, k, v, mask=m, causal=causal, backend="torch")
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("backend", ["torch", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_tensors_keep_their_dtype_and_stay_close(backend, dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 16, 8, dtype=torch.float64) for _ in range(3))
    expected = reference_attention(q.numpy(), k.numpy(), v.numpy(), causal=True)
    got = attnlib.attention(q.to(dtype), k.to(dtype), v.to(dtype), causal=True, backend=backend)
    assert got.dtype == dtype
    tol = 1e-2 if dtype == torch.float16 else 4e-2
    np.testing.assert_allclose(got.double().numpy(), expected, atol=tol, rtol=tol)
