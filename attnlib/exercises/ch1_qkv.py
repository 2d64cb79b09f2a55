"""Chapter 1, Query, Key and Value: counting weights, projecting, and what one column of W_Q changes."""

import numpy as np

from ..examples import THE_CAT_SAT
from ..projections import project_qkv
from .core import Case, ChoiceExercise, FunctionExercise, Mistake, ValueExercise

# A layer the size of one GPT-2 small attention layer.
GPT2_SMALL = {"d_model": 768, "n_heads": 12, "d_head": 64}


def _qkv_parameters(d_model, n_heads, d_head):
    """Entries of W_Q, W_K and W_V together, every head included, no biases."""
    return 3 * d_model * n_heads * d_head


qkv_parameter_count = ValueExercise(
    id="ch1.qkv_parameter_count",
    title="Count the projection weights",
    kind="by hand",
    task=(
        f"A layer the size of one GPT-2 small attention layer has $d_{{model}} = {GPT2_SMALL['d_model']}$ "
        f"and {GPT2_SMALL['n_heads']} heads, each with $d_k = d_v = {GPT2_SMALL['d_head']}$. "
        "Every head has its own $W_Q$, $W_K$ and $W_V$ of shape "
        "$(d_{model}, d_k)$. How many numbers do the query, key and value weights of all heads "
        "hold together? (Count only these three matrices.)"
    ),
    starter="answer = ...  # a whole number",
    solution=(
        "d_model, n_heads, d_head = 768, 12, 64\n"
        "per_matrix = d_model * d_head  # one head's W_Q: (d_model, d_k)\n"
        "answer = 3 * n_heads * per_matrix  # W_Q, W_K and W_V for every head\n"
        'print(f"{answer:,} weights")'
    ),
    answer_name="answer",
    expected=lambda: _qkv_parameters(**GPT2_SMALL),
    rtol=1e-9,
    hint="count the entries of one (d_model, d_k) matrix, then how many such matrices there are",
    mistakes={
        "one_matrix_type": Mistake(
            lambda: _qkv_parameters(**GPT2_SMALL) // 3,
            "that is one kind of matrix: count W_Q, W_K and W_V",
        ),
        "one_head": Mistake(
            lambda: _qkv_parameters(**GPT2_SMALL) // GPT2_SMALL["n_heads"],
            "that is one head: every one of the 12 heads has its own three matrices",
        ),
    },
    explanation=(
        f"With {GPT2_SMALL['n_heads']} heads of {GPT2_SMALL['d_head']}, the heads together are exactly "
        f"as wide as the model ({GPT2_SMALL['n_heads']} × {GPT2_SMALL['d_head']} = "
        f"{GPT2_SMALL['n_heads'] * GPT2_SMALL['d_head']}), so the three projections of all heads are "
        f"three ${GPT2_SMALL['d_model']} \\times {GPT2_SMALL['d_model']}$ matrices."
    ),
)


def _project_cases():
    rng = np.random.default_rng(101)
    return [
        Case('"the cat sat": x of shape (3, 4), w_q of shape (4, 4)', (THE_CAT_SAT.x, THE_CAT_SAT.w_q)),
        Case("x of shape (5, 6), w_q of shape (6, 3)", (rng.normal(size=(5, 6)), rng.normal(size=(6, 3)))),
        Case(
            "a batch: x of shape (2, 4, 6), w_q of shape (6, 3)",
            (rng.normal(size=(2, 4, 6)), rng.normal(size=(6, 3))),
        ),
    ]


def _projected(case):
    x, w_q = case.args
    q, _, _ = project_qkv(x, w_q, w_q, w_q)
    return q


def _project_diagnose(case, given, answer):
    x, w_q = case.args
    expected = x @ w_q
    given = np.asarray(given)
    if given.shape == expected.swapaxes(-2, -1).shape and np.allclose(given, expected.swapaxes(-2, -1)):
        return "you returned Q transposed, one column per token: keep one row per token, Q = X @ W_Q"
    return None


def _column_convention(x, w_q):
    return w_q.T @ x.swapaxes(-2, -1)  # (d_k, d_model) @ (..., d_model, T) -> (..., d_k, T)


project_queries = FunctionExercise(
    id="ch1.project_queries",
    title="Project embeddings to queries",
    kind="implement",
    task=(
        "Write `project_queries(x, w_q)` that turns embeddings `x` of shape `(..., T, d_model)` into "
        "queries of shape `(..., T, d_k)`, with `w_q` of shape `(d_model, d_k)`. It must work for "
        "one sentence and for a batch of sentences."
    ),
    starter="def project_queries(x, w_q):\n    ...  # your code here",
    solution=(
        "def project_queries(x, w_q):\n"
        "    return x @ w_q  # (..., T, d_model) @ (d_model, d_k) -> (..., T, d_k)"
    ),
    answer_name="project_queries",
    cases=_project_cases,
    expected=_projected,
    diagnose=_project_diagnose,
    mistakes={
        "transposed_weights": Mistake(
            lambda x, w_q: x @ w_q.T,
            "with one row per token, multiply by W_Q itself: Q = X @ W_Q, not X @ W_Q.T",
        ),
        "column_convention": Mistake(
            _column_convention,
            "you returned Q transposed, one column per token: keep one row per token, Q = X @ W_Q",
        ),
    },
    explanation=(
        "`@` multiplies the last two axes and carries any leading (batch) axes along, so the one "
        "line serves a sentence and a batch alike."
    ),
)


def _columns_that_change():
    """Change column 0 of W_Q and report which columns of Q move."""
    ex = THE_CAT_SAT
    w_q = ex.w_q.copy()
    w_q[:, 0] += 1.0
    q_before, _, _ = project_qkv(ex.x, ex.w_q, ex.w_k, ex.w_v)
    q_after, _, _ = project_qkv(ex.x, w_q, ex.w_k, ex.w_v)
    return tuple(int(j) for j in np.flatnonzero(~np.isclose(q_before, q_after).all(axis=0)))


def _column_dependence():
    changed = _columns_that_change()
    if changed == (0,):
        return "a"
    return "b" if len(changed) == THE_CAT_SAT.q.shape[1] else "c"


column_depends_on = ChoiceExercise(
    id="ch1.column_depends_on",
    title="What does one column of W_Q change?",
    kind="predict",
    task=(
        "In $Q = X W_Q$, suppose you change only column $j$ of $W_Q$. Which entries of $Q$ change?\n\n"
        "- **a**: only column $j$ of $Q$: feature $j$ of every token's query\n"
        "- **b**: every entry of $Q$\n"
        "- **c**: only row $j$ of $Q$: the query of token $j$\n\n"
        'Set `answer` to `"a"`, `"b"` or `"c"`.'
    ),
    starter='answer = ...  # "a", "b" or "c"',
    solution=(
        "ex = attnlib.examples.THE_CAT_SAT\n"
        "w_q = ex.w_q.copy()\n"
        "w_q[:, 0] += 1.0  # change column 0 of W_Q only\n"
        "moved = ~np.isclose(ex.x @ w_q, ex.x @ ex.w_q)  # (T, d_k): which entries of Q moved\n"
        "print(moved)\n"
        'answer = "a"'
    ),
    answer_name="answer",
    options={"a": "only column j of Q", "b": "every entry of Q", "c": "only row j of Q"},
    expected=_column_dependence,
    mistakes={
        "everything": Mistake(
            lambda: "b",
            "entry [t, j] of Q is x_t times column j of W_Q: the other columns of Q are made "
            "from the other columns of W_Q",
        ),
        "row": Mistake(
            lambda: "c",
            "rows of Q are tokens: a column of W_Q makes one feature of every token's query",
        ),
    },
    explanation=(
        "Entry $[t, j]$ of $XW_Q$ is $x_t$ times column $j$ of $W_Q$: each column of the weights "
        "makes one feature of the queries, the same way for every token. Each row of $Q$, in "
        "turn, depends on one token's embedding only; tokens first meet in the score matrix $QK^\\top$."
    ),
)

EXERCISES = (qkv_parameter_count, project_queries, column_depends_on)
