"""Chapter 8's evidence: running a model with heads replaced, ablations, patching, and the stored seed sweep."""

import copy

import pytest
import torch

from attnlib.learn import induction, patching, recipes, sweep
from attnlib.learn.transformer import without_head


@pytest.fixture(scope="module")
def small():
    """A briefly trained two-block model and 64 held-out sequences (cheap; no circuit needed)."""
    recipe = dict(recipes.INDUCTION, steps=30)
    model = recipes.induction_model(recipe)
    recipes.train_induction(model, recipe)
    data = induction.induction_sequences(64, torch.Generator().manual_seed(3))
    return model, data


def test_run_with_heads_without_replacement_is_the_model(small):
    model, data = small
    logits, outputs = patching.run_with_heads(model, data.tokens)
    assert torch.equal(logits, model(data.tokens))
    assert set(outputs) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert outputs[(0, 1)].shape == (64, induction.SEQUENCE_LENGTH, 16)


def test_zero_replacement_equals_zeroing_w_o(small):
    model, data = small
    n, t = data.tokens.shape
    zeros = torch.zeros(n, t, 16, dtype=torch.float64)
    logits, _ = patching.run_with_heads(
        model, data.tokens, {(1, 0): (zeros, torch.ones(n, t, dtype=torch.bool))}
    )
    assert torch.allclose(logits, without_head(model, 1, 0)(data.tokens), atol=1e-12)


def test_replacement_only_where_asked(small):
    model, data = small
    _, clean = patching.run_with_heads(model, data.tokens)
    where = torch.zeros(data.tokens.shape, dtype=torch.bool)
    where[:, 5] = True
    _, patched = patching.run_with_heads(
        model, data.tokens, {(0, 0): (torch.full((16,), 7.0, dtype=torch.float64), where)}
    )
    assert torch.all(patched[(0, 0)][:, 5] == 7.0)
    assert torch.equal(patched[(0, 0)][:, :5], clean[(0, 0)][:, :5])
    assert torch.equal(patched[(0, 1)], clean[(0, 1)])  # block 0's other head is untouched
    assert not torch.equal(patched[(1, 0)][:, 5:], clean[(1, 0)][:, 5:])  # block 1 sees the change


def test_bad_head_is_named(small):
    model, data = small
    with pytest.raises(ValueError, match="head 2 of block 0"):
        patching.run_with_heads(model, data.tokens, {(0, 2): (0.0, torch.ones(1, dtype=torch.bool))})


def test_mean_ablation_uses_the_mean(small):
    model, data = small
    means = patching.head_means(model, data.tokens)
    _, outputs = patching.run_with_heads(model, data.tokens)
    assert torch.allclose(means[(1, 1)], outputs[(1, 1)].mean(0))
    result = patching.ablation_accuracies(model, data)
    assert set(result) == {"none"} | {
        (kind, l, h) for kind in ("zero", "mean") for l in (0, 1) for h in (0, 1)
    }
    assert all(0 <= v <= 1 for v in result.values())


def test_corrupt_first_copy_changes_exactly_the_first_copy():
    data = induction.induction_sequences(200, torch.Generator().manual_seed(0))
    corrupted = patching.corrupt_first_copy(data, torch.Generator().manual_seed(1))
    position = torch.arange(data.tokens.shape[1])
    in_first = (position >= data.first[:, None]) & (position < (data.first + data.length)[:, None])
    assert torch.all(corrupted.tokens[in_first] != data.tokens[in_first])
    assert torch.equal(corrupted.tokens[~in_first], data.tokens[~in_first])
    assert int(corrupted.tokens.max()) < induction.VOCAB_SIZE and int(corrupted.tokens.min()) >= 0


def test_patching_moves_the_copy_in_the_trained_model():
    """The chapter's trained model: the previous-token head's output carries what the induction head matches."""
    model, _, _ = recipes.trained_induction_model()
    data = recipes.induction_eval_data()
    induction_scores, previous_scores = induction.head_scores(model.attention_maps(data.tokens), data)
    previous = int(previous_scores[0].argmax())
    result = patching.patching_experiment(
        model, data, previous, 1 - previous, torch.Generator().manual_seed(5)
    )
    follows = result["follows_patch"]
    assert follows["previous"] > 0.5 > follows["none"] + 0.3  # patched in, the copy follows the patch
    assert follows["other"] < follows["none"] + 0.1  # the other head carries nothing the copy needs
    patched_out = result["clean_accuracy_patched"]
    assert patched_out["previous"] < result["clean_accuracy"] - 0.5 < patched_out["other"]


# The stored sweep


@pytest.fixture(scope="module")
def stored():
    return sweep.load()


def test_stored_sweep_is_stamped_and_complete(stored):
    stamp = stored["stamp"]
    assert len(stamp["git_commit"].split("-")[0]) == 40
    assert stamp["command"].startswith("python -m attnlib.learn.sweep")
    for field in ("date_utc", "torch_version", "cpu", "load_average"):
        assert stamp[field]
    assert stored["recipe"] == {
        k: (list(v) if isinstance(v, tuple) else v) for k, v in recipes.INDUCTION.items()
    }
    seeds = {run["seed"] for run in stored["runs"]}
    assert len(seeds) >= 8
    for seed in seeds:
        layers = sorted(run["n_layers"] for run in stored["runs"] if run["seed"] == seed)
        assert layers == [1, 2]  # the model and its one-block control, for every seed
    for run in stored["runs"]:
        assert run["curves"]["step"][0] == 0 and run["curves"]["step"][-1] == run["steps"]
        assert run["steps"] >= stored["budget"]
        if run["n_layers"] == 1:
            assert run["steps"] >= 2 * stored["budget"]  # the control trains well past the budget


def test_stored_sweep_reproduces(stored):
    """Seed 1 retrained for 100 steps gives the stored curve's first points."""
    run = next(r for r in stored["runs"] if r["seed"] == 1 and r["n_layers"] == 2)
    fresh = sweep.train_seed(recipes.INDUCTION, 1, 100, experiments=False)
    stored_curves = run["curves"]
    for i, step in enumerate(fresh["curves"]["step"]):
        j = stored_curves["step"].index(step)
        assert abs(fresh["curves"]["repeat_loss"][i] - stored_curves["repeat_loss"][j]) < 2e-3
        for a, b in zip(fresh["curves"]["induction"][i], stored_curves["induction"][j]):
            assert abs(a - b) < 2e-3


def test_formation_steps_follow_their_definition():
    run = {
        "n_layers": 2,
        "n_heads": 2,
        "steps": 150,
        "curves": {
            "step": [0, 50, 100, 150],
            "repeat_accuracy": [0.05, 0.2, 0.6, 0.9],
            "previous": [
                [0.1, 0.1, 0.1, 0.1],
                [0.1, 0.35, 0.1, 0.1],
                [0.1, 0.5, 0.1, 0.1],
                [0.1, 0.5, 0.2, 0.1],
            ],
            "induction": [[0.0] * 4, [0.0, 0.0, 0.2, 0.1], [0.0, 0.0, 0.1, 0.4], [0.9, 0.9, 0.5, 0.6]],
        },
    }
    assert sweep.formed_at(run, "previous", 0) == 50
    assert sweep.formed_at(run, "induction", 1) == 100  # layer 0's 0.9 at step 150 does not count
    assert sweep.circuit_formed_at(run) == 100
    run["curves"]["repeat_accuracy"][2] = 0.4
    assert sweep.circuit_formed_at(run) == 150
    assert sweep.accuracy_at(run, 120) == 0.4


def test_summary_has_every_seed(stored):
    rows = sweep.summary(stored)
    assert [row["seed"] for row in rows] == sorted({run["seed"] for run in stored["runs"]})
    for row in rows:
        assert {"circuit_at", "accuracy_budget", "control_budget", "control_end"} <= set(row)
