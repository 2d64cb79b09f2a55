"""attnlib.learn.gpt_heads: the induction keys, the head scores and the mean ablation of the GPT's heads."""

import pytest
import torch

from attnlib.learn import gpt, gpt_heads


def test_repeat_targets_point_one_past_the_earlier_copy():
    tokens = torch.tensor([[5, 6, 7, 5, 6, 7]])  # half = 3
    targets = gpt_heads.repeat_targets(tokens)[0]
    pairs = {tuple(p) for p in torch.nonzero(targets).tolist()}
    assert pairs == {(3, 1), (4, 2)}  # query 3 (a copy of 0) looks at 1; query 4 at 2


def test_text_targets_match_the_last_two_characters():
    tokens = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2]])  # "ab c ab d ab"
    targets = gpt_heads.text_targets(tokens)[0]
    pairs = {tuple(p) for p in torch.nonzero(targets).tolist()}
    # query 4 (b after a): key 2 (after a, b at 0, 1); query 7: keys 2 and 5
    assert pairs == {(4, 2), (7, 2), (7, 5)}
    assert not targets.triu().any()  # earlier keys only


def test_uniform_induction_is_the_share_of_matching_keys():
    tokens = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2]])
    targets = gpt_heads.text_targets(tokens)
    assert gpt_heads.uniform_induction(targets) == pytest.approx((1 / 5 + 2 / 8) / 2)


class _OneHeadMaps(torch.nn.Module):
    """A stand-in model whose single head looks only at the previous token (and token 0 at itself)."""

    def attention_maps(self, tokens):
        n, T = tokens.shape
        m = torch.zeros(n, 1, T, T)
        m[:, 0, 0, 0] = 1
        i = torch.arange(1, T)
        m[:, 0, i, i - 1] = 1
        return [m]


def test_head_scores_of_a_previous_token_head():
    tokens = torch.tensor([[5, 6, 7, 5, 6, 7]])
    previous, induction = gpt_heads.head_scores(_OneHeadMaps(), tokens, gpt_heads.repeat_targets(tokens))
    assert previous.tolist() == [[1.0]]
    assert induction.tolist() == [[0.0]]  # key i + 1 - half is never i - 1 here


@pytest.fixture(scope="module")
def seed_0():
    model, tokenizer, _ = gpt.load(gpt.stored_seeds()[0])
    return model, tokenizer


def test_mean_ablation_of_the_stored_models_previous_character_head_costs_loss(seed_0):
    model, tokenizer = seed_0
    heldout = gpt.heldout_windows()[:64, :64]
    result = gpt_heads.measure(model, tokenizer.vocab, heldout, n_repeated=32)
    top = int(result["previous_text"].argmax())
    assert result["previous_text"].max() > 0.5  # a previous-character head exists
    assert result["heldout"].flatten()[top] > 0.1  # and removing it costs loss
    assert result["heldout"].shape == (2, 4)


def test_ablation_needs_windows_of_one_length(seed_0):
    model, _ = seed_0
    with pytest.raises(ValueError, match="same length T"):
        gpt_heads.ablation_deltas(model, torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 6, dtype=torch.long))
