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

When a wrong array matches none of the listed mistakes, the check looks for
general symptoms before it falls back to "expected ... given ...": the
transpose of the expected answer, a constant factor (2, sqrt(d_k), T, ...),
and, for attention weights, a missing softmax, rows left unnormalised, a
softmax over the wrong axis, weights outside [0, 1], rows that do not sum to 1,
or scores off by a constant factor (see :func:`general_hint` and
:func:`weights_symptom`). An answer that returns an attention output,
weights @ v, is probed with the identity matrix in place of v, which makes it
return the weights it uses. Each symptom is only claimed when the expected
answer does not show it, and a probe only when the answer is linear in v, so
that the weights it returns are the ones it used.

A check never raises because of the answer: a stub, an exception (``sys.exit()``
included), a wrong type, shape or dtype, a huge integer, or NaN in the output all
become a :class:`Result` whose ``message`` says what to fix. Every subclass's
``check`` is wrapped so that this holds for exercises defined elsewhere too; only
``KeyboardInterrupt`` goes through.
"""

import copy
import decimal
import functools
import math
import numbers
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

# General symptoms, tried when no listed mistake matches (see general_hint).
HINT_TRANSPOSED = (
    "your answer is the transpose of the expected one: rows and columns are swapped "
    "(check the order of a matrix product, or a stray .T)"
)
HINT_WEIGHTS_TRANSPOSED = (
    "your weights are the transpose of the right ones: row i must hold query i's weights over the "
    "keys (check the order of q and k in the score product)"
)
HINT_ALL_ZEROS = (
    "every entry of your answer is 0: return the array you computed, not the one you started from"
)
HINT_SOFTMAX_MISSING = (
    "your weights are the scores themselves: the softmax is missing "
    "(exponentiate, then divide each row by its sum over the keys)"
)
HINT_NOT_NORMALISED = (
    "your weights are proportional to the right ones but do not sum to 1: "
    "divide each row by its sum over the keys"
)
HINT_WEIGHTS_RIGHT = (
    "called with v = the identity matrix, your function returns the right weights: "
    "the mistake is in how it combines them with v (output = weights @ v)"
)
PROBE_INTRO = "called with v = the identity matrix, your function returns the weights it mixes v with"
HINT_WRONG_AXIS = (
    "your weights' columns sum to 1 instead of the rows: the softmax runs over the wrong axis; "
    "take both the maximum and the sum over the keys, axis=-1"
)
HINT_SYSTEM_EXIT = "your code called sys.exit() (or exit()): return the result instead"

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
    """Call the answer with warnings silenced; what it returns or raises comes back as an outcome.

    Anything the answer raises, ``SystemExit`` included, becomes the outcome's
    ``error``; only ``KeyboardInterrupt`` (the reader stopping a slow cell) goes through.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            try:
                return Outcome(value=fn(*args, **(kwargs or {})))
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - the answer's own error becomes feedback
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


def _safe_str(value):
    """``str(value)``, or a stand-in when the object's own ``__str__`` fails."""
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - a broken __str__ in the answer's own class
        return f"<unprintable {type(value).__name__}>"


def describe_error(exc):
    """``"ValueError: operands could not be broadcast ..."``, shortened, with no traceback."""
    detail = _safe_str(exc)
    if isinstance(exc, SystemExit):
        text = f"SystemExit: your code called sys.exit({detail})"
    else:
        text = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


def fmt_number(x):
    """A number as feedback shows it: 6 significant digits, ``inf``, ``nan``, ``True``.

    An integer too large for a float is described by its number of digits.
    """
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    try:
        x = float(x)
    except OverflowError:
        sign = "-" if x < 0 else ""
        return f"{sign}an integer of {len(str(abs(int(x))))} digits"
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return f"{x:.6g}"


def _fmt_index(index):
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


def describe_value(value):
    """``"a function"``, ``"an int"``, ``"the string 'abc'"``: what a wrong answer is, in words."""
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {text!r}"
    if isinstance(value, types.GeneratorType):
        return "a generator (use return, not yield)"
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype}"
    if callable(value):
        return "a function"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def as_numeric_array(value):
    """``value`` as a NumPy array of bools, ints or floats, or None if it is not one."""
    try:
        if is_tensor(value):
            value = value.detach().cpu().numpy()
        if not isinstance(value, (np.ndarray, np.generic, int, float, list, tuple)):
            return None
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 - ragged lists, tensors NumPy cannot hold, a broken __array__
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
            (f"expected: a NumPy array of shape {expected.shape}", f"given:    {describe_value(given)}")
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


def _is_weights(array):
    """True when ``array`` holds attention weights: entries in [0, 1], each row summing to 1."""
    return (
        array.dtype.kind == "f"
        and array.ndim >= 1
        and array.shape[-1] >= 2
        and array.size > 0
        and bool(np.isfinite(array).all())
        and bool((array >= -1e-12).all() and (array <= 1 + 1e-12).all())
        and bool(np.allclose(array.sum(axis=-1), 1.0, rtol=0, atol=1e-9))
    )


def _rows_sum_to_one(array, axis):
    return bool(np.allclose(array.sum(axis=axis), 1.0, rtol=1e-6, atol=1e-6))


def weights_symptom(expected, given, *, sizes=None):
    """A hint for wrong attention weights ``given``, or None.

    ``expected`` must hold valid weights (rows along the last axis summing to 1,
    entries in [0, 1]): a symptom is only claimed when the right answer does not
    show it. Tried in order: the transpose, the scores without a softmax, rows
    left unnormalised, weights outside [0, 1], columns summing to 1 instead of
    rows (a softmax over the wrong axis), rows that do not sum to 1, and a
    softmax of scores off by a constant factor (named from ``sizes`` as for
    :func:`general_hint`).
    """
    expected = np.asarray(expected, dtype=np.float64)
    given = as_numeric_array(given)
    if given is None or given.shape != expected.shape or not _is_weights(expected):
        return None
    given = given.astype(np.float64)
    if not np.isfinite(given).all() or np.allclose(given, expected, rtol=1e-6, atol=1e-9):
        return None
    if _is_transpose(expected, given):
        return HINT_WEIGHTS_TRANSPOSED
    with np.errstate(all="ignore"):
        shifted = np.exp(given - given.max(axis=-1, keepdims=True))
        softmax_of_given = shifted / shifted.sum(axis=-1, keepdims=True)
        normalised = given / given.sum(axis=-1, keepdims=True)
    if np.allclose(softmax_of_given, expected, rtol=1e-6, atol=1e-9):
        return HINT_SOFTMAX_MISSING
    if (given >= 0).all() and np.allclose(normalised, expected, rtol=1e-6, atol=1e-9):
        return HINT_NOT_NORMALISED
    outside = np.argwhere((given < -1e-9) | (given > 1 + 1e-9))
    if outside.size:
        index = tuple(outside[0])
        return (
            f"some of your weights lie outside [0, 1] ({fmt_number(given[index])} at index "
            f"{_fmt_index(index)}): weights come out of a softmax, which only gives numbers "
            "between 0 and 1; is the softmax missing?"
        )
    if not _rows_sum_to_one(given, -1):
        if given.ndim >= 2 and _rows_sum_to_one(given, -2):
            return HINT_WRONG_AXIS
        sums = given.sum(axis=-1)
        index = tuple(np.argwhere(~np.isclose(sums, 1.0, rtol=1e-6, atol=1e-6))[0])
        where = f"row {_fmt_index(index)} sums" if index else "they sum"
        return (
            f"your weights do not sum to 1 ({where} to {fmt_number(sums[index])}): the weights "
            "of each query over the keys must sum to 1; check the axis and the denominator of "
            "your softmax"
        )
    factor = _score_factor(expected, given)
    if factor is not None:
        names = _factor_names(factor, sizes)
        named = f", that is {' or '.join(names)}" if names else ""
        return (
            f"your weights are a softmax of scores {fmt_number(factor)} times the right ones{named}: "
            "the scale of your scores is off (a scale such as 1/sqrt(d_k) missing, applied twice, "
            "or the wrong one)"
        )
    return None


def _score_factor(expected, given):
    """``c`` when ``given`` is the softmax of ``c`` times the scores behind ``expected`` (c != 1), else None.

    Both must be valid weights with every entry positive (so the scores can be read
    back as logarithms, up to a constant per row) and not all uniform.
    """
    if not (_is_weights(given) and (expected > 0).all() and (given > 0).all()):
        return None
    log_expected, log_given = np.log(expected), np.log(given)
    x = log_expected - log_expected.mean(axis=-1, keepdims=True)  # the scores, up to a row constant
    y = log_given - log_given.mean(axis=-1, keepdims=True)
    spread = float(np.sum(x * x))
    if spread < 1e-12:
        return None
    factor = float(np.sum(x * y) / spread)
    if not np.allclose(y, factor * x, rtol=1e-6, atol=1e-9) or math.isclose(factor, 1.0, rel_tol=1e-6):
        return None
    return factor


def _is_transpose(expected, given):
    """True when ``given`` is ``expected`` with its last two axes swapped, and that differs."""
    if expected.ndim < 2:
        return False
    swapped = np.swapaxes(expected, -2, -1)
    if given.shape != swapped.shape:
        return False
    if expected.dtype == np.bool_ or given.dtype == np.bool_:
        same = np.array_equal(given.astype(bool), swapped) and given.dtype == expected.dtype
        return bool(same and not (swapped.shape == expected.shape and np.array_equal(swapped, expected)))
    given = given.astype(np.float64)
    if not np.allclose(given, swapped, rtol=1e-6, atol=1e-9):
        return False
    return not (swapped.shape == expected.shape and np.allclose(swapped, expected, rtol=1e-6, atol=1e-9))


def _factor_names(factor, sizes):
    """How ``factor`` reads in terms of ``sizes``: ``["1/sqrt(d_k) (d_k = 4)"]``; possibly empty."""
    candidates = []
    for name, size in (sizes or {}).items():
        if size in (0, 1):
            continue
        root = math.sqrt(size)
        candidates += [
            (size, f"{name} ({name} = {size})"),
            (1 / size, f"1/{name} ({name} = {size})"),
            (root, f"sqrt({name}) ({name} = {size})"),
            (1 / root, f"1/sqrt({name}) ({name} = {size})"),
        ]
    candidates.append((-1.0, "the opposite sign"))
    return [text for value, text in candidates if math.isclose(factor, value, rel_tol=1e-6)]


def constant_factor(expected, given, *, rtol=1e-6):
    """The number ``c`` with ``given == c * expected`` at every entry (c != 1), or None.

    Needs at least two non-zero entries in ``expected``, finite values, and
    zeros in ``given`` wherever ``expected`` is zero.
    """
    expected = np.asarray(expected, dtype=np.float64)
    given = as_numeric_array(given)
    if given is None or given.shape != expected.shape or given.dtype == np.bool_:
        return None
    given = given.astype(np.float64)
    if not (np.isfinite(expected).all() and np.isfinite(given).all()):
        return None
    scale = np.abs(expected).max() if expected.size else 0.0
    nonzero = np.abs(expected) > 1e-9 * scale
    if scale == 0 or nonzero.sum() < 2 or not np.allclose(given[~nonzero], 0.0, atol=1e-9 * scale):
        return None
    ratios = given[nonzero] / expected[nonzero]
    factor = float(np.median(ratios))
    if not np.allclose(ratios, factor, rtol=max(rtol, 1e-9), atol=1e-12):
        return None
    if math.isclose(factor, 1.0, rel_tol=max(rtol, 1e-9)):
        return None
    return factor


def _factor_hint(expected, given, sizes, rtol):
    """``(hint, named)`` for an answer that is a constant times ``expected`` (or all zeros), else None."""
    factor = constant_factor(expected, given, rtol=rtol)
    if factor is None:
        return None
    if factor == 0:
        return HINT_ALL_ZEROS, True
    names = _factor_names(factor, sizes)
    named = f", that is {' or '.join(names)}" if names else ""
    hint = (
        f"every entry of your answer is {fmt_number(factor)} times the expected one{named}: "
        "a constant factor is off; look for a scale that is missing, applied twice, or "
        "applied where it does not belong"
    )
    return hint, bool(names)


def general_hint(expected, given, *, sizes=None, rtol=1e-6):
    """A hint read off a wrong array answer alone, for mistakes no exercise lists; or None.

    Tried in order: the transpose of ``expected``; when ``expected`` holds
    attention weights, :func:`weights_symptom`; all zeros, or a constant factor
    (named when it is 2, -1, or a size such as ``sqrt(d_k)`` from ``sizes``,
    e.g. ``{"d_k": 4, "T": 3}``). Only symptoms that ``expected`` itself does
    not show are claimed.
    """
    expected = np.asarray(expected)
    given_array = as_numeric_array(given)
    if given_array is None or expected.dtype.kind not in "biuf":
        return None
    is_weights = expected.dtype.kind == "f" and _is_weights(expected)
    if _is_transpose(expected, given_array):
        return HINT_WEIGHTS_TRANSPOSED if is_weights else HINT_TRANSPOSED
    if given_array.shape != expected.shape or expected.dtype == np.bool_:
        return None
    if is_weights:
        symptom = weights_symptom(expected, given_array, sizes=sizes)
        if symptom is not None:
            return symptom
    factor = _factor_hint(expected, given_array, sizes, rtol)
    return factor[0] if factor else None


def attention_sizes(case):
    """``{"d_k": ..., "T": ...}`` of a case whose first two arguments are q and k.

    For :class:`FunctionExercise` ``sizes``, so that a constant factor such as
    sqrt(d_k) is named. ``T`` becomes ``T_q`` and ``T_k`` when they differ.
    """
    q, k = (np.asarray(a) for a in case.args[:2])
    sizes = {"d_k": int(q.shape[-1])}
    t_q = int(q.shape[-2]) if q.ndim >= 2 else 1
    t_k = int(k.shape[-2])
    if t_q == t_k:
        sizes["T"] = t_k
    else:
        sizes.update(T_q=t_q, T_k=t_k)
    return sizes


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


def _never_raises(check):
    """Wrap an exercise's ``check`` so that whatever happens while judging becomes a failed Result."""

    @functools.wraps(check)
    def guarded_check(self, answer):
        try:
            result = check(self, answer)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - the answer made the check itself fail
            return self.failed(
                "the check could not judge this answer.",
                Failure(
                    (f"while checking it: {describe_error(exc)}",),
                    f"give `{self.answer_name}` the kind of answer the task asks for",
                ),
            )
        if not isinstance(result, Result):
            return self.failed(
                "the check could not judge this answer.",
                Failure((f"the check returned {describe_value(result)} instead of a Result",)),
            )
        return result

    guarded_check.never_raises = True
    return guarded_check


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

    def __init_subclass__(cls, **kwargs):
        """Every subclass's own ``check`` (here or in a chapter module) never raises."""
        super().__init_subclass__(**kwargs)
        check = cls.__dict__.get("check")
        if check is not None and not getattr(check, "never_raises", False):
            cls.check = _never_raises(check)

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
        return Result(self.id, False, "not solved", f"{self.id}: waiting for your answer. {why}")

    def refuse_non_function(self, answer):
        """The Result for a stub or a non-function where a function is due, else None."""
        if _is_stub(answer):
            return self.not_solved(
                f"`{self.answer_name}` is still `{stub_text(answer)}`: define the function, "
                "then run the cell to check it."
            )
        if not callable(answer):
            return self.failed(
                "expected a function.",
                Failure(
                    ("expected: a function", f"given:    {describe_value(answer)}"),
                    f"pass the function itself: check(..., {self.answer_name})",
                ),
            )
        return None

    def returned_stub(self, answer, value):
        name = getattr(answer, "__name__", self.answer_name)
        return self.not_solved(
            f"`{name}` returned {stub_text(value)}: write its body in place of `...` "
            "(and check it ends with `return`), then run the cell to check it."
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
    sizes : callable, optional
        ``sizes(case) -> dict`` such as ``{"d_k": 4, "T": 3}``, so that a
        constant factor in a wrong answer is named (``sqrt(d_k)``); see
        :func:`attention_sizes`.
    rtol, atol : float
        Tolerances of the comparison (``np.isclose``).

    A wrong output gets, in this order, the comparison's own hint (a dtype), the
    ``diagnose`` hint, the hint of the first listed mistake it behaves like, and
    then a general symptom (:func:`general_hint`, and for an answer that returns
    ``weights @ v``, :func:`weights_symptom` on the weights it uses).
    """

    cases: object
    expected: object
    diagnose: object = None
    sizes: object = None
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
                "find the mistake, fix it in the cell and run it to check it."
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
            hint = self._mistake_hint(case, outcome)
            if hint is None and isinstance(outcome.error, SystemExit):
                hint = HINT_SYSTEM_EXIT
            return Failure((line,), hint)
        expected = self.expected(case)
        failure = compare_arrays(expected, outcome.value, rtol=self.rtol, atol=self.atol)
        if failure is None:
            return None
        hint = (
            failure.hint
            or self._diagnosed(case, outcome.value, answer)
            or self._mistake_hint(case, outcome)
            or self._general_hint(case, expected, outcome.value, answer)
        )
        return Failure(failure.lines, hint)

    def _general_hint(self, case, expected, given, answer):
        """A general symptom of the output, or of the weights the answer uses (see the class docstring).

        For an output ``weights @ v`` the order is: the output transposed; all zeros
        or a named constant factor; a symptom of the probed weights; an unnamed
        constant factor; the probed weights being right.
        """
        sizes = None
        if self.sizes is not None:
            outcome = call_safely(self.sizes, (case,))
            sizes = outcome.value if outcome.error is None and isinstance(outcome.value, dict) else None
        rtol = max(self.rtol, 1e-6)
        probe = self._weights_probe(case, expected)
        if probe is None:
            return general_hint(expected, given, sizes=sizes, rtol=rtol)
        given_array = as_numeric_array(given)
        if given_array is None:
            return None
        if _is_transpose(np.asarray(expected), given_array):
            return HINT_TRANSPOSED
        factor = _factor_hint(np.asarray(expected), given_array, sizes, rtol)
        if factor is not None and factor[1]:
            return factor[0]
        probed = self._probed_weights_hint(answer, *probe, given_array, sizes)
        if probed is not None and probed != HINT_WEIGHTS_RIGHT:
            return probed
        return factor[0] if factor else probed

    @staticmethod
    def _probed_weights_hint(answer, probe_case, expected_weights, v, given, sizes):
        """What the weights the answer returns for v = identity show, or None.

        A symptom is only claimed when those weights times the real ``v`` give the
        answer's real output ``given``: then they are the weights it used.
        """
        args, kwargs = probe_case.fresh()
        outcome = call_safely(answer, args, kwargs)
        if outcome.error is not None:
            return None
        weights = as_numeric_array(outcome.value)
        if weights is None or weights.shape != expected_weights.shape or weights.dtype == np.bool_:
            return None
        weights = weights.astype(np.float64)
        if np.allclose(weights, expected_weights, rtol=1e-6, atol=1e-9):
            return HINT_WEIGHTS_RIGHT
        with np.errstate(all="ignore"):
            mixed = weights @ v  # what a function linear in v returns for the real v
        if (
            given.shape != mixed.shape
            or given.dtype == np.bool_
            or not np.allclose(mixed, given.astype(np.float64), rtol=1e-6, atol=1e-9)
        ):
            return None
        symptom = weights_symptom(expected_weights, weights, sizes=sizes)
        return f"{PROBE_INTRO}. {symptom[0].upper()}{symptom[1:]}" if symptom else None

    def _weights_probe(self, case, expected):
        """``(case with v = identity, expected weights, v)`` when the expected output is ``weights @ v``.

        Tries each array argument of shape ``(..., T_k, d_v)``, last first: with the
        identity matrix in its place, the expected output must be valid attention
        weights ``W`` with ``W @ v`` equal to the expected output, so the probe is
        only used where it means something.
        """
        expected = as_numeric_array(expected)
        if expected is None or expected.dtype.kind != "f" or not np.isfinite(expected).all():
            return None
        for position in reversed(range(len(case.args))):
            v = case.args[position]
            if not isinstance(v, np.ndarray) or v.ndim < 2 or v.dtype.kind != "f":
                continue
            t_k = v.shape[-2]
            identity = np.broadcast_to(np.eye(t_k), (*v.shape[:-2], t_k, t_k)).copy()
            args = (*case.args[:position], identity, *case.args[position + 1 :])
            probe_case = Case(f"{case.description}, with v = the identity", args, case.kwargs)
            outcome = call_safely(self.expected, (probe_case,))
            weights = as_numeric_array(outcome.value) if outcome.error is None else None
            if weights is None or weights.dtype.kind != "f" or not _is_weights(weights):
                continue
            with np.errstate(all="ignore"):
                mixed = weights @ v  # (..., T_q, T_k) @ (..., T_k, d_v), or (T_k,) @ (T_k, d_v)
            if mixed.shape == expected.shape and np.allclose(mixed, expected, rtol=1e-9, atol=1e-12):
                return probe_case, weights.astype(np.float64), v
        return None

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
            and _safe_str(a.error) == _safe_str(b.error)
        )
    x, y = as_numeric_array(a.value), as_numeric_array(b.value)
    if x is None or y is None or x.shape != y.shape:
        return False
    return bool(np.allclose(x.astype(np.float64), y.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True))


def _as_number(value):
    """A real number as a float (+-inf for an integer too large for one), or None.

    Bools, strings and complex numbers are not numbers here; a size-1 array is.
    """
    try:
        if is_tensor(value):
            value = value.detach().cpu().numpy()
        if isinstance(value, (bool, np.bool_)):
            return None
        if isinstance(value, np.ndarray):
            if value.size != 1 or value.dtype.kind not in "iuf":
                return None
            value = value.reshape(())[()]
        if not isinstance(value, (numbers.Real, decimal.Decimal)):
            return None
        try:
            return float(value)
        except OverflowError:  # 10**400: larger than any float
            return math.inf if value > 0 else -math.inf
    except Exception:  # noqa: BLE001 - a number-like object whose conversion fails
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
                "then run the cell to check it."
            )
        number = _as_number(answer)
        if number is None:
            hint = (
                "write the number itself, without quotes"
                if isinstance(answer, str)
                else f"set `{self.answer_name}` to one number, an int or a float"
            )
            return self.failed(
                "expected one number.",
                Failure(("expected: a number (int or float)", f"given:    {describe_value(answer)}"), hint),
            )
        if not math.isfinite(number):
            return self.failed(
                "expected a finite number.",
                Failure(
                    ("expected: a finite number", f"given:    {fmt_number(answer)}"),
                    "the answer is an ordinary finite number: check your arithmetic",
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
                "then run the cell to check it."
            )
        if not isinstance(answer, str) or normalise_choice(answer) not in self.options:
            given = f"{answer!r}" if isinstance(answer, str) else describe_value(answer)
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
