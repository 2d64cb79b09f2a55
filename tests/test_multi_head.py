import numpy as np
import pytest
import torch

import attnlib
from attnlib.errors import ShapeError


def _torch_mha_and_attnlib_weights(d_model, n_heads, seed=0):
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(d_model, n_heads, bias=False, batch_first=True).double()
    w_in = mha.in_proj_weight.detach()  # (3 d_model, d_model), rows: q, k, v
    w_q, w_k, w_v = (w_in[i * d_model:(i + 1) * d_model].T.contiguous() for i in range(3))
    w_o = mha.out_proj.weight.detach().T.contiguous()
    return mha, (w_q, w_k, w_v, w_o)


@pytest.mark.parametrize("n_heads", [1, 2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["torch", "sdpa", "numpy", "loop"])
def test_multi_head_attention_matches_torch_nn_multihead_attention(n_heads, causal, backend):
    d_model, T = 8, 6
    mha, weights = _torch_mha_and_attnlib_weights(d_model, n_heads)
    x = torch.randn(2, T, d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ignore = ~torch.ones(T, T, dtype=torch.bool).tril() if causal else None  # MHA: True = ignore
    expected, _ = mha(x, x, x, attn_mask=ignore, need_weights=False)
    if backend in ("numpy", "loop"):
        got = attnlib.multi_head_attention(x.numpy(), *(w.numpy() for w in weights), n_heads,
                                           causal=causal, backend=backend)
        np.testing.assert_allclose(got, expected.detach().numpy(), atol=1e-12)
    else:
        got = attnlib.multi_head_attention(x, *weights, n_heads, causal=causal, backend=backend)
        torch.testing.assert_close(got, expected.detach())


def test_head_h_uses_columns_h_dk_to_h_plus_one_dk():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 6))
    w_q, w_k, w_v = (rng.standard_normal((6, 6)) for _ in range(3))
    w_o = np.eye(6)  # the output is the concatenated heads themselves
    out = attnlib.multi_head_attention(x, w_q, w_k, w_v, w_o, n_heads=3)
    for h in range(3):
        cols = slice(2 * h, 2 * h + 2)
        head = attnlib.attention(x @ w_q[:, cols], x @ w_k[:, cols], x @ w_v[:, cols])
        np.testing.assert_allclose(out[:, cols], head, atol=1e-12)


def test_split_and_merge_heads_are_inverse():
    x = np.arange(2 * 5 * 12, dtype=float).reshape(2, 5, 12)
    heads = attnlib.split_heads(x, 4)
    assert heads.shape == (2, 4, 5, 3)
    np.testing.assert_array_equal(heads[1, 2, 3], x[1, 3, 6:9])
    np.testing.assert_array_equal(attnlib.merge_heads(heads), x)


def test_heads_that_do_not_divide_the_width_are_refused():
    x = np.zeros((3, 6))
    w = np.zeros((6, 6))
    with pytest.raises(ShapeError, match="n_heads=4"):
        attnlib.multi_head_attention(x, w, w, w, w, n_heads=4)
    with pytest.raises(ShapeError, match="w_o"):
        attnlib.multi_head_attention(x, w, w, w, np.zeros((5, 6)), n_heads=2)
