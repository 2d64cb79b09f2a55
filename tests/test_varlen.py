"""attnlib.varlen_attention (flash_attn_varlen_func's layout) against a loop over the sequences."""

import importlib.util
import os

import numpy as np
import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
ON_GPU = torch.cuda.is_available()
if HAS_TRITON and not ON_GPU:
    _saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    from attnlib.backends import triton_flash  # noqa: E402,F401  (kernels defined under the interpreter)

    if _saved is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _saved

import attnlib  # noqa: E402
from attnlib.errors import MaskError, ShapeError  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def interpreter():
    saved = os.environ.get("TRITON_INTERPRET")
    if HAS_TRITON and not ON_GPU:
        os.environ["TRITON_INTERPRET"] = "1"
    yield
    if saved is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = saved


LENS_Q = [5, 1, 9, 3]
LENS_K = [7, 4, 9, 3]  # query i of a sequence sees keys j <= i + L_k - L_q (bottom-right)
H, H_KV, D = 4, 2, 8


def packed(rng):
    q = rng.standard_normal((sum(LENS_Q), H, D))
    k = rng.standard_normal((sum(LENS_K), H_KV, D))
    v = rng.standard_normal((sum(LENS_K), H_KV, D))
    d_out = rng.standard_normal((sum(LENS_Q), H, D))
    cu_q = np.concatenate([[0], np.cumsum(LENS_Q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(LENS_K)]).astype(np.int64)
    return q, k, v, d_out, cu_q, cu_k


def loop_reference(q, k, v, d_out, cu_q, cu_k, causal, window=None):
    """One sequence at a time, with torch autograd in float64 (heads repeated for GQA)."""
    outs, grads = [], [np.zeros_like(x) for x in (q, k, v)]
    for s in range(len(cu_q) - 1):
        rq, rk = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        xs = [torch.from_numpy(x[r]).transpose(0, 1).requires_grad_() for x, r in ((q, rq), (k, rk), (v, rk))]
        kk, vv = (x.repeat_interleave(H // H_KV, dim=0) for x in xs[1:])
        keep = torch.from_numpy(attnlib.causal_mask(rq.stop - rq.start, rk.stop - rk.start, "bottom-right", window)) \
            if causal else None
        out = torch.nn.functional.scaled_dot_product_attention(xs[0], kk, vv, attn_mask=keep)
        g = torch.autograd.grad(out, xs, torch.from_numpy(d_out[rq]).transpose(0, 1))
        outs.append(out.detach().transpose(0, 1).numpy())
        for acc, gi, r in zip(grads, g, (rq, rk, rk)):
            acc[r] = gi.transpose(0, 1).numpy()
    return np.concatenate(outs), grads


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, 3)])
def test_varlen_matches_a_loop_over_sequences(causal, window):
    rng = np.random.default_rng(4)
    q, k, v, d_out, cu_q, cu_k = packed(rng)
    expected, expected_grads = loop_reference(q, k, v, d_out, cu_q, cu_k, causal, window)
    for backend in [b for b in attnlib.backends() if b != "triton-simple"]:
        numpy_side = backend in ("numpy", "loop", "tiled")
        args = (q, k, v, d_out) if numpy_side else tuple(torch.from_numpy(x) for x in (q, k, v, d_out))
        cu = (cu_q, cu_k) if numpy_side else (torch.from_numpy(cu_q), torch.from_numpy(cu_k))
        out = attnlib.varlen_attention(*args[:3], *cu, causal=causal, window=window, backend=backend, block_size=4)
        np.testing.assert_allclose(np.asarray(out), expected, atol=1e-12, rtol=0, err_msg=backend)
        if backend in attnlib.backward_backends():
            grads = attnlib.varlen_attention_backward(*args, *cu, causal=causal, window=window, backend=backend,
                                                      block_size=4)
            for g, e in zip(grads, expected_grads):
                np.testing.assert_allclose(np.asarray(g), e, atol=1e-12, rtol=0, err_msg=backend)
        if not numpy_side:  # autograd through the packed call
            xs = [x.clone().requires_grad_() for x in args[:3]]
            attnlib.varlen_attention(*xs, *cu, causal=causal, window=window, backend=backend).backward(args[3])
            for x, e in zip(xs, expected_grads):
                np.testing.assert_allclose(x.grad.numpy(), e, atol=1e-12, rtol=0, err_msg=backend)


def test_tiled_skips_tiles_outside_the_sequences():
    from attnlib.varlen import varlen_mask_mod

    cu = np.array([0, 64, 128, 192, 256])
    bm = attnlib.block_mask(varlen_mask_mod(cu, cu, causal=True), None, None, 256, 256, block_size=32)
    assert bm.sparsity() == pytest.approx(100 * (1 - 12 / 64))  # 4 sequences x 3 tiles of the 64 computed


def test_varlen_errors():
    rng = np.random.default_rng(0)
    q, k, v, _, cu_q, cu_k = packed(rng)
    with pytest.raises(ShapeError, match="ends at"):
        attnlib.varlen_attention(q[:-1], k, v, cu_q, cu_k)
    with pytest.raises(TypeError, match="int32 or int64"):
        attnlib.varlen_attention(q, k, v, cu_q.astype(float), cu_k)
    with pytest.raises(ValueError, match="start at 0 and never decrease"):
        attnlib.varlen_attention(q, k, v, cu_q[::-1].copy(), cu_k)
    with pytest.raises(ShapeError, match="same sequences"):
        attnlib.varlen_attention(q, k, v, cu_q[:-1], cu_k)
    with pytest.raises(ShapeError, match=r"\(total, heads, d\)"):
        attnlib.varlen_attention(q[None], k, v, cu_q, cu_k)
    short_k = np.array([0, 2, 6, 15, 18])  # sequence 0 has 5 queries and 2 keys: bottom-right leaves 3 rows
    with pytest.raises(MaskError, match="no key"):
        attnlib.varlen_attention(q, k[:18], v[:18], cu_q, short_k, causal=True)
    out = attnlib.varlen_attention(q, k[:18], v[:18], cu_q, short_k, causal=True, empty_rows="zero")
    assert (out[:3] == 0).all() and np.isfinite(out).all()
