"""Sliding windows (``window=W``): each query sees at most the W most recent keys its causal
alignment allows.

Checked on every backend against an explicit mask built here with plain loops,
in both alignments and with T_q != T_k, with and without a user's mask, through
the backward pass; the tiled backend's block skipping is counted (never timed);
bad input gets a clear error.
"""

import numpy as np
import pytest
import torch

import attnlib
from backend_inputs import as_numpy, for_backend
from attnlib import errors
from attnlib.backends import tiled
from conftest import reference_attention

BACKENDS = [name for name in attnlib.backends() if not name.startswith("triton")]
BACKWARD_BACKENDS = [name for name in attnlib.backward_backends() if not name.startswith("triton")]
SHAPES = [(6, 6), (3, 10), (10, 10), (1, 12)]  # (T_q, T_k)


def window_band(t_q, t_k, causal, window):
    """Written without attnlib: query i may see key j iff i + offset - window < j <= i + offset."""
    offset = t_k - t_q if causal == "bottom-right" else 0
    return np.array([[i + offset - window < j <= i + offset for j in range(t_k)] for i in range(t_q)])




def test_causal_mask_with_a_window_is_a_band():
    np.testing.assert_array_equal(attnlib.causal_mask(5, window=2), window_band(5, 5, "top-left", 2))
    np.testing.assert_array_equal(attnlib.causal_mask(3, 7, "bottom-right", window=3),
                                  window_band(3, 7, "bottom-right", 3))
    assert attnlib.causal_mask(6, window=2).sum(axis=1).tolist() == [1, 2, 2, 2, 2, 2]
    np.testing.assert_array_equal(attnlib.causal_mask(4, window=4), attnlib.causal_mask(4))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", ["top-left", "bottom-right"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"Tq{s[0]}-Tk{s[1]}")
@pytest.mark.parametrize("window", [1, 3, 64])
def test_a_window_equals_its_explicit_mask(backend, causal, shape, window, rng):
    t_q, t_k = shape
    q = rng.standard_normal((2, t_q, 4))
    k = rng.standard_normal((2, t_k, 4))
    v = rng.standard_normal((2, t_k, 3))
    expected = reference_attention(q, k, v, mask=window_band(t_q, t_k, causal, window))
    out = attnlib.attention(*for_backend(backend, q, k, v), causal=causal, window=window, backend=backend)
    np.testing.assert_allclose(as_numpy(out), expected, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("float_mask", [False, True])
def test_a_window_combines_with_a_users_mask(backend, float_mask, rng):
    t_q, t_k, window = 4, 9, 4
    q, k, v = rng.standard_normal((t_q, 5)), rng.standard_normal((t_k, 5)), rng.standard_normal((t_k, 2))
    mask = rng.random((t_q, t_k)) < 0.7
    mask[:, -1] = True  # the last key is inside every bottom-right window
    if float_mask:
        mask = np.where(mask, rng.standard_normal((t_q, t_k)), -np.inf)
    band = window_band(t_q, t_k, "bottom-right", window)
    combined = (mask & band) if not float_mask else np.where(band, mask, -np.inf)
    expected = reference_attention(q, k, v, mask=combined)
    q_b, k_b, v_b, mask_b = for_backend(backend, q, k, v, mask)
    out = attnlib.attention(q_b, k_b, v_b, mask=mask_b, causal="bottom-right", window=window, backend=backend)
    np.testing.assert_allclose(as_numpy(out), expected, atol=1e-12)


@pytest.mark.parametrize("causal", ["top-left", "bottom-right"])
@pytest.mark.parametrize("window", [1, 5, 40])
def test_attention_weights_vanish_outside_the_window(causal, window, rng):
    q, k = rng.standard_normal((7, 3)), rng.standard_normal((20, 3))
    weights = attnlib.attention_weights(q, k, causal=causal, window=window)
    band = window_band(7, 20, causal, window)
    assert np.all(weights[~band] == 0)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0)


@pytest.mark.parametrize("backend", BACKWARD_BACKENDS)
@pytest.mark.parametrize("causal", ["top-left", "bottom-right"])
@pytest.mark.parametrize("window", [1, 3])
def test_window_gradients_match_autograd_with_the_explicit_mask(backend, causal, window, rng):
    t_q, t_k = 5, 8
    q, k, v = rng.standard_normal((2, t_q, 4)), rng.standard_normal((2, t_k, 4)), rng.standard_normal((2, t_k, 3))
    d_out = rng.standard_normal((2, t_q, 3))
    leaves = [torch.from_numpy(a).requires_grad_() for a in (q, k, v)]
    band = torch.from_numpy(window_band(t_q, t_k, causal, window))
    out = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=band)
    expected = torch.autograd.grad(out, leaves, torch.from_numpy(d_out))
    grads = attnlib.attention_backward(*for_backend(backend, q, k, v, d_out), causal=causal, window=window,
                                       backend=backend)
    for name, grad, reference in zip("qkv", grads, expected):
        np.testing.assert_allclose(as_numpy(grad), reference.numpy(), atol=1e-12, err_msg=name)


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
@pytest.mark.parametrize("causal", ["top-left", "bottom-right"])
def test_the_tiled_kernel_matches_the_mask_at_every_block_size(block_size, causal, rng):
    q, k, v = rng.standard_normal((3, 13, 4)), rng.standard_normal((3, 21, 4)), rng.standard_normal((3, 21, 2))
    for window in (1, 4, 7, 30):
        expected = reference_attention(q, k, v, mask=window_band(13, 21, causal, window))
        out = tiled.tiled_attention(q, k, v, causal=causal, window=window, block_size=block_size)
        np.testing.assert_allclose(out, expected, atol=1e-12)


def _visited_blocks(t, window, block_size):
    """Key blocks the tiled forward visits over all query blocks, and the scores it computes."""
    blocks = scores = 0
    for i0 in range(0, t, block_size):
        n_q = min(block_size, t - i0)
        for j0, j1, _ in tiled.key_blocks(i0, n_q, t, block_size, "top-left", t, window):
            blocks += 1
            scores += n_q * (j1 - j0)
    return blocks, scores


def test_the_tiled_kernel_skips_whole_blocks_outside_the_window():
    """The work is counted, not timed: with a window each query block visits at most
    (W + block) / block + 1 key blocks, so the scores computed grow as T * W, not T^2."""
    block, window = 256, 512
    per_query_block = (window + block) // block + 1
    for t in (1024, 2048, 4096, 8192):
        blocks, scores = _visited_blocks(t, window, block)
        assert blocks <= (t // block) * per_query_block
        assert scores <= t * (window + 2 * block)
    _, scores_4k = _visited_blocks(4096, window, block)
    _, scores_8k = _visited_blocks(8192, window, block)
    _, causal_4k = _visited_blocks(4096, None, block)
    _, causal_8k = _visited_blocks(8192, None, block)
    assert scores_8k / scores_4k < 2.1  # linear in T
    assert causal_8k / causal_4k > 3.8  # quadratic without a window
    # every visited block holds at least one key some row of its query block may see
    for i0 in range(0, 4096, block):
        for j0, j1, _ in tiled.key_blocks(i0, block, 4096, block, "top-left", 4096, window):
            assert j1 - 1 > i0 - window and j0 <= i0 + block - 1


BAD_WINDOWS = {
    # name: (kwargs, error, fragments of the message)
    "a window of 0": ({"window": 0, "causal": True}, ValueError, ["window must be at least 1", "window=0"]),
    "a negative window": ({"window": -3, "causal": True}, ValueError, ["window must be at least 1"]),
    "a float window": ({"window": 2.5, "causal": True}, TypeError, ["window must be a positive int", "2.5"]),
    "a bool window": ({"window": True, "causal": True}, TypeError, ["window must be a positive int"]),
    "a window without causal": ({"window": 2}, ValueError, ["window=2 needs causal", "causal is off"]),
    "a window and a mask that leave a row empty": (
        {"window": 2, "causal": True, "mask": np.array([[True] + [False] * 5] * 6)}, errors.MaskError,
        ["query row 2", "with window=2"]),
}


@pytest.mark.parametrize("case", BAD_WINDOWS, ids=list(BAD_WINDOWS))
@pytest.mark.parametrize("backend", ["numpy", "tiled", "torch"])
def test_bad_windows_get_a_clear_error(case, backend):
    kwargs, error, fragments = BAD_WINDOWS[case]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((6, 3)) for _ in range(3))
    kwargs = dict(kwargs)
    if backend == "torch":
        q, k, v = (torch.from_numpy(a) for a in (q, k, v))
        if "mask" in kwargs:
            kwargs["mask"] = torch.from_numpy(kwargs["mask"])
    with pytest.raises(error) as caught:
        attnlib.attention(q, k, v, backend=backend, **kwargs)
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))
    with pytest.raises(error):
        attnlib.attention_backward(q, k, v, q, **kwargs)
    with pytest.raises(error):
        attnlib.attention_weights(q, k, **kwargs)
