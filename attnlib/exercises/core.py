"""The machinery behind :mod:`attnlib.exercises`: exercises, hidden cases and feedback.

An exercise holds everything its notebook cells show (the task, the starter
code, the solution code) and knows how to check an answer:

- a :class:`FunctionExercise` calls the reader's function on hidden cases
  generated from a seeded rng and compares each output with the one attnlib
  computes;
- a :class:`ValueExercise` compares a number worked out by hand with the
  one attnlib computes;
- a :class:`ChoiceExercise` compares a predicted option with the one an
  experiment run at check time picks.

Expected values are always computed when the check runs, from attnlib, never
typed in. Each exercise also lists its typical wrong answers as
:class:`Mistake` objects: when a wrong answer behaves like one of them, the
feedback gives that mistake's hint. The tests use the same list to prove
every hint fires.

A check never raises because of the answer: a stub, an exception, a wrong
type, shape or dtype, or NaN in the output all become a :class:`Result` whose
``message`` says what to fix.
"""

import copy
import math
import types
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..arrays import is_tensor
from ..attention import attention_weights

KINDS = ("by hand", "implement", "find the bug", "predict")

# The names every exercise cell may use: the set-up cell at the top of each
# chapter's exercises imports exactly these, and solutions run with them.
SETUP_CODE = "import numpy as np\n\nimport attnlib\nimport attnlib.exercises"

HINT_ROWS = "your rows do not sum to 1: check the axis of your softmax"
HINT_COLUMNS = "columns sum to 1 instead of rows: take the softmax over the keys, axis=-1"
HINT_OVERFLOW = "your output overflowed to inf/nan for large scores: subtract the row maximum before exp"

_MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class Result:
    """What :func:`attnlib.exercises.check` found.

    Attributes
    ----------
    exercise_id : str
    passed : bool
        True when every hidden case passed.
    status : {"passed", "failed", "not solved"}
        "not solved" means the answer is still the stub (or the unchanged buggy
        starter of a find-the-bug exercise).
    message : str
        The feedback that ``check`` printed.
    case : str or None
        The hidden case that failed, when one did.
    """

    exercise_id: str
    passed: bool
    status: str
    message: str
    case: str | None = None

    def __bool__(self):
        return self.passed

    def __str__(self):
        return self.message

    def __repr__(self):
        return f"Result({self.exercise_id!r}, passed={self.passed}, status={self.status!r})"


@dataclass(frozen=True)
class Case:
    """One hidden input: the arguments the answer is called with, described for feedback."""

    description: str
    args: tuple
    kwargs: dict = field(default_factory=dict)

    def fresh(self):
        """Copies of the arguments, so an answer that writes into its inputs spoils nothing."""
        return copy.deepcopy(self.args), copy.deepcopy(self.kwargs)


@dataclass(frozen=True)
class Mistake:
    """A typical wrong answer and the hint an answer that behaves like it gets.

    ``answer`` is what a learner might pass to ``check``: a wrong function for
    implement and find-the-bug exercises; for by-hand and predict exercises, a
    function of no arguments that computes the wrong value or option (from
    attnlib, at check time).
    """

    answer: object
    hint: str


@dataclass(frozen=True)
class Outcome:
    """What one call of an answer gave: a value, or the exception it raised."""

    value: object = None
    error: Exception | None = None


@dataclass(frozen=True)
class Failure:
    """Why one hidden case failed: what was expected against what was given, and a hint."""

    lines: tuple  # "expected: ..." and "given: ..." lines
    hint: str | None = None


def call_safely(fn, args=(), kwargs=None):
    """Call the answer with warnings silenced; what it returns or raises comes back as an outcome."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            try:
                return Outcome(value=fn(*args, **(kwargs or {})))
            except Exception as exc:  # noqa: BLE001 - the answer's own error becomes feedback
                return Outcome(error=exc)


def _is_stub(value):
    return value is None or value is Ellipsis


def stub_text(value):
    """``None`` or ``...``, as the starter cell spells it."""
    return "..." if value is Ellipsis else repr(value)


def attention_output(q, k, v, causal=False):
    """The expected attention output, ``attention_weights(q, k) @ v``.

    Used in place of :func:`attnlib.attention`, which looks up its backends
    and so imports torch (about a second) even for NumPy input.
    """
    return attention_weights(q, k, causal=causal) @ v  # (..., T_q, T_k) @ (..., T_k, d_v)


def describe_error(exc):
    """``"ValueError: operands could not be broadcast ..."``, shortened, with no traceback."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


def fmt_number(x):
    """A number as feedback shows it: 6 significant digits, ``inf``, ``nan``, ``True``."""
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return f"{x:.6g}"


def _fmt_index(index):
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


def _type_name(value):
    return "a function" if callable(value) else f"a {type(value).__name__}"


def as_numeric_array(value):
    """``value`` as a NumPy array of bools, ints or floats, or None if it is not one."""
    if is_tensor(value):
        value = value.detach().cpu().numpy()
    if not isinstance(value, (np.ndarray, np.generic, int, float, list, tuple)):
        return None
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):  # ragged lists
        return None
    return array if array.dtype.kind in "biuf" else None


def compare_arrays(expected, given, *, rtol, atol):
    """None when ``given`` matches ``expected``, else a :class:`Failure` saying where it differs.

    Boolean expectations need a boolean answer. Float comparisons use
    ``np.isclose(given, expected, rtol, atol)``; -inf matches -inf.
    """
    expected = np.asarray(expected)
    array = as_numeric_array(given)
    if array is None:
        return Failure(
            (f"expected: a NumPy array of shape {expected.shape}", f"given:    {_type_name(given)}")
        )
    if expected.dtype == np.bool_ and array.dtype != np.bool_:
        return Failure(
            (
                f"expected: a boolean array (dtype=bool) of shape {expected.shape}",
                f"given:    dtype {array.dtype}",
            ),
            "return a boolean array: compare, or use dtype=bool",
        )
    if array.shape != expected.shape:
        return Failure((f"expected: shape {expected.shape}", f"given:    shape {array.shape}"))
    if expected.dtype == np.bool_:
        wrong = array != expected
    else:
        array = array.astype(np.float64)
        nan = np.isnan(array)
        if nan.any():
            index = tuple(np.argwhere(nan)[0])
            return Failure(
                (
                    "expected: no NaN",
                    f"given:    NaN at index {_fmt_index(index)} ({int(nan.sum())} of {array.size} entries)",
                ),
            )
        wrong = ~np.isclose(array, expected, rtol=rtol, atol=atol)
    if not wrong.any():
        return None
    index = tuple(np.argwhere(wrong)[0])
    return Failure(
        (
            f"expected: {fmt_number(expected[index])} at index {_fmt_index(index)}",
            f"given:    {fmt_number(array[index])} ({int(wrong.sum())} of {array.size} entries differ)",
        )
    )


def weights_hint(weights, axis=-1):
    """A hint when attention weights do not sum to 1 along ``axis`` (None when they do)."""
    array = as_numeric_array(weights)
    if array is None or array.ndim < 2 or np.isnan(array).any():
        return None
    if np.allclose(array.sum(axis=axis), 1.0):
        return None
    if np.allclose(array.sum(axis=-2 if axis in (-1, array.ndim - 1) else -1), 1.0):
        return HINT_COLUMNS
    return HINT_ROWS


def _code_fingerprint(code):
    """What a function's code does, independent of where it was defined."""
    consts = tuple(_code_fingerprint(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.co_code, consts, code.co_names, code.co_varnames


def same_code(fn, other):
    """True when two functions were compiled from the same source text."""
    code, other_code = getattr(fn, "__code__", None), getattr(other, "__code__", None)
    if code is None or other_code is None:
        return False
    return _code_fingerprint(code) == _code_fingerprint(other_code)


def run_code(source, name):
    """Execute ``source`` with the exercise set-up imports and return the object it names."""
    namespace = {}
    exec(compile(SETUP_CODE, "<exercise set-up>", "exec"), namespace)  # noqa: S102 - our own cell code
    exec(compile(source, f"<{name}>", "exec"), namespace)  # noqa: S102
    return namespace[name]


@dataclass(frozen=True, eq=False, kw_only=True)
class Exercise:
    """An exercise: its text, its starter and solution code, and its check.

    Parameters
    ----------
    id : str
        ``"ch4.stable_softmax"``: chapter number, then a name.
    title : str
        Shown in the exercise box.
    kind : str
        One of :data:`KINDS`.
    task : str
        What to do, in Markdown.
    starter : str
        The starter cell's code before its ``check`` line. It defines
        ``answer_name`` as a stub (``...``), or, for find-the-bug, as the
        buggy function.
    solution : str
        The solution cell's code before its ``check`` line.
    answer_name : str
        The name both cells pass to ``check`` (``"answer"``, ``"my_softmax"``).
    mistakes : dict of str to Mistake
        Typical wrong answers, keyed by a short name.
    explanation : str
        One or two sentences shown under the solution.
    """

    id: str
    title: str
    kind: str
    task: str
    starter: str
    solution: str
    answer_name: str
    mistakes: dict = field(default_factory=dict)
    explanation: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"exercise {self.id}: kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def chapter(self):
        """The chapter number, read off the id (``"ch4.x"`` -> 4)."""
        return int(self.id.split(".")[0][2:])

    @property
    def label(self):
        """The sphinx-exercise label: ``"ch4-stable-softmax"``."""
        return self.id.replace(".", "-").replace("_", "-")

    def check_line(self):
        return f'result = attnlib.exercises.check("{self.id}", {self.answer_name})'

    def reference_answer(self):
        """The answer the solution cell defines (its code run with the set-up imports)."""
        return run_code(self.solution, self.answer_name)

    def wrong_answer(self, key):
        """The typical wrong answer ``key`` as a learner would pass it to ``check``."""
        return self.mistakes[key].answer

    def check(self, answer):
        """Run the hidden cases on ``answer``; return a :class:`Result` (never raises on the answer)."""
        raise NotImplementedError

    # Feedback -------------------------------------------------------------

    def passed(self, n_cases=None):
        what = f"passed all {n_cases} hidden cases" if n_cases else "correct"
        return Result(self.id, True, "passed", f"{self.id}: {what}.")

    def not_solved(self, why):
        return Result(self.id, False, "not solved", f"{self.id}: not solved yet. {why}")

    def refuse_non_function(self, answer):
        """The Result for a stub or a non-function where a function is due, else None."""
        if _is_stub(answer):
            return self.not_solved(
                f"`{self.answer_name}` is still `{stub_text(answer)}`: define the function, "
                "then run the cell again."
            )
        if not callable(answer):
            return self.failed(
                "expected a function.",
                Failure(
                    ("expected: a function", f"given:    {_type_name(answer)}"),
                    f"pass the function itself: check(..., {self.answer_name})",
                ),
            )
        return None

    def returned_stub(self, answer, value):
        name = getattr(answer, "__name__", self.answer_name)
        return self.not_solved(
            f"`{name}` returned {stub_text(value)}: write its body in place of `...` "
            "(and check it ends with `return`), then run the cell again."
        )

    def failed(self, headline, failure, case=None):
        lines = [f"{self.id}: {headline}"]
        lines += [f"  {line}" for line in failure.lines]
        if failure.hint:
            lines.append(f"  hint: {failure.hint}")
        return Result(self.id, False, "failed", "\n".join(lines), case)


@dataclass(frozen=True, eq=False, kw_only=True)
class FunctionExercise(Exercise):
    """The answer is a function; it runs on hidden cases and its outputs are compared.

    Parameters
    ----------
    cases : callable
        ``cases() -> list of Case``, built from a seeded rng.
    expected : callable
        ``expected(case) -> array``, the right output, computed with attnlib.
    diagnose : callable, optional
        ``diagnose(case, given, answer) -> str or None``: a hint read off a
        wrong output, or off more calls of the answer (rows not summing to 1,
        a token seeing the future, ...). Tried before the mistakes.
    rtol, atol : float
        Tolerances of the comparison (``np.isclose``).
    """

    cases: object
    expected: object
    diagnose: object = None
    rtol: float = 1e-5
    atol: float = 1e-7

    def shipped_bug(self):
        """For find-the-bug: the buggy function exactly as the starter cell ships it."""
        return run_code(self.starter, self.answer_name) if self.kind == "find the bug" else None

    def check(self, answer):
        refusal = self.refuse_non_function(answer)
        if refusal is not None:
            return refusal
        if self.kind == "find the bug" and same_code(answer, self.shipped_bug()):
            return self.not_solved(
                f"`{answer.__name__}` is still the starter, bug included. Run it on a small example, "
                "find the mistake, fix it in the cell and run the cell again."
            )
        cases = self.cases()
        for number, case in enumerate(cases, start=1):
            args, kwargs = case.fresh()
            outcome = call_safely(answer, args, kwargs)
            if number == 1 and outcome.error is None and _is_stub(outcome.value):
                return self.returned_stub(answer, outcome.value)
            failure = self._judge(case, outcome, answer)
            if failure is not None:
                headline = f"hidden case {number} of {len(cases)} failed: {case.description}."
                return self.failed(headline, failure, case.description)
        return self.passed(len(cases))

    def _judge(self, case, outcome, answer):
        if outcome.error is not None:
            line = f"raised {describe_error(outcome.error)}"
            return Failure((line,), self._mistake_hint(case, outcome))
        failure = compare_arrays(self.expected(case), outcome.value, rtol=self.rtol, atol=self.atol)
        if failure is None:
            return None
        hint = (
            failure.hint or self._diagnosed(case, outcome.value, answer) or self._mistake_hint(case, outcome)
        )
        return Failure(failure.lines, hint)

    def _diagnosed(self, case, given, answer):
        if self.diagnose is None:
            return None
        outcome = call_safely(self.diagnose, (case, given, answer))
        return outcome.value if outcome.error is None else None

    def _mistake_hint(self, case, outcome):
        """The hint of the first mistake that behaves like the answer on this case."""
        for mistake in self.mistakes.values():
            args, kwargs = case.fresh()
            typical = call_safely(mistake.answer, args, kwargs)
            if _same_outcome(typical, outcome, self.rtol, self.atol):
                return mistake.hint
        return None


def _same_outcome(a, b, rtol, atol):
    if a.error is not None or b.error is not None:
        return (
            a.error is not None
            and b.error is not None
            and type(a.error) is type(b.error)
            and str(a.error) == str(b.error)
        )
    x, y = as_numeric_array(a.value), as_numeric_array(b.value)
    if x is None or y is None or x.shape != y.shape:
        return False
    return bool(np.allclose(x.astype(np.float64), y.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True))


def _as_number(value):
    """A real number as a float, or None (bools and strings are not numbers here)."""
    if is_tensor(value):
        value = value.detach().cpu().numpy()
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, np.ndarray):
        if value.size != 1 or value.dtype.kind not in "iuf":
            return None
        value = value.reshape(())[()]
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    return None


@dataclass(frozen=True, eq=False, kw_only=True)
class ValueExercise(Exercise):
    """The answer is one number; it is compared with ``expected()`` within ``atol`` or ``rtol``.

    The feedback never reveals the expected number (the reader is meant to
    work it out), only whether the answer is within tolerance and, when it
    matches a typical mistake, that mistake's hint.

    Parameters
    ----------
    expected : callable
        ``expected() -> float``, computed with attnlib at check time.
    atol, rtol : float
        The answer passes when ``abs(answer - expected) <= atol + rtol * abs(expected)``.
    tolerance_text : str
        How close is close enough, in words ("to 3 decimal places").
    hint : str
        Shown when the answer matches no typical mistake.
    """

    expected: object
    atol: float = 0.0
    rtol: float = 0.0
    tolerance_text: str = ""
    hint: str = ""

    def _close(self, given, target):
        return abs(given - target) <= self.atol + self.rtol * abs(target)

    def check(self, answer):
        if _is_stub(answer):
            return self.not_solved(
                f"`{self.answer_name}` is still `{stub_text(answer)}`: set it to your number, "
                "then run the cell again."
            )
        number = _as_number(answer)
        if number is None or math.isnan(number):
            given = "NaN" if number is not None else _type_name(answer)
            if isinstance(answer, str):
                given = f"the string {answer!r}"
            return self.failed(
                "expected one number.",
                Failure(
                    ("expected: a number (int or float)", f"given:    {given}"),
                    "write the number itself, without quotes",
                ),
            )
        if self._close(number, float(self.expected())):
            return self.passed()
        hint = self.hint or None
        for mistake in self.mistakes.values():
            if self._close(number, float(mistake.answer())):
                hint = mistake.hint
                break
        within = f" ({self.tolerance_text})" if self.tolerance_text else ""
        return self.failed(
            f"{fmt_number(number)} is not the answer{within}.",
            Failure((), hint),
        )


def normalise_choice(value):
    """``" (B) "`` -> ``"b"``, ``"'sat'"`` -> ``"sat"``."""
    return str(value).strip().strip("()[]'\"").strip().lower()


@dataclass(frozen=True, eq=False, kw_only=True)
class ChoiceExercise(Exercise):
    """The answer is one of ``options`` (a letter, or a token); ``expected()`` picks the right one.

    Parameters
    ----------
    options : dict of str to str
        Option key (what the reader writes) to its text.
    expected : callable
        ``expected() -> key``, decided at check time by an experiment with attnlib.
    hint : str
        Shown for a wrong option that matches no typical mistake.
    """

    options: dict
    expected: object
    hint: str = ""

    def check(self, answer):
        if _is_stub(answer):
            return self.not_solved(
                f"`{self.answer_name}` is still `{stub_text(answer)}`: set it to one of {self._listed()}, "
                "then run the cell again."
            )
        if not isinstance(answer, str) or normalise_choice(answer) not in self.options:
            given = f"{answer!r}" if isinstance(answer, str) else _type_name(answer)
            return self.failed(
                "expected one of the options.",
                Failure(
                    (f"expected: one of {self._listed()}", f"given:    {given}"),
                    "answer with the option's key, as a string",
                ),
            )
        choice = normalise_choice(answer)
        if choice == normalise_choice(self.expected()):
            return self.passed()
        hint = self.hint or None
        for mistake in self.mistakes.values():
            if choice == normalise_choice(mistake.answer()):
                hint = mistake.hint
                break
        return self.failed(f"{choice!r} is not the answer.", Failure((), hint))

    def _listed(self):
        return ", ".join(f'"{key}"' for key in self.options)
