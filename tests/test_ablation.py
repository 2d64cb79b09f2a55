"""Ablations of chapter 7's pointer model (attnlib.learn.ablation): each removes exactly what it says."""

import pytest

torch = pytest.importorskip("torch")

from attnlib.learn import ablation, coreference, recipes  # noqa: E402
from attnlib.learn.layers import AttentionLayer  # noqa: E402
from attnlib.learn.training import accuracy  # noqa: E402
from attnlib.multi_head import split_heads  # noqa: E402
from attnlib.projections import project_qkv  # noqa: E402


@pytest.fixture(scope="module")
def layer_and_x():
    generator = torch.Generator().manual_seed(0)
    layer = AttentionLayer(8, 2, generator)
    x = torch.randn(3, 5, 8, generator=generator, dtype=torch.float64)
    return layer, x


def test_with_nothing_removed_it_is_the_layer(layer_and_x):
    layer, x = layer_and_x
    torch.testing.assert_close(ablation.layer_output(layer, x), layer(x).detach(), rtol=1e-12, atol=1e-12)


def test_zeroing_a_head_changes_only_the_named_positions_by_that_heads_share(layer_and_x):
    layer, x = layer_and_x
    full = ablation.layer_output(layer, x)
    ablated = ablation.layer_output(layer, x, zero_head=1, at=[2])
    others = [0, 1, 3, 4]
    torch.testing.assert_close(ablated[:, others], full[:, others], rtol=0, atol=0)
    # what head 1 added at position 2: its weights times its values, through its rows of W_O
    _, _, v = project_qkv(x, layer.w_q, layer.w_k, layer.w_v)
    row, values = layer.weights(x)[:, 1, 2], split_heads(v, 2)[:, 1]  # (B, T), (B, T, d_head)
    head_1 = torch.einsum("bt,btd->bd", row, values)  # (B, d_head)
    torch.testing.assert_close(full[:, 2] - ablated[:, 2], (head_1 @ layer.w_o[4:]).detach(),
                               rtol=1e-12, atol=1e-12)


def test_a_blocked_key_gets_no_weight_and_the_rows_renormalise(layer_and_x):
    layer, x = layer_and_x
    blocked = ablation.layer_output(layer, x, blocked=[([0, 3], 1)])
    weights = layer.weights(x).detach()  # (B, H, T, T)
    renormalised = weights.clone()
    renormalised[:, :, [0, 3], 1] = 0.0
    renormalised /= renormalised.sum(-1, keepdim=True)
    _, _, v = project_qkv(x, layer.w_q, layer.w_k, layer.w_v)
    heads = renormalised @ split_heads(v, 2)  # (B, H, T, d_head)
    expected = x + heads.transpose(1, 2).flatten(-2) @ layer.w_o
    torch.testing.assert_close(blocked, expected.detach(), rtol=1e-12, atol=1e-12)
    untouched = [1, 2, 4]
    torch.testing.assert_close(blocked[:, untouched], ablation.layer_output(layer, x)[:, untouched])


def test_bad_ablations_are_refused_with_the_argument_named(layer_and_x):
    layer, x = layer_and_x
    with pytest.raises(ValueError, match="zero_head=2"):
        ablation.layer_output(layer, x, zero_head=2, at=[0])
    with pytest.raises(ValueError, match="at=\\[7\\]"):
        ablation.layer_output(layer, x, zero_head=0, at=[7])


def test_chapter_7s_adjective_reaches_the_pointer_through_it_not_through_the_nouns():
    data, model, _ = recipes.trained_coreference_model()
    tokens, targets = data.test.tokens, data.test.targets
    full = ablation.pointer_accuracy(model, tokens, targets)
    assert full == accuracy(model, tokens, targets) == 1.0
    it, adjective = coreference.IT_POSITION, coreference.ADJECTIVE_POSITION
    without_head_0_at_it = ablation.pointer_accuracy(model, tokens, targets, zero_head=0, at=[it])
    assert without_head_0_at_it < 0.6  # about a coin toss between the two nouns
    nouns_blocked = ablation.pointer_accuracy(model, tokens, targets,
                                              blocked=[(coreference.NOUN_POSITIONS, adjective)])
    assert nouns_blocked > 0.99
