"""attnlib.learn (chapter 7): the data split, the models' shapes, seeded training, the accuracy goal,
and the feedback of the chapter's exercises."""

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnlib  # noqa: E402
from attnlib.exercises import check, get  # noqa: E402
from attnlib.exercises import ch7_learning  # noqa: E402
from attnlib.learn import coreference, recipes, reversal, training  # noqa: E402
from attnlib.learn.layers import AttentionLayer, PointerHead  # noqa: E402
from attnlib.learn.model import AttentionClassifier  # noqa: E402
from attnlib.multi_head import merge_heads, split_heads  # noqa: E402


@pytest.fixture(scope="module")
def data():
    return coreference.make_coreference_data()


def _nouns_and_adjective(sentence):
    nouns = [w for w in sentence if w in coreference.ANIMALS + coreference.PLACES]
    adjective = sentence[coreference.ADJECTIVE_POSITION]
    return nouns, adjective


# --- The data ---------------------------------------------------------------------------------


def test_no_training_sentence_holds_a_held_out_pair(data):
    for sentence in data.train.sentences:
        nouns, adjective = _nouns_and_adjective(sentence)
        assert len(nouns) == 2
        assert not any((noun, adjective) in data.held_out_pairs for noun in nouns), sentence


def test_every_held_out_sentence_pairs_its_referent_with_a_held_out_adjective(data):
    assert len(data.test) > 0
    for sentence, noun in zip(data.test.sentences, data.test.referents):
        assert (noun, sentence[coreference.ADJECTIVE_POSITION]) in data.held_out_pairs


def test_held_out_sentences_use_only_words_seen_in_training(data):
    seen = {w for s in data.train.sentences for w in s}
    assert {w for s in data.test.sentences for w in s} <= seen
    assert not set(map(tuple, data.train.sentences)) & set(map(tuple, data.test.sentences))


def test_the_books_own_sentences_are_held_out(data):
    held_out = set(map(tuple, data.test.sentences))
    for adjective in ("tired", "wide"):
        assert tuple(coreference.book_sentence(adjective)) in held_out
    assert tuple(coreference.book_sentence("tired")) == attnlib.examples.ANIMAL_SENTENCE


def test_the_referent_is_the_noun_the_adjective_can_describe(data):
    for split in (data.train, data.test):
        positions = split.targets[:, 0, 0]
        for sentence, noun, position, word_id in itertools.islice(
            zip(split.sentences, split.referents, positions, split.word_targets[:, 0, 0]), 0, None, 97
        ):
            _, adjective = _nouns_and_adjective(sentence)
            kind = coreference.ANIMALS if adjective in coreference.ANIMAL_ADJECTIVES else coreference.PLACES
            assert noun in kind and sentence[int(position)] == noun
            assert data.vocab[int(word_id)] == noun
        assert (split.tokens[:, coreference.IT_POSITION] == data.vocab.index("it")).all()


def test_both_templates_put_each_kind_of_noun_in_both_places(data):
    positions = {(s[1] in coreference.ANIMALS, int(p)) for s, p in zip(data.train.sentences,
                                                                      data.train.targets[:, 0, 0])}
    assert positions == {(True, 1), (True, 5), (False, 1), (False, 5)}


def test_the_split_is_seeded(data):
    again = coreference.make_coreference_data(seed=0)
    other = coreference.make_coreference_data(seed=1)
    assert again.held_out_pairs == data.held_out_pairs and torch.equal(again.test.tokens, data.test.tokens)
    assert other.held_out_pairs != data.held_out_pairs


def test_bad_split_arguments_and_words_are_refused(data):
    with pytest.raises(ValueError, match="held_out_fraction"):
        coreference.make_coreference_data(held_out_fraction=1.5)
    with pytest.raises(ValueError, match="zebra"):
        data.encode([["The", "zebra"]])
    with pytest.raises(ValueError, match="adjective"):
        coreference.referent("dog", "road", "purple")


def test_reversal_targets_read_the_mirrored_and_the_previous_digit():
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    answers = reversal.targets_for(tokens)  # (1, 5, 2)
    assert answers[0, :, 0].tolist() == [5, 1, 4, 1, 3]
    assert answers[0, :, 1].tolist() == [5, 3, 1, 4, 1]


# --- The models -------------------------------------------------------------------------------


def test_a_classifier_reads_every_answer_at_every_position():
    model = AttentionClassifier(10, 8, 16, 2, 1, 10, n_targets=2, seed=0)
    tokens = torch.randint(10, (3, 8), generator=torch.Generator().manual_seed(0))
    assert model(tokens).shape == (3, 8, 2, 10)
    maps = model.attention_maps(tokens)
    assert [m.shape for m in maps] == [(3, 2, 8, 8)]
    torch.testing.assert_close(maps[0].sum(-1), torch.ones(3, 2, 8, dtype=torch.float64))


def test_a_classifier_can_read_at_chosen_positions_only():
    model = AttentionClassifier(20, 12, 8, 2, 2, 5, read_at=[7], seed=0)
    assert model(torch.zeros(4, 12, dtype=torch.long)).shape == (4, 1, 1, 5)
    assert len(model.attention_maps(torch.zeros(4, 12, dtype=torch.long))) == 2


def test_a_pointer_answers_with_one_score_per_token_and_its_softmax_is_its_attention(data):
    model = recipes.coreference_model()
    tokens = data.test.tokens[:5]
    logits = model(tokens)  # (5, 1, 1, 12)
    assert logits.shape == (5, 1, 1, coreference.SENTENCE_LENGTH)
    maps = model.attention_maps(tokens)
    assert [tuple(m.shape) for m in maps] == [(5, 2, 12, 12), (5, 1, 12, 12)]
    pointer_row = maps[-1][:, 0, coreference.IT_POSITION]  # (5, 12)
    torch.testing.assert_close(torch.softmax(logits[:, 0, 0], dim=-1), pointer_row)


def test_an_attention_layer_is_x_plus_its_heads_mixing_the_values():
    generator = torch.Generator().manual_seed(3)
    layer = AttentionLayer(12, 3, generator)
    x = torch.randn(2, 5, 12, generator=generator, dtype=torch.float64)
    weights = layer.weights(x)  # (2, 3, 5, 5)
    v = split_heads(x @ layer.w_v, 3)  # (2, 3, 5, 4)
    expected = x + merge_heads(weights @ v) @ layer.w_o
    torch.testing.assert_close(layer(x), expected)


def test_bad_model_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="n_heads=3 must divide d_model=8"):
        AttentionLayer(8, 3, torch.Generator())
    model = AttentionClassifier(10, 8, 8, 2, 1, 10, seed=0)
    with pytest.raises(ValueError, match=r"T <= max_len=8, got shape \(2, 9\)"):
        model(torch.zeros(2, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"got shape \(8,\)"):
        model(torch.zeros(8, dtype=torch.long))


def test_building_a_model_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    recipes.coreference_model()
    assert torch.equal(torch.rand(3), before)


def test_one_step_sends_a_gradient_to_every_parameter(data):
    model = recipes.coreference_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    training.training_step(model, optimizer, data.train.tokens[:32], data.train.targets[:32])
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_a_pointer_head_has_no_values():
    head = PointerHead(8, 4, torch.Generator().manual_seed(0))
    assert [name for name, _ in head.named_parameters()] == ["w_q", "w_k"]


# --- Training ---------------------------------------------------------------------------------


def _short_run(data, seed, steps=20):
    recipe = dict(recipes.COREFERENCE, seed=seed, steps=steps)
    model = recipes.coreference_model(recipe)
    history = recipes.train_coreference(data, model, recipe)
    return model, history


def test_two_runs_with_one_seed_give_identical_weights(data):
    first, first_history = _short_run(data, seed=0)
    second, second_history = _short_run(data, seed=0)
    assert first_history.losses == second_history.losses
    for (name, a), (_, b) in zip(first.named_parameters(), second.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    other, _ = _short_run(data, seed=1)
    assert not torch.equal(first.pointer.w_q, other.pointer.w_q)


def test_training_restores_the_thread_count(data):
    outer = torch.get_num_threads()
    torch.set_num_threads(3)  # not the 1 that training uses (make test runs with 1)
    try:
        _short_run(data, seed=0, steps=2)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(outer)


def test_a_short_run_reaches_the_accuracy_goal_on_held_out_sentences(data):
    model, history = _short_run(data, seed=0, steps=150)
    assert history.eval_accuracy[-1] >= 0.95
    assert history.eval_accuracy[0] < 0.95  # it was learned, not there from the start
    pointer = model.attention_maps(data.test.tokens)[-1][:, 0, coreference.IT_POSITION]  # (N, 12)
    on_right = pointer[torch.arange(len(data.test)), data.test.targets[:, 0, 0]]
    assert on_right.mean() > 0.9


def test_the_reversal_heads_take_one_question_each():
    model = recipes.reversal_model()
    tokens, answers = reversal.random_sequences(500, torch.Generator().manual_seed(1))
    history = recipes.train_reversal(model, tokens, answers, dict(recipes.REVERSAL, steps=200))
    assert history.eval_accuracy[-1] >= 0.95
    mean_maps = model.attention_maps(tokens)[0].mean(0)  # (H, T, T)
    queries = torch.arange(reversal.SEQUENCE_LENGTH)
    on_source = torch.stack([mean_maps[:, queries, s].mean(-1) for s in reversal.source_positions()])
    assert sorted(on_source.argmax(dim=1).tolist()) == [0, 1]
    assert (on_source.max(dim=1).values > 0.9).all()


# --- The exercises' feedback ------------------------------------------------------------------


def test_the_swap_exercise_states_what_the_trained_model_does(data):
    sentence_pairs = [(ch7_learning.SWAP_NOUNS["animal"], ch7_learning.SWAP_ADJECTIVES[0]),
                      (ch7_learning.SWAP_NOUNS["place"], ch7_learning.SWAP_ADJECTIVES[1])]
    assert all(pair in data.held_out_pairs for pair in sentence_pairs)
    assert ch7_learning.where_it_looks(ch7_learning.SWAP_ADJECTIVES[0]) == ("lazy", "dog")
    assert get("ch7.swap_adjective").expected() == "a"


def test_predicting_that_the_first_layer_points_at_the_noun_explains_why_it_cannot():
    result = check("ch7.swap_adjective", "b")
    assert not result.passed
    assert "same vector in every sentence" in result.message


def test_a_loop_that_clears_the_gradients_once_gets_the_accumulation_hint():
    source = ch7_learning._SHIPPED_NO_ZERO_GRAD.replace(
        "    losses = []\n", "    losses = []\n    optimizer.zero_grad()  # once, before the loop\n")
    result = check("ch7.fix_zero_grad", attnlib.exercises.core.run_code(source, "train"))
    assert result.status == "failed"
    assert "call optimizer.zero_grad() at the start of every step" in result.message
    assert "hidden case 1 of 2" in result.message


def test_the_unchanged_buggy_loop_is_not_solved_yet():
    starter = get("ch7.fix_zero_grad").starter.replace("# d loss", "# gradient of the loss, d loss")
    result = check("ch7.fix_zero_grad", attnlib.exercises.core.run_code(starter, "train"))
    assert result.status == "not solved"


def test_a_loop_that_never_updates_is_told_why():
    source = ch7_learning._FIXED.replace("        optimizer.step()\n", "")
    result = check("ch7.fix_zero_grad", attnlib.exercises.core.run_code(source, "train"))
    assert not result.passed
    assert "never move" in result.message


def test_counting_weights_per_head_gets_the_shared_weights_hint():
    d, heads, layers = (ch7_learning.BIGGER[k] for k in ("d_model", "n_heads", "n_layers"))
    per_head = get("ch7.parameter_count").expected() + layers * 4 * d * d * (heads - 1)
    result = check("ch7.parameter_count", per_head)
    assert "the heads share" in result.message
    assert str(get("ch7.parameter_count").expected()) not in result.message


def test_the_identity_map_is_not_the_reversal_map():
    result = check("ch7.reversal_map", lambda T: np.eye(T))
    assert "every token looks at itself" in result.message
    assert check("ch7.reversal_map", lambda T: np.fliplr(np.eye(T))).passed
    assert check("ch7.reversal_map", lambda T: torch.eye(T).flip(0)).passed


def test_loss_along_gradient_falls_with_the_slope_of_the_gradient_and_restores_the_weights():
    import torch

    from attnlib.learn import recipes
    from attnlib.learn.coreference import make_coreference_data
    from attnlib.learn.training import classification_loss, loss_along_gradient

    data = make_coreference_data()
    model = recipes.coreference_model()
    tokens, targets = data.train.tokens[:32], data.train.targets[:32]
    before = [p.detach().clone() for p in model.parameters()]
    h = 1e-6
    losses, norm = loss_along_gradient(model, tokens, targets, [0.0, h])
    assert losses[0] == pytest.approx(classification_loss(model(tokens), targets).item(), rel=1e-12)
    assert (losses[1] - losses[0]) / h == pytest.approx(-norm, rel=1e-4)  # the directional derivative
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_loss_along_gradient_measured_on_other_sentences_moves_along_the_batch_gradient(data):
    from attnlib.learn import recipes
    from attnlib.learn.training import classification_loss, loss_along_gradient

    model = recipes.coreference_model()
    batch = data.train.tokens[:32], data.train.targets[:32]
    other = data.train.tokens[100:164], data.train.targets[100:164]

    def gradient(tokens, targets):
        model.zero_grad()
        classification_loss(model(tokens), targets).backward()
        flat = torch.cat([p.grad.flatten() for p in model.parameters()])
        model.zero_grad()
        return flat

    g_batch, g_other = gradient(*batch), gradient(*other)
    h = 1e-6
    losses, norm = loss_along_gradient(model, *batch, [0.0, h], measured_on=other)
    assert norm == pytest.approx(float(g_batch.norm()), rel=1e-12)
    assert losses[0] == pytest.approx(classification_loss(model(other[0]), other[1]).item(),
                                      rel=1e-12)
    # the other sentences' loss changes at the rate of their gradient along the batch's
    expected_slope = -float(g_other @ g_batch) / norm
    assert (losses[1] - losses[0]) / h == pytest.approx(expected_slope, rel=1e-3, abs=1e-6)
    own, _ = loss_along_gradient(model, *batch, [0.0, h])
    assert own != losses  # the batch's own curve is a different one


@pytest.mark.parametrize("distances, measured_on, message", [
    ([], None, "distances is empty"),
    ([0.0], "mismatch", "measured_on: 5 sequences of tokens but 4 targets"),
])
def test_loss_along_gradient_rejects_bad_input(data, distances, measured_on, message):
    from attnlib.learn import recipes
    from attnlib.learn.training import loss_along_gradient

    model = recipes.coreference_model()
    if measured_on == "mismatch":
        measured_on = (data.train.tokens[:5], data.train.targets[:4])
    with pytest.raises(ValueError, match=message):
        loss_along_gradient(model, data.train.tokens[:8], data.train.targets[:8], distances,
                            measured_on=measured_on)
