"""Chapter 2, Token by token: one scaled score, one query's output, and where "cat" looks."""

import numpy as np

from ..attention import attention_weights
from ..examples import THE_CAT_SAT
from ..scores import score_matrix
from .core import Case, ChoiceExercise, FunctionExercise, Mistake, ValueExercise, attention_output

_CAT, _SAT = THE_CAT_SAT.index("cat"), THE_CAT_SAT.index("sat")


def _raw_score(query, key):
    return float(score_matrix(THE_CAT_SAT.q, THE_CAT_SAT.k)[query, key])


scaled_score = ValueExercise(
    id="ch2.scaled_score",
    title="One scaled score",
    kind="by hand",
    task=(
        'Using the rows of "the cat sat" from this chapter, compute the scaled score of the query of '
        '"cat" against the key of "sat", $q_{cat} \\cdot k_{sat} / \\sqrt{d_k}$, with pen and paper '
        "(or as a sum typed out in a cell). Three decimal places are enough."
    ),
    starter="answer = ...  # a number",
    solution=(
        "ex = attnlib.examples.THE_CAT_SAT\n"
        'q_cat, k_sat = ex.q[ex.index("cat")], ex.k[ex.index("sat")]\n'
        'print("q_cat =", q_cat, " k_sat =", k_sat)\n'
        "products = q_cat * k_sat  # one product per dimension\n"
        "answer = float(products.sum() / np.sqrt(ex.d_k))\n"
        'print(f"sum of products = {products.sum():.2f}, scaled by 1/sqrt({ex.d_k}): {answer:.3f}")'
    ),
    answer_name="answer",
    expected=lambda: _raw_score(_CAT, _SAT) / np.sqrt(THE_CAT_SAT.d_k),
    atol=5e-4,
    tolerance_text="to 3 decimal places",
    hint="multiply q_cat and k_sat entry by entry, add the four products, then divide by sqrt(d_k)",
    mistakes={
        "unscaled": Mistake(
            lambda: _raw_score(_CAT, _SAT), "that is the raw dot product: divide it by sqrt(d_k)"
        ),
        "divided_by_d_k": Mistake(
            lambda: _raw_score(_CAT, _SAT) / THE_CAT_SAT.d_k, "you divided by d_k: divide by its square root"
        ),
        "swapped": Mistake(
            lambda: _raw_score(_SAT, _CAT) / np.sqrt(THE_CAT_SAT.d_k),
            'that is the query of "sat" against the key of "cat": take q from "cat" and k from "sat"',
        ),
    },
    explanation=(
        "The dot product adds one product per dimension; the scale keeps that sum from growing with $d_k$."
    ),
)


def _one_query_cases():
    rng = np.random.default_rng(202)
    ex = THE_CAT_SAT
    return [
        Case('the query of "cat" over "the cat sat" (T=3, d_k=4, d_v=4)', (ex.q[_CAT], ex.k, ex.v)),
        Case(
            "T=6 keys, d_k=8, d_v=3", (rng.normal(size=8), rng.normal(size=(6, 8)), rng.normal(size=(6, 3)))
        ),
        Case(
            "a single key (T=1), d_k=5, d_v=2",
            (rng.normal(size=5), rng.normal(size=(1, 5)), rng.normal(size=(1, 2))),
        ),
        Case(
            "larger scores: T=4, d_k=16, entries up to about 10",
            (5 * rng.normal(size=16), 5 * rng.normal(size=(4, 16)), rng.normal(size=(4, 3))),
        ),
    ]


def _one_query_expected(case):
    q_t, k, v = case.args
    return attention_output(q_t[None, :], k, v)[0]  # (1, d_k) query -> (1, d_v) -> (d_v,)


def _loop_with_scale(scale_of):
    def attend(q_t, k, v):
        scores = np.array([q_t @ k_j for k_j in k]) * scale_of(len(q_t))
        weights = np.exp(scores - scores.max())
        weights /= weights.sum()
        return weights @ v

    return attend


def _weights_only(q_t, k, v):
    scores = k @ q_t / np.sqrt(len(q_t))
    weights = np.exp(scores - scores.max())
    return weights / weights.sum()


one_query_output = FunctionExercise(
    id="ch2.one_query_output",
    title="One query's output, by the loop",
    kind="implement",
    task=(
        "Write `attend_one(q_t, k, v)` that computes the output of one query the way this chapter "
        "does, token by token: for each key $j$, the score $s_j = q_t \\cdot k_j / \\sqrt{d_k}$; then "
        "the weights $\\alpha = \\mathrm{softmax}(s)$; then $\\sum_j \\alpha_j v_j$. Here `q_t` has "
        "shape `(d_k,)`, `k` is `(T, d_k)` and `v` is `(T, d_v)`; return an array of shape `(d_v,)`. "
        "A Python loop over the keys is welcome."
    ),
    starter="def attend_one(q_t, k, v):\n    ...  # your code here",
    solution=(
        "def attend_one(q_t, k, v):\n"
        "    d_k = len(q_t)\n"
        "    scores = np.array([q_t @ k_j / np.sqrt(d_k) for k_j in k])  # (T,)\n"
        "    weights = np.exp(scores - scores.max())  # subtracting the max keeps exp small\n"
        "    weights = weights / weights.sum()  # (T,), sums to 1\n"
        "    output = np.zeros(v.shape[1])\n"
        "    for alpha_j, v_j in zip(weights, v):\n"
        "        output += alpha_j * v_j  # (d_v,)\n"
        "    return output"
    ),
    answer_name="attend_one",
    cases=_one_query_cases,
    expected=_one_query_expected,
    mistakes={
        "unscaled": Mistake(
            _loop_with_scale(lambda d_k: 1.0), "you did not scale the scores: divide each by sqrt(d_k)"
        ),
        "scaled_by_d_k": Mistake(
            _loop_with_scale(lambda d_k: 1.0 / d_k), "you divided the scores by d_k: divide by sqrt(d_k)"
        ),
        "weights_only": Mistake(
            _weights_only,
            "you returned the weights, one per key: multiply each value row by its weight and add them up",
        ),
    },
    explanation=(
        'The output is a weighted average of the value rows. `attnlib.attention(..., backend="loop")` '
        "runs the same three steps for every query."
    ),
)


def _weights_of_cat():
    return attention_weights(THE_CAT_SAT.q, THE_CAT_SAT.k)[_CAT]  # row "cat": (T,)


def _most_attended():
    return THE_CAT_SAT.tokens[int(np.argmax(_weights_of_cat()))]


def _column_reading():
    column = attention_weights(THE_CAT_SAT.q, THE_CAT_SAT.k)[:, _CAT]
    return THE_CAT_SAT.tokens[int(np.argmax(column))]


cat_attends_most = ChoiceExercise(
    id="ch2.cat_attends_most",
    title='Where does "cat" look?',
    kind="predict",
    task=(
        'Before computing anything: in "the cat sat", with scaling and no mask, which token does '
        '"cat" give the largest attention weight? Set `answer` to `"the"`, `"cat"` or `"sat"`.'
    ),
    starter='answer = ...  # "the", "cat" or "sat"',
    solution=(
        "ex = attnlib.examples.THE_CAT_SAT\n"
        'weights_of_cat = attnlib.attention_weights(ex.q, ex.k)[ex.index("cat")]  # row "cat"\n'
        "for token, weight in zip(ex.tokens, weights_of_cat):\n"
        '    print(f"{token:>4}: {weight:.4f}")\n'
        "answer = ex.tokens[int(np.argmax(weights_of_cat))]"
    ),
    answer_name="answer",
    options={token: token for token in THE_CAT_SAT.tokens},
    expected=_most_attended,
    hint='compare the three entries of row "cat" of the weights, the query of "cat" against every key',
    mistakes={
        "column": Mistake(
            _column_reading,
            'that token is the one that attends most to "cat" (column "cat"); '
            'the question is about row "cat"',
        ),
        "itself": Mistake(
            lambda: "cat",
            "a token does not always match its own key best: "
            "the query and the key of a token come from different weights",
        ),
    },
    explanation=(
        'The three weights of "cat" are close to one another: with scores this small, the softmax '
        "spreads the weight almost evenly, and the largest score wins only by a little."
    ),
)

EXERCISES = (scaled_score, one_query_output, cat_attends_most)
