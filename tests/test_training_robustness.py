"""What the book prints about trained models does not depend on the CPU (issue 18).

The models train in float64, and ``make test`` runs every chapter that reports a trained model
with two changes to its kernel's environment at once (tools/nbval_kernels.py; ``make
nbval-training`` does the same alone): every model's initial weights changed by a relative 1e-9
before training (``ATTNLIB_PERTURB_INITIAL_WEIGHTS``, read by
:func:`attnlib.learn.training.train`), and torch's and MKL's kernels on other code paths
(``ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE``). nbval then requires every stored output,
glued numbers included, to come out the same. ``make nbval-perturbed`` and ``make
nbval-default-isa`` make each change alone.

To register a chapter that trains a model: add its notebook to ``TRAINING_CHAPTERS`` in the
Makefile (the test below fails until you do, for any chapter that imports attnlib.learn). Train
through :func:`attnlib.learn.training.train`, which applies the perturbation; a loop of your own
calls ``perturb_initial_weights(model)`` before its first step.
"""

import re
from pathlib import Path

import nbformat
import pytest

torch = pytest.importorskip("torch")

from attnlib.learn import coreference, recipes, training  # noqa: E402
from conftest import make_nbval_commands  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
USES_ATTNLIB_LEARN = re.compile(r"\battnlib\.learn\b|from attnlib import [^\n]*\blearn\b")
ENVIRONMENT_CHECKS = ("ATTNLIB_PERTURB_INITIAL_WEIGHTS", "ATEN_CPU_CAPABILITY", "MKL_CBWR")


def _training_chapters_in_the_makefile():
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(r"^TRAINING_CHAPTERS\s*:=\s*(.*)$", makefile, re.MULTILINE)
    assert match, "the Makefile defines no TRAINING_CHAPTERS"
    return {Path(name).name for name in match.group(1).split()}


def _code(chapter):
    return "\n".join(c.source for c in nbformat.read(chapter, as_version=4).cells if c.cell_type == "code")


def test_every_chapter_that_trains_a_model_is_checked_against_a_perturbed_start():
    training = {chapter.name for chapter in CHAPTERS if USES_ATTNLIB_LEARN.search(_code(chapter))}
    assert {"05_weighted_sum.ipynb", "06_matrix_form.ipynb", "07_attention_that_learns.ipynb"} <= training
    listed = _training_chapters_in_the_makefile()
    assert training <= listed, f"add to TRAINING_CHAPTERS in the Makefile: {sorted(training - listed)}"
    assert listed <= {chapter.name for chapter in CHAPTERS}, "TRAINING_CHAPTERS names a missing notebook"


def test_make_test_runs_the_training_chapters_perturbed_and_on_the_plain_kernels():
    chapters = sorted(f"book/{name}" for name in _training_chapters_in_the_makefile())
    perturbed, isa = ["ATTNLIB_PERTURB_INITIAL_WEIGHTS=1e-9"], ["ATEN_CPU_CAPABILITY=default", "MKL_CBWR=COMPATIBLE"]
    (run,) = make_nbval_commands("test")  # every notebook and every unit test in one session
    assert "--nbval book tests" in run and "-p tools.nbval_kernels" in run
    assert not re.match(r"\s*\w+=", run)  # the session itself on this machine's arithmetic ...
    listed = re.search(r'--other-arithmetic="([^"]*)"', run).group(1).split()
    env = re.search(r'--other-arithmetic-env="([^"]*)"', run).group(1).split()
    assert sorted(listed) == chapters  # ... the training chapters' kernels on the other
    assert sorted(env) == sorted(perturbed + isa)
    (alone,) = make_nbval_commands("nbval-training")
    assert all(pair in alone for pair in perturbed + isa)
    assert sorted(re.findall(r"book/\S+\.ipynb", alone)) == chapters
    (alone,) = make_nbval_commands("nbval-perturbed")
    assert perturbed[0] in alone and "ATEN_CPU_CAPABILITY" not in alone
    (alone,) = make_nbval_commands("nbval-default-isa")
    assert all(pair in alone for pair in isa) and "ATTNLIB_PERTURB" not in alone


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_notebook_sets_the_variables_the_checks_use(chapter):
    code = _code(chapter)
    assert not [name for name in ENVIRONMENT_CHECKS if name in code]


@pytest.mark.parametrize("build", [recipes.coreference_model, recipes.word_reader_model, recipes.reversal_model])
def test_the_books_models_train_in_float64(build):
    assert {p.dtype for p in build().parameters()} == {torch.float64}


def test_a_seed_draws_the_same_initial_weights_in_float32_and_float64():
    from attnlib.learn.model import AttentionPointer

    def model(dtype):
        return AttentionPointer(20, 12, 8, 2, 1, read_at=[7], seed=3, dtype=dtype)

    for (name, low), (_, high) in zip(model(torch.float32).named_parameters(),
                                      model(torch.float64).named_parameters(), strict=True):
        assert low.dtype == torch.float32 and high.dtype == torch.float64
        # two float32 roundings: the cast, then the division by sqrt(d_in)
        torch.testing.assert_close(low.double(), high, rtol=2.5e-7, atol=0, msg=name)


def test_perturbing_changes_every_weight_by_the_relative_amount_in_both_directions():
    model = recipes.coreference_model()
    before = [p.detach().clone() for p in model.parameters()]
    assert training.perturb_initial_weights(model, 1e-9) == 1e-9
    for start, parameter in zip(before, model.parameters(), strict=True):
        ratio = (parameter.detach() / start)[start != 0] - 1  # +-1e-9 each
        torch.testing.assert_close(ratio.abs(), torch.full_like(ratio, 1e-9), rtol=1e-6, atol=0)
        assert (ratio > 0).any() and (ratio < 0).any()


def test_without_the_variable_nothing_is_perturbed(monkeypatch):
    monkeypatch.delenv(training.PERTURB_ENV, raising=False)
    model = recipes.coreference_model()
    before = [p.detach().clone() for p in model.parameters()]
    assert training.perturb_initial_weights(model) == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _short_run(steps=20):
    data = coreference.make_coreference_data()
    recipe = dict(recipes.COREFERENCE, steps=steps)
    model = recipes.coreference_model(recipe)
    history = recipes.train_coreference(data, model, recipe)
    return model, history


def test_train_starts_from_perturbed_weights_only_when_the_variable_asks(monkeypatch):
    monkeypatch.delenv(training.PERTURB_ENV, raising=False)
    reference, reference_history = _short_run()
    again, _ = _short_run()
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), again.parameters()))
    monkeypatch.setenv(training.PERTURB_ENV, "1e-9")
    perturbed, perturbed_history = _short_run()
    differences = [(a - b).abs().max().item() for a, b in zip(reference.parameters(), perturbed.parameters())]
    assert max(differences) > 0  # the start really moved ...
    assert max(differences) < 1e-6  # ... by a trace, which twenty steps of float64 keep small
    assert perturbed_history.losses[0] != reference_history.losses[0]
