"""attnlib.exercises: every solution passes, every typical mistake gets its hint, nothing a learner
passes makes check raise, and the starter cells report "waiting for your answer"."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import attnlib.exercises
from attnlib.exercises import KINDS, Result, UnknownExerciseError, check, get
from attnlib.exercises.core import (
    HINT_ALL_ZEROS,
    HINT_NOT_NORMALISED,
    HINT_SOFTMAX_MISSING,
    HINT_TRANSPOSED,
    HINT_WEIGHTS_RIGHT,
    HINT_WEIGHTS_TRANSPOSED,
    HINT_WRONG_AXIS,
    Case,
    ChoiceExercise,
    Exercise,
    FunctionExercise,
    ValueExercise,
    attention_output,
    general_hint,
    run_code,
    weights_symptom,
)

ALL_IDS = attnlib.exercises.list()
FUNCTION_IDS = [ex_id for ex_id in ALL_IDS if get(ex_id).kind in ("implement", "find the bug")]
VALUE_IDS = [ex_id for ex_id in ALL_IDS if get(ex_id).kind in ("by hand", "predict")]
MISTAKES = [(ex_id, key) for ex_id in ALL_IDS for key in get(ex_id).mistakes]
BOOK = Path(__file__).resolve().parent.parent / "book"


def test_every_chapter_has_at_least_three_exercises():
    chapters = {get(ex_id).chapter for ex_id in ALL_IDS}
    assert {1, 2, 3, 4, 5, 6, 8, 9} <= chapters
    for chapter in chapters:
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
    assert "waiting for your answer" in result.message


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
    assert check("ch4.scale_by_d_k", " (A) ").passed


def test_an_unknown_option_lists_the_options():
    result = check("ch4.scale_by_d_k", "e")
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

    assert HINT_NOT_NORMALISED in check("ch4.fix_sqrt_t", unnormalised).message
    assert HINT_WRONG_AXIS in check("ch4.fix_sqrt_t", columns_sum_to_one).message


def test_the_causal_hint_names_the_token_that_sees_the_future():
    result = check("ch4.causal_mask", lambda T: np.ones((T, T), dtype=bool))
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

    result = check("ch11.median_timer", calls_fn_too_often)
    assert "expected: fn() called 5 times" in result.message


def test_a_function_exercise_reports_its_case_number():
    exercise = FunctionExercise(
        id="ch12.demo",
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
    assert result.message.startswith("ch12.demo: hidden case 2 of 2 failed: two.")
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


@pytest.mark.parametrize("chapter", sorted({get(ex_id).chapter for ex_id in ALL_IDS}))
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


# Spoilers: a by-hand or predict answer is never already printed ------------------------

NUMBER = re.compile(r"[-+]?\d[\d,_]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _printed_before_exercises(chapter):
    """Every output (interactive figures included) and markdown text of the chapters before
    ``chapter``, exercises and solutions included, and of ``chapter`` up to its exercises."""
    import nbformat

    texts = []
    for path in sorted(BOOK.glob("[0-9][0-9]_*.ipynb")):
        number = int(path.name[:2])
        if not 1 <= number <= chapter:
            continue
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.get("id") == f"ch{chapter}-exercises":  # earlier chapters' solutions count too
                break
            if cell.cell_type == "markdown":
                texts.append(cell.source)
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                texts.append(output.get("text") or data.get("text/plain", ""))
                shown = re.sub(r"<(script|style)\b.*?</\1>", " ", data.get("text/html", ""), flags=re.S)
                texts.append(re.sub(r"<[^>]*>", " ", shown))  # interactive figures, less their code and data
    return texts


def _pins(printed, answer, tolerance):
    """True when the printed number would pass as the answer: the page gives it away."""
    try:
        value = float(printed.replace(",", "").replace("_", ""))
    except (ValueError, OverflowError):
        return False
    return abs(value - answer) <= max(tolerance, 1e-12 * abs(answer))


def _small_integer(answer):
    """A slope of 1 or 2 appears on many pages as another quantity: such answers are checked by hand."""
    return abs(answer) < 10 and abs(answer - round(answer)) < 1e-9


@pytest.mark.parametrize("ex_id", [i for i in VALUE_IDS if isinstance(get(i), ValueExercise)])
def test_a_by_hand_or_predict_answer_is_not_printed_before_the_exercise(ex_id):
    exercise = get(ex_id)
    answer = float(exercise.expected())
    if _small_integer(answer):
        pytest.skip(f"{ex_id}: a small integer answer ({answer:g}) is checked by reading the chapter")
    tolerance = exercise.atol + exercise.rtol * abs(answer)
    spoilers = [
        match.group()
        for text in _printed_before_exercises(exercise.chapter)
        for match in NUMBER.finditer(text)
        if _pins(match.group(), answer, tolerance)
    ]
    assert not spoilers, f"{ex_id}: the chapter already prints its answer as {spoilers}"


def test_the_spoiler_check_finds_a_printed_answer():
    assert _pins("0.465", 0.465, 5e-4) and _pins("1,024", 1024.0, 0.0)
    assert not _pins("0.5", 0.465, 5e-4)  # too coarse to pass for a 3-decimal answer
    assert not _pins("1,023", 1024.0, 0.0)
    chapter_2 = _printed_before_exercises(2)  # prints the scaled score of "cat" and "sat", 0.465
    assert any(_pins(m.group(), 0.465, 5e-4) for text in chapter_2 for m in NUMBER.finditer(text))


def test_the_causal_mask_exercise_is_in_the_chapter_that_teaches_masks():
    assert "ch4.causal_mask" in attnlib.exercises.list(4)
    assert not any("causal" in ex_id for ex_id in attnlib.exercises.list(3))


# General symptoms, for mistakes an exercise does not list --------------------------------

WEIGHTS = attnlib.attention_weights(*np.random.default_rng(7).normal(size=(2, 4, 5)))  # (4, 4)


def test_leaving_out_the_softmax_in_one_query_output_is_named():
    def without_softmax(q_t, k, v):
        scores = k @ q_t / np.sqrt(len(q_t))  # (T,)
        return scores @ v  # the scores used as weights

    message = check("ch2.one_query_output", without_softmax).message
    assert "called with v = the identity matrix" in message
    assert HINT_SOFTMAX_MISSING[1:] in message


def test_returning_scaled_scores_in_score_matrix_names_the_factor():
    message = check("ch3.score_matrix", lambda q, k: q @ k.swapaxes(-2, -1) / np.sqrt(q.shape[-1])).message
    assert "every entry of your answer is 0.5 times the expected one" in message
    assert "1/sqrt(d_k) (d_k = 4)" in message


def test_fixing_the_max_axis_but_not_the_sum_axis_is_named():
    def max_fixed_sum_not(q, k, v):
        scores = q @ k.swapaxes(-2, -1) / np.sqrt(q.shape[-1])
        scores = scores - scores.max(axis=-1, keepdims=True)  # fixed
        weights = np.exp(scores)
        weights = weights / weights.sum(axis=-2, keepdims=True)  # still the wrong axis
        return weights @ v

    message = check("ch5.fix_wrong_axis", max_fixed_sum_not).message
    assert "called with v = the identity matrix" in message
    assert HINT_WRONG_AXIS[1:] in message


def test_the_transpose_is_named_and_not_claimed_for_a_symmetric_answer():
    expected = np.arange(12.0).reshape(3, 4)
    assert general_hint(expected, expected.T) == HINT_TRANSPOSED
    square = np.arange(9.0).reshape(3, 3)
    assert general_hint(square, square.T) == HINT_TRANSPOSED
    symmetric = square + square.T
    assert general_hint(symmetric, symmetric.T * 1.5) != HINT_TRANSPOSED
    mask = np.tri(4, dtype=bool)
    assert general_hint(mask, mask.T) == HINT_TRANSPOSED


@pytest.mark.parametrize(
    ("factor", "named"),
    [
        (2.0, ""),
        (-1.0, "the opposite sign"),
        (np.sqrt(16), "sqrt(d_k) (d_k = 16)"),
        (1 / np.sqrt(16), "1/sqrt(d_k) (d_k = 16)"),
        (5.0, "T (T = 5)"),
        (1 / 5, "1/T (T = 5)"),
    ],
)
def test_a_constant_factor_is_named(factor, named):
    expected = np.random.default_rng(1).normal(size=(5, 3))
    message = general_hint(expected, factor * expected, sizes={"d_k": 16, "T": 5})
    assert f"every entry of your answer is {factor:.6g} times the expected one" in message
    assert (f", that is {named}:" in message) if named else (", that is" not in message)


def test_a_constant_factor_is_only_claimed_when_every_entry_shows_it():
    expected = np.random.default_rng(2).normal(size=(4, 3))
    assert "3.7 times" in general_hint(expected, 3.7 * expected)  # unnamed, still stated
    almost = 2 * expected
    almost[0, 0] += 0.1
    assert general_hint(almost, expected) is None
    with_zero = expected.copy()
    with_zero[1, 1] = 0.0
    given = 2 * with_zero
    given[1, 1] = 0.3  # nonzero where the expected answer is 0
    assert general_hint(with_zero, given) is None
    assert general_hint(expected, np.zeros_like(expected)) == HINT_ALL_ZEROS


def test_weights_from_scores_off_by_a_constant_factor_are_named():
    sharper = attnlib.softmax(np.sqrt(8) * np.log(WEIGHTS))  # scores sqrt(8) times too large
    message = general_hint(WEIGHTS, sharper, sizes={"d_k": 8})
    assert "a softmax of scores 2.82843 times the right ones, that is sqrt(d_k) (d_k = 8)" in message
    assert weights_symptom(WEIGHTS, attnlib.softmax(np.log(WEIGHTS) + 0.3)) is None  # same weights
    uniform = np.full((3, 4), 0.25)
    assert weights_symptom(uniform, attnlib.softmax(np.arange(12.0).reshape(3, 4))) is None


def test_transposed_weights_are_named_as_weights():
    assert general_hint(WEIGHTS, WEIGHTS.T) == HINT_WEIGHTS_TRANSPOSED


def test_weights_without_a_softmax_are_named():
    scores = np.log(WEIGHTS) + 0.7  # softmax(scores) == WEIGHTS
    assert general_hint(WEIGHTS, scores) == HINT_SOFTMAX_MISSING
    assert weights_symptom(WEIGHTS, scores) == HINT_SOFTMAX_MISSING


def test_weights_outside_zero_and_one_are_named():
    given = WEIGHTS.copy()
    given[0, :2] = [-0.2, WEIGHTS[0, 0] + WEIGHTS[0, 1] + 0.2]  # rows still sum to 1
    message = general_hint(WEIGHTS, given)
    assert "outside [0, 1]" in message and "-0.2 at index [0, 0]" in message
    assert "is the softmax missing?" in message


def test_a_softmax_over_the_wrong_axis_is_named():
    columns = attnlib.softmax(np.log(WEIGHTS), axis=-2)  # each column sums to 1
    assert general_hint(WEIGHTS, columns) == HINT_WRONG_AXIS


def test_unnormalised_weights_and_rows_not_summing_to_one_are_named():
    assert general_hint(WEIGHTS, WEIGHTS * np.array([[1.0], [2.0], [3.0], [4.0]])) == HINT_NOT_NORMALISED
    given = WEIGHTS.copy()
    given[2] = [0.1, 0.2, 0.3, 0.2]  # in [0, 1], sums to 0.8, not proportional
    assert "row [2] sums to 0.8" in general_hint(WEIGHTS, given)


def test_weight_symptoms_are_only_claimed_for_weights():
    values = np.random.default_rng(3).normal(size=(4, 4))  # rows do not sum to 1
    given = np.random.default_rng(4).normal(size=(4, 4))
    assert general_hint(values, given) is None
    assert weights_symptom(values, given) is None
    twice = 2 * WEIGHTS  # rows sum to 2: not weights, so no "sum to 1" claim
    assert weights_symptom(twice, WEIGHTS[::-1]) is None
    assert general_hint(WEIGHTS, WEIGHTS) is None


def _demo_attention_exercise():
    rng = np.random.default_rng(5)
    return FunctionExercise(
        id="ch12.demo_attention",
        title="demo",
        kind="implement",
        task="",
        starter="def f(q, k, v):\n    ...",
        solution="def f(q, k, v):\n    return attnlib.attention(q, k, v)",
        answer_name="f",
        cases=lambda: [Case("T=4", tuple(rng.normal(size=shape) for shape in ((4, 3), (4, 3), (4, 2))))],
        expected=lambda case: attention_output(*case.args),
    )


def test_an_output_answer_is_probed_for_its_weights():
    exercise = _demo_attention_exercise()
    right_weights_wrong_mix = exercise.check(lambda q, k, v: attention_output(q, k, v**2))  # v**2 == v for I
    assert HINT_WEIGHTS_RIGHT in right_weights_wrong_mix.message
    transposed_weights = exercise.check(lambda q, k, v: attnlib.attention_weights(q, k).T @ v)
    assert HINT_WEIGHTS_TRANSPOSED[1:] in transposed_weights.message
    doubled = exercise.check(lambda q, k, v: attnlib.attention(q, k, v, scale=2 / np.sqrt(q.shape[-1])))
    assert "your weights are a softmax of scores 2 times the right ones" in doubled.message.lower()


def test_the_probe_claims_nothing_when_the_answer_is_not_weights_at_v():
    exercise = _demo_attention_exercise()

    def shifted_without_softmax(q, k, v):  # not linear in v: the probed weights are not the ones used
        return (q @ k.T) @ v + 0.1

    message = exercise.check(shifted_without_softmax).message
    assert "identity" not in message and "hint:" not in message


@pytest.mark.parametrize(
    ("ex_id", "probed"),
    [
        ("ch1.project_queries", False),
        ("ch3.score_matrix", False),
        ("ch6.split_heads", False),
        ("ch2.one_query_output", True),
        ("ch5.fix_wrong_axis", True),
        ("ch6.fix_causal_future", True),
        ("ch12.fix_acc_rescale", True),
    ],
)
def test_the_weights_probe_is_used_only_where_the_answer_is_weights_at_v(ex_id, probed):
    exercise = get(ex_id)
    case = exercise.cases()[0]
    assert (exercise._weights_probe(case, exercise.expected(case)) is not None) is probed


def test_a_listed_mistake_wins_over_a_general_symptom():
    message = check("ch5.fix_wrong_axis", get("ch5.fix_wrong_axis").wrong_answer("columns")).message
    assert "columns sum to 1 instead of rows: take the softmax over the keys, axis=-1" in message
    assert "identity" not in message


# The running-sum hint names only its own mistake ---------------------------------------


def test_the_running_sum_rescale_hint_fires_only_for_the_missing_rescale():
    exercise = get("ch12.running_sum")
    rescale_hint = exercise.mistakes["not_rescaled"].hint
    reciprocal = check("ch12.running_sum", 1 / exercise.expected()).message
    assert "that is 1/l, the largest softmax weight" in reciprocal
    assert rescale_hint not in reciprocal and "without rescaling" not in reciprocal
    unrelated = check("ch12.running_sum", 7.0).message
    assert rescale_hint not in unrelated and "without rescaling" not in unrelated
    assert rescale_hint in check("ch12.running_sum", exercise.wrong_answer("not_rescaled")()).message


# check() never raises, whatever it is given ---------------------------------------------


class _BrokenStr(Exception):
    def __str__(self):
        raise RuntimeError("no text")


class _BrokenArray:
    def __array__(self, *args, **kwargs):
        raise RuntimeError("no array")


class _BrokenFloat(float):
    def __float__(self):
        raise RuntimeError("no float")


def _raise(exc):
    def answer(*args, **kwargs):
        raise exc

    return answer


def _returns(value):
    def answer(*args, **kwargs):
        return value

    return answer


def _generator_function(*args, **kwargs):
    yield 1


def _calls_sys_exit(*args, **kwargs):
    sys.exit("done")


def _bad_values():
    torch = pytest.importorskip("torch")
    return [
        10**400, -10**400, float("nan"), float("inf"), -float("inf"), np.float64("nan"), "0.5", "", "   ",
        b"0.5", [1, 2], [], (), {}, {1}, np.zeros(3), np.array([]), np.array(["a"]), np.array([1 + 2j]),
        1 + 2j, object(), (x for x in range(3)), True, dict, Ellipsis, None, _BrokenArray(),
        _BrokenFloat(0.5), torch.ones(2, dtype=torch.bfloat16), torch.tensor(float("nan")),
    ]


def _bad_functions():
    torch = pytest.importorskip("torch")
    return [
        _raise(ZeroDivisionError("my bug")), _raise(SystemExit(0)), _raise(GeneratorExit()),
        _raise(_BrokenStr()), _raise(RecursionError()), _raise(MemoryError()), _calls_sys_exit,
        _returns(None), _returns(10**400), _returns("an array"), _returns(object()), _returns({}),
        _returns([["a"]]), _returns(np.full((3, 3), np.nan)), _returns(np.full((3, 3), np.inf)),
        _returns(np.ones((3, 3), dtype=complex)), _returns(np.zeros((7, 1, 3))), _returns(np.array(0.5)),
        _returns(_BrokenArray()), _returns(torch.ones(3, 3, dtype=torch.bfloat16)),
        _returns((np.zeros(3), np.zeros(3))), _returns(x for x in range(3)), _generator_function,
        lambda: 1.0, lambda *args, **kwargs: args[0] if args else None, print, len, dict,
    ]


@pytest.mark.parametrize("ex_id", ALL_IDS)
def test_check_never_raises_and_never_passes_a_bad_answer(ex_id, capsys):
    for answer in _bad_values() + _bad_functions():
        result = check(ex_id, answer)
        assert isinstance(result, Result), (ex_id, answer)
        assert not result.passed, (ex_id, answer, result.message)
        assert result.message.strip(), (ex_id, answer)


@pytest.mark.parametrize("ex_id", ["ch2.one_query_output", "ch11.median_timer", "ch12.online_update"])
def test_a_keyboard_interrupt_still_stops_the_check(ex_id):
    with pytest.raises(KeyboardInterrupt):
        check(ex_id, _raise(KeyboardInterrupt()))


def test_sys_exit_in_an_answer_becomes_feedback():
    message = check("ch2.one_query_output", _calls_sys_exit).message
    assert "raised SystemExit: your code called sys.exit(done)" in message
    assert "return the result instead" in message


def test_a_huge_integer_is_feedback_in_every_value_exercise():
    for ex_id in VALUE_IDS:
        result = check(ex_id, 10**400)
        assert not result.passed and result.status == "failed", ex_id


def test_an_exercise_defined_elsewhere_never_raises_either():
    from dataclasses import dataclass

    @dataclass(frozen=True, eq=False, kw_only=True)
    class Fragile(Exercise):
        def check(self, answer):
            return 1 / answer

    exercise = Fragile(
        id="ch13.demo", title="", kind="implement", task="", starter="", solution="", answer_name="f"
    )
    for answer in (0, "x"):
        result = exercise.check(answer)
        assert isinstance(result, Result) and not result.passed
        assert "the check could not judge this answer" in result.message


# Random wrong answers never pass ------------------------------------------------------

FUNCTION_EXERCISES = [ex_id for ex_id in FUNCTION_IDS if isinstance(get(ex_id), FunctionExercise)]


def _expected_for(exercise, args, kwargs):
    return np.asarray(exercise.expected(Case("", args, kwargs)))


def _random_of_right_shape(exercise, seed):
    rng = np.random.default_rng(seed)

    def answer(*args, **kwargs):
        expected = _expected_for(exercise, args, kwargs)
        if expected.dtype == np.bool_:
            return rng.random(expected.shape) < 0.5
        return rng.normal(size=expected.shape)

    return answer


def _nearly_right(exercise):
    def answer(*args, **kwargs):
        expected = _expected_for(exercise, args, kwargs).copy()
        if expected.dtype == np.bool_:
            expected.flat[-1] = not expected.flat[-1]
            return expected
        finite = np.flatnonzero(np.isfinite(expected))
        expected.flat[finite[-1]] += 1e-3 * (1 + abs(expected.flat[finite[-1]]))
        return expected

    return answer


def _right_for_the_first_case_only(exercise):
    first = exercise.cases()[0]
    return _returns(_expected_for(exercise, first.args, first.kwargs))


@pytest.mark.parametrize("ex_id", FUNCTION_EXERCISES)
def test_random_and_nearly_right_answers_do_not_pass(ex_id):
    exercise = get(ex_id)
    answers = [_random_of_right_shape(exercise, seed) for seed in range(5)]
    answers += [_nearly_right(exercise), _right_for_the_first_case_only(exercise)]
    for answer in answers:
        result = exercise.check(answer)
        assert not result.passed, result.message


@pytest.mark.parametrize("ex_id", [i for i in VALUE_IDS if isinstance(get(i), ValueExercise)])
def test_a_number_answer_passes_only_within_a_tight_tolerance(ex_id):
    exercise = get(ex_id)
    answer = float(exercise.expected())
    tolerance = exercise.atol + exercise.rtol * abs(answer)
    assert tolerance <= 0.03 * abs(answer) or tolerance <= 1e-9, (tolerance, answer)
    assert exercise.check(answer).passed
    just_outside = 1.01 * tolerance + 1e-9
    for outside in (answer + just_outside, answer - just_outside, 0.0, -answer, 2 * answer):
        if abs(outside - answer) > tolerance:
            assert not exercise.check(outside).passed, outside
    for key, mistake in exercise.mistakes.items():
        assert abs(float(mistake.answer()) - answer) > tolerance, key


@pytest.mark.parametrize("ex_id", [i for i in VALUE_IDS if isinstance(get(i), ChoiceExercise)])
def test_only_the_right_option_passes(ex_id):
    exercise = get(ex_id)
    right = exercise.expected()
    for option in exercise.options:
        assert exercise.check(option).passed is (option == right), option


@pytest.mark.parametrize(("ex_id", "key"), MISTAKES)
def test_each_typical_mistake_gets_its_own_hint_and_no_other(ex_id, key):
    exercise = get(ex_id)
    wrong = exercise.wrong_answer(key)
    message = check(ex_id, wrong if ex_id in FUNCTION_IDS else wrong()).message
    assert exercise.mistakes[key].hint in message
    own = exercise.mistakes[key].hint
    others = {mistake.hint for other, mistake in exercise.mistakes.items() if other != key}
    assert not [hint for hint in others if hint in message and hint not in own]


def test_printed_feedback_is_wrapped_to_the_code_column_and_keeps_indented_lines():
    from attnlib.exercises import FEEDBACK_WIDTH, wrap_feedback

    long_line = "ch0.x: " + " ".join(["word"] * 60)
    wrapped = wrap_feedback(long_line + "\n    q = np.ones((4, 4))  " + "# " + "x" * 100)
    lines = wrapped.splitlines()
    assert all(len(line) <= FEEDBACK_WIDTH for line in lines[:-1]) and len(lines) > 2
    assert " ".join(lines[:-1]) == long_line  # only line breaks added
    assert lines[-1].startswith("    q = np.ones")  # code is never re-flowed


def test_every_exercise_prints_its_waiting_message_within_the_code_column(capsys):
    for exercise_id in attnlib.exercises.list():
        result = attnlib.exercises.check(exercise_id, ...)
        printed = capsys.readouterr().out
        assert result.status == "not solved" and "waiting for your answer" in printed
        assert max(len(line) for line in printed.splitlines()) <= 88, printed


def test_chapter_10s_exercises_count_the_characters_the_model_knows():
    from attnlib.exercises import ch10_writing
    from attnlib.learn import gpt

    assert ch10_writing.N_CHARACTERS == len(gpt.tokenizer().vocab)
