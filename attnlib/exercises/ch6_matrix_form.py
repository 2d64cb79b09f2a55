"""Chapter 6, The matrix form and multi-head attention: heads, mask conventions, a leaky causal mask."""

import numpy as np

from ..examples import THE_CAT_SAT
from ..masks import causal_mask, to_additive, to_ignore_mask
from ..multi_head import merge_heads, split_heads
from .core import (
    Case,
    FunctionExercise,
    Mistake,
    as_numeric_array,
    attention_output,
    attention_sizes,
    call_safely,
)

HINT_FUTURE = "your mask lets tokens see the future"


def _split_cases():
    rng = np.random.default_rng(601)
    return [
        Case("x of shape (3, 8), n_heads=2", (rng.normal(size=(3, 8)), 2)),
        Case("a batch: x of shape (2, 5, 12), n_heads=3", (rng.normal(size=(2, 5, 12)), 3)),
        Case("one head: x of shape (4, 6), n_heads=1", (rng.normal(size=(4, 6)), 1)),
        Case("two leading axes: x of shape (2, 1, 3, 8), n_heads=4", (rng.normal(size=(2, 1, 3, 8)), 4)),
    ]


def _split_straight(x, n_heads):
    *lead, T, width = x.shape
    return x.reshape(*lead, n_heads, T, width // n_heads)


def _split_unmoved(x, n_heads):
    *lead, T, width = x.shape
    return x.reshape(*lead, T, n_heads, width // n_heads)


split_heads_exercise = FunctionExercise(
    id="ch6.split_heads",
    title="Split into heads",
    kind="implement",
    task=(
        "Write `my_split_heads(x, n_heads)` that takes `x` of shape `(..., T, n_heads * d_head)` and "
        "returns shape `(..., n_heads, T, d_head)`, where head `j` gets columns `j*d_head` to "
        "`(j+1)*d_head - 1` of every token (the layout `torch.nn.MultiheadAttention` uses)."
    ),
    starter="def my_split_heads(x, n_heads):\n    ...  # your code here",
    solution=(
        "def my_split_heads(x, n_heads):\n"
        "    *lead, T, width = x.shape\n"
        "    x = x.reshape(*lead, T, n_heads, width // n_heads)  # (..., T, H, d_head)\n"
        "    return x.swapaxes(-3, -2)  # (..., H, T, d_head)"
    ),
    answer_name="my_split_heads",
    cases=_split_cases,
    expected=lambda case: split_heads(*case.args),
    mistakes={
        "straight_reshape": Mistake(
            _split_straight,
            "you reshaped straight to (H, T, d_head), which mixes tokens into heads: reshape to "
            "(T, H, d_head), then swap the T and H axes",
        ),
        "head_axis_not_moved": Mistake(
            _split_unmoved,
            "that is (..., T, H, d_head): move the head axis in front of T with swapaxes(-3, -2)",
        ),
    },
    explanation=(
        "A reshape regroups numbers in row-major order, in which the features of one token sit "
        "together. So the split has to happen on the last axis first; the swap then gathers each "
        "head's slices of all tokens."
    ),
)


def _merge_cases():
    rng = np.random.default_rng(602)
    return [
        Case("x of shape (2, 3, 4): 2 heads, T=3, d_head=4", (rng.normal(size=(2, 3, 4)),)),
        Case("a batch: x of shape (2, 3, 5, 2)", (rng.normal(size=(2, 3, 5, 2)),)),
        Case("one head: x of shape (1, 4, 3)", (rng.normal(size=(1, 4, 3)),)),
    ]


def _merge_straight(x):
    *lead, H, T, d_head = x.shape
    return x.reshape(*lead, T, H * d_head)


merge_heads_exercise = FunctionExercise(
    id="ch6.merge_heads",
    title="Merge the heads back",
    kind="implement",
    task=(
        "Write `my_merge_heads(x)`, the inverse of splitting: from shape `(..., n_heads, T, d_head)` "
        "back to `(..., T, n_heads * d_head)`, with head 0's features first in every row."
    ),
    starter="def my_merge_heads(x):\n    ...  # your code here",
    solution=(
        "def my_merge_heads(x):\n"
        "    *lead, H, T, d_head = x.shape\n"
        "    x = x.swapaxes(-3, -2)  # (..., T, H, d_head)\n"
        "    return x.reshape(*lead, T, H * d_head)  # (..., T, H * d_head)"
    ),
    answer_name="my_merge_heads",
    cases=_merge_cases,
    expected=lambda case: merge_heads(*case.args),
    mistakes={
        "straight_reshape": Mistake(
            _merge_straight,
            "you reshaped without moving the head axis back: "
            "swap H and T first (swapaxes(-3, -2)), then reshape",
        ),
    },
    explanation="Merging undoes the two steps of splitting in reverse order: swap back, then reshape.",
)


def _mask_cases():
    rng = np.random.default_rng(603)
    padding = rng.random(size=(2, 1, 5)) < 0.7
    padding[..., 0] = True
    return [
        Case("the causal mask of T=4, shape (4, 4)", (causal_mask(4),)),
        Case("a padding mask of shape (2, 1, 5)", (padding,)),
        Case("a random mask of shape (3, 6)", (rng.random(size=(3, 6)) < 0.5,)),
    ]


def _additive_diagnose(case, given, answer):
    given = as_numeric_array(given)
    (mask,) = case.args
    if given is None or given.shape != mask.shape:
        return None
    if given.dtype == np.bool_:
        return "return floats, 0.0 where the mask is True and -inf where it is False"
    given = given.astype(np.float64)
    dropped = given[~mask]
    if dropped.size and np.isfinite(dropped).all() and (dropped < -1e3).all():
        return (
            "use -inf as the task asks: with a large finite number, a query whose keys are all masked "
            "gets uniform weights instead of NaN, which hides the mistake"
        )
    return None


additive_mask = FunctionExercise(
    id="ch6.additive_mask",
    title="From a boolean mask to an additive one",
    kind="implement",
    task=(
        "attnlib and PyTorch's `torch.nn.functional.scaled_dot_product_attention` (one call that "
        "computes all of $\\operatorname{softmax}(QK^\\top/\\sqrt{d_k})\\,V$) accept a boolean mask, "
        "`True` where a query may attend, or a float mask that is *added* to the scores. Write "
        "`my_additive_mask(mask)` that turns a boolean mask into the float one: `0.0` where the mask "
        "is `True`, `-inf` where it is `False`, same shape."
    ),
    starter="def my_additive_mask(mask):\n    ...  # your code here",
    solution=(
        "def my_additive_mask(mask):\n"
        "    return np.where(mask, 0.0, -np.inf)  # keep: +0, drop: -inf, so exp gives 0"
    ),
    answer_name="my_additive_mask",
    cases=_mask_cases,
    expected=lambda case: to_additive(*case.args),
    diagnose=_additive_diagnose,
    mistakes={
        "inverted": Mistake(
            lambda mask: np.where(mask, -np.inf, 0.0),
            "you put -inf where the mask is True: True means 'may attend', so it becomes 0",
        ),
        "times_inf": Mistake(
            lambda mask: (~mask) * -np.inf,
            "0 * -inf is NaN, not 0: build the mask with np.where(mask, 0.0, -np.inf)",
        ),
        "finite": Mistake(lambda mask: np.where(mask, 0.0, -1e9), "use -inf as the task asks"),
        "ones_and_zeros": Mistake(
            lambda mask: mask.astype(np.float64),
            "the float mask is added to the scores, not multiplied: adding 0.0 keeps a score, "
            "adding -inf removes it, so True becomes 0.0 and False becomes -inf",
        ),
    },
    explanation=(
        "Adding $-\\infty$ to a score makes its exponential exactly 0, so the softmax hands that key "
        "no weight. A large finite number such as $-10^9$ gives 0 too, but a query with every key "
        "masked then gets uniform weights instead of NaN, and the mistake goes unnoticed."
    ),
)

ignore_mask = FunctionExercise(
    id="ch6.ignore_mask",
    title="From scaled_dot_product_attention's mask to nn.MultiheadAttention's",
    kind="implement",
    task=(
        "PyTorch's `scaled_dot_product_attention` reads a boolean `attn_mask` as `True` = *may "
        "attend*. `torch.nn.MultiheadAttention` reads a boolean "
        "`attn_mask` the other way round: `True` = *ignore this key*. Write `my_ignore_mask(mask)` that "
        "turns a `scaled_dot_product_attention` mask into an `nn.MultiheadAttention` one (boolean, "
        "same shape)."
    ),
    starter="def my_ignore_mask(mask):\n    ...  # your code here",
    solution=('def my_ignore_mask(mask):\n    return ~mask  # "may attend" -> "ignore": flip every boolean'),
    answer_name="my_ignore_mask",
    cases=_mask_cases,
    expected=lambda case: to_ignore_mask(*case.args),
    mistakes={
        "unchanged": Mistake(
            lambda mask: mask.copy(),
            "you returned the same convention: for nn.MultiheadAttention, True means 'ignore'",
        ),
        "minus": Mistake(lambda mask: -mask, "use ~mask (or np.logical_not) to flip booleans"),
        "one_minus": Mistake(lambda mask: 1 - mask, "return a boolean array"),
    },
    explanation=(
        "Passing a `scaled_dot_product_attention` mask to `nn.MultiheadAttention` unchanged raises no "
        "error: every query "
        "attends to exactly the keys it should have ignored, and a query allowed to see every key "
        "is left with none (NaN)."
    ),
)

_SHIPPED_CAUSAL = """def my_causal_attention(q, k, v):
    T, d_k = q.shape[-2], q.shape[-1]
    scores = q @ k.swapaxes(-2, -1) / np.sqrt(d_k)  # (..., T, T)
    may_attend = np.tril(np.ones((T, T), dtype=bool), k=1)  # True: query i sees key j
    scores = np.where(may_attend, scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights @ v  # (..., T, T) @ (..., T, d_v) -> (..., T, d_v)"""


def _causal_cases():
    rng = np.random.default_rng(604)
    ex = THE_CAT_SAT
    return [
        Case('"the cat sat": q, k, v of shape (3, 4)', (ex.q, ex.k, ex.v)),
        Case(
            "T=5, d_k=4, d_v=2", (rng.normal(size=(5, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2)))
        ),
        Case(
            "a batch of 2 with 2 heads, T=4, d_k=3",
            (rng.normal(size=(2, 2, 4, 3)), rng.normal(size=(2, 2, 4, 3)), rng.normal(size=(2, 2, 4, 3))),
        ),
    ]


def _first_leak(answer, q, k, v, given):
    """The first (query i, key j > i) whose value changes output i, or None."""
    T = q.shape[-2]
    for i in range(T - 1):
        for j in range(i + 1, T):
            moved = v.copy()
            moved[..., j, :] += 1.0  # change a future token's value only
            outcome = call_safely(answer, (q.copy(), k.copy(), moved))
            out = as_numeric_array(outcome.value)
            if out is None or out.shape != given.shape:
                return None
            if not np.allclose(out[..., i, :], given[..., i, :], equal_nan=True):
                return i, j
    return None


def _causal_diagnose(case, given, answer):
    q, k, v = case.args
    given = as_numeric_array(given)
    if given is None or given.shape != (
        *np.broadcast_shapes(q.shape[:-2], v.shape[:-2]),
        q.shape[-2],
        v.shape[-1],
    ):
        return None
    given = given.astype(np.float64)
    leak = _first_leak(answer, q, k, v, given)
    if leak is not None:
        return f"token {leak[0]} can see token {leak[1]}: {HINT_FUTURE}"
    empty = np.flatnonzero(np.isnan(given).any(axis=-1).reshape(-1, given.shape[-2]).any(axis=0))
    if empty.size:
        return (
            f"token {empty[0]} has no key left to attend to: keep the diagonal, "
            "every token may attend to itself"
        )
    return None


def _causal_with_keep(keep):
    def attend(q, k, v):
        T = q.shape[-2]
        scores = np.where(keep(T), q @ k.swapaxes(-2, -1) / np.sqrt(q.shape[-1]), -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        return weights / weights.sum(axis=-1, keepdims=True) @ v

    return attend


fix_causal_future = FunctionExercise(
    id="ch6.fix_causal_future",
    title="Find the bug: a decoder that peeks",
    kind="find the bug",
    task=(
        "This causal attention function is meant for a decoder: the output of token $i$ may use "
        "tokens $0, \\dots, i$ only. Its outputs have the right shape and its weights sum to 1, but "
        "it leaks. Find the mistake and fix it in the cell. A useful test: change the value of a "
        "later token and see whether an earlier output moves."
    ),
    starter=_SHIPPED_CAUSAL,
    solution=(
        "def my_causal_attention(q, k, v):\n"
        "    T, d_k = q.shape[-2], q.shape[-1]\n"
        "    scores = q @ k.swapaxes(-2, -1) / np.sqrt(d_k)  # (..., T, T)\n"
        "    may_attend = np.tril(np.ones((T, T), dtype=bool))  # the fix: k=0 keeps j <= i only\n"
        "    scores = np.where(may_attend, scores, -np.inf)\n"
        "    scores = scores - scores.max(axis=-1, keepdims=True)\n"
        "    weights = np.exp(scores)\n"
        "    weights = weights / weights.sum(axis=-1, keepdims=True)\n"
        "    return weights @ v  # (..., T, T) @ (..., T, d_v) -> (..., T, d_v)"
    ),
    answer_name="my_causal_attention",
    cases=_causal_cases,
    expected=lambda case: attention_output(*case.args, causal=True),
    diagnose=_causal_diagnose,
    sizes=attention_sizes,
    mistakes={
        "one_ahead": Mistake(_causal_with_keep(lambda T: np.tri(T, T, k=1, dtype=bool)), HINT_FUTURE),
        "upper_triangle": Mistake(
            _causal_with_keep(lambda T: np.triu(np.ones((T, T), dtype=bool))), HINT_FUTURE
        ),
        "no_diagonal": Mistake(
            _causal_with_keep(lambda T: np.tri(T, T, k=-1, dtype=bool)),
            "has no key left to attend to: keep the diagonal",
        ),
    },
    explanation=(
        "`np.tril(..., k=1)` keeps one diagonal above the main one, so token $i$ also sees token "
        "$i+1$. The bug never shows in the shapes, only in what each output depends on."
    ),
)

EXERCISES = (split_heads_exercise, merge_heads_exercise, additive_mask, ignore_mask, fix_causal_future)
