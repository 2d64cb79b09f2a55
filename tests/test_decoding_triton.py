"""Grouped-query attention, sliding windows and cached decoding on the triton backend.

Without a GPU the kernels run under Triton's CPU interpreter. tests/test_triton.py
switches it on before the backend is first imported and provides the ``interpreter``
fixture that keeps it on while a module runs (see its docstring); this module reuses
both. The shapes are small because the interpreter is slow.
"""

import numpy as np
import pytest
import torch
from test_triton import DEVICE, interpreter, triton_flash  # noqa: F401  (the fixture is autouse)

import attnlib
from attnlib.gqa import group_heads, repeat_kv
from attnlib.kv_cache import KVCache


def _tensors(*shapes, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator, dtype=torch.float32).to(DEVICE) for shape in shapes]


@pytest.mark.parametrize("heads", [(4, 2), (4, 1)], ids=["GQA", "MQA"])
@pytest.mark.parametrize("causal", [False, "top-left", "bottom-right"])
def test_gqa_on_triton_equals_repeated_heads_forward_and_backward(heads, causal):
    n_heads, n_kv_heads = heads
    q, k, v, d_out = _tensors((2, n_heads, 5, 16), (2, n_kv_heads, 20, 16), (2, n_kv_heads, 20, 16),
                              (2, n_heads, 5, 16))
    group = n_heads // n_kv_heads
    expected = attnlib.attention(q, repeat_kv(k, group), repeat_kv(v, group), causal=causal, backend="torch")
    out = attnlib.attention(q, k, v, causal=causal, enable_gqa=True, backend="triton")
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    grads = attnlib.attention_backward(q, k, v, d_out, causal=causal, enable_gqa=True, backend="triton")
    expected_grads = attnlib.attention_backward(q, k, v, d_out, causal=causal, enable_gqa=True, backend="torch")
    for grad, reference in zip(grads, expected_grads):
        torch.testing.assert_close(grad, reference, rtol=1e-4, atol=1e-4)


def test_the_triton_kernel_reads_a_shared_head_through_a_stride_0_view():
    q, k, v = _tensors((2, 8, 3, 16), (2, 2, 7, 16), (2, 2, 7, 16))
    q_g, k_g, _, _, _, _ = group_heads(q, k, v)
    batch_shape = torch.broadcast_shapes(q_g.shape[:-2], k_g.shape[:-2])  # (B, H_kv, G)
    k4 = triton_flash._as_4d(k_g, batch_shape)  # what the kernel is given: (B * H_kv, G, T, d)
    assert k4.shape == (4, 4, 7, 16) and k4.stride(1) == 0 and k4.data_ptr() == k.data_ptr()


@pytest.mark.parametrize("causal", ["top-left", "bottom-right"])
@pytest.mark.parametrize("window", [1, 4])
def test_a_window_on_triton_equals_its_mask(causal, window):
    q, k, v, d_out = _tensors((2, 9, 16), (2, 20, 16), (2, 20, 16), (2, 9, 16))
    band = torch.from_numpy(attnlib.causal_mask(9, 20, causal, window=window)).to(DEVICE)
    expected = attnlib.attention(q, k, v, mask=band, backend="torch")
    out = attnlib.attention(q, k, v, causal=causal, window=window, backend="triton")
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    grads = attnlib.attention_backward(q, k, v, d_out, causal=causal, window=window, backend="triton")
    expected_grads = attnlib.attention_backward(q, k, v, d_out, mask=band, backend="torch")
    for grad, reference in zip(grads, expected_grads):
        torch.testing.assert_close(grad, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", [None, 3])
def test_cached_decoding_on_triton_gives_the_full_causal_rows(window):
    q = _tensors((1, 4, 10, 16))[0]
    k, v = _tensors((1, 2, 10, 16), (1, 2, 10, 16), seed=1)
    full = attnlib.attention(q, k, v, causal=True, window=window, enable_gqa=True, backend="torch")
    cache, outputs = KVCache(window=window), []
    for t0, t1 in [(0, 4)] + [(t, t + 1) for t in range(4, 10)]:
        keys, values = cache.update(k[..., t0:t1, :], v[..., t0:t1, :])
        outputs.append(attnlib.attention(q[..., t0:t1, :], keys, values, causal="bottom-right", window=window,
                                         enable_gqa=True, backend="triton"))
    torch.testing.assert_close(torch.cat(outputs, dim=-2), full, rtol=1e-4, atol=1e-5)
    assert np.isclose(cache.nbytes, 2 * 2 * (window or 10) * 16 * 4)
