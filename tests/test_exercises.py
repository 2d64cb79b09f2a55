"""attnlib.exercises: every solution passes, every typical mistake gets its hint, nothing a learner
passes makes check raise, and the starter cells report "not solved yet"."""

import numpy as np
import pytest

import attnlib.exercises
from attnlib.exercises import KINDS, Result, UnknownExerciseError, check, get
from attnlib.exercises.core import Case, FunctionExercise, run_code

ALL_IDS = attnlib.exercises.list()
FUNCTION_IDS = [ex_id for ex_id in ALL_IDS if get(ex_id).kind in ("implement", "find the bug")]
VALUE_IDS = [ex_id for ex_id in ALL_IDS if get(ex_id).kind in ("by hand", "predict")]
MISTAKES = [(ex_id, key) for ex_id in ALL_IDS for key in get(ex_id).mistakes]


def test_every_chapter_has_at_least_three_exercises():
    for chapter in range(1, 9):
        assert len(attnlib.exercises.list(chapter)) >= 3, chapter


def test_the_book_has_every_kind_of_exercise():
    assert {get(ex_id).kind for ex_id in ALL_IDS} == set(KINDS)


def test_ids_name_their_chapter_and_are_unique():
    assert len(set(ALL_IDS)) == len(ALL_IDS)
    for ex_id in ALL_IDS:
        assert ex_id.startswith(f"ch{get(ex_id).chapter}.")


@pytest.mark.parametrize("ex_id", ALL_IDS)
def test_the_solution_cell_passes_its_check(ex_id, capsys):
    exercise = get(ex_id)
    result = check(ex_id, exercise.reference_answer())
    assert result.passed, result.message
    assert result.status == "passed"
    assert capsys.readouterr().out.endswith(result.message + "\n")


@pytest.mark.parametrize("ex_id", ALL_IDS)
def test_the_starter_cell_reports_not_solved_yet(ex_id):
    exercise = get(ex_id)
    result = check(ex_id, run_code(exercise.starter, exercise.answer_name))
    assert not result.passed
    assert result.status == "not solved"
    assert "not solved yet" in result.message


@pytest.mark.parametrize(("ex_id", "key"), MISTAKES)
def test_a_typical_mistake_fails_with_its_hint(ex_id, key):
    exercise = get(ex_id)
    wrong = exercise.wrong_answer(key)
    result = check(ex_id, wrong if ex_id in FUNCTION_IDS else wrong())
    assert not result.passed
    assert result.status == "failed"
    assert exercise.mistakes[key].hint in result.message, result.message


@pytest.mark.parametrize("ex_id", FUNCTION_IDS)
def test_every_function_exercise_lists_a_typical_mistake(ex_id):
    assert get(ex_id).mistakes


@pytest.mark.parametrize("ex_id", ALL_IDS)
@pytest.mark.parametrize("stub", [None, ...])
def test_a_stub_is_not_solved_yet(ex_id, stub):
    result = check(ex_id, stub)
    assert (result.passed, result.status) == (False, "not solved")


def _raises(*args, **kwargs):
    raise ZeroDivisionError("my bug")


def _wrong_shape(*args, **kwargs):
    return np.zeros((7, 1, 3))


def _returns_none(*args, **kwargs):
    return None


def _returns_nan(*args, **kwargs):
    first = np.asarray(args[0], dtype=float)
    return np.full(first.shape, np.nan)


def _returns_text(*args, **kwargs):
    return "an array"


@pytest.mark.parametrize("ex_id", FUNCTION_IDS)
def test_a_function_that_raises_gets_its_error_not_a_traceback(ex_id):
    result = check(ex_id, _raises)
    assert not result.passed
    assert "ZeroDivisionError: my bug" in result.message
    assert "Traceback" not in result.message


@pytest.mark.parametrize("ex_id", FUNCTION_IDS)
@pytest.mark.parametrize("answer", [_wrong_shape, _returns_nan, _returns_text, len])
def test_a_wrong_function_fails_gracefully(ex_id, answer, capsys):
    result = check(ex_id, answer)
    assert isinstance(result, Result)
    assert not result.passed
    assert result.status == "failed"


@pytest.mark.parametrize("ex_id", FUNCTION_IDS)
def test_a_function_returning_none_is_not_solved_yet(ex_id):
    result = check(ex_id, _returns_none)
    assert result.status == "not solved"
    assert "return" in result.message


def test_a_wrong_shape_is_reported_with_both_shapes():
    result = check("ch6.split_heads", lambda x, n_heads: x.reshape(x.shape[0], n_heads, -1))
    assert "expected: shape (2, 3, 4)" in result.message
    assert "given:    shape (3, 2, 4)" in result.message
    assert result.case is not None and result.case in result.message


def test_differing_values_are_reported_with_their_index():
    result = check("ch4.stable_softmax", lambda x, axis=-1: np.ones_like(x) / x.shape[axis])
    assert "at index [" in result.message
    assert "entries differ" in result.message


def test_nan_in_an_output_is_reported():
    result = check("ch4.stable_softmax", _returns_nan)
    assert "NaN at index" in result.message


@pytest.mark.parametrize("ex_id", VALUE_IDS)
@pytest.mark.parametrize("answer", [float("nan"), "0.5", [1, 2], print, np.zeros(3)])
def test_a_wrong_kind_of_value_fails_gracefully(ex_id, answer):
    result = check(ex_id, answer)
    assert not result.passed
    assert result.status == "failed"


@pytest.mark.parametrize("ex_id", VALUE_IDS)
def test_a_function_for_a_value_exercise_is_refused(ex_id):
    result = check(ex_id, lambda: 1.0)
    assert not result.passed
    assert "a function" in result.message


@pytest.mark.parametrize("ex_id", FUNCTION_IDS)
def test_a_value_for_a_function_exercise_is_refused(ex_id):
    result = check(ex_id, 0.5)
    assert not result.passed
    assert "expected: a function" in result.message


def test_by_hand_feedback_does_not_give_the_answer_away():
    expected = get("ch3.score_entry").expected()
    result = check("ch3.score_entry", 0.5)
    assert f"{expected:.2f}" not in result.message


def test_predict_answers_accept_a_letter_in_any_case_and_brackets():
    assert check("ch4.no_scaling", " (B) ").passed


def test_an_unknown_option_lists_the_options():
    result = check("ch4.no_scaling", "e")
    assert not result.passed
    assert '"a", "b", "c"' in result.message


@pytest.mark.parametrize("bad_id", ["ch4.softmax", "nope", 4, None])
def test_an_unknown_id_raises_a_clear_error_listing_the_valid_ids(bad_id):
    with pytest.raises(UnknownExerciseError) as info:
        check(bad_id, None)
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    message = str(info.value)
    assert repr(bad_id) in message
    assert all(ex_id in message for ex_id in ALL_IDS)


def test_an_unknown_id_suggests_the_closest_one():
    with pytest.raises(UnknownExerciseError, match="Did you mean 'ch4.stable_softmax'"):
        get("ch4.stable_softmx")


def test_the_hidden_cases_are_the_same_every_time():
    exercise = get("ch4.stable_softmax")
    first, second = exercise.cases(), exercise.cases()
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a.args[0], b.args[0])


def test_find_the_bug_hidden_cases_scale_by_d_k_not_t():
    for case in get("ch4.fix_sqrt_t").cases():
        q, _ = case.args
        assert q.shape[-2] != q.shape[-1], case.description


def test_find_the_bug_hidden_cases_include_large_scores():
    largest = max(
        np.abs(q @ np.swapaxes(k, -2, -1)).max()
        for q, k in (case.args for case in get("ch4.fix_missing_max").cases())
    )
    assert largest > 1000


def test_an_edited_but_still_buggy_function_gets_the_hint():
    exercise = get("ch4.fix_sqrt_t")
    edited = exercise.starter.replace("T = q.shape[-2]", "T = q.shape[-2]  # looked fine to me")
    edited = edited.replace("(..., T, T)", "(..., T_q, T_k)")  # a changed comment does not change the code
    assert check("ch4.fix_sqrt_t", run_code(edited, exercise.answer_name)).status == "not solved"
    renamed = exercise.starter.replace("T = q.shape[-2]", "n = q.shape[-2]").replace(
        "np.sqrt(T)", "np.sqrt(n)"
    )
    result = check("ch4.fix_sqrt_t", run_code(renamed, exercise.answer_name))
    assert result.status == "failed"
    assert "you scaled by sqrt(T)" in result.message


def test_weights_that_do_not_sum_to_one_along_rows_get_an_axis_hint():
    def unnormalised(q, k):
        return np.exp(q @ np.swapaxes(k, -2, -1) / np.sqrt(q.shape[-1]))

    def columns_sum_to_one(q, k):
        return attnlib.softmax(q @ np.swapaxes(k, -2, -1) / np.sqrt(q.shape[-1]), axis=-2)

    assert (
        "your rows do not sum to 1: check the axis of your softmax"
        in check("ch4.fix_sqrt_t", unnormalised).message
    )
    assert "columns sum to 1 instead of rows" in check("ch4.fix_sqrt_t", columns_sum_to_one).message


def test_the_causal_hint_names_the_token_that_sees_the_future():
    result = check("ch3.causal_mask", lambda T: np.ones((T, T), dtype=bool))
    assert "token 0 can see token 1: your mask lets tokens see the future" in result.message
    leaky = get("ch6.fix_causal_future").wrong_answer("one_ahead")
    assert "token 0 can see token 1" in check("ch6.fix_causal_future", leaky).message


def test_an_answer_that_writes_into_its_inputs_does_not_change_the_cases():
    def overwrite_then_softmax(x, axis=-1):
        x -= np.max(x, axis=axis, keepdims=True)
        exps = np.exp(x)
        return exps / exps.sum(axis=axis, keepdims=True)

    assert check("ch4.stable_softmax", overwrite_then_softmax).passed


def test_torch_tensors_are_accepted_as_outputs():
    torch = pytest.importorskip("torch")
    assert check(
        "ch3.score_matrix", lambda q, k: torch.from_numpy(q) @ torch.from_numpy(k).transpose(-2, -1)
    ).passed


def test_a_result_reads_well():
    result = check("ch3.quadratic_growth", 32)
    assert repr(result) == "Result('ch3.quadratic_growth', passed=False, status='failed')"
    assert str(result) == result.message
    assert not result
    assert result.message.startswith("ch3.quadratic_growth: 32 is not the answer")


def test_the_timer_check_counts_calls_rather_than_trusting_the_clock():
    def calls_fn_too_often(fn, sync, warmup=1, repeats=5):
        for _ in range(warmup + repeats + 1):
            fn()
        sync()
        return 0.002

    result = check("ch8.median_timer", calls_fn_too_often)
    assert "expected: fn() called 5 times" in result.message


def test_a_function_exercise_reports_its_case_number():
    exercise = FunctionExercise(
        id="ch9.demo",
        title="demo",
        kind="implement",
        task="",
        starter="def f(x):\n    ...",
        solution="def f(x):\n    return x",
        answer_name="f",
        cases=lambda: [Case("one", (np.zeros(2),)), Case("two", (np.ones(2),))],
        expected=lambda case: case.args[0],
    )
    result = exercise.check(lambda x: np.zeros(2))
    assert result.message.startswith("ch9.demo: hidden case 2 of 2 failed: two.")
    assert result.case == "two"


def test_exercise_labels_are_valid_sphinx_labels():
    labels = [get(ex_id).label for ex_id in ALL_IDS]
    assert len(set(labels)) == len(labels)
    assert all(label.replace("-", "").isalnum() for label in labels)


GATED_PAGE = """# Page

```{exercise-start} Demo
:label: demo-exercise
```

Do the thing.

```python
answer = None  # STARTER
```

```{exercise-end}
```

```{solution-start} demo-exercise
:class: dropdown
```

```python
answer = 42  # SOLUTION
```

```{solution-end}
```

After the solution.
"""


@pytest.mark.parametrize("hide", [False, True])
def test_hide_solutions_drops_gated_solutions_and_builds_without_warnings(tmp_path, hide):
    pytest.importorskip("sphinx_exercise")
    pytest.importorskip("myst_parser")
    from sphinx.cmd.build import build_main

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "conf.py").write_text(
        'extensions = ["myst_parser", "sphinx_exercise", "attnlib.exercises.sphinx_ext"]\n'
        f"hide_solutions = {hide}\n"
    )
    (tmp_path / "src" / "index.md").write_text(GATED_PAGE)
    out = tmp_path / "html"
    status = build_main(["-b", "html", "-W", "-q", "-E", str(tmp_path / "src"), str(out)])
    assert status == 0
    page = (out / "index.html").read_text()
    assert "STARTER" in page and "After the solution." in page
    assert ("SOLUTION" in page) is not hide
    assert ("solution dropdown" in page) is not hide


@pytest.mark.parametrize("chapter", sorted({int(ex_id[2]) for ex_id in ALL_IDS}))
def test_each_chapter_notebook_holds_its_exercises_as_the_registry_renders_them(chapter):
    """The notebooks' exercise sections are generated by tools/insert_exercises.py; they must not drift."""
    import sys
    from pathlib import Path

    import nbformat

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "tools"))
    try:
        import insert_exercises
    finally:
        sys.path.pop(0)
    nb = nbformat.read(root / "book" / f"{insert_exercises.CHAPTERS[chapter]}.ipynb", as_version=4)
    stored = [(cell.cell_type, cell.source) for cell in nb.cells]
    rendered = [(cell.cell_type, cell.source) for cell in insert_exercises.exercise_cells(chapter)]
    assert stored[-len(rendered):] == rendered, "re-run tools/insert_exercises.py and re-execute the chapter"
