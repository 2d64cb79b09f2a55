"""Chapter 3, The score matrix: one entry, the whole matrix, and how fast it grows.

The chapter prints the whole score matrix of "the cat sat" and the sizes of the
matrix at 1,000 and 32,000 tokens, so the by-hand and predict exercises use a
sentence and lengths it never prints. (The causal mask exercise is in chapter 4,
which teaches masks.)
"""

import numpy as np

from ..examples import THE_CAT_SAT
from ..scores import score_matrix
from .core import Case, FunctionExercise, Mistake, ValueExercise, attention_sizes

# Another three-token sentence, with made-up queries and keys that, unlike those of
# "the cat sat", have negative entries (as a trained layer's do).
OTHER_TOKENS = ("dogs", "chase", "cats")
OTHER_Q = np.array([[0.5, -0.3, 0.8, 0.1], [-0.6, 0.4, 0.2, 0.9], [0.7, 0.2, -0.5, 0.3]])
OTHER_K = np.array([[0.4, 0.9, -0.2, 0.5], [0.3, -0.7, 0.6, 0.2], [-0.8, 0.1, 0.5, 0.6]])
_ROW, _COLUMN = OTHER_TOKENS.index("chase"), OTHER_TOKENS.index("dogs")


def _other_score(row, column):
    return float(score_matrix(OTHER_Q, OTHER_K)[row, column])


def _matrix_tex(rows):
    body = " \\\\ ".join(" & ".join(f"{x:g}" for x in row) for row in rows)
    return f"\\begin{{bmatrix}} {body} \\end{{bmatrix}}"


_ROW_NAME, _COLUMN_NAME = OTHER_TOKENS[_ROW], OTHER_TOKENS[_COLUMN]

score_entry = ValueExercise(
    id="ch3.score_entry",
    title="One entry of the score matrix",
    kind="by hand",
    task=(
        f'Here are the queries and keys of another sentence, "{" ".join(OTHER_TOKENS)}", one row per '
        'token. The numbers are made up and, unlike those of "the cat sat", some are negative, as in '
        "a trained layer:\n\n"
        f"$$Q = {_matrix_tex(OTHER_Q)}, \\qquad K = {_matrix_tex(OTHER_K)}$$\n\n"
        "In the score matrix $S = QK^\\top$ rows are queries and columns are keys. Work out by hand the "
        f'entry in row "{_ROW_NAME}", column "{_COLUMN_NAME}" (no scaling). Two decimal places are enough.'
    ),
    starter="answer = ...  # a number",
    solution=(
        f"q = np.array({OTHER_Q.tolist()})\n"
        f"k = np.array({OTHER_K.tolist()})\n"
        f"q_{_ROW_NAME}, k_{_COLUMN_NAME} = q[{_ROW}], k[{_COLUMN}]  # row = query, column = key\n"
        f"answer = float(q_{_ROW_NAME} @ k_{_COLUMN_NAME})\n"
        f'terms = " + ".join(f"({{a:g}})*({{b:g}})" for a, b in zip(q_{_ROW_NAME}, k_{_COLUMN_NAME}))\n'
        'print(terms, f"= {answer:.2f}")'
    ),
    answer_name="answer",
    expected=lambda: _other_score(_ROW, _COLUMN),
    atol=5e-3,
    tolerance_text="to 2 decimal places",
    hint=f'the entry is the dot product of the query of "{_ROW_NAME}" with the key of "{_COLUMN_NAME}"',
    mistakes={
        "transposed": Mistake(
            lambda: _other_score(_COLUMN, _ROW),
            f'that is row "{_COLUMN_NAME}", column "{_ROW_NAME}": the row gives the query '
            f'("{_ROW_NAME}"), the column the key ("{_COLUMN_NAME}")',
        ),
        "scaled": Mistake(
            lambda: _other_score(_ROW, _COLUMN) / np.sqrt(OTHER_Q.shape[-1]),
            "that is the scaled score: the score matrix itself is not divided by sqrt(d_k)",
        ),
        "signs_dropped": Mistake(
            lambda: float(np.abs(OTHER_Q[_ROW] * OTHER_K[_COLUMN]).sum()),
            "keep the signs: a product of a negative and a positive entry is negative and lowers the score",
        ),
    },
    explanation=(
        "Negative products pull the score down: a query and a key that disagree in sign on a "
        "dimension fit less well."
    ),
)


def _score_cases():
    rng = np.random.default_rng(303)
    ex = THE_CAT_SAT
    return [
        Case('"the cat sat": q and k of shape (3, 4)', (ex.q, ex.k)),
        Case("3 queries and 5 keys: q (3, 4), k (5, 4)", (rng.normal(size=(3, 4)), rng.normal(size=(5, 4)))),
        Case(
            "a batch of 2 sentences with 2 heads: q (2, 2, 4, 3), k (2, 2, 6, 3)",
            (rng.normal(size=(2, 2, 4, 3)), rng.normal(size=(2, 2, 6, 3))),
        ),
    ]


def _score_diagnose(case, given, answer):
    q, k = case.args
    given = np.asarray(given)
    keys_by_queries = k @ q.swapaxes(-2, -1)
    if given.shape == keys_by_queries.shape and np.allclose(given, keys_by_queries):
        return (
            "your matrix is the transpose of the score matrix: rows must be queries, columns keys (Q @ K^T)"
        )
    return None


score_matrix_exercise = FunctionExercise(
    id="ch3.score_matrix",
    title="The whole score matrix",
    kind="implement",
    task=(
        "Write `scores(q, k)` that returns $S = QK^\\top$ for queries `q` of shape `(..., T_q, d_k)` "
        "and keys `k` of shape `(..., T_k, d_k)`: shape `(..., T_q, T_k)`, entry `[i, j]` is "
        "$q_i \\cdot k_j$. The leading axes (batch, heads) may be there or not. Careful: on an "
        "array with more than two axes, `k.T` reverses *every* axis; transpose only the last two."
    ),
    starter="def scores(q, k):\n    ...  # your code here",
    solution=(
        "def scores(q, k):\n"
        "    # (..., T_q, d_k) @ (..., d_k, T_k) -> (..., T_q, T_k)\n"
        "    return q @ k.swapaxes(-2, -1)"
    ),
    answer_name="scores",
    cases=_score_cases,
    expected=lambda case: score_matrix(*case.args),
    diagnose=_score_diagnose,
    sizes=attention_sizes,
    mistakes={
        "keys_by_queries": Mistake(
            lambda q, k: k @ q.swapaxes(-2, -1),
            "your matrix is the transpose of the score matrix: rows must be queries, columns keys (Q @ K^T)",
        ),
        "dot_t": Mistake(
            lambda q, k: q @ k.T,
            ".T reverses every axis of a batched array: transpose only the last two, k.swapaxes(-2, -1)",
        ),
    },
    explanation=(
        "`k.T` works for one sentence but reverses *all* axes of a batch; `swapaxes(-2, -1)` (or "
        "`transpose(-2, -1)` in PyTorch) swaps only the token and feature axes."
    ),
)

# The lengths of the predict exercise (the chapter prints 1,000 and 32,000 tokens).
SHORT, LONG = 2_000, 12_000


def _growth(short, long):
    """How many times more (query, key) pairs ``long`` tokens have than ``short`` ones."""
    return (long * long) / (short * short)


quadratic_growth = ValueExercise(
    id="ch3.quadratic_growth",
    title="How fast the score matrix grows",
    kind="predict",
    task=(
        f"A model reads {SHORT:,} tokens, then {LONG:,} tokens. By what factor does the number of entries "
        "of its score matrix grow? Set `answer` to the factor."
    ),
    starter="answer = ...  # a number",
    solution=(
        f"short, long = {SHORT:_}, {LONG:_}\n"
        "answer = (long * long) / (short * short)  # the score matrix is T x T\n"
        'print(f"{short**2:,} -> {long**2:,} entries: x{answer:,.0f}")'
    ),
    answer_name="answer",
    expected=lambda: _growth(SHORT, LONG),
    rtol=1e-6,
    hint="the score matrix has one entry per (query, key) pair",
    mistakes={
        "linear": Mistake(
            lambda: LONG / SHORT,
            "that is how much longer the sequence is: the matrix grows in both rows and columns",
        ),
    },
    explanation=(
        f"With {LONG // SHORT} times the tokens the matrix has ${LONG // SHORT}^2 = {LONG**2 // SHORT**2}$ "
        "times the entries. The work grows the same way, which is why long contexts are expensive."
    ),
)

EXERCISES = (score_entry, score_matrix_exercise, quadratic_growth)
