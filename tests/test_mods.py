"""score_mod / mask_mod (FlexAttention's signatures) on every backend, the gallery, and empty_rows.

The reference here is independent of attnlib.mods and attnlib.backends.flex: it
evaluates each gallery rule with Python ints, one (b, h, i, j) at a time, and
computes softmax(scores) V in float64 with explicit loops over rows.
"""

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
    from attnlib.backends import triton_flash  # noqa: E402  (kernels defined under the interpreter)

    if _saved is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _saved
    TRITON_OK = triton_flash.RUNS_ON_CPU
else:
    TRITON_OK = HAS_TRITON and ON_GPU

import attnlib  # noqa: E402
from attnlib import mods  # noqa: E402
from attnlib.errors import DTypeError, MaskError, ShapeError  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def interpreter():
    """TRITON_INTERPRET=1 while this module runs on a CPU (attnlib.backends() then lists triton)."""
    saved = os.environ.get("TRITON_INTERPRET")
    if HAS_TRITON and not ON_GPU:
        os.environ["TRITON_INTERPRET"] = "1"
    yield
    if saved is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = saved


B, H, T, D = 2, 3, 21, 4
DOC = np.repeat([0, 1, 2], [6, 10, 5])  # three packed documents
DOC_B = np.stack([DOC, np.repeat([0, 1], [15, 6])])  # one packing per batch entry
SLOPES = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)

# name -> (attnlib mod, keyword, independent rule): mask rules (b, h, i, j) -> bool, score rules
# (s, b, h, i, j) -> float, all on Python numbers
GALLERY = {
    "causal": (mods.causal(), "mask_mod", lambda b, h, i, j: i >= j),
    "sliding_window": (mods.sliding_window(5), "mask_mod", lambda b, h, i, j: i - 5 < j <= i),
    "document": (mods.document(DOC), "mask_mod", lambda b, h, i, j: DOC[i] == DOC[j]),
    "document_per_batch": (mods.document(DOC_B), "mask_mod", lambda b, h, i, j: DOC_B[b, i] == DOC_B[b, j]),
    "packed_causal": (mods.and_masks(mods.causal(), mods.document(DOC)), "mask_mod",
                      lambda b, h, i, j: DOC[i] == DOC[j] and j <= i),
    "prefix_lm": (mods.prefix_lm(4), "mask_mod", lambda b, h, i, j: j < 4 or j <= i),
    "prefix_lm_per_batch": (mods.prefix_lm(np.array([3, 8])), "mask_mod",
                            lambda b, h, i, j: j < (3, 8)[b] or j <= i),
    "attention_sinks": (mods.attention_sinks(2, 4), "mask_mod", lambda b, h, i, j: j <= i and (j < 2 or i - j < 4)),
    "alibi": (mods.alibi(H), "score_mod", lambda s, b, h, i, j: s + SLOPES[h] * (j - i)),
    "soft_cap": (mods.soft_cap(0.8), "score_mod", lambda s, b, h, i, j: 0.8 * np.tanh(s / 0.8)),
}
SCORE_MODS_RUN_BY_MASK = ("alibi",)  # additive: sdpa takes them as a mask


def reference(q, k, v, rule=None, kind="mask_mod", mask=None, causal=False, window=None):
    """float64, one (b, h, i) row at a time; rows with no key give 0 (the empty_rows='zero' answer)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    scale = 1 / np.sqrt(q.shape[-1])
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                scores = []
                for j in range(k.shape[2]):
                    s = float(q[b, h, i] @ k[b, h, j]) * scale
                    keep = True
                    if rule is not None and kind == "mask_mod":
                        keep = bool(rule(b, h, i, j))
                    if rule is not None and kind == "score_mod":
                        s = float(rule(s, b, h, i, j))
                    if causal:
                        keep = keep and j <= i and (window is None or j > i - window)
                    if mask is not None:
                        keep = keep and bool(mask[i, j])
                    scores.append(s if keep else -np.inf)
                scores = np.array(scores)
                if np.isneginf(scores).all():
                    continue
                w = np.exp(scores - scores.max())
                out[b, h, i] = (w / w.sum()) @ v[b, h]
    return out


def backends_here():
    names = [b for b in attnlib.backends() if b != "triton-simple"]
    return names


def as_kind(backend, *arrays):
    if backend in ("numpy", "loop", "tiled"):
        return arrays
    dev = "cuda" if ON_GPU and backend == "triton" else "cpu"
    return tuple(None if a is None else torch.from_numpy(np.ascontiguousarray(a)).to(dev) for a in arrays)


def as_np(x):
    return x if isinstance(x, np.ndarray) else x.detach().cpu().numpy()


@pytest.fixture(scope="module")
def qkv():
    rng = np.random.default_rng(7)
    return tuple(rng.standard_normal((B, H, T, D)) for _ in range(4))


@pytest.mark.parametrize("name", list(GALLERY))
def test_gallery_forward_every_backend_matches_reference(name, qkv):
    mod, kind, rule = GALLERY[name]
    expected = reference(*qkv[:3], rule, kind)
    for backend in backends_here():
        if kind == "score_mod" and backend == "sdpa" and name not in SCORE_MODS_RUN_BY_MASK:
            with pytest.raises(ValueError, match="numpy, loop, torch, tiled"):
                attnlib.attention(*as_kind(backend, *qkv[:3]), backend=backend, **{kind: mod})
            continue
        out = attnlib.attention(*as_kind(backend, *qkv[:3]), backend=backend, **{kind: mod})
        np.testing.assert_allclose(as_np(out), expected, atol=1e-12, rtol=0, err_msg=f"{name} on {backend}")


def reference_grads(q, k, v, d_out, name):
    """torch.autograd through a float64 torch reference written from the rule's formula."""
    mod, kind, rule = GALLERY[name]
    qt, kt, vt = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    s = qt @ kt.transpose(-2, -1) / np.sqrt(q.shape[-1])
    i = torch.arange(T).view(-1, 1)
    j = torch.arange(T).view(1, -1)
    if name == "alibi":
        s = s + torch.from_numpy(SLOPES).view(1, H, 1, 1) * (j - i)
    elif name == "soft_cap":
        s = 0.8 * torch.tanh(s / 0.8)
    else:
        keep = torch.tensor([[[[rule(b, h, a, c) for c in range(T)] for a in range(T)] for h in range(H)]
                             for b in range(B)])
        s = s.masked_fill(~keep, float("-inf"))
    out = torch.softmax(s, dim=-1) @ vt
    return [g.numpy() for g in torch.autograd.grad(out, (qt, kt, vt), torch.from_numpy(d_out))]


@pytest.mark.parametrize("name", list(GALLERY))
def test_gallery_backward_every_backend_matches_autograd(name, qkv):
    mod, kind, _ = GALLERY[name]
    expected = reference_grads(*qkv, name)
    for backend in attnlib.backward_backends():
        if kind == "score_mod" and backend == "sdpa" and name not in SCORE_MODS_RUN_BY_MASK:
            continue
        grads = attnlib.attention_backward(*as_kind(backend, *qkv), backend=backend, **{kind: mod})
        for g, e, what in zip(grads, expected, "qkv"):
            np.testing.assert_allclose(as_np(g), e, atol=1e-11, rtol=0, err_msg=f"d{what}, {name} on {backend}")


@pytest.mark.parametrize("backend", ["torch", "sdpa", "triton"])
def test_autograd_through_mods_equals_attention_backward(backend, qkv):
    if backend not in attnlib.backends():
        pytest.skip(f"{backend} not available")
    score_mod = mods.soft_cap(0.8) if backend == "torch" else mods.alibi(H)
    kw = dict(score_mod=score_mod, mask_mod=mods.sliding_window(6))
    q, k, v, d_out = as_kind(backend, *qkv)
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    attnlib.attention(q, k, v, backend=backend, **kw).backward(d_out)
    expected = attnlib.attention_backward(*qkv, **kw)
    for x, e in zip((q, k, v), expected):
        np.testing.assert_allclose(as_np(x.grad), e, atol=1e-11, rtol=0)


def test_user_callables_with_plain_operations(qkv):
    """A user's own lambdas (no attnlib.mods), including a score_mod with no derivative attribute."""
    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx) % 3 != 1

    def score_mod(score, b, h, q_idx, kv_idx):
        # torch makes (integer tensor) * 0.1 a float32 tensor: bring the score in before the float
        return score + 0.1 * (h * score) - 0.05 * (score * 0 + (q_idx - kv_idx) ** 2)

    rule_m = lambda b, h, i, j: (i - j) % 3 != 1  # noqa: E731
    q, k, v, d_out = qkv
    expected = reference(q, k, v, rule_m)
    for backend in backends_here():
        if backend == "triton":  # runs the gallery's mods in its kernel, and refuses one's own by name
            with pytest.raises(ValueError, match="backends that take it"):
                attnlib.attention(*as_kind(backend, q, k, v), backend=backend, mask_mod=mask_mod)
            continue
        out = attnlib.attention(*as_kind(backend, q, k, v), backend=backend, mask_mod=mask_mod)
        np.testing.assert_allclose(as_np(out), expected, atol=1e-12, rtol=0)
    both = reference(q, k, v, lambda s, b, h, i, j: s * (1 + 0.1 * h) - 0.05 * (i - j) ** 2 if rule_m(b, h, i, j)
                     else -np.inf, "score_mod")
    torch_grads = attnlib.attention_backward(*as_kind("torch", *qkv), score_mod=score_mod, mask_mod=mask_mod)
    for backend in ("numpy", "loop", "tiled", "torch"):
        out = attnlib.attention(*as_kind(backend, q, k, v), backend=backend, score_mod=score_mod, mask_mod=mask_mod)
        np.testing.assert_allclose(as_np(out), both, atol=1e-12, rtol=0)
        if backend != "loop":  # the NumPy backward takes this score_mod's derivative from torch.autograd
            grads = attnlib.attention_backward(*as_kind(backend, *qkv), backend=backend, score_mod=score_mod,
                                               mask_mod=mask_mod)
            for g, e in zip(grads, torch_grads):
                np.testing.assert_allclose(as_np(g), as_np(e), atol=1e-11, rtol=0)


def test_mods_combine_with_mask_causal_and_window(qkv):
    """A key must be allowed by mask, causal, window and mask_mod all at once."""
    rng = np.random.default_rng(3)
    user = rng.random((T, T)) < 0.8
    np.fill_diagonal(user, True)
    rule = GALLERY["prefix_lm"][2]
    expected = reference(*qkv[:3], rule, mask=user, causal=True, window=7)
    for backend in backends_here():
        q, k, v, m = as_kind(backend, *qkv[:3], user)
        out = attnlib.attention(q, k, v, mask=m, causal=True, window=7, mask_mod=mods.prefix_lm(4), backend=backend)
        np.testing.assert_allclose(as_np(out), expected, atol=1e-12, rtol=0, err_msg=backend)


def test_gqa_passes_the_query_head(qkv):
    """Under enable_gqa, h is the query head: ALiBi's slope per query head, not per key/value head."""
    q = qkv[0]
    k, v = qkv[1][:, :1], qkv[2][:, :1]  # one key/value head shared by the three query heads
    expected = attnlib.attention(q, np.repeat(k, H, axis=1), np.repeat(v, H, axis=1), score_mod=mods.alibi(H))
    for backend in backends_here():
        out = attnlib.attention(*as_kind(backend, q, k, v), backend=backend, score_mod=mods.alibi(H),
                                enable_gqa=True)
        np.testing.assert_allclose(as_np(out), expected, atol=1e-12, rtol=0, err_msg=backend)


# ---------------------------------------------------------------- validation

def test_bad_mods_get_clear_errors(qkv):
    q, k, v, _ = qkv
    with pytest.raises(TypeError, match="mask_mod must be a function"):
        attnlib.attention(q, k, v, mask_mod="causal")
    with pytest.raises(TypeError, match="score_mod must be a function"):
        attnlib.attention(q, k, v, score_mod=3)
    with pytest.raises(TypeError, match="pass it as mask_mod="):
        attnlib.attention(q, k, v, score_mod=mods.causal())
    with pytest.raises(TypeError, match="pass it as score_mod="):
        attnlib.attention(q, k, v, mask_mod=mods.soft_cap(2))
    with pytest.raises(DTypeError, match="mask_mod returned dtype int64"):
        attnlib.attention(q, k, v, mask_mod=lambda b, h, i, j: i - j)
    with pytest.raises(ShapeError, match=r"mask_mod returned shape \(5,\)"):
        attnlib.attention(q, k, v, mask_mod=lambda b, h, i, j: np.ones(5, dtype=bool))
    with pytest.raises(DTypeError, match="score_mod returned dtype bool"):
        attnlib.attention(q, k, v, score_mod=lambda s, b, h, i, j: s > 0)
    with pytest.raises(ShapeError, match="score_mod returned shape"):
        attnlib.attention(q, k, v, score_mod=lambda s, b, h, i, j: s[..., :3])
    with pytest.raises(TypeError, match="score_mod returned ndarray for a score of kind torch"):
        attnlib.attention(*as_kind("torch", q, k, v), score_mod=lambda s, b, h, i, j: np.zeros(3))
    with pytest.raises(TypeError, match="mask_mod raised"):
        attnlib.attention(q, k, v, mask_mod=lambda b, h, i, j: torch.tril(i))
    with pytest.raises(ValueError, match="empty_rows must be 'raise'"):
        attnlib.attention(q, k, v, empty_rows="zeros")


def test_triton_simple_refuses_mods_naming_the_backends(qkv):
    if "triton-simple" not in attnlib.backends():
        pytest.skip("triton not available")
    q, k, v = as_kind("sdpa", *(x.astype(np.float32) for x in qkv[:3]))
    q, k, v = (torch.nn.functional.pad(x, (0, 12)) for x in (q, k, v))  # d = 16
    with pytest.raises(ValueError, match="takes no mask, mask_mod.*numpy, loop, torch, tiled, sdpa, triton"):
        attnlib.attention(q, k, v, mask_mod=mods.causal(), backend="triton-simple")


def test_gallery_arguments_are_checked():
    with pytest.raises(ValueError, match="window must be a positive int"):
        mods.sliding_window(0)
    with pytest.raises(ValueError, match="cap must be a positive finite number"):
        mods.soft_cap(-1)
    with pytest.raises(ValueError, match="doc_ids must be an integer array"):
        mods.document(np.zeros(4))
    with pytest.raises(TypeError, match="and_masks takes one or more"):
        mods.and_masks()
    assert repr(mods.sliding_window(4)) == "sliding_window(window=4)"


# ---------------------------------------------------------------- empty rows

def left_padded(rng, lengths, t=8):
    """A left-padded batch: row b has t - lengths[b] padding tokens first; key-padding mask (B, 1, 1, T)."""
    keep = np.zeros((len(lengths), 1, 1, t), dtype=bool)
    for b, n in enumerate(lengths):
        keep[b, ..., t - n:] = True
    return keep


@pytest.mark.parametrize("backend", ["numpy", "loop", "tiled", "torch", "sdpa", "triton"])
def test_empty_rows_zero_equals_sdpa_on_left_padding(backend):
    """Left padding with causal: the padding queries see no key. 'zero' gives SDPA's answer (0), and
    zero gradients from those rows; the default raises."""
    if backend not in attnlib.backends():
        pytest.skip(f"{backend} not available")
    rng = np.random.default_rng(11)
    q, k, v, d_out = (rng.standard_normal((3, 2, 8, 4)) for _ in range(4))
    keep = left_padded(rng, [8, 5, 2])
    qt, kt, vt, mt, dt = (torch.from_numpy(x) for x in (q, k, v, keep, d_out))
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    with torch.enable_grad():
        xs = [x.clone().requires_grad_() for x in (qt, kt, vt)]
        expected = torch.nn.functional.scaled_dot_product_attention(*xs, attn_mask=mt & causal)
        expected_grads = torch.autograd.grad(expected, xs, dt)
    args = as_kind(backend, q, k, v, keep, d_out)
    with pytest.raises(MaskError, match="no key"):
        attnlib.attention(*args[:3], mask=args[3], causal=True, backend=backend)
    out = attnlib.attention(*args[:3], mask=args[3], causal=True, backend=backend, empty_rows="zero")
    np.testing.assert_allclose(as_np(out), expected.detach().numpy(), atol=1e-12, rtol=0)
    assert (as_np(out)[1, :, :3] == 0).all() and (as_np(out)[2, :, :6] == 0).all()
    if backend in attnlib.backward_backends():
        grads = attnlib.attention_backward(*args[:3], args[4], mask=args[3], causal=True, backend=backend,
                                           empty_rows="zero")
        for g, e in zip(grads, expected_grads):
            np.testing.assert_allclose(as_np(g), e.numpy(), atol=1e-12, rtol=0)
        assert (as_np(grads[0])[2, :, :6] == 0).all()


def test_attention_weights_zero_rows():
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 6, 3)), rng.standard_normal((2, 6, 3))
    mask = np.ones((6, 6), dtype=bool)
    mask[2] = False
    with pytest.raises(MaskError):
        attnlib.attention_weights(q, k, mask=mask)
    for x, y in ((q, k), (torch.from_numpy(q), torch.from_numpy(k))):
        w = as_np(attnlib.attention_weights(x, y, mask=mask if isinstance(x, np.ndarray) else torch.from_numpy(mask),
                                            empty_rows="zero"))
        assert (w[:, 2] == 0).all()
        np.testing.assert_allclose(np.delete(w, 2, axis=1).sum(-1), 1.0)


@pytest.mark.parametrize("backend", ["numpy", "loop", "tiled", "torch", "sdpa", "triton"])
def test_causal_window_past_the_keys_names_the_window(backend):
    """QA: causal=True, window=W with T_q >= T_k + W leaves the last queries no key: a MaskError naming
    the window on every backend (it was zeros on sdpa and triton, NonFiniteError on the others)."""
    if backend not in attnlib.backends():
        pytest.skip(f"{backend} not available")
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((9, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 4))
    args = as_kind(backend, q, k, v)
    with pytest.raises(MaskError, match=r"window=3 leaves query rows 7\.\.8 with no key"):
        attnlib.attention(*args, causal=True, window=3, backend=backend)
    out = as_np(attnlib.attention(*args, causal=True, window=3, backend=backend, empty_rows="zero"))
    assert (out[7:] == 0).all()
    band = attnlib.causal_mask(9, 5, window=3)
    np.testing.assert_allclose(out[:7], reference(q[None, None], k[None, None], v[None, None], mask=band)[0, 0, :7],
                               atol=1e-12)
    if backend in attnlib.backward_backends():
        with pytest.raises(MaskError, match="window=3"):
            attnlib.attention_backward(*args, args[0][:, :4] * 0 + 1, causal=True, window=3, backend=backend)


def test_unchecked_skips_the_empty_row_check_with_mods(qkv):
    q, k, v, _ = qkv
    never = lambda b, h, i, j: (i < 3) | (j == 0) & (i > 100)  # noqa: E731  rows 3.. see nothing
    with pytest.raises(MaskError, match="mask_mod together leave query row 3"):
        attnlib.attention(q, k, v, mask_mod=never)
    with attnlib.unchecked():
        out = attnlib.attention(q, k, v, mask_mod=never, backend="tiled")
    assert (out[:, :, 3:] == 0).all()


# ---------------------------------------------------------------- QA defects of the issue (triton-simple)

def _simple_inputs(requires_grad=False):
    rng = np.random.default_rng(5)
    return [torch.from_numpy(rng.standard_normal((9, 16)).astype(np.float32)).requires_grad_(requires_grad)
            for _ in range(3)]


def test_triton_simple_refuses_inputs_that_require_grad():
    """QA: its output used to come back without grad, silently dropping attention's gradient."""
    if "triton-simple" not in attnlib.backends():
        pytest.skip("triton not available")
    q, k, v = _simple_inputs(requires_grad=True)
    with pytest.raises(ValueError, match="no backward pass.*requires grad.*backend='triton'"):
        attnlib.attention(q, k, v, backend="triton-simple")
    with torch.no_grad():
        out = attnlib.attention(q, k, v, backend="triton-simple")
    assert out.shape == (9, 16)


def test_triton_simple_names_the_window():
    """QA: window= was refused as 'takes no mask (got one of shape (9, 9))'; the caller passed no mask."""
    if "triton-simple" not in attnlib.backends():
        pytest.skip("triton not available")
    q, k, v = _simple_inputs()
    with pytest.raises(ValueError, match=r"no sliding window \(got window=3\)") as caught:
        attnlib.attention(q, k, v, causal=True, window=3, backend="triton-simple")
    assert "mask" not in str(caught.value)


# ---------------------------------------------------------------- no host sync under unchecked()

def _unchecked_case(case):
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    mask[:2] = False
    return {"empty_rows": dict(mask=mask, empty_rows="zero"),
            "mask_mod": dict(mask_mod=mods.causal()),
            "score_and_mask": dict(score_mod=mods.alibi(3), mask_mod=mods.sliding_window(4)),
            "document": dict(mask_mod=mods.document(torch.arange(16) // 5))}[case]


@pytest.mark.parametrize("backend", ["torch", "sdpa"])
@pytest.mark.parametrize("case", ["empty_rows", "mask_mod", "score_and_mask", "document"])
def test_mods_and_zero_rows_compile_without_graph_breaks_unchecked(backend, case):
    """Under attnlib.unchecked(), calls with mods or empty_rows='zero' trace into one graph: no value is
    read on the host; and they give the checked call's output, bit for bit."""
    kw = _unchecked_case(case)
    q = torch.randn(2, 3, 16, 8, generator=torch.Generator().manual_seed(0))

    def step(q):
        with attnlib.unchecked():
            return attnlib.attention(q, q, q, backend=backend, **kw)

    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(q)
    assert explained.graph_break_count == 0, [str(r.reason)[:300] for r in explained.break_reasons]
    torch.testing.assert_close(step(q), attnlib.attention(q, q, q, backend=backend, **kw),
                               atol=0, rtol=0)


@pytest.mark.parametrize("backend", ["torch", "sdpa"])
def test_the_same_call_checked_breaks_the_graph(backend):
    """The control for the test above: checked, the call reads values on the host (the finiteness and
    empty-row checks), which explain() counts as graph breaks. The first break comes from the inputs'
    finiteness check, before any mask or mod is read, so one case per backend shows it for all."""
    kw = _unchecked_case("empty_rows")
    q = torch.randn(2, 3, 16, 8, generator=torch.Generator().manual_seed(0))

    def checked(q):
        return attnlib.attention(q, q, q, backend=backend, **kw)

    torch._dynamo.reset()
    explained = torch._dynamo.explain(checked)(q)
    assert explained.graph_break_count >= 1
    assert any("check_finite" in str(r.user_stack) or "all_finite" in str(r.user_stack)
               for r in explained.break_reasons), [str(r.reason)[:300] for r in explained.break_reasons]


def test_attention_weights_take_the_mods(qkv):
    """The weights times v are the output, NumPy and torch, with a score_mod and a mask_mod."""
    q, k, v, _ = qkv
    kw = dict(score_mod=mods.soft_cap(0.8), mask_mod=mods.attention_sinks(2, 4))
    for x in ((q, k, v), as_kind("torch", q, k, v)):
        w = attnlib.attention_weights(x[0], x[1], **kw)
        np.testing.assert_allclose(as_np(w) @ v, reference(q, k, v, lambda s, b, h, i, j: 0.8 * np.tanh(s / 0.8)
                                                           if GALLERY["attention_sinks"][2](b, h, i, j) else -np.inf,
                                                           "score_mod"), atol=1e-12, rtol=0)
        assert (as_np(w)[..., 0, 1:] == 0).all()
