"""Chapter 13, The backward pass: dV by hand, the missing row sum, and dS~ from P, dP and O.

The chapter works dV for "cat" with every output in the loss (dO all ones); the
by-hand exercise leaves the output of "sat" out of the loss and asks for dV of
"sat", a number no page prints. Expected values come from
:func:`attnlib.attention_backward` when the check runs. The score-gradient
exercise gets its expected dS from it too: with k the identity matrix and
scale 1, the scores are q itself and ``dQ = dS K = dS`` (see
``_score_gradient_expected``).
"""

import numpy as np

from ..attention import attention_weights
from ..backward import attention_backward
from ..examples import THE_CAT_SAT
from .core import Case, FunctionExercise, Mistake, ValueExercise, attention_sizes

_THE, _CAT, _SAT = (THE_CAT_SAT.index(token) for token in ("the", "cat", "sat"))
_IN_LOSS = (_THE, _CAT)  # the queries whose outputs the by-hand loss sums


def _weights():
    return attention_weights(THE_CAT_SAT.q, THE_CAT_SAT.k)  # (3, 3), row i: query i's weights


def _d_out_the_and_cat():
    """dO of L = the sum of the outputs of "the" and "cat": ones in their rows, zeros for "sat"."""
    d_out = np.zeros_like(THE_CAT_SAT.v)
    d_out[list(_IN_LOSS)] = 1.0
    return d_out


def _dv_sat_entry():
    _, _, dv = attention_backward(THE_CAT_SAT.q, THE_CAT_SAT.k, THE_CAT_SAT.v, _d_out_the_and_cat())
    return float(dv[_SAT, 0])


def _weight_sum(rows, column):
    return float(sum(_weights()[row, column] for row in rows))


HINT_ROW_NOT_COLUMN = (
    'dV = P^T dO: the value of "sat" collects, from every query, the weight that query gave to "sat" '
    '(a column of P), not the weights "sat" gives to the others (its row)'
)
HINT_ROWSUM_MISSING = (
    "the gradient through the softmax is missing its row sum: a softmax does not change when the same "
    "number is added to every score of a row, so each row of d_s must sum to 0. Subtract "
    "rowsum(dO * O), one number per query row, from d_p before multiplying by p"
)
HINT_NO_KEEPDIMS = (
    "the row sum needs keepdims=True (shape (T_q, 1)), so that each query row subtracts its own number; "
    "without it the sums are subtracted along the keys"
)
HINT_ROWSUM_OF_DP = (
    "the term is rowsum(dO * O), which equals rowsum(P * dP): a sum weighted by the softmax weights, "
    "not the plain row sum of d_p"
)

dv_by_hand = ValueExercise(
    id="ch13.dv_by_hand",
    title='dV of "sat" by hand',
    kind="by hand",
    task=(
        'In "the cat sat", let the loss be the sum of every entry of the outputs of "the" and "cat" '
        'only, $L = \\sum_c (o_{\\text{the},c} + o_{\\text{cat},c})$. So $dO$ has rows $(1, 1, 1, 1)$ for '
        '"the" and "cat" and $(0, 0, 0, 0)$ for "sat". All four entries of $dv_{\\text{sat}}$, the gradient '
        'of $L$ with respect to the value row of "sat", are the same number. What is it? Work from the '
        "attention weights, `attnlib.attention_weights(ex.q, ex.k)` with "
        "`ex = attnlib.examples.THE_CAT_SAT`; three decimal places are enough."
    ),
    starter="answer = ...  # a number",
    solution=(
        "ex = attnlib.examples.THE_CAT_SAT\n"
        "P = attnlib.attention_weights(ex.q, ex.k)  # row i: query i's weights over the keys\n"
        'the, cat, sat = (ex.index(token) for token in ("the", "cat", "sat"))\n'
        'answer = P[the, sat] + P[cat, sat]  # dv_sat = sum_i P[i, sat] do_i; do_sat is 0\n'
        "\n"
        "d_out = np.zeros((3, 4))\n"
        "d_out[[the, cat]] = 1.0\n"
        "_, _, dv = attnlib.attention_backward(ex.q, ex.k, ex.v, d_out)\n"
        'print(f"by hand {answer:.4f}; attention_backward: dv_sat = {np.round(dv[sat], 4)}")'
    ),
    answer_name="answer",
    expected=_dv_sat_entry,
    atol=5e-4,
    tolerance_text="to 3 decimal places",
    hint=(
        "dv_sat = sum over the queries i of P[i, sat] * do_i: add up the weights that the queries in "
        "the loss give to \"sat\""
    ),
    mistakes={
        "row_not_column": Mistake(lambda: _weight_sum([_SAT], _THE) + _weight_sum([_SAT], _CAT),
                                  HINT_ROW_NOT_COLUMN),
        "sat_in_the_loss": Mistake(
            lambda: _weight_sum((_THE, _CAT, _SAT), _SAT),
            'the output of "sat" is not in this loss: its row of dO is 0, so the weight "sat" gives '
            "itself contributes nothing",
        ),
        "only_the": Mistake(lambda: _weight_sum([_THE], _SAT),
                            'add the contribution of "cat" too: both outputs are in the loss'),
        "only_cat": Mistake(lambda: _weight_sum([_CAT], _SAT),
                            'add the contribution of "the" too: both outputs are in the loss'),
        "four_entries": Mistake(
            lambda: 4 * _dv_sat_entry(),
            "that is the sum of the four entries of dv_sat; the question asks for one entry",
        ),
        "scores": Mistake(
            lambda: float(sum(THE_CAT_SAT.q[i] @ THE_CAT_SAT.k[_SAT] for i in _IN_LOSS)
                          / np.sqrt(THE_CAT_SAT.d_k)),
            "use the attention weights P (after the softmax), not the scores",
        ),
    },
    explanation=(
        "Each query hands the value of \"sat\" the weight it gave \"sat\", times its own output "
        "gradient: $dv_{\\text{sat}} = \\sum_i P_{i,\\text{sat}}\\, do_i$, a column of $P$. The query "
        "\"sat\" uses its own value most, but its output is not in this loss, so it adds nothing."
    ),
)


# Find the bug: the row sum left out ----------------------------------------------------

_SHIPPED_NO_ROWSUM = """def query_gradient(q, k, v, d_out):
    scale = 1 / np.sqrt(q.shape[-1])
    p = attnlib.attention_weights(q, k)  # (T_q, T_k), each row sums to 1
    d_p = d_out @ v.T  # (T_q, d_v) @ (d_v, T_k) -> (T_q, T_k)
    d_s = p * d_p  # (T_q, T_k): the gradient of the scaled scores
    return scale * d_s @ k  # (T_q, T_k) @ (T_k, d_k) -> (T_q, d_k)"""


def _query_gradient_with(delta_of):
    """dQ with the row term computed by ``delta_of(p, d_p, out, d_out)`` (the typical mistakes)."""
    def query_gradient(q, k, v, d_out):
        p = attention_weights(q, k)
        d_p = d_out @ v.T
        d_s = p * (d_p - delta_of(p, d_p, p @ v, d_out))
        return d_s @ k / np.sqrt(q.shape[-1])

    return query_gradient


def _query_gradient_cases():
    rng = np.random.default_rng(1001)
    ex = THE_CAT_SAT
    return [
        Case('"the cat sat" with dO all ones: q, k, v and d_out of shape (3, 4)',
             (ex.q, ex.k, ex.v, np.ones_like(ex.v))),
        Case("5 queries, 7 keys, d_k=4, d_v=3, a random d_out",
             (rng.normal(size=(5, 4)), rng.normal(size=(7, 4)), rng.normal(size=(7, 3)),
              rng.normal(size=(5, 3)))),
        Case("scores in the tens: 4 queries and 4 keys, d_k=8, d_v=2",
             (3 * rng.normal(size=(4, 8)), 3 * rng.normal(size=(4, 8)), rng.normal(size=(4, 2)),
              rng.normal(size=(4, 2)))),
    ]


fix_rowsum = FunctionExercise(
    id="ch13.fix_rowsum",
    title="Find the bug: a gradient that pushes whole rows",
    kind="find the bug",
    task=(
        "This function computes $dQ$, the gradient of the loss with respect to the queries, from "
        "$dO$. It runs and returns the right shape, but its $dQ$ differs from "
        "`attnlib.attention_backward(q, k, v, d_out)[0]`. Compare the two on \"the cat sat\" with "
        "`d_out = np.ones((3, 4))`, and look at the row sums of `d_s`. Find the mistake and fix it in "
        "the cell."
    ),
    starter=_SHIPPED_NO_ROWSUM,
    solution=(
        "def query_gradient(q, k, v, d_out):\n"
        "    scale = 1 / np.sqrt(q.shape[-1])\n"
        "    p = attnlib.attention_weights(q, k)  # (T_q, T_k), each row sums to 1\n"
        "    d_p = d_out @ v.T  # (T_q, d_v) @ (d_v, T_k) -> (T_q, T_k)\n"
        "    out = p @ v  # (T_q, d_v), the attention output\n"
        "    delta = (d_out * out).sum(axis=-1, keepdims=True)  # the fix: rowsum(dO * O)\n"
        "    d_s = p * (d_p - delta)  # (T_q, T_k): each row now sums to 0\n"
        "    return scale * d_s @ k  # (T_q, T_k) @ (T_k, d_k) -> (T_q, d_k)"
    ),
    answer_name="query_gradient",
    cases=_query_gradient_cases,
    expected=lambda case: attention_backward(*case.args)[0],
    sizes=attention_sizes,
    mistakes={
        "rowsum_missing": Mistake(_query_gradient_with(lambda p, d_p, out, d_out: 0.0), HINT_ROWSUM_MISSING),
        "rowsum_of_dp": Mistake(
            _query_gradient_with(lambda p, d_p, out, d_out: d_p.sum(axis=-1, keepdims=True)),
            HINT_ROWSUM_OF_DP,
        ),
        "no_keepdims": Mistake(
            _query_gradient_with(lambda p, d_p, out, d_out: (d_out * out).sum(axis=-1)), HINT_NO_KEEPDIMS
        ),
    },
    explanation=(
        "Adding the same number to every score of a row leaves its softmax, and so the loss, "
        "unchanged; the gradient of the scores can have no component along that direction, so each "
        "row of $d\\tilde S$ sums to 0. The term $\\operatorname{rowsum}(dO \\circ O)$, which is "
        "$p^\\top dp$, removes it. Without it, every query's gradient is off by "
        "$\\text{scale}\\cdot(p^\\top dp)\\,\\sum_j p_j k_j$."
    ),
)


# Implement: dS~ from P, dP and O ------------------------------------------------------


def _score_gradient_cases():
    rng = np.random.default_rng(1002)
    ex = THE_CAT_SAT
    problems = [  # (description, scores, v, d_out, causal)
        ('"the cat sat": P, dP, O of the running example with dO all ones',
         ex.q @ ex.k.T / np.sqrt(ex.d_k), ex.v, np.ones_like(ex.v), False),
        ("4 queries, 6 keys, d_v=3, a random dO",
         rng.normal(size=(4, 6)), rng.normal(size=(6, 3)), rng.normal(size=(4, 3)), False),
        ("a causal mask: 5 queries and 5 keys, zeros above the diagonal of P",
         rng.normal(size=(5, 5)), rng.normal(size=(5, 2)), rng.normal(size=(5, 2)), True),
    ]
    cases = []
    for description, scores, v, d_out, causal in problems:
        identity = np.eye(scores.shape[-1])  # q = scores, k = I, scale 1: the scores are q itself
        p = attention_weights(scores, identity, causal=causal, scale=1.0)  # (T_q, T_k)
        cases.append(Case(description, (p, d_out @ v.T, p @ v, d_out)))
    return cases


def _score_gradient_expected(case):
    """dS from attnlib.attention_backward, given only P and dP.

    With q = log P (the scores up to a constant per row, which the softmax ignores), k = I
    and scale 1, the scores are q itself and dQ = dS K = dS. With v = I and d_out = dP,
    attention_backward's dP is dP, and its rowsum(d_out * out) is rowsum(dP * P) = p^T dp,
    which equals rowsum(dO * O).
    """
    p, d_p = (np.asarray(x, dtype=np.float64) for x in case.args[:2])
    allowed = p > 0  # masked keys have weight exactly 0
    scores = np.log(np.where(allowed, p, 1.0))
    identity = np.eye(p.shape[-1])
    return attention_backward(scores, identity, identity, d_p, mask=allowed, scale=1.0)[0]


def _score_gradient_with(delta_of, times_p=True):
    def score_gradient(p, d_p, out, d_out):
        d_s = d_p - delta_of(p, d_p, out, d_out)
        return p * d_s if times_p else d_s

    return score_gradient


def _rowsum(p, d_p, out, d_out):
    return (d_out * out).sum(axis=-1, keepdims=True)


score_gradient = FunctionExercise(
    id="ch13.score_gradient",
    title="The gradient through the softmax",
    kind="implement",
    task=(
        "Write `score_gradient(p, d_p, out, d_out)`, which returns $d\\tilde S$, the gradient of the loss with "
        "respect to the scaled scores. `p` is the weight matrix $P$, shape `(T_q, T_k)`, each row the "
        "softmax of a row of scores; `d_p` is $dP = dO\\,V^\\top$, the same shape; `out` is the output "
        "$O = PV$ and `d_out` its gradient $dO$, both `(T_q, d_v)`. Use the row-sum form, not a "
        "Jacobian per row. One hidden case has a causal mask, so some weights are exactly 0."
    ),
    starter="def score_gradient(p, d_p, out, d_out):\n    ...  # your code here",
    solution=(
        "def score_gradient(p, d_p, out, d_out):\n"
        "    delta = (d_out * out).sum(axis=-1, keepdims=True)  # (T_q, 1): rowsum(dO * O)\n"
        "    return p * (d_p - delta)  # (T_q, T_k)"
    ),
    answer_name="score_gradient",
    cases=_score_gradient_cases,
    expected=_score_gradient_expected,
    mistakes={
        "rowsum_missing": Mistake(_score_gradient_with(lambda p, d_p, out, d_out: 0.0),
                                  HINT_ROWSUM_MISSING.replace("d_s must", "dS~ must")),
        "no_keepdims": Mistake(_score_gradient_with(lambda p, d_p, out, d_out: (d_out * out).sum(axis=-1)),
                               HINT_NO_KEEPDIMS),
        "columns": Mistake(
            _score_gradient_with(lambda p, d_p, out, d_out: (d_out * out).sum(axis=0, keepdims=True).T),
            "sum dO * O over each row, axis=-1 (the d_v entries of one query's output), one number per "
            "query",
        ),
        "rowsum_of_dp": Mistake(
            _score_gradient_with(lambda p, d_p, out, d_out: d_p.sum(axis=-1, keepdims=True)),
            HINT_ROWSUM_OF_DP,
        ),
        "not_times_p": Mistake(
            _score_gradient_with(_rowsum, times_p=False),
            "multiply by p: dS~ = P * (dP - rowsum(dO * O)); a weight near 0 passes almost no gradient "
            "back to its score, and a masked score (weight 0) gets none",
        ),
    },
    explanation=(
        "$\\operatorname{rowsum}(dO \\circ O)$ is $p^\\top dp$ for each row, the term the softmax's "
        "Jacobian $\\operatorname{diag}(p) - pp^\\top$ subtracts, so `(p * d_p).sum(axis=-1, "
        "keepdims=True)` in its place passes too. The form with $dO$ and $O$ is the one FlashAttention "
        "uses: it costs $O(T\\,d)$ before any block of $P$ exists."
    ),
)

EXERCISES = (dv_by_hand, fix_rowsum, score_gradient)
