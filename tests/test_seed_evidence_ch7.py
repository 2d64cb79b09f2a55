"""Chapter 7's stored seed runs (attnlib.learn.ch7_seeds): the file is complete, stamped, reproducible,
and the summary the chapter quotes is what the file says."""

import re

import pytest

torch = pytest.importorskip("torch")

from attnlib.learn import ablation, ch7_seeds, recipes, reversal  # noqa: E402
from attnlib.learn.layers import AttentionLayer  # noqa: E402
from attnlib.learn.training import PERTURB_ENV, torch_threads  # noqa: E402


@pytest.fixture(scope="module")
def stored():
    return ch7_seeds.read_seed_runs(ch7_seeds.DEFAULT_OUTPUT)


def _row(rows, experiment, seed, n_heads):
    (row,) = [r for r in rows if (r["experiment"], r["seed"], r["n_heads"]) == (experiment, seed, n_heads)]
    return row


def test_the_stored_file_has_one_complete_row_per_experiment_and_seed(stored):
    _, rows = stored
    keys = sorted((r["experiment"], r["n_heads"], r["seed"]) for r in rows)
    n_heads = recipes.COREFERENCE["n_heads"]
    expected = sorted([("pointer", n_heads, s) for s in ch7_seeds.SEEDS]
                      + [("reversal", h, s) for h in (1, 2) for s in ch7_seeds.SEEDS])
    assert keys == expected
    assert len(ch7_seeds.SEEDS) >= 5
    for row in rows:
        measured = ch7_seeds.POINTER_COLUMNS if row["experiment"] == "pointer" else ch7_seeds.REVERSAL_COLUMNS
        other = set(ch7_seeds.POINTER_COLUMNS + ch7_seeds.REVERSAL_COLUMNS) - set(measured)
        assert all(row[name] is None for name in other), row
        fractions = [name for name in measured if name not in ("first_step_reached", "head_on_reversed",
                                                                "head_on_previous")]
        assert all(0.0 <= row[name] <= 1.0 for name in fractions), row
        if row["experiment"] == "reversal":
            assert row["steps"] == ch7_seeds.LONG_STEPS
            assert row["first_step_reached"] is None or 0 < row["first_step_reached"] <= ch7_seeds.LONG_STEPS
            assert {row["head_on_reversed"], row["head_on_previous"]} <= set(range(row["n_heads"]))


def test_the_stamp_names_a_clean_commit_a_date_the_versions_and_the_load(stored):
    stamp, rows = stored
    assert re.fullmatch(r"[0-9a-f]{40}", stamp["git_commit"]), stamp["git_commit"]  # no "-dirty"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", stamp["date_utc"])
    assert all(stamp[name] for name in ("torch_version", "numpy_version", "python_version", "cpu"))
    assert re.fullmatch(r"[\d.]+ [\d.]+ [\d.]+", stamp["load_average"])
    assert stamp["command"].startswith("python -m attnlib.learn.ch7_seeds")
    assert stamp["torch_num_threads"] == "1"  # the runs train on one thread


def test_a_pointer_seed_trained_again_reproduces_its_stored_row(stored, monkeypatch):
    monkeypatch.delenv(PERTURB_ENV, raising=False)
    _, rows = stored
    seed = 1  # the seed whose adjective goes through the nouns
    with torch_threads(1):
        again = ch7_seeds.pointer_run(seed)
    row = _row(rows, "pointer", seed, recipes.COREFERENCE["n_heads"])
    assert again == pytest.approx({name: row[name] for name in ch7_seeds.POINTER_COLUMNS}, abs=1.5e-6)


def test_a_reversal_seed_trained_again_for_300_steps_reproduces_its_stored_accuracy(stored, monkeypatch):
    monkeypatch.delenv(PERTURB_ENV, raising=False)
    _, rows = stored
    with torch_threads(1):
        again = ch7_seeds.reversal_accuracy_at_recipe_steps(1, 0)
    row = _row(rows, "reversal", 0, 1)
    assert again == pytest.approx({"reversed_at_300": row["reversed_at_300"],
                                   "previous_at_300": row["previous_at_300"]}, abs=1.5e-6)


def test_the_summary_says_what_the_rows_say(stored):
    _, rows = stored
    result = ch7_seeds.summary(rows)
    pointer = [r for r in rows if r["experiment"] == "pointer"]
    cut = ch7_seeds.ROUTE_NEEDED_BELOW
    only_it = sorted(r["seed"] for r in pointer if r["without_it_view"] < cut <= r["without_nouns_view"])
    only_nouns = sorted(r["seed"] for r in pointer if r["without_nouns_view"] < cut <= r["without_it_view"])
    assert result["pointer"]["route_seeds"]["it"] == only_it
    assert result["pointer"]["route_seeds"]["nouns"] == only_nouns
    assert sum(len(seeds) for seeds in result["pointer"]["route_seeds"].values()) == len(pointer)
    both = [r["without_both_views"] for r in pointer]
    assert result["pointer"]["without_both_views"] == {"min": min(both), "max": max(both), "n": len(pointer)}
    for route, seeds in result["pointer"]["route_seeds"].items():
        group = [r for r in pointer if r["seed"] in seeds]
        if group:
            carriers = [min(r["without_head_0_at_it"], r["without_head_1_at_it"]) for r in group]
            assert result["pointer"]["by_route"][route]["carrier_removed"]["max"] == max(carriers)
            views = [r["without_nouns_view"] for r in group]
            assert result["pointer"]["by_route"][route]["without_nouns_view"]["min"] == min(views)
    for n_heads, key in ((1, "reversal_1_head"), (2, "reversal_2_heads")):
        runs = [r for r in rows if r["experiment"] == "reversal" and r["n_heads"] == n_heads]
        for name in ("reversed_at_300", "previous", "weight_on_reversed", "average_weights_previous"):
            values = [r[name] for r in runs]
            assert result[key][name] == {"min": min(values), "max": max(values), "n": len(runs)}
        never = sorted(r["seed"] for r in runs if r["first_step_reached"] is None)
        assert result[key]["never_reached"] == never
        split = sorted(r["seed"] for r in runs if r["head_on_reversed"] != r["head_on_previous"])
        assert result[key]["separate_heads"] == split


def test_routes_are_named_by_which_blocked_view_costs_the_accuracy():
    def row(it, nouns):
        return {"without_it_view": it, "without_nouns_view": nouns}

    assert ch7_seeds.pointer_route(row(0.51, 1.0)) == "it"
    assert ch7_seeds.pointer_route(row(0.88, 0.62)) == "nouns"
    assert ch7_seeds.pointer_route(row(0.6, 0.6)) == "both"
    assert ch7_seeds.pointer_route(row(0.9, 0.9)) == "either"


def test_the_file_round_trips_and_a_foreign_csv_is_refused(tmp_path):
    stamp = {name: f"<{name}>" for name in ch7_seeds.STAMP_COLUMNS}
    rows = [{"experiment": "reversal", "seed": 3, "n_heads": 1, "steps": 1500, "reversed": 0.5,
             "first_step_reached": None}]
    path = tmp_path / "runs.csv"
    ch7_seeds.write_seed_runs(path, stamp, rows)
    read_stamp, read_rows = ch7_seeds.read_seed_runs(path)
    assert read_stamp == stamp
    assert read_rows == [{**{name: None for name in ch7_seeds.COLUMNS}, **rows[0]}]
    foreign = tmp_path / "other.csv"
    foreign.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="seed runs"):
        ch7_seeds.read_seed_runs(foreign)


@pytest.fixture(scope="module")
def layer_and_x():
    generator = torch.Generator().manual_seed(0)
    layer = AttentionLayer(8, 2, generator)
    x = torch.randn(3, 5, 8, generator=generator, dtype=torch.float64)
    return layer, x


def test_a_layer_given_its_own_weights_and_inputs_is_unchanged(layer_and_x):
    layer, x = layer_and_x
    same = ablation.layer_output(layer, x, weights=layer.weights(x).detach(), values_from=x)
    torch.testing.assert_close(same, layer(x).detach(), rtol=1e-12, atol=1e-12)


def test_fixed_weights_are_used_for_every_sequence_and_values_come_from_values_from(layer_and_x):
    layer, x = layer_and_x
    weights = torch.softmax(torch.randn(2, 5, 5, generator=torch.Generator().manual_seed(1),
                                        dtype=torch.float64), dim=-1)  # (H, T, T)
    other = x.flip(0)  # other inputs for the values
    out = ablation.layer_output(layer, x, weights=weights, values_from=other)
    v = (other @ layer.w_v).detach().reshape(3, 5, 2, 4).transpose(1, 2)  # (B, H, T, d_head)
    heads = weights @ v  # (B, H, T, d_head)
    expected = x + heads.transpose(1, 2).reshape(3, 5, 8) @ layer.w_o.detach()
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="blocked"):
        ablation.layer_output(layer, x, weights=weights, blocked=[([0], 1)])
    with pytest.raises(ValueError, match="weights has shape"):
        ablation.layer_output(layer, x, weights=weights[:1])


def test_classifier_accuracy_without_ablation_is_the_models_accuracy_per_question():
    recipe = dict(recipes.REVERSAL, steps=0)
    model = recipes.reversal_model(recipe)
    tokens, answers = reversal.random_sequences(50, torch.Generator().manual_seed(2))
    per_position = ablation.classifier_accuracy(model, tokens, answers)  # (T, 2)
    assert per_position.shape == (reversal.SEQUENCE_LENGTH, 2)
    right = (model(tokens).argmax(-1) == answers).double()  # (B, T, 2)
    torch.testing.assert_close(per_position, right.mean(0))
    averaged = ablation.classifier_accuracy(model, tokens, answers, average_weights=True)
    assert not torch.equal(averaged, per_position)  # the ablation changes what the model answers
    with pytest.raises(ValueError, match="1 attention layer"):
        ablation.classifier_accuracy(recipes.reversal_model(dict(recipe, n_layers=2)), tokens, answers)
