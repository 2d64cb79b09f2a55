"""Chapter 2, Token by token: one scaled score, one query's output, and a doubled key.

The chapter prints every score, scaled score and weight of "the cat sat" (its
figure steps through all of them), so the by-hand and predict exercises ask
about a key the chapter never shows: a made-up fourth token, and a doubled key.
"""

import numpy as np

from ..attention import attention_weights
from ..examples import THE_CAT_SAT
from .core import (
    Case,
    ChoiceExercise,
    FunctionExercise,
    Mistake,
    ValueExercise,
    attention_output,
    attention_sizes,
)

_CAT = THE_CAT_SAT.index("cat")
# The by-hand exercise: the sentence goes on, "the cat sat down", with a made-up key for "down".
NEW_TOKEN = "down"
NEW_KEY = np.array([0.8, 0.1, 0.6, 0.4])
# The predict exercise: the key of this token is doubled.
DOUBLED = THE_CAT_SAT.index("the")


def _row_text(row):
    return "[" + ", ".join(f"{x:g}" for x in row) + "]"


def _score_of_cat_against_new_key():
    return float(THE_CAT_SAT.q[_CAT] @ NEW_KEY)  # (d_k,) . (d_k,)


scaled_score = ValueExercise(
    id="ch2.scaled_score",
    title="One scaled score",
    kind="by hand",
    task=(
        f'Suppose the sentence goes on, "the cat sat {NEW_TOKEN}", and the key of "{NEW_TOKEN}" is '
        f"$k_{{{NEW_TOKEN}}} = {_row_text(NEW_KEY)}$ (a made-up row). With the query of \"cat\" from "
        f"this chapter, $q_{{cat}} = {_row_text(THE_CAT_SAT.q[_CAT])}$, and $d_k = {THE_CAT_SAT.d_k}$, "
        f"compute the scaled score $q_{{cat}} \\cdot k_{{{NEW_TOKEN}}} / \\sqrt{{d_k}}$ with pen and "
        "paper (or as a sum typed out in a cell). Three decimal places are enough."
    ),
    starter="answer = ...  # a number",
    solution=(
        "ex = attnlib.examples.THE_CAT_SAT\n"
        'q_cat = ex.q[ex.index("cat")]\n'
        f"k_{NEW_TOKEN} = np.array({NEW_KEY.tolist()})\n"
        f"products = q_cat * k_{NEW_TOKEN}  # one product per dimension\n"
        "answer = float(products.sum() / np.sqrt(ex.d_k))\n"
        f'terms = " + ".join(f"{{a:g}}*{{b:g}}" for a, b in zip(q_cat, k_{NEW_TOKEN}))\n'
        'print(terms, f"= {products.sum():.2f}, scaled by 1/sqrt({ex.d_k}): {answer:.3f}")'
    ),
    answer_name="answer",
    expected=lambda: _score_of_cat_against_new_key() / np.sqrt(THE_CAT_SAT.d_k),
    atol=5e-4,
    tolerance_text="to 3 decimal places",
    hint="multiply the two rows entry by entry, add the four products, then divide by sqrt(d_k)",
    mistakes={
        "unscaled": Mistake(
            _score_of_cat_against_new_key, "that is the raw dot product: divide it by sqrt(d_k)"
        ),
        "divided_by_d_k": Mistake(
            lambda: _score_of_cat_against_new_key() / THE_CAT_SAT.d_k,
            "you divided by d_k: divide by its square root",
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
        "    # subtracting the max only keeps exp from overflowing (chapter 4 explains it)\n"
        "    weights = np.exp(scores - scores.max())\n"
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


def _largest_weight_of_cat(doubled):
    """The token "cat" gives the largest weight, with the key of token ``doubled`` doubled (or none)."""
    k = THE_CAT_SAT.k.copy()
    if doubled is not None:
        k[doubled] *= 2
    weights = attention_weights(THE_CAT_SAT.q, k)[_CAT]  # (T,): row "cat"
    return THE_CAT_SAT.tokens[int(np.argmax(weights))]


_DOUBLED_NAME = THE_CAT_SAT.tokens[DOUBLED]
_OPTIONS_TEXT = (
    ", ".join(f'`"{token}"`' for token in THE_CAT_SAT.tokens[:-1]) + f' or `"{THE_CAT_SAT.tokens[-1]}"`'
)

doubled_key = ChoiceExercise(
    id="ch2.doubled_key",
    title="A doubled key",
    kind="predict",
    task=(
        f'In this chapter "cat" gives its largest weight to "{_largest_weight_of_cat(None)}". Suppose '
        f'the key of "{_DOUBLED_NAME}" were doubled, $2 k_{{{_DOUBLED_NAME}}}$: still '
        f"$d_k = {THE_CAT_SAT.d_k}$ entries wide and pointing the same way, but twice the size (twice "
        "its *norm*, $\\lVert k \\rVert = \\sqrt{k \\cdot k}$). Nothing else changes. Before "
        'computing: which token would "cat" then give the largest weight? Set '
        f"`answer` to {_OPTIONS_TEXT}."
    ),
    starter="answer = ...  # " + " or ".join(f'"{token}"' for token in THE_CAT_SAT.tokens),
    solution=(
        "ex = attnlib.examples.THE_CAT_SAT\n"
        "k = ex.k.copy()\n"
        f'k[ex.index("{_DOUBLED_NAME}")] *= 2  # same direction, twice the norm\n'
        'weights_of_cat = attnlib.attention_weights(ex.q, k)[ex.index("cat")]\n'
        "for token, weight in zip(ex.tokens, weights_of_cat):\n"
        '    print(f"{token:>4}: {weight:.4f}")\n'
        "answer = ex.tokens[int(np.argmax(weights_of_cat))]"
    ),
    answer_name="answer",
    options={token: token for token in THE_CAT_SAT.tokens},
    expected=lambda: _largest_weight_of_cat(DOUBLED),
    hint=(
        f'the dot product is linear: doubling k_{_DOUBLED_NAME} doubles the score of "cat" against it; '
        "compare that with the other two scores"
    ),
    mistakes={
        "unchanged": Mistake(
            lambda: _largest_weight_of_cat(None),
            f'doubling k_{_DOUBLED_NAME} doubles the score of "cat" against it, and the largest score '
            "gets the largest weight: compare the new score with the other two",
        ),
    },
    explanation=(
        "A dot product grows with the norm of its vectors: doubling a key doubles every score "
        "against it, so a key with a larger norm draws more attention from every query that points "
        "its way. Dividing by $\\sqrt{d_k}$ does not undo this: it depends on the width alone, and "
        "like the softmax it keeps the scores in order, so the largest score still wins."
    ),
)

EXERCISES = (scaled_score, one_query_output, doubled_key)
