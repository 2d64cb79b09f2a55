"""Chapter 3, The score matrix: one entry, the whole matrix, the causal mask, and its growth."""

import numpy as np

from ..examples import THE_CAT_SAT
from ..masks import causal_mask
from ..scores import score_matrix
from .core import Case, FunctionExercise, Mistake, ValueExercise

_CAT, _SAT = THE_CAT_SAT.index("cat"), THE_CAT_SAT.index("sat")


def _score(row, column):
    return float(score_matrix(THE_CAT_SAT.q, THE_CAT_SAT.k)[row, column])


score_entry = ValueExercise(
    id="ch3.score_entry",
    title="One entry of the score matrix",
    kind="by hand",
    task=(
        'In the score matrix $S = QK^\\top$ of "the cat sat", rows are queries and columns are keys. '
        'Work out by hand the entry in row "sat", column "cat" (no scaling yet). '
        "Two decimal places are enough."
    ),
    starter="answer = ...  # a number",
    solution=(
        "ex = attnlib.examples.THE_CAT_SAT\n"
        'q_sat, k_cat = ex.q[ex.index("sat")], ex.k[ex.index("cat")]\n'
        "answer = float(q_sat @ k_cat)  # row = query, column = key\n"
        'print(" + ".join(f"{a:.1f}*{b:.1f}" for a, b in zip(q_sat, k_cat)), f"= {answer:.2f}")'
    ),
    answer_name="answer",
    expected=lambda: _score(_SAT, _CAT),
    atol=5e-3,
    tolerance_text="to 2 decimal places",
    hint='the entry is the dot product of the query of "sat" with the key of "cat"',
    mistakes={
        "transposed": Mistake(
            lambda: _score(_CAT, _SAT),
            'that is row "cat", column "sat": the row gives the query ("sat"), the column the key ("cat")',
        ),
        "scaled": Mistake(
            lambda: _score(_SAT, _CAT) / np.sqrt(THE_CAT_SAT.d_k),
            "that is the scaled score: the score matrix itself is not divided by sqrt(d_k)",
        ),
    },
    explanation=(
        'Row "sat" holds how well the query of "sat" matches every key; column "cat" picks the key of "cat".'
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
        "$q_i \\cdot k_j$. The leading axes (batch, heads) may be there or not."
    ),
    starter="def scores(q, k):\n    ...  # your code here",
    solution=(
        "def scores(q, k):\n"
        "    return q @ k.swapaxes(-2, -1)  # (..., T_q, d_k) @ (..., d_k, T_k) -> (..., T_q, T_k)"
    ),
    answer_name="scores",
    cases=_score_cases,
    expected=lambda case: score_matrix(*case.args),
    diagnose=_score_diagnose,
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

_HINT_FUTURE = "your mask lets tokens see the future"


def _causal_cases():
    return [Case(f"T={T}", (T,)) for T in (3, 6, 2, 1)]


def _causal_diagnose(case, given, answer):
    (T,) = case.args
    mask = np.asarray(given)
    if mask.shape != (T, T) or mask.dtype != np.bool_:
        return None
    future = np.argwhere(np.triu(mask, k=1))
    if future.size:
        i, j = future[0]
        if not np.tril(mask).any():
            return (
                f"token {i} can see token {j} but not itself: {_HINT_FUTURE}; "
                "True must mean 'may attend' (j <= i)"
            )
        return f"token {i} can see token {j}: {_HINT_FUTURE}"
    missing = np.flatnonzero(~np.diag(mask))
    if missing.size:
        return f"token {missing[0]} cannot see itself: keep the diagonal, query i may attend to keys j <= i"
    return None


causal_mask_exercise = FunctionExercise(
    id="ch3.causal_mask",
    title="The causal mask",
    kind="implement",
    task=(
        "Write `causal(T)` that returns the causal mask of a decoder: a boolean array of shape `(T, T)` "
        "that is `True` where query `i` may attend to key `j`, that is where $j \\le i$. This is the "
        "convention of PyTorch's `scaled_dot_product_attention` and of attnlib."
    ),
    starter="def causal(T):\n    ...  # your code here",
    solution=(
        "def causal(T):\n"
        "    rows = np.arange(T)[:, None]  # query index i, as a column\n"
        "    cols = np.arange(T)[None, :]  # key index j, as a row\n"
        "    return cols <= rows  # (T, T) booleans, True where j <= i"
    ),
    answer_name="causal",
    cases=_causal_cases,
    expected=lambda case: causal_mask(*case.args),
    diagnose=_causal_diagnose,
    mistakes={
        "upper_triangle": Mistake(lambda T: np.triu(np.ones((T, T), dtype=bool)), _HINT_FUTURE),
        "off_by_one": Mistake(lambda T: np.tri(T, T, k=1, dtype=bool), _HINT_FUTURE),
        "no_diagonal": Mistake(
            lambda T: np.tri(T, T, k=-1, dtype=bool), "cannot see itself: keep the diagonal"
        ),
        "float": Mistake(lambda T: np.tri(T, T), "return a boolean array"),
    },
    explanation=(
        "`np.tril(np.ones((T, T), dtype=bool))` and `np.tri(T, dtype=bool)` build the same lower triangle."
    ),
)


def _growth(short, long):
    """How many times more (query, key) pairs ``long`` tokens have than ``short`` ones."""
    return (long * long) / (short * short)


quadratic_growth = ValueExercise(
    id="ch3.quadratic_growth",
    title="How fast the score matrix grows",
    kind="predict",
    task=(
        "A model reads 1,000 tokens, then 32,000 tokens. By what factor does the number of entries "
        "of its score matrix grow? Set `answer` to the factor."
    ),
    starter="answer = ...  # a number",
    solution=(
        "short, long = 1_000, 32_000\n"
        "answer = (long * long) / (short * short)  # the score matrix is T x T\n"
        'print(f"{short**2:,} -> {long**2:,} entries: x{answer:,.0f}")'
    ),
    answer_name="answer",
    expected=lambda: _growth(1_000, 32_000),
    rtol=1e-6,
    hint="the score matrix has one entry per (query, key) pair",
    mistakes={
        "linear": Mistake(
            lambda: 32_000 / 1_000,
            "that is how much longer the sequence is: the matrix grows in both rows and columns",
        ),
    },
    explanation=(
        "Thirty-two times the tokens gives $32^2$ times the entries. The work grows the same way, "
        "which is why long contexts are expensive."
    ),
)

EXERCISES = (score_entry, score_matrix_exercise, causal_mask_exercise, quadratic_growth)
