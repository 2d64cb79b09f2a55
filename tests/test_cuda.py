"""The CUDA path: the same checks on a GPU. Skipped where PyTorch sees no GPU."""

import numpy as np
import pytest
import torch

import attnlib
from conftest import reference_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GPU_BACKENDS = [name for name in ("torch", "sdpa", "triton", "triton-simple") if name in attnlib.backends()]


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-3), (torch.float16, 1e-2), (torch.bfloat16, 4e-2)])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_backends_match_the_float64_reference(backend, dtype, tol, causal):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 70, 64, dtype=torch.float64, generator=gen) for _ in range(3))
    expected = reference_attention(q.numpy(), k.numpy(), v.numpy(), causal=causal)
    got = attnlib.attention(*(t.to("cuda", dtype) for t in (q, k, v)), causal=causal, backend=backend)
    assert got.device.type == "cuda" and got.dtype == dtype
    np.testing.assert_allclose(got.double().cpu().numpy(), expected, atol=tol, rtol=tol)


def test_cuda_output_stays_on_the_device_with_its_dtype():
    q = torch.randn(1, 8, 16, device="cuda", dtype=torch.float16)
    out = attnlib.attention(q, q, q)
    assert out.device == q.device and out.dtype == torch.float16
    assert attnlib.device() == "cuda"
