"""The sdpa backend passes SDPA no mask array where the causal alignment needs none."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlib


@pytest.mark.parametrize(
    "t_q, t_k, expect_mask, expect_causal",
    [
        (6, 6, False, True),  # bottom-right with T_q == T_k is top-left: is_causal=True
        (1, 9, False, False),  # one query over a cache sees every key
        (3, 7, True, False),  # otherwise a (T_q, T_k) mask
    ],
)
def test_bottom_right_uses_is_causal_or_nothing_where_it_can(
    monkeypatch, t_q, t_k, expect_mask, expect_causal
):
    rng = np.random.default_rng(0)
    q = torch.from_numpy(rng.standard_normal((2, t_q, 4)))
    k, v = (torch.from_numpy(rng.standard_normal((2, t_k, 4))) for _ in range(2))
    seen = {}
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.update(mask=kwargs.get("attn_mask") is not None, causal=kwargs.get("is_causal"))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    out = attnlib.attention(q, k, v, causal="bottom-right", backend="sdpa")
    assert seen == {"mask": expect_mask, "causal": expect_causal}
    expected = attnlib.attention(q.numpy(), k.numpy(), v.numpy(), causal="bottom-right", backend="numpy")
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-12)
