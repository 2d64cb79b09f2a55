"""The Triton FlashAttention kernel against the float64 reference.

With a GPU the kernel runs on it. Without one it runs under Triton's CPU
interpreter, which reads TRITON_INTERPRET when a kernel is defined, so the
variable is set here before attnlib's triton backend is first imported. The
variable is then put back as it was, and switched on again only while this
module's tests run (the ``interpreter`` fixture): other test modules in the same
pytest-xdist worker keep seeing ``attnlib.backends()`` as they would alone.
The interpreter is slow, so the shapes here are small.

The backward kernels (attnlib.backends.triton_backward) are tested here too, against
torch autograd in float64: through ``attention(...).backward()`` and through
``attention_backward(..., backend="triton")``.
"""

import importlib.util
import os

import numpy as np
import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

ON_GPU = torch.cuda.is_available()
_SAVED_INTERPRET = os.environ.get("TRITON_INTERPRET")
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
from attnlib.backends import triton_autograd, triton_backward, triton_flash, triton_simple  # noqa: E402  (kernels defined here)

if _SAVED_INTERPRET is None:
    os.environ.pop("TRITON_INTERPRET", None)
else:
    os.environ["TRITON_INTERPRET"] = _SAVED_INTERPRET

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import attnlib  # noqa: E402
from attnlib import errors  # noqa: E402
from conftest import random_bool_mask, reference_attention  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"

if not ON_GPU and not triton_flash.RUNS_ON_CPU:
    pytest.fail("attnlib.backends.triton_flash was imported before TRITON_INTERPRET=1 was set, so its "
                "kernel cannot run on this CPU; run tests/test_triton.py in a fresh process",
                pytrace=False)


@pytest.fixture(autouse=True, scope="module")
def interpreter():
    """TRITON_INTERPRET=1 while this module runs (on a CPU), as it was before afterwards."""
    if ON_GPU:
        yield
        return
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    if saved is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = saved


def _tensors(*arrays, dtype=torch.float32):
    return [torch.from_numpy(np.asarray(a)).to(DEVICE, dtype) for a in arrays]


@st.composite
def kernel_problems(draw):
    """Small shapes around the interpreter's 16 x 16 tiles: ragged edges, T_q != T_k, broadcasting,
    both causal alignments."""
    batch = tuple(draw(st.lists(st.integers(1, 2), max_size=2)))
    t_q, t_k = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    d_k = draw(st.sampled_from([16, 32, 64, 5]))
    d_v = draw(st.sampled_from([d_k, 8]))
    mask_kind = draw(st.sampled_from(["none", "bool", "additive"]))
    causal = draw(st.sampled_from([False, "top-left", "bottom-right"]))
    if causal == "bottom-right" and t_k < t_q:  # bottom-right leaves the first T_q - T_k rows no key
        t_q, t_k = t_k, t_q
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal((*batch, t_q, d_k))
    k = rng.standard_normal((*batch[draw(st.integers(0, len(batch))):], t_k, d_k))  # k, v may broadcast
    v = rng.standard_normal((*k.shape[:-2], t_k, d_v))
    mask = None
    if mask_kind != "none":
        mask = random_bool_mask(rng, (*batch[draw(st.integers(0, len(batch))):], t_q, t_k))
        if mask_kind == "additive":
            mask = np.where(mask, rng.uniform(-2, 2, mask.shape), -np.inf)
    return q, k, v, mask, causal


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=kernel_problems())
def test_kernel_matches_the_float64_reference(problem):
    q, k, v, mask, causal = problem
    expected = reference_attention(q, k, v, mask=mask, causal=causal)
    if mask is not None:
        mask = torch.from_numpy(mask).to(DEVICE)
    got = attnlib.attention(*_tensors(q, k, v), mask=mask, causal=causal, backend="triton")
    assert got.dtype == torch.float32 and got.device.type == DEVICE
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("head_dim", [16, 32, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_every_supported_head_dim(head_dim, causal, rng):
    q, k, v = (rng.standard_normal((1, 2, t, head_dim)) for t in (19, 35, 35))
    expected = reference_attention(q, k, v, causal=causal)
    got = attnlib.attention(*_tensors(q, k, v), causal=causal, backend="triton")
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_half_precision_error_is_at_most_twice_torch_math_backend_error(dtype, causal, rng):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _tensors(*(rng.standard_normal((2, 2, t, 64)) for t in (37, 50, 50)), dtype=dtype)
    expected = reference_attention(*(x.double().cpu().numpy() for x in (q, k, v)), causal=causal)
    with sdpa_kernel(SDPBackend.MATH):
        math = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    got = attnlib.attention(q, k, v, causal=causal, backend="triton")
    assert got.dtype == dtype
    math_error = np.abs(math.double().cpu().numpy() - expected).max()
    kernel_error = np.abs(got.double().cpu().numpy() - expected).max()
    assert kernel_error <= 2 * math_error + 1e-6, (kernel_error, math_error)


def test_float64_keeps_float64_accuracy(rng):
    q, k, v = (rng.standard_normal((2, t, 16)) for t in (21, 33, 33))
    got = attnlib.attention(*_tensors(q, k, v, dtype=torch.float64), causal=True, backend="triton")
    expected = reference_attention(q, k, v, causal=True)
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(ON_GPU, reason="NumPy input becomes CPU tensors, which only the interpreter runs")
def test_numpy_in_numpy_out(rng):
    q, k, v = (rng.standard_normal((3, 18, 16)).astype(np.float32) for _ in range(3))
    got = attnlib.attention(q, k, v, backend="triton")
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_allclose(got, attnlib.attention(q, k, v), rtol=1e-5, atol=1e-6)


def test_future_keys_do_not_change_past_outputs(rng):
    q, k, v = (rng.standard_normal((1, 1, 40, 16)) for _ in range(3))
    before = attnlib.attention(*_tensors(q, k, v), causal=True, backend="triton")
    k[..., 33:, :], v[..., 33:, :] = rng.standard_normal((2, 7, 16))
    after = attnlib.attention(*_tensors(q, k, v), causal=True, backend="triton")
    torch.testing.assert_close(after[..., :33, :], before[..., :33, :], rtol=0, atol=0)


CONFIG_NAMES = [f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}" for c in triton_flash.CUDA_CONFIGS]


@pytest.mark.parametrize("config", triton_flash.CUDA_CONFIGS, ids=CONFIG_NAMES)
@pytest.mark.parametrize("case", ["no mask", "causal top-left", "causal bottom-right", "bool mask"])
def test_every_autotuned_tile_on_ragged_shapes(config, case, rng):
    """Each tile shape the GPU autotuner may pick, on lengths that are multiples of none of them."""
    t_q, t_k = (37, 70) if case != "causal top-left" else (70, 37)
    q, k, v = (rng.standard_normal((2, t, d)) for t, d in ((t_q, 32), (t_k, 32), (t_k, 16)))
    causal = {"causal top-left": "top-left", "causal bottom-right": "bottom-right"}.get(case)
    mask = random_bool_mask(rng, (t_q, t_k)) if case == "bool mask" else None
    expected = reference_attention(q, k, v, mask=mask, causal=causal or False)
    tensors = _tensors(q, k, v)
    mask_t = None if mask is None else torch.from_numpy(mask).to(DEVICE)
    tile = {"BLOCK_M": config.kwargs["BLOCK_M"], "BLOCK_N": config.kwargs["BLOCK_N"]}
    if ON_GPU:
        tile.update(num_warps=config.num_warps, num_stages=config.num_stages)
    got = triton_flash.forward(*tensors, mask_t, causal, 1 / np.sqrt(32), tile=tile)
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("t_q, t_k", [(5, 40), (24, 56), (40, 40), (1, 33)])
def test_bottom_right_causal_equals_its_explicit_mask(t_q, t_k, rng):
    q, k, v = (rng.standard_normal((2, 1, t, 16)) for t in (t_q, t_k, t_k))
    keep = attnlib.causal_mask(t_q, t_k, alignment="bottom-right")  # j <= i + T_k - T_q
    expected = reference_attention(q, k, v, mask=keep)
    by_flag = attnlib.attention(*_tensors(q, k, v), causal="bottom-right", backend="triton")
    by_mask = attnlib.attention(*_tensors(q, k, v), mask=torch.from_numpy(keep).to(DEVICE),
                                backend="triton")
    np.testing.assert_allclose(by_flag.cpu().numpy(), expected, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(by_mask.cpu().numpy(), expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("causal, t_q, t_k, first_skipped", [
    ("top-left", 40, 40, 16),  # query tile 0 (rows 0-15) sees keys 0-15
    ("bottom-right", 24, 56, 48),  # offset 32: rows 0-15 see keys up to 47
])
def test_key_tiles_past_the_diagonal_are_never_loaded(causal, t_q, t_k, first_skipped, rng):
    """NaN in the values of skipped key tiles cannot reach the first query tile's output.

    Called below attnlib.attention, whose input checks would refuse the NaN: if a skipped
    tile were loaded and masked instead, 0 * NaN would still make those rows NaN.
    """
    q, k, v = _tensors(*(rng.standard_normal((1, 1, t, 16)) for t in (t_q, t_k, t_k)))
    expected = attnlib.attention(q, k, v, causal=causal, backend="torch")[..., :16, :]
    v[..., first_skipped:, :] = float("nan")
    got = triton_flash.forward(q, k, v, None, causal, 0.25, tile=triton_flash.INTERPRETER_TILE)
    torch.testing.assert_close(got[..., :16, :], expected, rtol=2e-5, atol=2e-5)


INT64_PROBE = """
import os, sys
import torch
import attnlib
from attnlib.backends import triton_flash
device = sys.argv[1]
t_q, t_k = 3, 40
row_stride = 2**30 + 64  # row 2 of the mask starts past 2**31 elements
storage = torch.empty((t_q - 1) * row_stride + t_k, dtype=torch.bool, device=device)
mask = storage.as_strided((t_q, t_k), (row_stride, 1))  # about 2 GiB reserved, 120 B written
gen = torch.Generator().manual_seed(0)
mask.copy_((torch.rand(t_q, t_k, generator=gen) < 0.5).to(device))
mask[:, 0] = True
q, k, v = (torch.randn(t, d, generator=gen).to(device) for t, d in ((t_q, 16), (t_k, 16), (t_k, 8)))
got = triton_flash.forward(q, k, v, mask, None, 0.25)
expected = attnlib.attention(q, k, v, mask=mask.contiguous(), scale=0.25, backend="torch")
print(float((got - expected).abs().max()))
"""


def test_mask_rows_past_two_to_the_31_are_addressed_with_int64_offsets():
    """A mask whose row i starts at element i * stride_mm >= 2**31: int32 offsets would wrap.

    Run in a child process, because a wrapped offset reads outside the mask and can
    crash the process rather than raise.
    """
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0" if ON_GPU else "1"}
    run = subprocess.run([sys.executable, "-c", INT64_PROBE, DEVICE], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, f"the kernel crashed (exit {run.returncode}): {run.stderr[-2000:]}"
    assert float(run.stdout.split()[-1]) < 1e-5


@pytest.mark.skipif(ON_GPU, reason="pre-fills the autotuner's cache instead of timing configs")
def test_autotune_key_buckets_lengths_to_the_next_power_of_two(monkeypatch, rng):
    """Lengths in one power-of-two bucket share one tuning; a new bucket would tune again."""
    tuned = triton_flash._attn_fwd_tuned
    monkeypatch.setattr(tuned, "cache", {})
    monkeypatch.setattr(triton_flash, "choose_kernel", lambda jitted, tuned, *args: (tuned, {}))
    chosen = triton_flash.CUDA_CONFIGS[-1]
    key_values = {"T_Q_BUCKET": 32, "T_K_BUCKET": 64, "HEAD_DK": 16, "HEAD_DV": 16,
                  "CAUSAL": False, "MASK_KIND": triton_flash.NO_MASK}
    cached_key = (*(key_values[name] for name in triton_flash.AUTOTUNE_KEY),
                  *["torch.float32"] * 6)  # the dtypes of Q, K, V, Mask, Out and Lse
    tuned.cache[cached_key] = chosen
    for t_q, t_k in ((17, 33), (30, 64), (32, 50)):  # every one in the (32, 64) bucket
        q, k, v = _tensors(*(rng.standard_normal((1, t, 16)) for t in (t_q, t_k, t_k)))
        got = triton_flash.forward(q, k, v, None, None, 0.25)
        expected = attnlib.attention(q, k, v, backend="torch")
        torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)
    assert list(tuned.cache) == [cached_key], "a length in the same bucket started a new tuning"


# The backward kernels -----------------------------------------------------------------


def autograd_grads(q, k, v, d_out, mask=None, causal=False):
    """(dq, dk, dv) from torch autograd through the float64 matrix form (the torch backend)."""
    q, k, v = (x.detach().double().requires_grad_() for x in (q, k, v))
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.double()
    attnlib.attention(q, k, v, mask=mask, causal=causal, backend="torch").backward(d_out.double())
    return q.grad, k.grad, v.grad


def backward_problem(rng, t_q, t_k, dtype, mask_kind=None, d=16):
    """q (2, 2, T_q, d); k and v shared by the batch; d_out; a mask leaving every query key 0."""
    q, k, v, d_out = _tensors(rng.standard_normal((2, 2, t_q, d)), rng.standard_normal((2, t_k, d)),
                              rng.standard_normal((1, 2, t_k, 8)), rng.standard_normal((2, 2, t_q, 8)),
                              dtype=dtype)
    mask = None
    if mask_kind is not None:
        keep = random_bool_mask(rng, (t_q, t_k))
        mask = keep if mask_kind == "bool" else np.where(keep, rng.uniform(-2, 2, keep.shape), -np.inf)
        mask = torch.from_numpy(mask).to(DEVICE, torch.bool if mask_kind == "bool" else dtype)
    return q, k, v, d_out, mask


GRAD_TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-12}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("causal, t_q, t_k", [
    (False, 21, 37), (False, 37, 21), ("top-left", 37, 21), ("top-left", 21, 37),
    ("bottom-right", 21, 37), ("bottom-right", 33, 33),
])
@pytest.mark.parametrize("mask_kind", [None, "bool", "additive"])
def test_backward_through_autograd_matches_torch_autograd(dtype, causal, t_q, t_k, mask_kind, rng):
    q, k, v, d_out, mask = backward_problem(rng, t_q, t_k, dtype, mask_kind)
    expected = autograd_grads(q, k, v, d_out, mask, causal)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = attnlib.attention(*leaves, mask=mask, causal=causal, backend="triton")
    assert out.grad_fn is not None
    out.backward(d_out)
    tolerance = GRAD_TOLERANCE[dtype]
    for name, leaf, e in zip(("dq", "dk", "dv"), leaves, expected):
        assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == dtype, name
        torch.testing.assert_close(leaf.grad.double(), e, rtol=tolerance, atol=tolerance, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_attention_backward_with_the_triton_backend_matches_autograd(dtype, rng):
    q, k, v, d_out, mask = backward_problem(rng, 19, 34, dtype, "bool")
    expected = autograd_grads(q, k, v, d_out, mask, "bottom-right")
    got = attnlib.attention_backward(q, k, v, d_out, mask=mask, causal="bottom-right", backend="triton")
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.double(), e, rtol=GRAD_TOLERANCE[dtype], atol=GRAD_TOLERANCE[dtype])


# The two lists need not be equally long: pair them index by index, the shorter one cycling, so
# that every tile of each list runs.
N_BACKWARD_PAIRS = max(len(triton_backward.DKDV_CONFIGS), len(triton_backward.DQ_CONFIGS))


def _backward_config(configs, index):
    return configs[index % len(configs)]


BACKWARD_PAIR_NAMES = [
    "-".join(f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}w{c.num_warps}"
             for c in (_backward_config(triton_backward.DKDV_CONFIGS, i),
                       _backward_config(triton_backward.DQ_CONFIGS, i)))
    for i in range(N_BACKWARD_PAIRS)]


@pytest.mark.parametrize("config_index", range(N_BACKWARD_PAIRS), ids=BACKWARD_PAIR_NAMES)
@pytest.mark.parametrize("causal, t_q, t_k", [(None, 70, 37), ("top-left", 70, 37),
                                              ("top-left", 37, 150), ("bottom-right", 37, 150)])
def test_every_autotuned_backward_tile_on_ragged_shapes(config_index, causal, t_q, t_k, rng):
    """Each (dK/dV tile, dQ tile) pair the GPU autotuner may pick, on lengths none divides."""
    tiles = {}
    for name, configs in (("dkdv", triton_backward.DKDV_CONFIGS), ("dq", triton_backward.DQ_CONFIGS)):
        config = _backward_config(configs, config_index)
        tiles[name] = {"BLOCK_M": config.kwargs["BLOCK_M"], "BLOCK_N": config.kwargs["BLOCK_N"]}
        if ON_GPU:
            tiles[name].update(num_warps=config.num_warps, num_stages=config.num_stages)
    q, k, v, d_out = _tensors(*(rng.standard_normal((2, t, d)) for t, d in
                                ((t_q, 32), (t_k, 32), (t_k, 16), (t_q, 16))), dtype=torch.float64)
    expected = autograd_grads(q, k, v, d_out, causal=causal or False)
    got = triton_backward.backward(q, k, v, d_out, None, causal, 1 / np.sqrt(32), tiles=tiles)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the NaN rows themselves warn, on purpose
@pytest.mark.parametrize("causal, t_q, t_k, cut", [("top-left", 40, 40, 16), ("bottom-right", 24, 56, 48)])
def test_backward_kernels_never_load_tiles_past_the_diagonal(causal, t_q, t_k, cut, rng):
    """NaN where a skipped tile would read it cannot reach the gradients that do not depend on it.

    dQ of queries 0-15 needs no key from ``cut`` on: NaN in those keys and values must stay
    out of it. dK and dV of keys from ``cut`` on need no query of tile 0 (rows 0-15): NaN in
    those queries and their dO must stay out of them. Called below the input checks.
    """
    q, k, v, d_out = _tensors(*(rng.standard_normal((1, 1, t, 16)) for t in (t_q, t_k, t_k, t_q)))
    expected = autograd_grads(q, k, v, d_out, causal=causal)
    # every kernel at 16 x 16 tiles (on a GPU the forward would otherwise take a 64-row tile, whose
    # rows 16-63 rightly see the NaN keys, and 0 * NaN in p @ v reaches rows 0-15 of that tile)
    tiles = {name: triton_flash.INTERPRETER_TILE for name in ("fwd", "dkdv", "dq")}
    k_nan, v_nan = k.clone(), v.clone()
    k_nan[..., cut:, :] = v_nan[..., cut:, :] = float("nan")
    dq, _, _ = triton_backward.backward(q, k_nan, v_nan, d_out, None, causal, 0.25, tiles=tiles)
    torch.testing.assert_close(dq[..., :16, :].double(), expected[0][..., :16, :], rtol=2e-5, atol=2e-5)
    q_nan, d_out_nan = q.clone(), d_out.clone()
    q_nan[..., :16, :] = d_out_nan[..., :16, :] = float("nan")
    _, dk, dv = triton_backward.backward(q_nan, k, v, d_out_nan, None, causal, 0.25, tiles=tiles)
    first_key = cut if causal == "top-left" else 16 + t_k - t_q  # keys query 15 cannot see
    for g, e in ((dk, expected[1]), (dv, expected[2])):
        torch.testing.assert_close(g[..., first_key:, :].double(), e[..., first_key:, :], rtol=2e-5,
                                   atol=2e-5)


def test_sum_backward_with_a_stride_zero_upstream_gradient(rng):
    """``out.sum().backward()`` hands the kernel an expanded, stride-0 d_out."""
    q, k, v, _, _ = backward_problem(rng, 20, 20, torch.float32)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    attnlib.attention(*leaves, causal=True, backend="triton").sum().backward()
    expected = autograd_grads(q, k, v, torch.ones(2, 2, 20, 8, device=DEVICE), causal=True)
    for leaf, e in zip(leaves, expected):
        torch.testing.assert_close(leaf.grad.double(), e, rtol=2e-5, atol=2e-5)


def test_only_the_inputs_that_require_grad_get_one(rng):
    q, k, v, d_out, _ = backward_problem(rng, 9, 12, torch.float32)
    k = k.clone().requires_grad_()
    attnlib.attention(q, k, v, backend="triton").backward(d_out)
    torch.testing.assert_close(k.grad.double(), autograd_grads(q, k, v, d_out)[1], rtol=2e-5, atol=2e-5)
    assert q.grad is None and v.grad is None


def test_a_mask_that_requires_grad_is_refused():
    q = torch.randn(5, 16, device=DEVICE, requires_grad=True)
    mask = torch.zeros(5, 5, device=DEVICE, requires_grad=True)
    with pytest.raises(ValueError, match="computes no gradient for a mask"):
        attnlib.attention(q, q, q, mask=mask, backend="triton")


def half_rounded_gradients(q, k, v, d_out, dtype, causal=True):
    """Float64 gradients that round where the GPU kernels round: O, P and dS to ``dtype``.

    On a GPU the kernels feed the tensor cores in fp16/bf16: the forward rounds its
    output, the backward rounds the weights P before ``dV = P^T dO`` and dS before
    ``dQ = dS K`` and ``dK = dS^T Q``; everything else accumulates in fp32, which is
    exact next to these roundings. (Under the CPU interpreter the tiles are fp32 and
    nothing is rounded, so the kernel there is closer to the exact gradients.)
    """
    def rounded(x):
        return x.to(dtype).double()

    q, k, v, d_out = (x.double() for x in (q, k, v, d_out))
    scale = 1 / np.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale
    if causal:
        t_q, t_k = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).triu(1),
                                    float("-inf"))
    p = torch.softmax(scores, dim=-1)
    out = rounded(rounded(p) @ v)
    d_v = rounded(p).transpose(-2, -1) @ d_out
    d_p = d_out @ v.transpose(-2, -1)
    delta = (d_out * out).sum(-1, keepdim=True)
    d_s = rounded(p * (d_p - delta))
    return d_s @ k * scale, d_s.transpose(-2, -1) @ q * scale, d_v


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gradients_are_as_close_as_the_gpus_rounding_allows(dtype, rng):
    """The tolerance comes from the roundings the GPU does (half_rounded_gradients), not from a guess.

    A kernel that rounded more than that, or got anything else wrong, fails.
    """
    q, k, v, d_out = _tensors(*(rng.standard_normal((2, 2, 40, 64)) for _ in range(4)), dtype=dtype)
    exact = attnlib.attention_backward(*(x.double() for x in (q, k, v, d_out)), causal=True)
    rounded = half_rounded_gradients(q, k, v, d_out, dtype)
    got = attnlib.attention_backward(q, k, v, d_out, causal=True, backend="triton")
    for name, g, r, e in zip(("dq", "dk", "dv"), got, rounded, exact):
        assert g.dtype == dtype
        rounding_error = (r - e).abs().max().item()
        unit = torch.finfo(dtype).eps * e.abs().max().item()  # one rounding of the largest entry
        assert rounding_error > 0, name  # the model of the GPU rounds something
        assert (g.double() - e).abs().max().item() <= 1.5 * rounding_error + 2 * unit, name


def _error_of(call):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    return type(info.value), str(info.value)


def _bad_inputs():
    q, k, v = torch.randn(5, 16), torch.randn(4, 16), torch.randn(4, 8)
    no_key = torch.zeros(5, 4, dtype=torch.bool)
    no_key[:4, 0] = True
    return {
        "d_k mismatch": ((q, k[:, :8], v), {}),
        "T_k mismatch": ((q, k, v[:3]), {}),
        "integer q": ((q.long(), k, v), {}),
        "float16 q with float32 k": ((q.half(), k, v), {}),
        "NaN in k": ((q, torch.where(torch.arange(4)[:, None] == 2, float("nan"), k), v), {}),
        "mask of the wrong shape": ((q, k, v), {"mask": torch.ones(3, 4, dtype=torch.bool)}),
        "a query with no key": ((q, k, v), {"mask": no_key}),
        "causal plus a mask that keeps only future keys": (
            (q, k, v), {"causal": True, "mask": torch.tensor([[0, 1, 1, 1]] * 5, dtype=torch.bool)}),
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_bad_inputs_raise_the_same_errors_as_the_torch_backend(case):
    args, kwargs = _bad_inputs()[case]
    args = [a.to(DEVICE) for a in args]
    kwargs = {name: value.to(DEVICE) if isinstance(value, torch.Tensor) else value
              for name, value in kwargs.items()}
    expected = _error_of(lambda: attnlib.attention(*args, backend="torch", **kwargs))
    assert issubclass(expected[0], (errors.ShapeError, errors.MaskError, errors.DTypeError,
                                    errors.NonFiniteError))
    assert _error_of(lambda: attnlib.attention(*args, backend="triton", **kwargs)) == expected


def test_head_dims_over_128_are_refused_with_the_alternatives():
    q = torch.randn(4, 129, device=DEVICE)
    with pytest.raises(ValueError, match="up to 128, got d_k=129"):
        attnlib.attention(q, q, q, backend="triton")


@pytest.mark.skipif(ON_GPU, reason="checks the CPU guard")
def test_cpu_tensors_without_the_interpreter_get_a_clear_error(monkeypatch):
    monkeypatch.setattr(triton_flash, "RUNS_ON_CPU", False)
    q = torch.randn(4, 16)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        triton_flash.forward(q, q, q, None, False, 0.25)


def test_backends_lists_triton_where_it_can_run():
    assert "triton" in attnlib.backends()


# ---- triton-simple: the teaching kernel -------------------------------------------------

SIMPLE_CASES = [  # (batch, T_q, T_k, d, causal): ragged edges, T_q != T_k, both alignments
    ((2, 3), 37, 37, 64, False),
    ((1, 2), 37, 53, 32, "top-left"),
    ((2,), 21, 50, 16, "bottom-right"),
    ((1, 1), 1, 40, 128, "bottom-right"),
    ((3,), 33, 17, 64, None),
]


@pytest.mark.parametrize("batch, t_q, t_k, d, causal", SIMPLE_CASES)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_triton_simple_matches_the_float64_reference(batch, t_q, t_k, d, causal, dtype, tol, rng):
    q, k, v = (rng.standard_normal((*batch, t, d)) for t in (t_q, t_k, t_k))
    expected = reference_attention(q, k, v, causal=causal or False)
    got = attnlib.attention(*_tensors(q, k, v, dtype=dtype), causal=causal or False, backend="triton-simple")
    assert got.dtype == dtype and got.shape == (*batch, t_q, d)
    np.testing.assert_allclose(got.double().cpu().numpy(), expected, atol=tol, rtol=tol)


def test_triton_simple_agrees_with_the_library_kernel(rng):
    q, k, v = _tensors(*(rng.standard_normal((2, 2, 45, 64)) for _ in range(3)))
    for causal in (False, "top-left", "bottom-right"):
        simple = attnlib.attention(q, k, v, causal=causal, backend="triton-simple")
        full = attnlib.attention(q, k, v, causal=causal, backend="triton")
        torch.testing.assert_close(simple, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("what, kwargs, shapes, error, words", [
    ("a mask", {"mask": np.ones((8, 8), bool)}, ((8, 16), (8, 16), (8, 16)), ValueError, "takes no mask"),
    ("d = 24", {}, ((8, 24), (8, 24), (8, 24)), ValueError, "d_k = d_v in"),
    ("d_v != d_k", {}, ((8, 16), (8, 16), (8, 32)), ValueError, "d_k = d_v in"),
])
def test_triton_simple_refuses_what_it_leaves_out_and_says_which_backend_can(what, kwargs, shapes, error,
                                                                            words, rng):
    q, k, v = _tensors(*(rng.standard_normal(s) for s in shapes))
    if "mask" in kwargs:
        kwargs = {**kwargs, "mask": torch.from_numpy(kwargs["mask"])}
    with pytest.raises(error, match=words) as caught:
        attnlib.attention(q, k, v, backend="triton-simple", **kwargs)
    assert "triton-simple" in str(caught.value)


def test_triton_simple_refuses_float64_and_rows_without_a_key_when_called_directly(rng):
    q = _tensors(rng.standard_normal((4, 16)), dtype=torch.float64)[0]
    with pytest.raises(TypeError, match="float16, bfloat16 or float32, got torch.float64"):
        triton_simple.forward(q, q, q, None, None, 0.25)
    q, k = _tensors(rng.standard_normal((9, 16)), rng.standard_normal((4, 16)))
    with pytest.raises(ValueError, match="leave the first queries no key"):
        triton_simple.forward(q, k, k, None, "bottom-right", 0.25)


def test_triton_simple_kernel_is_at_most_40_lines_of_code():
    import inspect

    source = inspect.getsource(triton_simple._simple_attn_fwd.fn if hasattr(triton_simple._simple_attn_fwd, "fn")
                               else triton_simple._simple_attn_fwd)
    body = source.split('"""')[-1]  # after the docstring
    code = [line for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]
    header = source.split('"""')[0].splitlines()
    assert len(code) + len(header) <= 40, len(code) + len(header)


def test_each_kernel_file_reads_alone_and_imports_go_one_way():
    import ast
    import inspect

    def imported(module):
        tree = ast.parse(inspect.getsource(module))
        return {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level
                for alias in node.names} | {node.module for node in ast.walk(tree)
                                            if isinstance(node, ast.ImportFrom) and node.level and node.module}

    assert not {"triton_backward", "triton_autograd"} & imported(triton_flash)
    assert "triton_autograd" not in imported(triton_backward)
    assert {"triton_backward", "triton_flash"} <= imported(triton_autograd)
    from attnlib.attention import backend_module

    assert backend_module("triton") is triton_autograd


def test_a_fixed_tile_that_does_not_fit_names_the_tile_and_the_limit(monkeypatch, rng):
    """On a GPU, Triton raises OutOfResources for a tile whose shared memory is over the limit;
    the autotuner silently drops such a config, but a tile the caller chose is reported."""
    from triton.runtime.errors import OutOfResources

    class TooBig:
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                raise OutOfResources(329_728, 232_448, "shared memory")
            return run

    tile = {"BLOCK_M": 256, "BLOCK_N": 256, "num_warps": 8, "num_stages": 4}
    monkeypatch.setattr(triton_flash, "choose_kernel", lambda *args, **kwargs: (TooBig(), tile))
    q = _tensors(rng.standard_normal((1, 1, 8, 16)))[0]
    with pytest.raises(ValueError, match=r"tile=.*256.* does not fit the fwd kernel.*329,728 bytes of "
                                         r"shared memory.*limit is 232,448"):
        triton_flash.forward(q, q, q, None, None, 0.25, tile=tile)
    with pytest.raises(OutOfResources):  # no tile of the caller's: Triton's own error goes through
        triton_flash.forward(q, q, q, None, None, 0.25)


def test_the_benchmark_records_the_tile_each_kernel_ran_with(rng):
    from attnlib.bench import kernels as bench_kernels

    q, k, v = _tensors(*(rng.standard_normal((1, 2, 20, 16)) for _ in range(3)))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    attnlib.attention(*leaves, backend="triton").sum().backward()
    def label(tile, warps=4, stages=3):
        return "{0}x{1} w{2} s{3}".format(tile["BLOCK_M"], tile["BLOCK_N"], tile.get("num_warps", warps),
                                          tile.get("num_stages", stages))

    if ON_GPU:  # 20 x 20 scores are below AUTOTUNE_MIN_SCORES: each kernel runs its fixed small-problem tile
        small = triton_backward.SMALL_PROBLEM_TILES
        expected = (f"fwd {label(triton_flash.SMALL_PROBLEM_TILE)}; dkdv {label(small['dkdv'])}; "
                    f"dq {label(small['dq'])}")
    else:  # the interpreter runs one tile everywhere
        one = label(triton_flash.INTERPRETER_TILE)
        expected = f"fwd {one}; dkdv {one}; dq {one}"
    assert bench_kernels.tiles_used("triton", "fwd+bwd") == expected
    attnlib.attention(q, k, v, backend="triton-simple")
    block_m, block_n, warps = triton_simple.tile_for(16)
    assert bench_kernels.tiles_used("triton-simple", "fwd") == f"fwd {block_m}x{block_n} w{warps}"
    assert (block_m, block_n, warps) == ((128, 64, 4) if ON_GPU else (16, 16, 1))
    assert bench_kernels.tiles_used("torch", "fwd") is None


def test_fp32_tiles_are_offered_to_exact_fp32_but_not_to_fp64():
    from attnlib.bench import sm90

    assert triton_flash.tile_offered("fp32", tensor_cores=False, fp64=False)
    assert not triton_flash.tile_offered("fp32", tensor_cores=False, fp64=True)
    assert triton_flash.tile_offered("any", tensor_cores=False, fp64=True)
    assert not triton_flash.tile_offered("tc", tensor_cores=False, fp64=False)
    assert triton_flash.tile_offered("tc", tensor_cores=True, fp64=False)
    with pytest.raises(ValueError, match="tile kind must be one of"):
        triton_flash.tile_offered("fp16", tensor_cores=True, fp64=False)
    for tiles in (triton_flash.FWD_TILES, triton_backward.DKDV_TILES, triton_backward.DQ_TILES):
        assert {kind for _, _, kind in tiles} <= set(triton_flash.TILE_KINDS)
        fp32 = triton_flash.usable_configs(tiles, 64, tensor_cores=False)
        fp64 = triton_flash.usable_configs(tiles, 64, tensor_cores=False, fp64=True)
        assert fp64 and set(map(id, fp64)) <= set(map(id, fp32))  # fp64 always keeps a tile
    fp64_fwd = triton_flash.usable_configs(triton_flash.FWD_TILES, 64, tensor_cores=False, fp64=True)
    assert all(c.kwargs != {"BLOCK_M": 64, "BLOCK_N": 32} for c in fp64_fwd)  # spilled under Triton 3.6
    # the sm_90 check asks whether a case may pick a tile the same way
    spilled = next(i for i, (c, _, kind) in enumerate(triton_flash.FWD_TILES) if kind == "fp32")
    case = sm90.Case("fwd", spilled, "fp64", 64, False)
    assert not sm90.is_pickable(case)
    assert sm90.is_pickable(sm90.Case("fwd", spilled, "fp32-ieee", 64, False))
