"""attention_backward: every backend's gradients against torch autograd, its checks, its memory.

The reference is torch autograd through a few lines of plain torch written here,
independent of attnlib, in float64. The Triton backward is tested in
tests/test_triton.py, which sets up Triton's interpreter.
"""

import math

import numpy as np
import pytest
import torch

import attnlib
from attnlib import errors
from attnlib.backends import tiled_backward
from attnlib.bench.memory import peak_numpy
from conftest import random_bool_mask

CPU_BACKENDS = ["numpy", "tiled", "torch", "sdpa"]


def autograd_reference(q, k, v, d_out, *, mask=None, causal=False, scale=None):
    """(dq, dk, dv) by torch autograd through softmax(q k^T * scale + mask) v, in float64."""
    q, k, v = (torch.tensor(np.asarray(x), dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    t_q, t_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if causal:
        offset = t_k - t_q if causal == "bottom-right" else 0
        scores = scores.masked_fill(~torch.ones(t_q, t_k, dtype=torch.bool).tril(offset), -math.inf)
    if mask is not None:
        mask = torch.from_numpy(np.asarray(mask))
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask
    out = torch.softmax(scores, dim=-1) @ v
    out.backward(torch.tensor(np.asarray(d_out), dtype=torch.float64))
    return tuple(x.grad.numpy() for x in (q, k, v))


def problem(rng, case):
    """``(q, k, v, d_out, options)`` for a named case; k and v broadcast over the batch."""
    t_q, t_k = {"T_q > T_k": (9, 5), "bottom-right": (6, 11)}.get(case, (7, 10))
    q = rng.standard_normal((2, 3, t_q, 5))
    k = rng.standard_normal((3, t_k, 5))  # shared by the batch: its gradient sums over it
    v = rng.standard_normal((1, 3, t_k, 4))
    d_out = rng.standard_normal((2, 3, t_q, 4))
    options = {}
    if case in ("bool mask", "additive mask", "causal + bool mask"):
        keep = random_bool_mask(rng, (t_q, t_k))
        options["mask"] = keep if case != "additive mask" else np.where(keep, rng.uniform(-2, 2, keep.shape),
                                                                         -np.inf)
    if case.startswith("causal") or case == "T_q > T_k":
        options["causal"] = "top-left"
    if case == "bottom-right":
        options["causal"] = "bottom-right"
    if case == "scale":
        options["scale"] = 0.7
    return q, k, v, d_out, options


CASES = ["plain", "scale", "bool mask", "additive mask", "causal", "causal + bool mask", "T_q > T_k",
         "bottom-right"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_gradients_match_torch_autograd_in_float64(backend, case, rng):
    q, k, v, d_out, options = problem(rng, case)
    expected = autograd_reference(q, k, v, d_out, **options)
    if backend in ("torch", "sdpa"):
        q, k, v, d_out = (torch.from_numpy(x) for x in (q, k, v, d_out))
        if "mask" in options:
            options["mask"] = torch.from_numpy(options["mask"])
    got = attnlib.attention_backward(q, k, v, d_out, backend=backend, **options)
    for name, g, e in zip(("dq", "dk", "dv"), got, expected):
        assert tuple(g.shape) == e.shape, name
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
@pytest.mark.parametrize("causal", [None, "top-left", "bottom-right"])
def test_tiled_backward_agrees_for_every_block_size(block_size, causal, rng):
    q, k, v = (rng.standard_normal((2, t, 6)) for t in (9, 14, 14))
    d_out = rng.standard_normal((2, 9, 6))
    mask = random_bool_mask(rng, (9, 14))
    expected = autograd_reference(q, k, v, d_out, mask=mask, causal=causal or False)
    got = tiled_backward.backward(q, k, v, d_out, mask, causal, 1 / math.sqrt(6), block_size=block_size)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


def test_tiled_backward_in_threads_gives_the_same_bits_as_inline(monkeypatch, rng):
    q, k, v, d_out = (rng.standard_normal((2, 3, 20, 8)) for _ in range(4))
    inline = tiled_backward.backward(q, k, v, d_out, None, "top-left", 0.3, block_size=4)
    monkeypatch.setattr(tiled_backward, "INLINE_FLOPS", 0)
    threaded = tiled_backward.backward(q, k, v, d_out, None, "top-left", 0.3, block_size=4, workers=2)
    for a, b in zip(inline, threaded):
        np.testing.assert_array_equal(a, b)


def test_tiled_backward_reuses_the_forward_output_and_log_sum_exp(rng):
    from attnlib.backends import tiled

    q, k, v, d_out = (rng.standard_normal((12, 5)) for _ in range(4))
    out, lse = tiled.forward(q, k, v, None, None, 0.4, return_lse=True, block_size=4)
    np.testing.assert_allclose(lse, np.log(np.exp(q @ k.T * 0.4).sum(axis=-1)), rtol=1e-12)
    given = tiled_backward.backward(q, k, v, d_out, None, None, 0.4, out=out, lse=lse, block_size=4)
    for g, e in zip(given, autograd_reference(q, k, v, d_out, scale=0.4)):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


def test_causal_query_blocks_skip_every_block_that_sees_none_of_the_keys():
    visited = list(tiled_backward.query_blocks(8, 4, 16, 16, 4, "top-left"))
    assert visited == [(8, 12, True), (12, 16, False)]  # queries 0-7 see none of keys 8-11
    visited = list(tiled_backward.query_blocks(8, 4, 4, 16, 4, "bottom-right"))  # offset 12
    assert visited == [(0, 4, False)]
    assert [b[:2] for b in tiled_backward.query_blocks(8, 4, 10, 16, 4)] == [(0, 4), (4, 8), (8, 10)]


def test_directional_derivative_matches_finite_differences(rng):
    """Independent of torch: <dq, u> + <dk, w> + <dv, z> = d/dh sum(d_out * attention(x + h * dir))."""
    q, k, v = (rng.standard_normal((4, 3)) for _ in range(3))
    d_out = rng.standard_normal((4, 3))
    directions = [rng.standard_normal((4, 3)) for _ in range(3)]
    grads = attnlib.attention_backward(q, k, v, d_out, causal=True)

    def loss(h):
        moved = (x + h * u for x, u in zip((q, k, v), directions))
        return float(np.sum(d_out * attnlib.attention(*moved, causal=True)))

    h = 1e-5
    numeric = (loss(h) - loss(-h)) / (2 * h)
    analytic = sum(float(np.sum(g * u)) for g, u in zip(grads, directions))
    assert numeric == pytest.approx(analytic, rel=1e-7, abs=1e-9)


def test_numpy_in_numpy_out_and_torch_in_torch_out(rng):
    q, k, v, d_out = (rng.standard_normal((5, 4)).astype(np.float32) for _ in range(4))
    got = attnlib.attention_backward(q, k, v, d_out)
    assert all(isinstance(g, np.ndarray) and g.dtype == np.float32 for g in got)
    via_torch = attnlib.attention_backward(q, k, v, d_out, backend="torch")
    assert all(isinstance(g, np.ndarray) for g in via_torch)
    tensors = [torch.from_numpy(x) for x in (q, k, v, d_out)]
    got_t = attnlib.attention_backward(*tensors)
    assert all(isinstance(g, torch.Tensor) and g.dtype == torch.float32 for g in got_t)
    for a, b in zip(got, got_t):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-6)


def test_float16_is_computed_in_float32_and_returned_in_float16(rng):
    q, k, v, d_out = (rng.standard_normal((6, 8)).astype(np.float16) for _ in range(4))
    expected = autograd_reference(q, k, v, d_out)
    for backend in ("numpy", "tiled"):
        got = attnlib.attention_backward(q, k, v, d_out, backend=backend)
        assert all(g.dtype == np.float16 for g in got)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g.astype(np.float64), e, rtol=1e-2, atol=1e-2)


def test_inputs_that_require_grad_give_plain_gradients(rng):
    q = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    dq, dk, dv = attnlib.attention_backward(q, q, q, torch.ones(4, 3, dtype=torch.float64))
    assert not any(g.requires_grad for g in (dq, dk, dv))


# Checks: as attention's, plus d_out -------------------------------------------------


def _error_of(call):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    return type(info.value), str(info.value)


def _bad_inputs():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((5, 4)), rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
    no_key = np.zeros((5, 6), dtype=bool)
    no_key[:4, 0] = True
    return {
        "d_k mismatch": ((q, k[:, :2], v), {}),
        "T_k mismatch": ((q, k, v[:5]), {}),
        "integer q": ((q.astype(int), k, v), {}),
        "NaN in v": ((q, k, np.where(np.arange(6)[:, None] == 2, np.nan, v)), {}),
        "mask of the wrong shape": ((q, k, v), {"mask": np.ones((3, 6), dtype=bool)}),
        "a query with no key": ((q, k, v), {"mask": no_key}),
        "causal='False'": ((q, k, v), {"causal": "False"}),
        "negative scale": ((q, k, v), {"scale": -1.0}),
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_bad_inputs_raise_the_errors_attention_raises(case):
    args, kwargs = _bad_inputs()[case]
    d_out = np.zeros((5, 3))
    expected = _error_of(lambda: attnlib.attention(*args, **kwargs))
    assert _error_of(lambda: attnlib.attention_backward(*args, d_out, **kwargs)) == expected


@pytest.mark.parametrize("d_out, error, words", [
    (np.zeros((5, 4)), errors.ShapeError,
     "d_out has shape (5, 4) but the output of attention has shape (5, 3)"),
    (np.zeros((2, 5, 3)), errors.ShapeError, "d_out has shape (2, 5, 3)"),
    (np.zeros((5, 3), dtype=np.float32), errors.DTypeError, "d_out is float32 but q, k and v are float64"),
    (np.zeros((5, 3), dtype=int), errors.DTypeError, "d_out must be a floating-point array"),
    (np.full((5, 3), np.nan), errors.NonFiniteError, "d_out (shape (5, 3)) contains NaN"),
    (torch.zeros(5, 3, dtype=torch.float64), errors.MixedArrayTypesError, "d_out is a torch array"),
    (None, TypeError, "d_out must be a NumPy array"),
])
def test_a_bad_d_out_gets_an_error_naming_it_and_the_shapes(d_out, error, words):
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((5, 4)), rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
    with pytest.raises(error) as info:
        attnlib.attention_backward(q, k, v, d_out)
    assert words in str(info.value)


def test_d_out_must_have_the_broadcast_output_shape():
    q, k, v = np.zeros((2, 1, 5, 4)), np.zeros((3, 6, 4)), np.zeros((6, 3))
    with pytest.raises(errors.ShapeError, match=r"\(2, 3, 5, 3\) \(batch\.\.\., T_q=5, d_v=3\)"):
        attnlib.attention_backward(q, k, v, np.zeros((2, 1, 5, 3)))


def test_a_backend_without_a_backward_pass_is_named_with_those_that_have_one():
    q = np.zeros((3, 2))
    with pytest.raises(ValueError, match=r"backend 'loop' has no backward pass; backends with one here: \["):
        attnlib.attention_backward(q, q, q, q, backend="loop")
    with pytest.raises(ValueError, match="unknown or unavailable backend 'nope'"):
        attnlib.attention_backward(q, q, q, q, backend="nope")


def test_gradients_too_large_for_the_dtype_raise_rather_than_return_inf():
    q = np.ones((3, 4), dtype=np.float16)
    d_out = np.full((3, 4), 6e4, dtype=np.float16)  # dk = scale * dS^T q sums to more than float16 holds
    v = np.array([[100.0] * 4, [-100.0] * 4, [0.0] * 4], dtype=np.float16)
    with pytest.raises(errors.NonFiniteError, match="not finite in float16"):
        attnlib.attention_backward(q, q * np.arange(1, 4, dtype=np.float16)[:, None], v, d_out)


def test_backward_backends_lists_the_cpu_backends():
    assert set(CPU_BACKENDS) <= set(attnlib.backward_backends())
    assert "loop" not in attnlib.backward_backends()


# Memory ---------------------------------------------------------------------------


def test_tiled_backward_needs_under_a_thirtieth_of_the_matrix_forms_memory():
    """Peak extra memory (tracemalloc), T = 4096, d = 16: the matrix form holds (T, T) arrays."""
    rng = np.random.default_rng(0)
    q, k, v, d_out = (rng.standard_normal((4096, 16), dtype=np.float32) for _ in range(4))
    matrix = peak_numpy(lambda: attnlib.attention_backward(q, k, v, d_out, backend="numpy"))
    tiled = peak_numpy(lambda: tiled_backward.backward(q, k, v, d_out, None, None, 0.25, block_size=256))
    assert matrix > 2 * 4096**2 * 4  # at least two (T, T) float32 arrays at once
    assert tiled * 30 < matrix, (tiled, matrix)


# The bench: --direction fwd | bwd | fwd+bwd ----------------------------------------


def test_backward_flops_are_two_and_a_half_times_the_forwards():
    from attnlib.bench import flops

    for causal in (False, True):
        forward = flops.attention_flops(2, 4, 256, 64, causal)
        assert flops.attention_backward_flops(2, 4, 256, 64, causal) == 2.5 * forward
        assert flops.direction_flops("fwd+bwd", 2, 4, 256, 64, causal) == 3.5 * forward
        assert flops.direction_flops("fwd", 2, 4, 256, 64, causal) == forward
    with pytest.raises(ValueError, match="direction must be one of"):
        flops.direction_flops("backward", 1, 1, 2, 3)


@pytest.mark.parametrize("kernel", ["numpy", "tiled", "torch", "sdpa-math"])
@pytest.mark.parametrize("direction", ["bwd", "fwd+bwd"])
def test_bench_backward_calls_compute_the_gradients(kernel, direction):
    from attnlib.bench import kernels

    kind = kernels.array_kind(kernel)
    q, k, v = kernels.make_inputs(kind, 1, 2, 24, 8, "float64", "cpu")
    d_out = kernels.upstream_gradient(q)
    expected = autograd_reference(*(np.asarray(x) for x in (q, k, v, d_out)), causal=True)
    call = kernels.make_call(kernel, q, k, v, True, direction=direction)
    with kernels.pinned(kernel):
        first, second = call(), call()  # a "bwd" call can run again: the graph is kept
    got = first[1] if kernel == "numpy" and direction == "fwd+bwd" else first
    for g, e, again in zip(got, expected, second if got is first else second[1]):
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(np.asarray(again), np.asarray(g))


def test_bench_rows_record_the_direction_and_a_kernel_without_a_backward_is_unsupported():
    from attnlib.bench import sweep

    fast = sweep.Settings(device="cpu", warmup=1, warmup_s=0.0, min_repeats=1, max_repeats=2,
                          budget_s=0.01, measure_memory=False)
    row = sweep.run_config(sweep.Config("tiled", 1, 2, 32, 16, "float32", False, "bwd"), fast, "cpu")
    assert row["status"] == "ok" and row["direction"] == "bwd"
    assert row["flops"] == 10 * 2 * 32**2 * 16
    loop = sweep.run_config(sweep.Config("loop", 1, 2, 32, 16, "float32", False, "fwd+bwd"), fast, "cpu")
    assert loop["status"] == "unsupported" and "no backward pass" in loop["message"]


def test_bench_command_line_times_the_backward(capsys):
    from attnlib.bench import cli

    code = cli.main(["--device", "cpu", "--direction", "fwd+bwd", "--kernels", "numpy,tiled",
                     "-T", "32", "64", "-H", "1", "--warmup-s", "0", "--budget", "0.01",
                     "--min-repeats", "1", "--max-repeats", "2", "--no-memory", "--no-progress",
                     "--reference", "numpy"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "direction fwd+bwd" in printed and "causal=False fwd+bwd: time / numpy time" in printed
