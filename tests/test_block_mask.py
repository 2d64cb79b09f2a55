"""attnlib.block_mask against torch's create_block_mask, and the tiled backend's block skipping."""

import numpy as np
import pytest
import torch

import attnlib
from attnlib import mods
from attnlib.errors import ShapeError

flex = pytest.importorskip("torch.nn.attention.flex_attention")

DOC = np.repeat([0, 1, 2, 3], [40, 70, 10, 33])  # T = 153: ragged last block at block size 16
T = len(DOC)
MASK_MODS = {
    "causal": mods.causal(),
    "sliding_window": mods.sliding_window(24),
    "document": mods.document(DOC),
    "packed_causal": mods.and_masks(mods.causal(), mods.document(DOC)),
    "prefix_lm": mods.prefix_lm(37),
    "attention_sinks": mods.attention_sinks(4, 20),
}


def torch_block_mask(mask_mod, B, H, t_q, t_k, block_size):
    def as_torch(b, h, q_idx, kv_idx):  # the same rule, on the scalar tensors torch's vmap passes
        return mask_mod(b, h, q_idx, kv_idx)

    return flex.create_block_mask(as_torch, B, H, t_q, t_k, device="cpu", BLOCK_SIZE=block_size)


@pytest.mark.parametrize("name", list(MASK_MODS))
@pytest.mark.parametrize("t_q, t_k, block_size", [(T, T, 16), (128, T, 32)])
def test_same_lists_as_torch_create_block_mask(name, t_q, t_k, block_size):
    mask_mod = MASK_MODS[name]
    ours = attnlib.block_mask(mask_mod, None, None, t_q, t_k, block_size=block_size)
    theirs = torch_block_mask(mask_mod, None, None, t_q, t_k, block_size)
    for attr in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        np.testing.assert_array_equal(getattr(ours, attr), getattr(theirs, attr).numpy(), err_msg=attr)
    for count, indices in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices"),
                           ("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")):
        n = getattr(ours, count)
        mine, other = getattr(ours, indices), getattr(theirs, indices).numpy()
        for idx in np.ndindex(*n.shape):  # the listed blocks, in torch's order
            np.testing.assert_array_equal(mine[idx][: n[idx]], other[idx][: n[idx]], err_msg=f"{indices}{idx}")
    if t_q % block_size == 0 and t_k % block_size == 0:  # torch's sparsity() counts padding otherwise
        assert ours.sparsity() == pytest.approx(theirs.sparsity(), abs=1e-9)


def test_per_head_and_batch_block_mask_and_sparsity():
    prefix = mods.prefix_lm(np.array([0, 64]))  # batch entry 0: causal; 1: a 64-key prefix
    bm = attnlib.block_mask(prefix, 2, None, 128, 128, block_size=32)
    assert bm.shape == (2, 1, 128, 128)
    np.testing.assert_array_equal(bm.full_kv_num_blocks[:, 0], [[0, 1, 2, 3], [2, 2, 2, 3]])
    np.testing.assert_array_equal(bm.kv_num_blocks[:, 0], [[1, 1, 1, 1], [0, 0, 1, 1]])
    dense = bm.to_dense()
    assert dense.shape == (2, 1, 4, 4)
    assert bm.sparsity() == pytest.approx(100 * (1 - dense.mean()))
    assert bm.sparsity() == pytest.approx(100 * (1 - (10 + 11) / 32))  # 10 + 11 of 32 tiles computed


class Recorder:
    """A mask_mod that records the (query, key) ranges it is called on."""

    def __init__(self, mask_mod):
        self.mask_mod, self.calls = mask_mod, []

    def __call__(self, b, h, q_idx, kv_idx):
        self.calls.append((int(np.min(q_idx)), int(np.max(q_idx)), int(np.min(kv_idx)), int(np.max(kv_idx))))
        return self.mask_mod(b, h, q_idx, kv_idx)


def test_tiled_visits_only_listed_blocks_and_skips_mask_mod_in_full_ones():
    recorder = Recorder(mods.and_masks(mods.causal(), mods.document(DOC)))
    bm = attnlib.block_mask(recorder, None, None, T, T, block_size=16)
    recorder.calls.clear()
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, T, 8)) for _ in range(3))
    out = attnlib.attention(q, k, v, block_mask=bm, backend="tiled", empty_rows="raise")
    called = {(q0 // 16, k0 // 16) for q0, _, k0, _ in recorder.calls}
    partial = {tuple(int(i) for i in ij) for ij in np.argwhere(bm.partial[0, 0])}
    assert called == partial  # the mask_mod ran in every partial block and nowhere else
    assert bm.sparsity() > 50
    expected = attnlib.attention(q, k, v, mask_mod=recorder.mask_mod)
    np.testing.assert_allclose(out, expected, atol=1e-13, rtol=0)


@pytest.mark.parametrize("name", list(MASK_MODS))
def test_tiled_with_block_mask_forward_and_backward(name):
    rng = np.random.default_rng(1)
    q, k, v, d_out = (rng.standard_normal((2, 2, T, 8)) for _ in range(4))
    bm = attnlib.block_mask(MASK_MODS[name], None, 2, T, T, block_size=32)
    kw = dict(score_mod=mods.soft_cap(1.5))
    out = attnlib.attention(q, k, v, block_mask=bm, backend="tiled", **kw)
    expected = attnlib.attention(q, k, v, mask_mod=MASK_MODS[name], **kw)
    np.testing.assert_allclose(out, expected, atol=1e-13, rtol=0)
    grads = attnlib.attention_backward(q, k, v, d_out, block_mask=bm, backend="tiled", **kw)
    expected = attnlib.attention_backward(q, k, v, d_out, mask_mod=MASK_MODS[name], **kw)
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g, e, atol=1e-12, rtol=0)


def test_block_mask_on_the_other_backends_applies_its_mask_mod():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, 64, 4)) for _ in range(3))
    bm = attnlib.block_mask(MASK_MODS["sliding_window"], 1, 2, 64, 64, block_size=16)
    expected = attnlib.attention(q, k, v, causal=True, window=24)
    for backend in ("numpy", "loop", "torch", "sdpa"):
        args = (q, k, v) if backend in ("numpy", "loop") else tuple(torch.from_numpy(x) for x in (q, k, v))
        out = attnlib.attention(*args, block_mask=bm, backend=backend)
        np.testing.assert_allclose(np.asarray(out), expected, atol=1e-13, rtol=0, err_msg=backend)


def test_block_mask_errors():
    q = np.zeros((2, 3, 64, 4))
    bm = attnlib.block_mask(mods.causal(), 1, 2, 64, 64, block_size=16)
    with pytest.raises(ShapeError, match=r"made for \(B, H, T_q, T_k\) = \(1, 2, 64, 64\).*H=3"):
        attnlib.attention(q, q, q, block_mask=bm)
    with pytest.raises(ValueError, match="not the one block_mask was made from"):
        attnlib.attention(q[:, :2], q[:, :2], q[:, :2], block_mask=bm, mask_mod=mods.causal())
    with pytest.raises(TypeError, match="torch BlockMask"):
        attnlib.attention(q, q, q, block_mask=flex.create_block_mask(lambda b, h, i, j: i >= j, None, None, 64, 64,
                                                                      device="cpu"))
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        attnlib.block_mask(mods.causal(), 1, 1, 64, 64, block_size=0)
    with pytest.raises(TypeError, match="mask_mod must be a function"):
        attnlib.block_mask("causal", 1, 1, 64, 64)
    with pytest.raises(ShapeError, match="mask_mod returned shape"):
        attnlib.block_mask(lambda b, h, i, j: np.ones((3, 3), dtype=bool), 1, 1, 64, 64, block_size=16)
