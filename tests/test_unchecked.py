"""attnlib.unchecked(): the checks that read values are skipped, the others kept, in one thread only."""

import threading

import numpy as np
import pytest
import torch

import attnlib
from attnlib.errors import DTypeError, MaskError, NonFiniteError, ShapeError
from attnlib.validation import checking_values


def _qkv(kind="torch", t=6, d=4):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((2, t, d)) for _ in range(3)]
    return [torch.from_numpy(a) for a in arrays] if kind == "torch" else arrays


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_nan_input_raises_checked_and_propagates_unchecked(kind):
    q, k, v = _qkv(kind)
    q[0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="q"):
        attnlib.attention(q, k, v)
    with attnlib.unchecked():
        out = attnlib.attention(q, k, v)
    out = np.asarray(out)
    assert np.isnan(out[0, 0]).all()  # the backend's own answer: NaN in the row that saw it
    assert np.isfinite(out[1]).all()


@pytest.mark.parametrize("backend", ["numpy", "torch", "sdpa"])
def test_empty_row_mask_is_not_read_unchecked(backend):
    kind = "numpy" if backend == "numpy" else "torch"
    q, k, v = _qkv(kind)
    mask = np.ones((6, 6), dtype=bool)
    mask[2] = False
    if kind == "torch":
        mask = torch.from_numpy(mask)
    with pytest.raises(MaskError, match="query row 2"):
        attnlib.attention(q, k, v, mask=mask, backend=backend)
    with attnlib.unchecked():
        out = np.asarray(attnlib.attention(q, k, v, mask=mask, backend=backend))
    assert out.shape == (2, 6, 4)
    assert np.isfinite(np.delete(out, 2, axis=1)).all()  # other rows are computed as usual


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_metadata_checks_still_run(kind):
    q, k, v = _qkv(kind)
    with attnlib.unchecked():
        with pytest.raises(ShapeError, match="d_k"):
            attnlib.attention(q, k[..., :3], v)
        with pytest.raises(DTypeError):
            attnlib.attention(q, k, v[..., :2].astype(np.float32) if kind == "numpy" else v.float())
        with pytest.raises(MaskError, match="broadcast"):
            attnlib.attention(
                q,
                k,
                v,
                mask=(np.ones((5, 6), bool) if kind == "numpy" else torch.ones(5, 6, dtype=torch.bool)),
            )
        with pytest.raises(ValueError, match="backend"):
            attnlib.attention(q, k, v, backend="nope")


def test_same_answer_checked_and_unchecked():
    q, k, v = _qkv("torch")
    d_out = torch.ones_like(q)
    checked = attnlib.attention(q, k, v, causal=True), attnlib.attention_backward(q, k, v, d_out, causal=True)
    with attnlib.unchecked():
        loose = attnlib.attention(q, k, v, causal=True), attnlib.attention_backward(
            q, k, v, d_out, causal=True
        )
    assert torch.equal(checked[0], loose[0])
    for a, b in zip(checked[1], loose[1]):
        assert torch.equal(a, b)


def test_overflow_check_skipped_unchecked():
    q = torch.full((1, 2, 2), 300.0, dtype=torch.float16)
    with pytest.raises(NonFiniteError, match="overflow"):
        attnlib.attention(q, q, q)
    with attnlib.unchecked():
        attnlib.attention(q, q, q)  # no error: what the kernel computed


def test_nesting_exceptions_and_threads():
    assert checking_values()
    with attnlib.unchecked():
        with attnlib.unchecked():
            assert not checking_values()
        assert not checking_values()
        seen = []
        thread = threading.Thread(target=lambda: seen.append(checking_values()))
        thread.start()
        thread.join()
        assert seen == [True]  # thread-local: another thread still checks
    assert checking_values()
    with pytest.raises(RuntimeError):
        with attnlib.unchecked():
            raise RuntimeError("inside")
    assert checking_values()


@pytest.mark.parametrize("backend", ["torch", "sdpa"])
def test_no_graph_breaks_under_torch_compile(backend):
    torch._dynamo.reset()
    q, k, v = (x.float() for x in _qkv("torch", t=16, d=8))

    def step(q, k, v):
        with attnlib.unchecked():
            return attnlib.attention(q, k, v, causal=True, backend=backend)

    explained = torch._dynamo.explain(step)(q, k, v)
    assert explained.graph_break_count == 0, [str(r.reason)[:300] for r in explained.break_reasons]
    assert explained.graph_count == 1
    torch._dynamo.reset()

    def checked(q, k, v):
        return attnlib.attention(q, k, v, causal=True, backend=backend)

    assert (
        torch._dynamo.explain(checked)(q, k, v).graph_break_count >= 1
    )  # the checks sync: the test can fail
    torch._dynamo.reset()
