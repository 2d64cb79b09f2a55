"""Self-study exercises for every chapter, with answers checked on hidden cases.

>>> import attnlib.exercises
>>> attnlib.exercises.list()[:2]
['ch1.qkv_parameter_count', 'ch1.project_queries']
>>> result = attnlib.exercises.check("ch3.quadratic_growth", 36)  # prints its feedback
ch3.quadratic_growth: correct.
>>> result.passed
True

Four kinds of exercise: *by hand* (a number worked out on paper), *implement*
(a function), *find the bug* (a short function with one classic mistake) and
*predict* (an answer given before computing). Each chapter's file
(``ch1_qkv.py`` ... ``ch15_decoding.py``) holds its exercises, their
solutions and their typical wrong answers; :mod:`.core` runs the checks.
"""

import difflib
import textwrap

from . import (
    ch1_qkv,
    ch2_token_by_token,
    ch3_scores,
    ch4_softmax,
    ch5_weighted_sum,
    ch6_matrix_form,
    ch7_learning,
    ch8_transformer,
    ch9_generating,
    ch10_writing,
    ch11_timing,
    ch12_without_the_matrix,
    ch13_backward,
    ch14_many_sequences,
    ch15_decoding,
)
from .core import KINDS, Exercise, Result

_CHAPTERS = (
    ch1_qkv,
    ch2_token_by_token,
    ch3_scores,
    ch4_softmax,
    ch5_weighted_sum,
    ch6_matrix_form,
    ch7_learning,
    ch8_transformer,
    ch9_generating,
    ch10_writing,
    ch11_timing,
    ch12_without_the_matrix,
    ch13_backward,
    ch14_many_sequences,
    ch15_decoding,
)
_REGISTRY = {exercise.id: exercise for chapter in _CHAPTERS for exercise in chapter.EXERCISES}
assert len(_REGISTRY) == sum(len(chapter.EXERCISES) for chapter in _CHAPTERS), "duplicate exercise ids"


class UnknownExerciseError(KeyError, ValueError):
    """An exercise id that does not exist; the message lists the valid ones."""

    def __str__(self):  # KeyError would print the message in quotes
        return str(self.args[0])


def list(chapter=None):
    """The ids of all exercises in book order, or of one chapter's (``list(4)``)."""
    return [ex_id for ex_id, ex in _REGISTRY.items() if chapter is None or ex.chapter == chapter]


def get(exercise_id):
    """The :class:`~attnlib.exercises.core.Exercise` behind an id: its task, solution and typical mistakes."""
    if isinstance(exercise_id, str) and exercise_id in _REGISTRY:
        return _REGISTRY[exercise_id]
    close = difflib.get_close_matches(str(exercise_id), _REGISTRY, n=1)
    suggestion = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownExerciseError(
        f"unknown exercise id {exercise_id!r}.{suggestion} The valid ids are: {', '.join(_REGISTRY)}"
    )


def check(exercise_id, answer):
    """Check ``answer`` against the hidden cases of ``exercise_id``, print feedback, return a Result.

    Parameters
    ----------
    exercise_id : str
        One of :func:`list`, e.g. ``"ch4.stable_softmax"``.
    answer : object
        A function (implement, find the bug) or a value (by hand, predict).

    Returns
    -------
    Result
        ``result.passed`` is True when every hidden case passed;
        ``result.message`` is the feedback printed; ``result.case`` names
        the case that failed, if one did.

    Raises
    ------
    UnknownExerciseError
        (a KeyError and a ValueError) for an id that does not exist. A wrong
        answer never raises: whatever it does becomes feedback.
    """
    result = get(exercise_id).check(answer)
    print(wrap_feedback(result.message))
    return result


FEEDBACK_WIDTH = 88  # the book's code column: printed feedback never scrolls sideways


def wrap_feedback(message, width=FEEDBACK_WIDTH):
    """``message`` with each line broken at spaces to at most ``width`` characters where it can be.

    Lines that start with spaces (code, tables of values) are kept as they are.
    """
    lines = []
    for line in message.splitlines() or [""]:
        if line.startswith(" ") or len(line) <= width:
            lines.append(line)
        else:
            lines.extend(textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False))
    return "\n".join(lines)


# ``list`` stays out of __all__: a star import must not hide the builtin.
__all__ = ["KINDS", "Exercise", "Result", "UnknownExerciseError", "check", "get"]
