"""Chapter 5, The weighted sum of V: one output entry, the first token under a causal mask, a wrong axis."""

import numpy as np

from ..attention import attention_weights
from ..examples import THE_CAT_SAT
from ..softmax import softmax
from .core import (
    HINT_COLUMNS,
    Case,
    ChoiceExercise,
    FunctionExercise,
    Mistake,
    ValueExercise,
    attention_output,
)

_CAT = THE_CAT_SAT.index("cat")


def _output_entry(weights):
    return float((weights @ THE_CAT_SAT.v)[_CAT, 0])


output_entry = ValueExercise(
    id="ch5.output_entry",
    title="One entry of the output",
    kind="by hand",
    task=(
        'The output of "cat" is its weights times the value rows: $z_{cat} = \\sum_j \\alpha_{cat,j} v_j$. '
        'Using the attention weights of "the cat sat" (scaled, no mask) and its value rows, compute '
        "the first entry of $z_{cat}$. Three decimal places are enough."
    ),
    starter="answer = ...  # a number",
    solution=(
        "ex = attnlib.examples.THE_CAT_SAT\n"
        'alpha_cat = attnlib.attention_weights(ex.q, ex.k)[ex.index("cat")]  # (T,) weights of "cat"\n'
        "first_values = ex.v[:, 0]  # (T,) entry 0 of every value row\n"
        "answer = float(alpha_cat @ first_values)  # sum_j alpha_cat,j * v_j[0]\n"
        'print(" + ".join(f"{a:.4f}*{v:.1f}" for a, v in zip(alpha_cat, first_values)), f"= {answer:.4f}")'
    ),
    answer_name="answer",
    expected=lambda: _output_entry(attention_weights(THE_CAT_SAT.q, THE_CAT_SAT.k)),
    atol=5e-4,
    tolerance_text="to 3 decimal places",
    hint='multiply each weight of row "cat" by entry 0 of the matching value row, and add',
    mistakes={
        "unscaled": Mistake(
            lambda: _output_entry(attention_weights(THE_CAT_SAT.q, THE_CAT_SAT.k, scale=1.0)),
            "those are the weights without the 1/sqrt(d_k) scale",
        ),
        "column_weights": Mistake(
            lambda: float(attention_weights(THE_CAT_SAT.q, THE_CAT_SAT.k)[:, _CAT] @ THE_CAT_SAT.v[:, 0]),
            'you used column "cat" of the weights: the weights of "cat" are its row',
        ),
        "row_of_values": Mistake(
            lambda: float(attention_weights(THE_CAT_SAT.q, THE_CAT_SAT.k)[_CAT] @ THE_CAT_SAT.v[0, :3]),
            "you used entries of one value row: take entry 0 of each value row",
        ),
    },
    explanation="Each entry of the output is a weighted average of the same entry across the value rows.",
)


def _first_token_output():
    ex = THE_CAT_SAT
    first = attention_output(ex.q, ex.k, ex.v, causal=True)[0]
    if np.allclose(first, ex.v[0]):
        return "a"
    if np.allclose(first, ex.v.mean(axis=0)):
        return "b"
    return "c" if np.allclose(first, 0.0) else "d"


causal_first_output = ChoiceExercise(
    id="ch5.causal_first_output",
    title="The first token of a decoder",
    kind="predict",
    task=(
        'With the causal mask, what is the output of the first token, "the", of "the cat sat"?\n\n'
        '- **a**: exactly the value row of "the"\n'
        "- **b**: the mean of the three value rows\n"
        "- **c**: a row of zeros\n"
        "- **d**: none of these\n\n"
        'Set `answer` to `"a"`, `"b"`, `"c"` or `"d"`.'
    ),
    starter='answer = ...  # "a", "b", "c" or "d"',
    solution=(
        "ex = attnlib.examples.THE_CAT_SAT\n"
        "output = attnlib.attention(ex.q, ex.k, ex.v, causal=True)\n"
        'print("output of the:", output[0])\n'
        'print("value of the: ", ex.v[0])\n'
        'answer = "a"'
    ),
    answer_name="answer",
    options={"a": "its own value row", "b": "the mean of the values", "c": "zeros", "d": "none of these"},
    expected=_first_token_output,
    hint="list the keys the first token may attend to under the causal mask",
    mistakes={
        "mean": Mistake(
            lambda: "b",
            "that is what equal weights over all three tokens would give; the first token sees only itself",
        ),
        "zeros": Mistake(
            lambda: "c",
            "masked keys get weight 0, but the first token keeps one key, itself, and its weights sum to 1",
        ),
    },
    explanation=(
        "The first token may attend only to itself, so its one weight is 1 and its output is its "
        "own value row, whatever the scores."
    ),
)

_SHIPPED_WRONG_AXIS = """def my_attention(q, k, v):
    d_k = q.shape[-1]
    scores = q @ k.swapaxes(-2, -1) / np.sqrt(d_k)  # (..., T_q, T_k)
    scores = scores - scores.max(axis=-2, keepdims=True)
    weights = np.exp(scores)
    weights = weights / weights.sum(axis=-2, keepdims=True)
    return weights @ v  # (..., T_q, T_k) @ (..., T_k, d_v) -> (..., T_q, d_v)"""


def _attention_cases():
    rng = np.random.default_rng(505)
    ex = THE_CAT_SAT
    return [
        Case('"the cat sat": q, k, v of shape (3, 4)', (ex.q, ex.k, ex.v)),
        Case(
            "T=5, d_k=4, d_v=2", (rng.normal(size=(5, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2)))
        ),
        Case(
            "a batch of 2, 2 queries and 4 keys, d_k=3, d_v=3",
            (rng.normal(size=(2, 2, 3)), rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 4, 3))),
        ),
    ]


def _attention_with_axes(max_axis, sum_axis):
    def attend(q, k, v):
        scores = q @ k.swapaxes(-2, -1) / np.sqrt(q.shape[-1])
        weights = np.exp(scores - scores.max(axis=max_axis, keepdims=True))
        return weights / weights.sum(axis=sum_axis, keepdims=True) @ v

    return attend


fix_wrong_axis = FunctionExercise(
    id="ch5.fix_wrong_axis",
    title="Find the bug: outputs that do not average the values",
    kind="find the bug",
    task=(
        "This attention function returns outputs of the right shape, but they are not weighted "
        "averages of the value rows. Find the mistake and fix it in the cell. A useful check: print "
        "the weights and add up their rows."
    ),
    starter=_SHIPPED_WRONG_AXIS,
    solution=(
        "def my_attention(q, k, v):\n"
        "    d_k = q.shape[-1]\n"
        "    scores = q @ k.swapaxes(-2, -1) / np.sqrt(d_k)  # (..., T_q, T_k)\n"
        "    scores = scores - scores.max(axis=-1, keepdims=True)  # the fix: over the keys...\n"
        "    weights = np.exp(scores)\n"
        "    weights = weights / weights.sum(axis=-1, keepdims=True)  # ...so each row sums to 1\n"
        "    return weights @ v  # (..., T_q, T_k) @ (..., T_k, d_v) -> (..., T_q, d_v)"
    ),
    answer_name="my_attention",
    cases=_attention_cases,
    expected=lambda case: attention_output(*case.args),
    mistakes={
        "columns": Mistake(_attention_with_axes(-2, -2), HINT_COLUMNS),
        "half_fixed": Mistake(
            _attention_with_axes(-2, -1),
            "you fixed the sum but not the maximum: subtract the maximum along the same axis, -1",
        ),
        "unscaled": Mistake(
            lambda q, k, v: softmax(q @ k.swapaxes(-2, -1), axis=-1) @ v,
            "these weights are not scaled: divide the scores by sqrt(d_k)",
        ),
    },
    explanation=(
        "Each query's weights over the keys must sum to 1, so both the maximum and the sum run "
        "along the key axis, the last one. Normalising over axis -2 makes each *key's* column sum "
        "to 1 instead."
    ),
)

EXERCISES = (output_entry, causal_first_output, fix_wrong_axis)
