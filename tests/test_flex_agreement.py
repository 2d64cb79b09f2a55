"""attnlib's mods against PyTorch's FlexAttention, eagerly on a CPU in float64.

Forward: ``torch.nn.attention.flex_attention`` itself. Backward: FlexAttention
refuses ``requires_grad`` on a CPU, so the gradients come from torch.autograd
through its reference implementation, ``math_attention`` (the eager math that
``flex_attention`` runs on a CPU: the same scores, mods and safe softmax).
Every gallery mod, every attnlib backend that takes it.
"""

import importlib

import numpy as np
import pytest
import torch

import attnlib
from attnlib import mods

flex = pytest.importorskip("torch.nn.attention.flex_attention")
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

B, H, T, D = 2, 4, 80, 8
BLOCK = 16
DOC = torch.from_numpy(np.repeat([0, 1, 2, 3], [17, 30, 9, 24]))
GALLERY = {
    "causal": dict(mask_mod=mods.causal()),
    "sliding_window": dict(mask_mod=mods.sliding_window(12)),
    "document": dict(mask_mod=mods.and_masks(mods.causal(), mods.document(DOC))),
    "prefix_lm": dict(mask_mod=mods.prefix_lm(20)),
    "attention_sinks": dict(mask_mod=mods.attention_sinks(3, 10)),
    "alibi": dict(score_mod=mods.alibi(H)),
    "soft_cap": dict(score_mod=mods.soft_cap(0.6)),
    "alibi_in_a_window": dict(score_mod=mods.alibi(H), mask_mod=mods.sliding_window(12)),
}


def flex_reference(q, k, v, d_out, score_mod=None, mask_mod=None):
    """(out, (dq, dk, dv)) from FlexAttention: forward by flex_attention, backward by autograd through
    torch's math_attention."""
    block_mask = None if mask_mod is None else flex.create_block_mask(mask_mod, None, None, T, T, device="cpu",
                                                                      BLOCK_SIZE=BLOCK)
    out = flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
    math = importlib.import_module("torch._higher_order_ops.flex_attention").math_attention
    if block_mask is None:
        block_mask = flex.create_block_mask(lambda b, h, i, j: i >= 0, None, None, T, T, device="cpu",
                                            BLOCK_SIZE=BLOCK)
    with torch.enable_grad():
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        identity = score_mod or (lambda score, b, h, i, j: score)
        again, _, _ = math(*xs, identity, block_mask.as_tuple(), D ** -0.5, {}, (), ())
        grads = torch.autograd.grad(again, xs, d_out)
    torch.testing.assert_close(again.detach(), out, atol=1e-14, rtol=0)  # the two references agree
    return out, grads


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(2026)
    return tuple(torch.from_numpy(rng.standard_normal((B, H, T, D))) for _ in range(4))


def _runs_on(backend, kw):
    score_mod = kw.get("score_mod")
    return not (backend in ("sdpa", "triton") and score_mod is not None and score_mod.bias is None)


@pytest.mark.parametrize("name", list(GALLERY))
def test_forward_and_backward_agree_with_flex_attention(name, inputs):
    kw = GALLERY[name]
    q, k, v, d_out = inputs
    expected, expected_grads = flex_reference(q, k, v, d_out, **kw)
    numpy_inputs = [x.numpy() for x in inputs]
    for backend in [b for b in attnlib.backends() if b not in ("triton", "triton-simple")]:
        if not _runs_on(backend, kw):
            continue
        args = numpy_inputs if backend in ("numpy", "loop", "tiled") else inputs
        out = attnlib.attention(*args[:3], backend=backend, **kw)
        np.testing.assert_allclose(np.asarray(out), expected.numpy(), atol=1e-13, rtol=0,
                                   err_msg=f"{name} on {backend}")
        if backend in attnlib.backward_backends():
            grads = attnlib.attention_backward(*args, backend=backend, **kw)
            for g, e, what in zip(grads, expected_grads, "qkv"):
                np.testing.assert_allclose(np.asarray(g), e.numpy(), atol=1e-12, rtol=0,
                                           err_msg=f"d{what}, {name} on {backend}")


@pytest.mark.parametrize("name", ["document", "sliding_window", "prefix_lm"])
def test_tiled_with_block_mask_agrees_with_flex_attention(name, inputs):
    kw = GALLERY[name]
    q, k, v, d_out = inputs
    expected, expected_grads = flex_reference(q, k, v, d_out, **kw)
    bm = attnlib.block_mask(kw["mask_mod"], None, None, T, T, block_size=BLOCK)
    numpy_inputs = [x.numpy() for x in inputs]
    out = attnlib.attention(*numpy_inputs[:3], block_mask=bm, backend="tiled")
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-13, rtol=0)
    grads = attnlib.attention_backward(*numpy_inputs, block_mask=bm, backend="tiled")
    for g, e in zip(grads, expected_grads):
        np.testing.assert_allclose(g, e.numpy(), atol=1e-12, rtol=0)


def test_rows_with_no_key_are_zero_in_both(inputs):
    """FlexAttention answers a query with no key by 0; so does attnlib under empty_rows='zero'."""
    def late(b, h, q_idx, kv_idx):  # the first 8 queries see nothing
        return (q_idx >= 8) & (kv_idx <= q_idx)

    q, k, v, d_out = inputs
    expected, expected_grads = flex_reference(q, k, v, d_out, mask_mod=late)
    assert (expected[:, :, :8] == 0).all()
    for backend in ("numpy", "tiled", "torch", "sdpa"):
        args = [x.numpy() for x in inputs] if backend in ("numpy", "tiled") else inputs
        out = attnlib.attention(*args[:3], mask_mod=late, backend=backend, empty_rows="zero")
        np.testing.assert_allclose(np.asarray(out), expected.numpy(), atol=1e-13, rtol=0, err_msg=backend)
        grads = attnlib.attention_backward(*args, mask_mod=late, backend=backend, empty_rows="zero")
        for g, e in zip(grads, expected_grads):
            np.testing.assert_allclose(np.asarray(g), e.numpy(), atol=1e-12, rtol=0, err_msg=backend)
