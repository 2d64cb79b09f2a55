"""Chapter 2, Token by token: one scaled score, one query's output, and where "the" looks.

The chapter follows "cat" and prints its scores, scaled scores and weights, so
the by-hand and predict exercises here ask about other tokens, whose numbers
the chapter never prints.
"""

import numpy as np

from ..attention import attention_weights
from ..examples import THE_CAT_SAT
from ..scores import score_matrix
from .core import (
    Case,
    ChoiceExercise,
    FunctionExercise,
    Mistake,
    ValueExercise,
    attention_output,
    attention_sizes,
)

# The pair of the by-hand exercise: the query of "sat" against the key of "the".
_QUERY, _KEY = THE_CAT_SAT.index("sat"), THE_CAT_SAT.index("the")
# The token of the predict exercise.
_LOOKER = THE_CAT_SAT.index("the")


def _row_text(row):
    return "[" + ", ".join(f"{x:g}" for x in row) + "]"


def _raw_score(query, key):
    return float(score_matrix(THE_CAT_SAT.q, THE_CAT_SAT.k)[query, key])


_Q_NAME, _K_NAME = THE_CAT_SAT.tokens[_QUERY], THE_CAT_SAT.tokens[_KEY]

scaled_score = ValueExercise(
    id="ch2.scaled_score",
    title="One scaled score",
    kind="by hand",
    task=(
        f'In "the cat sat", the query of "{_Q_NAME}" is '
        f"$q_{{{_Q_NAME}}} = {_row_text(THE_CAT_SAT.q[_QUERY])}$ "
        f'and the key of "{_K_NAME}" is $k_{{{_K_NAME}}} = {_row_text(THE_CAT_SAT.k[_KEY])}$ '
        f"($d_k = {THE_CAT_SAT.d_k}$). Compute the scaled score "
        f"$q_{{{_Q_NAME}}} \\cdot k_{{{_K_NAME}}} / \\sqrt{{d_k}}$ with pen and paper "
        "(or as a sum typed out in a cell). Three decimal places are enough."
    ),
    starter="answer = ...  # a number",
    solution=(
        "ex = attnlib.examples.THE_CAT_SAT\n"
        f'q_{_Q_NAME}, k_{_K_NAME} = ex.q[ex.index("{_Q_NAME}")], ex.k[ex.index("{_K_NAME}")]\n'
        f"products = q_{_Q_NAME} * k_{_K_NAME}  # one product per dimension\n"
        "answer = float(products.sum() / np.sqrt(ex.d_k))\n"
        'print(" + ".join(f"{a:g}*{b:g}" for a, b in '
        f'zip(q_{_Q_NAME}, k_{_K_NAME})), f"= {{products.sum():.2f}}")\n'
        'print(f"scaled by 1/sqrt({ex.d_k}): {answer:.3f}")'
    ),
    answer_name="answer",
    expected=lambda: _raw_score(_QUERY, _KEY) / np.sqrt(THE_CAT_SAT.d_k),
    atol=5e-4,
    tolerance_text="to 3 decimal places",
    hint="multiply the two rows entry by entry, add the four products, then divide by sqrt(d_k)",
    mistakes={
        "unscaled": Mistake(
            lambda: _raw_score(_QUERY, _KEY), "that is the raw dot product: divide it by sqrt(d_k)"
        ),
        "divided_by_d_k": Mistake(
            lambda: _raw_score(_QUERY, _KEY) / THE_CAT_SAT.d_k,
            "you divided by d_k: divide by its square root",
        ),
        "swapped": Mistake(
            lambda: _raw_score(_KEY, _QUERY) / np.sqrt(THE_CAT_SAT.d_k),
            f'that is the query of "{_K_NAME}" against the key of "{_Q_NAME}": '
            f'take q from "{_Q_NAME}" and k from "{_K_NAME}"',
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
        Case(
            'the query of "cat" over "the cat sat" (T=3, d_k=4, d_v=4)',
            (ex.q[ex.index("cat")], ex.k, ex.v),
        ),
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
    sizes=attention_sizes,
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


def _most_attended():
    weights = attention_weights(THE_CAT_SAT.q, THE_CAT_SAT.k)[_LOOKER]  # scaled, softmaxed: (T,)
    return THE_CAT_SAT.tokens[int(np.argmax(weights))]


_LOOKER_NAME = THE_CAT_SAT.tokens[_LOOKER]
_KEYS_TEXT = ", ".join(
    f"$k_{{{token}}} = {_row_text(row)}$" for token, row in zip(THE_CAT_SAT.tokens, THE_CAT_SAT.k)
)
_OPTIONS_TEXT = (
    ", ".join(f'`"{token}"`' for token in THE_CAT_SAT.tokens[:-1]) + f' or `"{THE_CAT_SAT.tokens[-1]}"`'
)

the_attends_most = ChoiceExercise(
    id="ch2.the_attends_most",
    title=f'Where does "{_LOOKER_NAME}" look?',
    kind="predict",
    task=(
        f'This chapter followed "cat". Now take "{_LOOKER_NAME}": with scaling and no mask, which token '
        f'does "{_LOOKER_NAME}" give the largest attention weight? Decide from dot products alone, '
        "without computing a softmax. Its query is "
        f"$q_{{{_LOOKER_NAME}}} = {_row_text(THE_CAT_SAT.q[_LOOKER])}$ and the keys are {_KEYS_TEXT}. "
        f"Set `answer` to {_OPTIONS_TEXT}."
    ),
    starter="answer = ...  # " + " or ".join(f'"{token}"' for token in THE_CAT_SAT.tokens),
    solution=(
        "ex = attnlib.examples.THE_CAT_SAT\n"
        f'q_{_LOOKER_NAME} = ex.q[ex.index("{_LOOKER_NAME}")]\n'
        f"scores = ex.k @ q_{_LOOKER_NAME}  # one dot product per key: (T,)\n"
        f"weights = attnlib.attention_weights(ex.q, ex.k)[ex.index(\"{_LOOKER_NAME}\")]  # the check\n"
        "for token, score, weight in zip(ex.tokens, scores, weights):\n"
        '    print(f"{token:>4}: score {score:.2f}, weight {weight:.4f}")\n'
        "answer = ex.tokens[int(np.argmax(scores))]  # softmax keeps the order of the scores"
    ),
    answer_name="answer",
    options={token: token for token in THE_CAT_SAT.tokens},
    expected=_most_attended,
    hint=(
        f'the largest weight goes to the largest score: compute q_{_LOOKER_NAME} · k for each of the '
        "three keys and compare"
    ),
    mistakes={
        "itself": Mistake(
            lambda: _LOOKER_NAME,
            "a token does not always match its own key best: "
            "the query and the key of a token come from different weights",
        ),
    },
    explanation=(
        "Dividing by $\\sqrt{d_k}$ and the softmax both keep the order of the scores, so the largest "
        "dot product gets the largest weight. Here that is not the token's own key: a query and a key "
        "of the same token come from different weights and need not match."
    ),
)

EXERCISES = (scaled_score, one_query_output, the_attends_most)
