"""Chapter 5, The weighted sum of V: one output entry, the first token under a causal mask, a wrong axis.

Chapters 2, 4 and 5 print every weight and every output of "the cat sat" without
a mask, so the by-hand exercise asks for an output under the causal mask of
chapter 4, which no chapter prints.
"""

import numpy as np

from ..attention import attention_weights
from ..examples import THE_CAT_SAT
from ..scores import score_matrix
from ..softmax import softmax
from .core import (
    HINT_COLUMNS,
    Case,
    ChoiceExercise,
    FunctionExercise,
    Mistake,
    ValueExercise,
    attention_output,
    attention_sizes,
)

_CAT = THE_CAT_SAT.index("cat")
_ENTRY = THE_CAT_SAT.v.shape[1] - 1  # the last entry of an output row


def _row_text(row, digits):
    return "[" + ", ".join(f"{x:.{digits}g}" for x in row) + "]"


def _entry_of_cat(weights, values=None):
    values = THE_CAT_SAT.v[:, _ENTRY] if values is None else values
    return float(weights[_CAT] @ values)  # o_cat[entry] = sum_j A[cat, j] * v_j[entry]


def _causal_weights(scale=None):
    return attention_weights(THE_CAT_SAT.q, THE_CAT_SAT.k, causal=True, scale=scale)


def _kept_but_not_renormalised():
    weights = attention_weights(THE_CAT_SAT.q, THE_CAT_SAT.k)  # no mask
    return _entry_of_cat(np.tril(weights))  # the future weight dropped, the others left as they were


_SCALED_CAT = score_matrix(THE_CAT_SAT.q, THE_CAT_SAT.k)[_CAT] / np.sqrt(THE_CAT_SAT.d_k)

output_entry = ValueExercise(
    id="ch5.output_entry",
    title="One entry of a causal output",
    kind="by hand",
    task=(
        'The output of "cat" is its row of weights times the value rows, '
        "$o_{\\text{cat}} = \\sum_j A_{\\text{cat},j}\\, v_j$. "
        'Under the causal mask of chapter 4, "cat" may attend only to "the" and to itself. The scaled '
        f'scores of "cat" are ${_row_text(_SCALED_CAT, 3)}$ (for "the", "cat", "sat"), and the last '
        f"entries of the three value rows are ${_row_text(THE_CAT_SAT.v[:, _ENTRY], 3)}$. Compute the "
        f"last entry, $o_{{\\text{{cat}}}}[{_ENTRY}]$, of the causal output of \"cat\". Three decimal places "
        "are enough."
    ),
    starter="answer = ...  # a number",
    solution=(
        "ex = attnlib.examples.THE_CAT_SAT\n"
        'cat = ex.index("cat")\n'
        "scaled = ex.q[cat] @ ex.k.T / np.sqrt(ex.d_k)  # (T,) scaled scores of \"cat\"\n"
        "scaled[cat + 1 :] = -np.inf  # the causal mask: no key after \"cat\"\n"
        "exps = np.exp(scaled - scaled.max())\n"
        "A_cat = exps / exps.sum()  # row \"cat\" of A, renormalised over the keys that remain\n"
        "o_cat = A_cat @ ex.v  # o_cat = sum_j A[cat, j] v_j, (d_v,)\n"
        f"answer = float(o_cat[{_ENTRY}])\n"
        'print("weights of cat:", np.round(A_cat, 4), f" entry: {answer:.4f}")'
    ),
    answer_name="answer",
    expected=lambda: _entry_of_cat(_causal_weights()),
    atol=5e-4,
    tolerance_text="to 3 decimal places",
    hint=(
        'take the softmax of the scores "cat" may see, the first two, then multiply each weight by '
        "the matching value entry and add"
    ),
    mistakes={
        "no_mask": Mistake(
            lambda: _entry_of_cat(attention_weights(THE_CAT_SAT.q, THE_CAT_SAT.k)),
            'that is the output without the mask: "cat" may not attend to "sat"',
        ),
        "not_renormalised": Mistake(
            _kept_but_not_renormalised,
            'you gave "sat" weight 0 but kept the other two weights as they were: the softmax runs '
            "over the keys that remain, so the two weights of \"cat\" must sum to 1",
        ),
        "unscaled": Mistake(
            lambda: _entry_of_cat(_causal_weights(scale=1.0)),
            "those are the weights without the 1/sqrt(d_k) scale",
        ),
        "column_weights": Mistake(
            lambda: float(_causal_weights()[:, _CAT] @ THE_CAT_SAT.v[:, _ENTRY]),
            'you used column "cat" of the weights: the weights of "cat" are its row',
        ),
        "row_of_values": Mistake(
            lambda: _entry_of_cat(_causal_weights(), THE_CAT_SAT.v[_CAT, : len(THE_CAT_SAT.tokens)]),
            f"you used entries of one value row: take entry {_ENTRY} of each value row",
        ),
    },
    explanation=(
        "Masking removes a key and the softmax shares all the weight among the keys that remain, "
        "so the output of a token under a causal mask is a weighted average of its own value "
        "and those before it."
    ),
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
    sizes=attention_sizes,
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
