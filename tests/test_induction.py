"""Chapter 8's induction task: the sequences, where the copied token is, the scores of a head, the
training recipe, and what the trained model does (the induction head forms, ablations, the control)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnlib.learn import induction, recipes  # noqa: E402
from attnlib.learn.induction import InductionData, head_scores, induction_sequences  # noqa: E402
from attnlib.learn.training import classification_loss  # noqa: E402
from attnlib.learn.transformer import next_token_loss, without_head  # noqa: E402


@pytest.fixture(scope="module")
def data():
    return induction_sequences(400, torch.Generator().manual_seed(5))


# --- The sequences -------------------------------------------------------------------------------


def test_the_segment_repeats_token_for_token_later_in_the_sequence(data):
    T = data.tokens.shape[1]
    shortest, longest = induction.SEGMENT_LENGTHS
    assert T == induction.SEQUENCE_LENGTH and data.tokens.max() < induction.VOCAB_SIZE
    for row, first, second, length in zip(data.tokens, data.first, data.second, data.length):
        assert shortest <= length <= longest
        assert second >= first + length and second + length <= T  # after the segment, inside the sequence
        assert torch.equal(row[second:second + length], row[first:first + length])


def test_the_offset_of_the_repeat_varies_so_no_fixed_offset_finds_it(data):
    offsets = (data.second - data.first).tolist()
    assert len(set(offsets)) >= 15
    lengths = data.length.tolist()
    assert set(lengths) == set(range(induction.SEGMENT_LENGTHS[0], induction.SEGMENT_LENGTHS[1] + 1))


def test_the_sequences_are_seeded():
    a, b, c = (induction_sequences(8, torch.Generator().manual_seed(seed)) for seed in (1, 1, 2))
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)


def test_the_repeated_tokens_are_the_repeat_less_its_first_token(data):
    repeated = data.repeated()
    assert torch.equal(repeated.sum(1), data.length - 1)
    for row, second, length in zip(repeated, data.second, data.length):
        assert row[second + 1:second + length].all() and not row[second]


def test_the_source_of_a_query_is_the_token_after_the_earlier_occurrence_of_the_query_token(data):
    source = data.source()
    rows, queries = torch.nonzero(source >= 0, as_tuple=True)
    keys = source[rows, queries]
    assert len(rows) == int((data.length - 1).sum())
    assert torch.all(keys <= queries)  # causal: the copied token is already there
    assert torch.equal(data.tokens[rows, keys], data.tokens[rows, queries + 1])  # it is the next token
    assert torch.equal(data.tokens[rows, keys - 1], data.tokens[rows, queries])  # after the query token


def test_a_perfect_induction_map_and_a_perfect_previous_token_map_score_one(data):
    N, T = data.tokens.shape
    source = data.source()
    perfect_induction = torch.zeros(N, 1, T, T, dtype=torch.float64)
    rows, queries = torch.nonzero(source >= 0, as_tuple=True)
    perfect_induction[rows, 0, queries, source[rows, queries]] = 1.0
    previous = torch.zeros(N, 1, T, T, dtype=torch.float64)
    previous[:, 0, torch.arange(1, T), torch.arange(T - 1)] = 1.0
    induction_score, previous_score = head_scores([perfect_induction, previous], data)
    assert induction_score.shape == (2, 1)
    assert induction_score[0, 0] == 1.0 and previous_score[1, 0] == 1.0
    assert induction_score[1, 0] < 0.2 and previous_score[0, 0] < 0.2


@pytest.mark.parametrize("segment_lengths, length", [((1, 4), 32), ((4, 3), 32), ((4, 17), 32)])
def test_impossible_segment_lengths_are_refused(segment_lengths, length):
    with pytest.raises(ValueError, match=r"segment_lengths=.* must satisfy"):
        induction_sequences(2, torch.Generator(), segment_lengths=segment_lengths, length=length)


def test_the_training_batches_are_the_next_token_loss_of_the_whole_sequence():
    model = recipes.induction_model()
    tokens, targets = induction.next_token_batches(8)(torch.Generator().manual_seed(0))
    assert tokens.shape == targets.shape == (8, induction.SEQUENCE_LENGTH - 1)
    assert torch.equal(tokens[:, 1:], targets[:, :-1])
    whole = torch.cat([tokens, targets[:, -1:]], dim=1)  # (8, T)
    torch.testing.assert_close(classification_loss(model(tokens), targets), next_token_loss(model(whole), whole))


def test_an_untrained_model_does_no_better_than_an_even_guess(data):
    # random logits are not flat: the loss sits a little above log V (chapter 8 says so), never below
    scores = induction.repeat_scores(recipes.induction_model(), data)
    log_v = np.log(induction.VOCAB_SIZE)
    assert log_v <= scores["repeat_loss"] < log_v + 1.0
    assert log_v <= scores["other_loss"] < log_v + 1.0
    assert scores["repeat_accuracy"] < 0.15


def test_training_records_a_snapshot_before_and_every_eval_every_steps():
    short = dict(recipes.INDUCTION, steps=6, eval_every=3, eval_sequences=16)
    model = recipes.induction_model(short)
    history, snapshots = recipes.train_induction(model, short)
    assert len(snapshots) == 3 and history.eval_steps == [3, 6] and len(history.losses) == 6
    first = recipes.induction_model(short)
    for name, value in snapshots[0].items():
        torch.testing.assert_close(value, first.state_dict()[name])
    assert not torch.equal(snapshots[-1]["embedding"], snapshots[0]["embedding"])
    curves = induction.scores_over_training(model, snapshots, recipes.induction_eval_data(short))
    assert curves["repeat_loss"].shape == (3,) and curves["induction"].shape == (3, 2, 2)


# --- The trained model (one training run per test process, ~30 s of CPU) --------------------------


@pytest.fixture(scope="module")
def trained():
    model, history, snapshots = recipes.trained_induction_model()
    return model, history, snapshots, recipes.induction_eval_data()


def test_an_induction_head_forms_in_the_second_layer(trained):
    model, history, snapshots, data = trained
    curves = induction.scores_over_training(model, [snapshots[0], snapshots[-1]], data)
    assert curves["repeat_accuracy"][0] < 0.15 and curves["repeat_accuracy"][1] > 0.6
    assert curves["repeat_loss"][1] < 2.0 < curves["repeat_loss"][0]
    assert curves["other_loss"][1] > 3.0  # random tokens stay unpredictable
    induction_scores, previous_scores = curves["induction"][1], curves["previous"][1]  # (layers, heads)
    assert induction_scores[1].max() > 0.4 and induction_scores[0].max() < 0.2
    assert previous_scores[0].max() > 0.3


def test_ablating_the_induction_head_or_the_previous_token_head_breaks_copying(trained):
    model, _, _, data = trained
    induction_scores, previous_scores = head_scores(model.attention_maps(data.tokens), data)
    def accuracy(ablated):
        return induction.repeat_scores(ablated, data)["repeat_accuracy"]

    full = accuracy(model)
    heads = {1: int(induction_scores[1].argmax()), 0: int(previous_scores[0].argmax())}
    for layer, head in heads.items():
        without_it, without_the_other = (accuracy(without_head(model, layer, h)) for h in (head, 1 - head))
        assert without_it < full - 0.2  # the head the maps single out carries much of the copying ...
        assert without_it < without_the_other  # ... more than the other head of its layer
        without_both = accuracy(without_head(without_head(model, layer, 0), layer, 1))
        assert without_both < 0.2  # and without its layer copying is gone (chapter 8's claim)


def test_a_one_layer_model_copies_far_less_at_the_same_budget():
    one_layer = dict(recipes.INDUCTION, n_layers=1)
    model = recipes.induction_model(one_layer)
    history, _ = recipes.train_induction(model, one_layer)
    _, two_layer_history, _ = recipes.trained_induction_model()
    assert max(history.eval_accuracy) < 0.6  # some guessing among the earlier tokens, no copying ...
    assert two_layer_history.eval_accuracy[-1] > max(history.eval_accuracy) + 0.3  # ... far below two layers
