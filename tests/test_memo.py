"""attnlib.learn.memo: with ATTNLIB_TRAINING_CACHE set, an equal training call loads what the first one trained."""

import pytest

torch = pytest.importorskip("torch")

from attnlib.learn import memo, recipes, training  # noqa: E402

SHORT = dict(recipes.INDUCTION, steps=6, eval_every=3, eval_sequences=16)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(memo.CACHE_ENV, str(tmp_path))
    for name in memo.ARITHMETIC_ENV:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.fixture
def trainings(monkeypatch):
    """How many times training.train really ran."""
    runs = []
    real = training.train

    def counted(*args, **kwargs):
        runs.append(kwargs.get("steps"))
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "train", counted)
    return runs


def _weights(model):
    return {name: value.clone() for name, value in model.state_dict().items()}


def test_an_equal_call_loads_the_weights_history_and_log_calls_of_the_first(store, trainings):
    first_calls, second_calls = [], []
    first = recipes.induction_model(SHORT)
    history, snapshots = recipes.train_induction(first, SHORT, log=lambda *call: first_calls.append(call))
    assert trainings == [6] and len(list(store.glob("train_induction-*.pt"))) == 1

    second = recipes.induction_model(SHORT)
    assert any(not torch.equal(a, b) for a, b in zip(_weights(first).values(), _weights(second).values()))
    again, again_snapshots = recipes.train_induction(second, SHORT, log=lambda *call: second_calls.append(call))
    assert trainings == [6]  # loaded, not trained
    for name, value in _weights(first).items():
        assert torch.equal(second.state_dict()[name], value), name
    assert again.losses == history.losses and again.eval_accuracy == history.eval_accuracy
    assert len(again_snapshots) == len(snapshots) == 3
    assert first_calls and second_calls == first_calls  # the live log sees the same calls again


def test_a_call_without_a_log_stores_the_calls_for_one_with_a_log(store, trainings):
    recipes.train_induction(recipes.induction_model(SHORT), SHORT)
    calls = []
    recipes.train_induction(recipes.induction_model(SHORT), SHORT, log=lambda *call: calls.append(call))
    assert trainings == [6]
    assert [step for step, _, _ in calls] == [3, 6]


@pytest.mark.parametrize("change", ["steps", "initial weights", "perturbation", "isa"])
def test_anything_that_changes_the_result_trains_again(store, trainings, monkeypatch, change):
    recipes.train_induction(recipes.induction_model(SHORT), SHORT)
    recipe, model = SHORT, recipes.induction_model(SHORT)
    if change == "steps":
        recipe = dict(SHORT, steps=5)
    elif change == "initial weights":
        with torch.no_grad():
            next(model.parameters()).view(-1)[0] += 1e-6
    elif change == "perturbation":
        monkeypatch.setenv("ATTNLIB_PERTURB_INITIAL_WEIGHTS", "1e-9")
    else:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    recipes.train_induction(model, recipe)
    assert len(trainings) == 2
    assert len(list(store.glob("train_induction-*.pt"))) == 2


def test_without_the_variable_nothing_is_stored(tmp_path, trainings, monkeypatch):
    monkeypatch.delenv(memo.CACHE_ENV, raising=False)
    recipes.train_induction(recipes.induction_model(SHORT), SHORT)
    recipes.train_induction(recipes.induction_model(SHORT), SHORT)
    assert trainings == [6, 6]


@memo.stored
def _draws_from_the_global_generator(n):
    return torch.rand(n)


@memo.stored
def _doubles(x):
    return x * 2


def test_a_call_that_draws_from_a_global_generator_is_not_stored(store):
    first, second = _draws_from_the_global_generator(3), _draws_from_the_global_generator(3)
    assert not torch.equal(first, second)
    assert not list(store.glob("*.pt"))


def test_an_argument_it_cannot_key_on_runs_the_call_unstored(store):
    class Opaque:
        def __mul__(self, other):
            return "ran"

    assert _doubles(Opaque()) == "ran"
    assert not list(store.glob("*.pt"))
    assert torch.equal(_doubles(torch.ones(2)), torch.full((2,), 2.0))
    assert len(list(store.glob("*.pt"))) == 1


def test_the_key_reads_tensors_by_value():
    a, b = torch.zeros(3), torch.zeros(3)
    assert memo.key(_doubles, {"x": a}) == memo.key(_doubles, {"x": b})
    b[1] = -0.0  # equal as numbers, different bits: a different key
    assert memo.key(_doubles, {"x": a}) != memo.key(_doubles, {"x": b})
    assert memo.key(_doubles, {"x": a}) != memo.key(_doubles, {"x": a.double()})
