"""Chapter 4, Scale and softmax: a weight by hand, a softmax that cannot overflow, two bugs,
a prediction about the scale, and the causal mask.

The chapter prints the softmax of the row [2, 4, 6] and every weight of "the cat
sat", so the by-hand exercise uses a score row the chapter never prints.
"""

import numpy as np

from ..attention import attention_weights
from ..examples import THE_CAT_SAT
from ..masks import causal_mask
from ..softmax import softmax
from .core import (
    HINT_OVERFLOW,
    Case,
    ChoiceExercise,
    FunctionExercise,
    Mistake,
    ValueExercise,
    as_numeric_array,
    attention_sizes,
    weights_hint,
)

HINT_GLOBAL_MAX = "subtract each row's own maximum (keepdims=True), not the maximum of the whole array"
HINT_SQRT_T = "the weights change when T changes but not when d_k changes: you scaled by sqrt(T)"

# The score row of the by-hand exercise, its d_k, and the key whose weight it asks for.
HAND_SCORES = np.array([2.0, 8.0, 4.0, 0.0])
HAND_D_K = 16
HAND_KEY = 2
_ORDINALS = ("first", "second", "third", "fourth", "fifth")


def _hand_weight(scale, exponentiate=True):
    scaled = HAND_SCORES * scale
    if not exponentiate:
        return float(scaled[HAND_KEY] / scaled.sum())
    return float(softmax(scaled)[HAND_KEY])


_HAND_TEXT = "[" + ", ".join(f"{s:g}" for s in HAND_SCORES) + "]"

softmax_weight = ValueExercise(
    id="ch4.softmax_weight",
    title="One softmax weight",
    kind="by hand",
    task=(
        f"A query has the scores ${_HAND_TEXT}$ against {len(HAND_SCORES)} keys, and $d_k = {HAND_D_K}$. "
        "Scale the scores by $1/\\sqrt{d_k}$, take the softmax, and give the weight of the "
        f"{_ORDINALS[HAND_KEY]} key. Three decimal places are enough."
    ),
    starter="answer = ...  # a number between 0 and 1",
    solution=(
        f"scores = np.array({HAND_SCORES.tolist()})\n"
        f"scaled = scores / np.sqrt({HAND_D_K})  # divide by sqrt(d_k)\n"
        "exps = np.exp(scaled)\n"
        f"answer = float(exps[{HAND_KEY}] / exps.sum())  # the {_ORDINALS[HAND_KEY]} key's share\n"
        'print(f"scaled scores {scaled}, weights {np.round(exps / exps.sum(), 3)}")'
    ),
    answer_name="answer",
    expected=lambda: _hand_weight(1 / np.sqrt(HAND_D_K)),
    atol=5e-4,
    tolerance_text="to 3 decimal places",
    hint=(
        f"divide each score by sqrt(d_k), exponentiate, and divide the {_ORDINALS[HAND_KEY]} "
        "exponential by the sum of all"
    ),
    mistakes={
        "unscaled": Mistake(
            lambda: _hand_weight(1.0), "you skipped the scaling: divide the scores by sqrt(d_k) first"
        ),
        "divided_by_d_k": Mistake(
            lambda: _hand_weight(1 / HAND_D_K), "you divided by d_k: divide by its square root"
        ),
        "no_exp": Mistake(
            lambda: _hand_weight(1 / np.sqrt(HAND_D_K), exponentiate=False),
            "you divided the scaled score by the sum of the scaled scores: "
            "softmax exponentiates first, e^s_j / sum_i e^s_i",
        ),
    },
    explanation=(
        f"Without the scale the largest score, {HAND_SCORES.max():g}, would take "
        f"{float(softmax(HAND_SCORES).max()):.0%} of the weight instead of "
        f"{float(softmax(HAND_SCORES / np.sqrt(HAND_D_K)).max()):.0%}: scaling softens the softmax."
    ),
)


def _softmax_cases():
    rng = np.random.default_rng(404)
    masked = rng.normal(size=(2, 3, 4))
    masked[..., 1:][rng.random(size=(2, 3, 3)) < 0.4] = -np.inf  # column 0 stays finite
    return [
        Case("the row [2, 4, 6], shape (3,)", (np.array([2.0, 4.0, 6.0]),)),
        Case("ordinary scores, shape (4, 6)", (rng.normal(size=(4, 6)),)),
        Case("large scores, up to a few thousand, shape (3, 5)", (1000 * rng.normal(size=(3, 5)),)),
        Case(
            "one row near +1000 and one near -1000, shape (2, 4)",
            (np.stack([1000 + rng.normal(size=4), -1000 + rng.normal(size=4)]),),
        ),
        Case("axis=0 on shape (5, 3)", (rng.normal(size=(5, 3)),), {"axis": 0}),
        Case("masked keys (-inf) in shape (2, 3, 4)", (masked,)),
    ]


def _softmax_expected(case):
    return softmax(*case.args, **case.kwargs)


def _global_max_softmax(x, axis=-1):
    exps = np.exp(x - np.max(x))
    return exps / exps.sum(axis=axis, keepdims=True)


def _naive_softmax(x, axis=-1):
    exps = np.exp(x)
    return exps / exps.sum(axis=axis, keepdims=True)


def _no_keepdims_softmax(x, axis=-1):
    exps = np.exp(x - x.max(axis=axis))
    return exps / exps.sum(axis=axis, keepdims=True)


def _matches(reference_fn, args, given):
    with np.errstate(all="ignore"):
        reference = reference_fn(*args)
    return reference.shape == given.shape and np.allclose(reference, given, equal_nan=True)


def _nonfinite_hint(scores, given, global_max_version):
    """Overflow or a global maximum, read off an output that holds inf or NaN."""
    if _matches(global_max_version, (), given):
        return HINT_GLOBAL_MAX
    finite = scores[np.isfinite(scores)]
    return HINT_OVERFLOW if finite.size and np.abs(finite).max() > 50 else None


def _softmax_diagnose(case, given, answer):
    (x,) = case.args
    axis = case.kwargs.get("axis", -1)
    given = as_numeric_array(given)
    if given is None or given.shape != x.shape:
        return None
    given = given.astype(np.float64)
    if not np.isfinite(given).all():
        return _nonfinite_hint(x, given, lambda: _global_max_softmax(x, axis))
    if axis == -1:
        return None  # the general symptoms read weights along the last axis
    if np.allclose(given.sum(axis=-1), 1.0):
        return f"you ignored the axis argument: this case asks for axis={axis}"
    return weights_hint(given, axis)


stable_softmax = FunctionExercise(
    id="ch4.stable_softmax",
    title="A softmax that does not overflow",
    kind="implement",
    task=(
        "Write `my_softmax(x, axis=-1)` that returns the softmax of `x` along `axis`: non-negative "
        "entries that sum to 1 along that axis. It must stay finite for scores in the thousands, "
        "where `np.exp` alone overflows, and give exactly 0 to entries of `-inf` (masked keys)."
    ),
    starter="def my_softmax(x, axis=-1):\n    ...  # your code here",
    solution=(
        "def my_softmax(x, axis=-1):\n"
        "    shifted = x - np.max(x, axis=axis, keepdims=True)  # every entry <= 0 now\n"
        "    exps = np.exp(shifted)  # so every exp is in [0, 1]: no overflow\n"
        "    return exps / np.sum(exps, axis=axis, keepdims=True)"
    ),
    answer_name="my_softmax",
    cases=_softmax_cases,
    expected=_softmax_expected,
    diagnose=_softmax_diagnose,
    mistakes={
        "naive": Mistake(_naive_softmax, HINT_OVERFLOW),
        "global_max": Mistake(_global_max_softmax, HINT_GLOBAL_MAX),
        "ignores_axis": Mistake(lambda x, axis=-1: softmax(x, axis=-1), "you ignored the axis argument"),
        "no_keepdims": Mistake(
            _no_keepdims_softmax,
            "keep the reduced axis so it broadcasts against x: np.max(x, axis=axis, keepdims=True)",
        ),
    },
    explanation=(
        "Subtracting the row maximum cancels between numerator and denominator, so the result is "
        "unchanged, but the largest exponent is now $e^0 = 1$. `attnlib.softmax` does the same."
    ),
)

_SHIPPED_MISSING_MAX = """def my_softmax_weights(q, k):
    d_k = q.shape[-1]
    scores = q @ k.swapaxes(-2, -1) / np.sqrt(d_k)  # (..., T_q, T_k)
    exps = np.exp(scores)
    return exps / exps.sum(axis=-1, keepdims=True)  # each row sums to 1"""


def _weights_cases(seed):
    rng = np.random.default_rng(seed)
    ex = THE_CAT_SAT
    two_heads_q = rng.normal(size=(2, 4, 8))
    two_heads_k = rng.normal(size=(2, 4, 8))
    two_heads_q[1] *= 40
    two_heads_k[1] *= 40
    return [
        Case('"the cat sat": q and k of shape (3, 4)', (ex.q, ex.k)),
        Case("T=6 tokens, d_k=2", (rng.normal(size=(6, 2)), rng.normal(size=(6, 2)))),
        Case("a batch of 2, T=2, d_k=16", (rng.normal(size=(2, 2, 16)), rng.normal(size=(2, 2, 16)))),
        Case(
            "large scores (in the thousands), T=5, d_k=8",
            (30 * rng.normal(size=(5, 8)), 30 * rng.normal(size=(5, 8))),
        ),
        Case(
            "two heads of T=4, d_k=8: head 0 ordinary, head 1 with scores in the thousands",
            (two_heads_q, two_heads_k),
        ),
    ]


def _weights_expected(case):
    return attention_weights(*case.args)


def _scaled_scores(q, k):
    return q @ k.swapaxes(-2, -1) / np.sqrt(q.shape[-1])  # (..., T_q, T_k)


def _weights_diagnose(case, given, answer):
    q, k = case.args
    given = as_numeric_array(given)
    scores = _scaled_scores(q, k)
    if given is None or given.shape != scores.shape:
        return None
    given = given.astype(np.float64)
    if not np.isfinite(given).all():
        return _nonfinite_hint(scores, given, lambda: _global_max_softmax(scores))
    return None  # finite but wrong: the listed mistakes, then the general symptoms


def _exp_limit(dtype):
    """Where exp overflows in ``dtype``: the log of its largest number, 709.78... in float64."""
    return float(np.log(float(np.finfo(dtype).max)))


fix_missing_max = FunctionExercise(
    id="ch4.fix_missing_max",
    title="Find the bug: the weights turn into NaN",
    kind="find the bug",
    task=(
        "This function computes attention weights and looks right: it scales by $\\sqrt{d_k}$ and "
        "normalises each row. On the running example it agrees with `attnlib.attention_weights`, "
        "but on some inputs it returns NaN. Find the mistake and fix it in the cell."
    ),
    starter=_SHIPPED_MISSING_MAX,
    solution=(
        "def my_softmax_weights(q, k):\n"
        "    d_k = q.shape[-1]\n"
        "    scores = q @ k.swapaxes(-2, -1) / np.sqrt(d_k)  # (..., T_q, T_k)\n"
        "    scores = scores - scores.max(axis=-1, keepdims=True)  # the fix: largest exp is 1\n"
        "    exps = np.exp(scores)\n"
        "    return exps / exps.sum(axis=-1, keepdims=True)  # each row sums to 1"
    ),
    answer_name="my_softmax_weights",
    cases=lambda: _weights_cases(405),
    expected=_weights_expected,
    diagnose=_weights_diagnose,
    sizes=attention_sizes,
    mistakes={
        "no_max": Mistake(lambda q, k: _naive_softmax(_scaled_scores(q, k)), HINT_OVERFLOW),
        "global_max": Mistake(lambda q, k: _global_max_softmax(_scaled_scores(q, k)), HINT_GLOBAL_MAX),
    },
    explanation=(
        f"`np.exp` overflows to `inf` a little above {int(_exp_limit(np.float64))} in float64 (and above "
        f"{int(_exp_limit(np.float32))} in float32), and `inf / inf` is NaN. Large activations or a "
        f"missing scale can produce such scores, and in float16 the limit is only about "
        f"{round(_exp_limit(np.float16))}."
    ),
)

_SHIPPED_SQRT_T = """def my_attention_weights(q, k):
    T = q.shape[-2]
    scores = q @ k.swapaxes(-2, -1) / np.sqrt(T)  # (..., T, T)
    scores = scores - scores.max(axis=-1, keepdims=True)
    exps = np.exp(scores)
    return exps / exps.sum(axis=-1, keepdims=True)"""


def _scaled_by(scale_of):
    def weights(q, k):
        return softmax(q @ k.swapaxes(-2, -1) * scale_of(q), axis=-1)

    return weights


fix_sqrt_t = FunctionExercise(
    id="ch4.fix_sqrt_t",
    title="Find the bug: the wrong scale",
    kind="find the bug",
    task=(
        "This function should compute $\\mathrm{softmax}(QK^\\top / \\sqrt{d_k})$ row by row, but one "
        "line is wrong. Compare its output with `attnlib.attention_weights` on a few shapes, find "
        "the mistake, and fix it in the cell."
    ),
    starter=_SHIPPED_SQRT_T,
    solution=(
        "def my_attention_weights(q, k):\n"
        "    d_k = q.shape[-1]  # the fix: the width of a query, not the number of tokens\n"
        "    scores = q @ k.swapaxes(-2, -1) / np.sqrt(d_k)  # (..., T, T)\n"
        "    scores = scores - scores.max(axis=-1, keepdims=True)\n"
        "    exps = np.exp(scores)\n"
        "    return exps / exps.sum(axis=-1, keepdims=True)"
    ),
    answer_name="my_attention_weights",
    cases=lambda: _weights_cases(406)[:3],
    expected=_weights_expected,
    sizes=attention_sizes,
    mistakes={
        "sqrt_t": Mistake(_scaled_by(lambda q: 1 / np.sqrt(q.shape[-2])), HINT_SQRT_T),
        "unscaled": Mistake(
            _scaled_by(lambda q: 1.0), "you removed the scaling: divide the scores by sqrt(d_k)"
        ),
        "d_k": Mistake(
            _scaled_by(lambda q: 1 / q.shape[-1]), "you divided by d_k: divide by its square root"
        ),
    },
    explanation=(
        "The scale corrects for the width of the vectors being dotted, $d_k$, their number of "
        "entries, not for how many tokens there are. The bug hides whenever $T = d_k$."
    ),
)


def _mean_max_weight(d_k, scale, rng):
    q = rng.normal(size=(32, 16, d_k))  # 32 sentences of 16 tokens, unit-variance entries
    k = rng.normal(size=(32, 16, d_k))
    return float(attention_weights(q, k, scale=scale).max(axis=-1).mean())


def _trend_scaled_by_d_k():
    """Run the experiment: the average largest weight of a row at d_k = 4 and 1024, scaled by 1/d_k."""
    rng = np.random.default_rng(407)
    small, large = _mean_max_weight(4, 1 / 4, rng), _mean_max_weight(1024, 1 / 1024, rng)
    uniform = 1 / 16
    if large > small + 0.05:
        return "b"
    if large < small - 0.05 and abs(large - uniform) < 0.1 * uniform:
        return "a"
    return "c"


scale_by_d_k = ChoiceExercise(
    id="ch4.scale_by_d_k",
    title="Dividing by d_k instead",
    kind="predict",
    task=(
        "Suppose we divide the scores by $d_k$ instead of $\\sqrt{d_k}$ and compute "
        "$\\mathrm{softmax}(QK^\\top / d_k)$ for random queries and keys with unit-variance entries. "
        "As $d_k$ grows, what happens to each row of weights?\n\n"
        "- **a**: the weights spread out evenly over the keys\n"
        "- **b**: the weights pile up on one key per query, close to one-hot\n"
        "- **c**: the weights do not change\n\n"
        'Set `answer` to `"a"`, `"b"` or `"c"`.'
    ),
    starter='answer = ...  # "a", "b" or "c"',
    solution=(
        "rng = np.random.default_rng(0)\n"
        "for d_k in (4, 64, 1024):\n"
        "    q, k = rng.normal(size=(2, 16, d_k))  # 16 tokens\n"
        "    weights = attnlib.attention_weights(q, k, scale=1 / d_k)  # 1/d_k, not 1/sqrt(d_k)\n"
        "    largest = weights.max(axis=-1).mean()  # the average largest weight of a row\n"
        '    print(f"d_k={d_k:>4}: average largest weight per row {largest:.3f}")\n'
        'print(f"uniform weights over 16 keys: {1 / 16:.3f}")\n'
        'answer = "a"'
    ),
    answer_name="answer",
    options={
        "a": "the weights spread out evenly",
        "b": "the weights pile up on one key per query",
        "c": "the weights do not change",
    },
    expected=_trend_scaled_by_d_k,
    hint="the spread of q·k grows like sqrt(d_k): how large is it after dividing by d_k?",
    mistakes={
        "one_hot": Mistake(
            lambda: "b",
            "dividing by d_k shrinks the scores more than dividing by sqrt(d_k) does: their spread "
            "becomes sqrt(d_k) / d_k = 1/sqrt(d_k), which falls as d_k grows",
        ),
        "unchanged": Mistake(
            lambda: "c",
            "for independent random q and k, as here, only 1/sqrt(d_k) keeps the spread of the scores "
            "near 1 for every d_k; 1/d_k overcorrects",
        ),
    },
    explanation=(
        "The spread of $q \\cdot k$ grows like $\\sqrt{d_k}$, so after dividing by $d_k$ it is "
        "$1/\\sqrt{d_k}$. For wide heads every score is then close to 0 and the softmax close to uniform: "
        "the layer can hardly prefer one key to another. For queries and keys whose entries are "
        "independent, as here and in a layer at initialisation, only $1/\\sqrt{d_k}$ keeps the spread "
        "near 1 whatever the width. Training then changes the weights, but every width starts "
        "from scores of the same size."
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
    id="ch4.causal_mask",
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

EXERCISES = (softmax_weight, stable_softmax, fix_missing_max, fix_sqrt_t, scale_by_d_k, causal_mask_exercise)
