"""Chapter 12, Attention without the n x n matrix: the running sum by hand, one online-softmax step,
a rescaling bug, and the blocks a causal tiled pass visits.

The update-step exercise checks the reader's ``online_update`` the way the
tiled backend uses it: every query row starts at ``m = -inf``, ``l = 0``,
``acc = 0``, the key blocks arrive in order, and after the last one
``acc / l`` must be the attention output that attnlib computes.
"""

from dataclasses import dataclass

import numpy as np

from ..attention import attention_weights
from ..backends.numpy_matrix import masked_scores
from ..backends.tiled import key_blocks
from ..examples import THE_CAT_SAT
from ..softmax import softmax
from .core import (
    Case,
    Exercise,
    Failure,
    FunctionExercise,
    Mistake,
    ValueExercise,
    as_numeric_array,
    attention_output,
    attention_sizes,
    call_safely,
    compare_arrays,
    describe_error,
    describe_value,
)

# The score row of the by-hand exercise, and how many keys each block holds.
TWO_BLOCK_SCORES = np.array([1.0, 3.0, 2.0, 5.0])
TWO_BLOCK_SIZE = 2

# The causal tiled pass the predict exercise asks about.
CAUSAL_GRID = {"T": 5120, "block_size": 256}  # 210 of 400 blocks: a count chapter 12 prints nowhere else

HINT_ACC_NOT_RESCALED = (
    "you rescaled l but not acc: every term in acc was also computed under the old maximum, "
    "so multiply acc by alpha too, alpha[:, None] * acc"
)
HINT_L_NOT_RESCALED = (
    "you rescaled acc but not l: every term in l was also computed under the old maximum, "
    "so multiply l by alpha too"
)
HINT_NOTHING_RESCALED = (
    "the old l and acc were summed under the old maximum: multiply both by "
    "alpha = exp(m - m_new) before adding the new block's terms"
)
HINT_INVERTED_ALPHA = "alpha = exp(m - m_new), the old maximum minus the new one: it is at most 1"
HINT_ALPHA_ROWS = (
    "alpha holds one number per query row, shape (n_q,): scale the rows of acc with alpha[:, None]"
)
HINT_RUNNING_MAX = (
    "m must be the running maximum, the largest score seen so far: "
    "m_new = np.maximum(m, scores_block.max(axis=1))"
)
HINT_NEG_INF = (
    "a row whose scores so far are all -inf (masked) has m_new = -inf, and -inf - (-inf) is NaN: "
    "subtract 0 for such rows instead, np.where(np.isneginf(m_new), 0.0, m_new)"
)
HINT_AMBIGUOUS = (
    "max() or an `if` on a whole array is ambiguous: use np.maximum and np.where, "
    "which work entry by entry"
)


# By hand: the running sum after two blocks -------------------------------------------


def _blocks_of(scores):
    return [scores[j0 : j0 + TWO_BLOCK_SIZE] for j0 in range(0, len(scores), TWO_BLOCK_SIZE)]


def _running_sum(rescale=lambda m_old, m_new: np.exp(m_old - m_new), last_block=None):
    """l after the blocks of TWO_BLOCK_SCORES, with a given rescaling rule (for the typical mistakes)."""
    m, l = -np.inf, 0.0
    for block in _blocks_of(TWO_BLOCK_SCORES)[:last_block]:
        m_new = max(m, float(block.max()))
        l = rescale(m, m_new) * l + float(np.exp(block - m_new).sum())
        m = m_new
    return l


def _inverted_alpha(m_old, m_new):
    return 0.0 if m_old == -np.inf else np.exp(m_new - m_old)  # new minus old; l is still 0 at first


def _one_pass_sum():
    """sum_j exp(s_j - max s): the largest softmax weight is exp(0) / that sum."""
    return 1.0 / float(softmax(TWO_BLOCK_SCORES).max())


_SCORES_TEXT = ", ".join(f"{s:g}" for s in TWO_BLOCK_SCORES)
_FIRST_TEXT, _SECOND_TEXT = (", ".join(f"{s:g}" for s in block) for block in _blocks_of(TWO_BLOCK_SCORES))

running_sum = ValueExercise(
    id="ch12.running_sum",
    title="The running sum after two blocks",
    kind="by hand",
    task=(
        f"One query's scaled scores against four keys are $[{_SCORES_TEXT}]$, and the keys arrive in "
        f"two blocks of {TWO_BLOCK_SIZE}: first $[{_FIRST_TEXT}]$, then $[{_SECOND_TEXT}]$. Start from "
        "$m = -\\infty$ and $\\ell = 0$ and apply the online-softmax update once per block: the new "
        "maximum $m_{new}$, the factor $\\alpha = e^{m_{old} - m_{new}}$, then "
        "$\\ell \\leftarrow \\alpha\\,\\ell + \\sum_{j \\in \\text{block}} e^{s_j - m_{new}}$. "
        "What is $\\ell$ after the second block? Three decimal places are enough."
    ),
    starter="answer = ...  # a number",
    solution=(
        f"scores = np.array({TWO_BLOCK_SCORES.tolist()})\n"
        "m, l = -np.inf, 0.0  # nothing seen yet\n"
        f"for block in (scores[:{TWO_BLOCK_SIZE}], scores[{TWO_BLOCK_SIZE}:]):\n"
        "    m_new = max(m, block.max())\n"
        "    alpha = np.exp(m - m_new)  # 0 for the first block: there is nothing to rescale yet\n"
        "    l = alpha * l + np.exp(block - m_new).sum()\n"
        "    m = m_new\n"
        '    print(f"after {block.tolist()}: m = {m:g}, alpha = {alpha:.4f}, l = {l:.4f}")\n'
        "answer = float(l)\n"
        'print(f"one pass, sum of exp(s - max s): {np.exp(scores - scores.max()).sum():.4f}")'
    ),
    answer_name="answer",
    expected=_one_pass_sum,
    atol=5e-4,
    tolerance_text="to 3 decimal places",
    hint=(
        "apply the update to each block in turn: m_new = max(m, the block's maximum), "
        "alpha = exp(m - m_new), then l = alpha * l + the block's sum of exp(s - m_new); "
        "write down m, alpha and l after each block"
    ),
    mistakes={
        "reciprocal": Mistake(
            lambda: 1.0 / _running_sum(),
            "that is 1/l, the largest softmax weight of the row: the question asks for l itself",
        ),
        "normalised": Mistake(
            lambda: 1.0,
            "1 is the sum of the softmax weights, l / l: the question asks for l, the sum of exp(s - m)",
        ),
        "not_rescaled": Mistake(
            lambda: _running_sum(rescale=lambda m_old, m_new: 1.0),
            "you added the second block without rescaling: multiply the first block's l by "
            "alpha = exp(m_old - m_new) first",
        ),
        "inverted_alpha": Mistake(
            lambda: _running_sum(rescale=_inverted_alpha),
            HINT_INVERTED_ALPHA,
        ),
        "first_block_only": Mistake(
            lambda: _running_sum(last_block=1), "that is l after the first block: apply the update once more"
        ),
        "no_maximum": Mistake(
            lambda: float(np.exp(TWO_BLOCK_SCORES).sum()),
            "l sums exp(s - m), measured from the running maximum m, not exp(s)",
        ),
    },
    explanation=(
        "After the last block $\\ell$ is $\\sum_j e^{s_j - \\max s}$, exactly the sum a one-pass "
        "softmax divides by: rescaling by $\\alpha$ loses nothing. The largest softmax weight of the "
        "row is $1/\\ell$."
    ),
)


# Implement: one online-softmax update step -------------------------------------------


@dataclass(frozen=True)
class _BlockCase:
    """Queries, keys and values whose scaled scores are fed to the update step block by block."""

    description: str
    q: np.ndarray  # (n_q, d_k)
    k: np.ndarray  # (T_k, d_k)
    v: np.ndarray  # (T_k, d_v)
    block_size: int
    mask: np.ndarray | None = None  # (n_q, T_k), True = may attend
    causal: bool = False

    def scores(self):
        """The scaled scores, -inf where masked, shape (n_q, T_k)."""
        return masked_scores(self.q, self.k, self.mask, self.causal, 1 / np.sqrt(self.q.shape[-1]))

    def blocks(self):
        """``(j0, j1)`` of each block of keys, in order."""
        t_k = self.k.shape[0]
        return [(j0, min(j0 + self.block_size, t_k)) for j0 in range(0, t_k, self.block_size)]

    def expected(self):
        """``(m, l, output)`` after the last block, from attnlib's matrix form."""
        weights = attention_weights(self.q, self.k, mask=self.mask, causal=self.causal)  # (n_q, T_k)
        m = self.scores().max(axis=-1)  # (n_q,), the largest allowed score of each row
        l = 1.0 / weights.max(axis=-1)  # sum_j exp(s_j - m): the largest weight is exp(0) / l
        return m, l, weights @ self.v  # (n_q, T_k) @ (T_k, d_v) -> (n_q, d_v)


def _update_cases():
    rng = np.random.default_rng(801)
    ex = THE_CAT_SAT
    keep = np.ones((4, 6), dtype=bool)
    keep[0, :2] = False  # query 0 sees no key of the first block
    keep[2, :4] = False  # query 2 sees none of the first two blocks
    keep[1, 3] = keep[3, 0] = False
    return [
        _BlockCase('"the cat sat": 3 queries, 3 keys in blocks of one key', ex.q, ex.k, ex.v, 1),
        _BlockCase(
            "4 queries, 7 keys in blocks of 3 (the last block holds one key), d_k=8, d_v=3",
            rng.normal(size=(4, 8)),
            rng.normal(size=(7, 8)),
            rng.normal(size=(7, 3)),
            3,
        ),
        _BlockCase(
            "scores in the thousands: 5 queries, 8 keys in blocks of 2, d_v=2",
            40 * rng.normal(size=(5, 8)),
            40 * rng.normal(size=(8, 8)),
            rng.normal(size=(8, 2)),
            2,
        ),
        _BlockCase(
            "causal: 6 queries and 6 keys in blocks of 4, later keys' scores are -inf",
            rng.normal(size=(6, 4)),
            rng.normal(size=(6, 4)),
            rng.normal(size=(6, 3)),
            4,
            causal=True,
        ),
        _BlockCase(
            "a boolean mask: query 0 sees no key of the first block, query 2 none of the first two; "
            "4 queries, 6 keys in blocks of 2",
            rng.normal(size=(4, 4)),
            rng.normal(size=(6, 4)),
            rng.normal(size=(6, 2)),
            2,
            mask=keep,
        ),
    ]


@dataclass(frozen=True)
class _Run:
    """What feeding the blocks to an update step gave: the final state, or where it went wrong."""

    state: tuple | None = None  # (m, l, acc) after the last block, float arrays
    error: Exception | None = None  # the exception the step raised
    block: int | None = None  # the 1-based block it raised at, or returned something wrong at
    returned: object = None  # what it returned, when that was not a valid (m, l, acc)


def _state_shapes(n_q, d_v):
    return {"m": (n_q,), "l": (n_q,), "acc": (n_q, d_v)}


def _valid_state(value, n_q, d_v):
    """The returned ``(m, l, acc)`` as float arrays of the right shapes, or None."""
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        return None
    arrays = [as_numeric_array(part) for part in value]
    shapes = _state_shapes(n_q, d_v).values()
    if any(a is None or a.shape != shape for a, shape in zip(arrays, shapes, strict=True)):
        return None
    return tuple(a.astype(np.float64) for a in arrays)  # copies: the answer keeps its own arrays


def _feed_blocks(update, case):
    """Call ``update`` once per key block, from m = -inf, l = 0, acc = 0, as the tiled backend does."""
    scores = case.scores()  # (n_q, T_k)
    n_q, d_v = scores.shape[0], case.v.shape[1]
    state = (np.full(n_q, -np.inf), np.zeros(n_q), np.zeros((n_q, d_v)))
    for number, (j0, j1) in enumerate(case.blocks(), start=1):
        args = (*(part.copy() for part in state), scores[:, j0:j1].copy(), case.v[j0:j1].copy())
        outcome = call_safely(update, args)
        if outcome.error is not None:
            return _Run(error=outcome.error, block=number)
        state = _valid_state(outcome.value, n_q, d_v)
        if state is None:
            return _Run(block=number, returned=outcome.value)
    return _Run(state=state)


def _same_run(a, b, rtol, atol):
    if a.error is not None or b.error is not None:
        return (
            a.error is not None
            and b.error is not None
            and a.block == b.block
            and type(a.error) is type(b.error)
            and str(a.error) == str(b.error)
        )
    if a.state is None or b.state is None:
        return False
    return all(
        np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True) for x, y in zip(a.state, b.state, strict=True)
    )


def _describe_return(value, n_q, d_v):
    """Why a returned value is not a valid ``(m, l, acc)``, as (given line, hint)."""
    if value is None:
        return "given:    None", "every path through your function must end with return m_new, l_new, acc_new"
    if not isinstance(value, (tuple, list)):
        return (
            f"given:    {describe_value(value)}",
            "return all three running quantities: return m_new, l_new, acc_new",
        )
    if len(value) != 3:
        return (
            f"given:    {describe_value(value)} of {len(value)} items",
            "return all three running quantities: return m_new, l_new, acc_new",
        )
    for (name, shape), part in zip(_state_shapes(n_q, d_v).items(), value, strict=True):
        array = as_numeric_array(part)
        if array is None:
            return (
                f"given:    {name} is {describe_value(part)}",
                f"{name} must be a NumPy array of shape {shape}",
            )
        if array.shape != shape:
            if name in ("m", "l") and array.shape == (n_q, 1):
                hint = f"{name} holds one number per query row, shape (n_q,): leave out keepdims=True"
            elif name in ("m", "l") and array.shape == ():
                hint = f"{name} needs one number per query row: reduce over the keys, axis=1"
            else:
                hint = "m and l have shape (n_q,), acc has shape (n_q, d_v), as they came in"
            return f"given:    {name} of shape {array.shape}", hint
    return "given:    something else", None


def _first_block_all_masked(case):
    """The rows whose scores in the first block are all -inf."""
    j0, j1 = case.blocks()[0]
    return np.isneginf(case.scores()[:, j0:j1]).all(axis=1)


@dataclass(frozen=True, eq=False, kw_only=True)
class UpdateStepExercise(Exercise):
    """The answer is one online-softmax step; each hidden case feeds it every key block in turn.

    After the last block ``acc / l[:, None]`` is compared with the attention
    output, then ``m`` with each row's largest score and ``l`` with the
    softmax's denominator, all computed by attnlib's matrix form.
    """

    cases: object
    rtol: float = 1e-5
    atol: float = 1e-7

    def check(self, answer):
        refusal = self.refuse_non_function(answer)
        if refusal is not None:
            return refusal
        cases = self.cases()
        for number, case in enumerate(cases, start=1):
            run = _feed_blocks(answer, case)
            returned_stub = run.returned is None or run.returned is Ellipsis
            if number == 1 and run.block == 1 and run.state is None and run.error is None and returned_stub:
                return self.returned_stub(answer, run.returned)
            failure = self._judge(case, run)
            if failure is not None:
                headline = f"hidden case {number} of {len(cases)} failed: {case.description}."
                return self.failed(headline, failure, case.description)
        return self.passed(len(cases))

    def _judge(self, case, run):
        n_blocks = len(case.blocks())
        if run.error is not None:
            line = f"block {run.block} of {n_blocks}: raised {describe_error(run.error)}"
            return Failure((line,), self._mistake_hint(case, run))
        n_q, d_v = case.q.shape[0], case.v.shape[1]
        if run.state is None:
            given, hint = _describe_return(run.returned, n_q, d_v)
            expected = f"expected: a tuple (m, l, acc) of shapes ({n_q},), ({n_q},), ({n_q}, {d_v})"
            intro = f"block {run.block} of {n_blocks} returned something else:"
            return Failure((intro, expected, given), hint)
        m, l, acc = run.state
        m_expected, l_expected, out_expected = case.expected()
        with np.errstate(all="ignore"):
            output = acc / l[:, None]  # (n_q, d_v)
        failure = compare_arrays(out_expected, output, rtol=self.rtol, atol=self.atol)
        if failure is not None:
            hint = self._mistake_hint(case, run) or self._nan_hint(case, output)
            return Failure(("after the last block, acc / l[:, None]:", *failure.lines), hint)
        failure = compare_arrays(m_expected, m, rtol=self.rtol, atol=self.atol)
        if failure is not None:
            intro = "acc / l is right, but after the last block, m:"
            return Failure((intro, *failure.lines), HINT_RUNNING_MAX)
        failure = compare_arrays(l_expected, l, rtol=self.rtol, atol=self.atol)
        if failure is not None:
            return Failure(
                ("acc / l is right, but after the last block, l:", *failure.lines),
                "l must be the sum of exp(score - m) over the keys seen so far, under the current m: "
                "rescale l and acc by the same alpha",
            )
        return None

    def _mistake_hint(self, case, run):
        """The hint of the first typical mistake that, fed the same blocks, ends the same way."""
        for mistake in self.mistakes.values():
            if _same_run(_feed_blocks(mistake.answer, case), run, self.rtol, self.atol):
                return mistake.hint
        return None

    @staticmethod
    def _nan_hint(case, output):
        nan_rows = np.isnan(output).any(axis=1)
        if nan_rows.any() and (nan_rows <= _first_block_all_masked(case)).all():
            return HINT_NEG_INF
        return None


def _update_with(*, rescale_l=True, rescale_acc=True, alpha_of=None, running_max=True, guard=True):
    """An update step with one thing done differently (for the typical mistakes)."""

    def online_update(m, l, acc, scores_block, v_block):
        block_max = scores_block.max(axis=1)
        m_new = np.maximum(m, block_max) if running_max else block_max
        shift = np.where(np.isneginf(m_new), 0.0, m_new) if guard else m_new
        p = np.exp(scores_block - shift[:, None])  # (n_q, n_k)
        alpha = alpha_of(m, shift) if alpha_of else np.exp(m - shift)
        l_new = (alpha * l if rescale_l else l) + p.sum(axis=1)
        acc_new = (alpha[:, None] * acc if rescale_acc else acc) + p @ v_block
        return m_new, l_new, acc_new

    return online_update


def _alpha_unbroadcast(m, l, acc, scores_block, v_block):
    m_new = np.maximum(m, scores_block.max(axis=1))
    shift = np.where(np.isneginf(m_new), 0.0, m_new)
    p = np.exp(scores_block - shift[:, None])
    alpha = np.exp(m - shift)
    return m_new, alpha * l + p.sum(axis=1), alpha * acc + p @ v_block


def _python_max(m, l, acc, scores_block, v_block):
    m_new = max(m, scores_block.max(axis=1))
    p = np.exp(scores_block - m_new[:, None])
    alpha = np.exp(m - m_new)
    return m_new, alpha * l + p.sum(axis=1), alpha[:, None] * acc + p @ v_block


online_update = UpdateStepExercise(
    id="ch12.online_update",
    title="One step of the online softmax",
    kind="implement",
    task=(
        "Write `online_update(m, l, acc, scores_block, v_block)`, one step of the online softmax for a "
        "block of `n_q` query rows. `m` and `l` have shape `(n_q,)` and `acc` shape `(n_q, d_v)`: each "
        "row's running maximum $m$, running sum $\\ell$ and running weighted sum $a$ over the keys seen "
        "so far. `scores_block`, shape `(n_q, n_k)`, holds the scaled scores of the next `n_k` keys "
        "(`-inf` where a key is masked), and `v_block`, shape `(n_k, d_v)`, their values. Return the "
        "updated `(m, l, acc)`.\n\n"
        "The check starts every row at `m = -inf`, `l = 0`, `acc = 0`, calls your function once per "
        "block of keys, in order, and compares `acc / l[:, None]` after the last block with the "
        "attention output of attnlib's matrix form, then `m` and `l` themselves. One hidden case has a "
        "query whose first block of keys is entirely masked."
    ),
    starter="def online_update(m, l, acc, scores_block, v_block):\n    ...  # your code here",
    solution=(
        "def online_update(m, l, acc, scores_block, v_block):\n"
        "    m_new = np.maximum(m, scores_block.max(axis=1))  # (n_q,): the maximum can only grow\n"
        "    # a row with no allowed key yet has m_new = -inf: shift it by 0 instead\n"
        "    shift = np.where(np.isneginf(m_new), 0.0, m_new)\n"
        "    p = np.exp(scores_block - shift[:, None])  # (n_q, n_k), every entry <= 1\n"
        "    alpha = np.exp(m - shift)  # (n_q,): moves the old sums onto the new maximum\n"
        "    l_new = alpha * l + p.sum(axis=1)\n"
        "    acc_new = alpha[:, None] * acc + p @ v_block  # p @ v_block: (n_q, d_v)\n"
        "    return m_new, l_new, acc_new"
    ),
    answer_name="online_update",
    cases=_update_cases,
    mistakes={
        "acc_not_rescaled": Mistake(_update_with(rescale_acc=False), HINT_ACC_NOT_RESCALED),
        "l_not_rescaled": Mistake(_update_with(rescale_l=False), HINT_L_NOT_RESCALED),
        "nothing_rescaled": Mistake(_update_with(rescale_l=False, rescale_acc=False), HINT_NOTHING_RESCALED),
        "inverted_alpha": Mistake(
            _update_with(alpha_of=lambda m, m_new: np.exp(m_new - m)), HINT_INVERTED_ALPHA
        ),
        "alpha_not_broadcast": Mistake(_alpha_unbroadcast, HINT_ALPHA_ROWS),
        "block_max_only": Mistake(_update_with(running_max=False), HINT_RUNNING_MAX),
        "no_inf_guard": Mistake(_update_with(guard=False), HINT_NEG_INF),
        "python_max": Mistake(_python_max, HINT_AMBIGUOUS),
    },
    explanation=(
        "Every term in $\\ell$ and in $a$ carries the factor $e^{-m}$ of the maximum it was computed "
        "under, so when $m$ grows both must be multiplied by the same $\\alpha$; rescaling only one "
        "of them divides sums taken under different maxima. The `shift` line is the guard of "
        "`attnlib.backends.tiled`: without it, a row with no allowed key yet computes "
        "$-\\infty - (-\\infty)$, which is NaN."
    ),
)


# Find the bug: the accumulator that is never rescaled ------------------------------

_SHIPPED_NO_ACC_RESCALE = """def online_attention(q, k, v, block_size=2):
    T_q, T_k = q.shape[0], k.shape[0]
    m = np.full(T_q, -np.inf)  # running maximum of each query's scores
    l = np.zeros(T_q)  # running sum of exp(score - m)
    acc = np.zeros((T_q, v.shape[1]))  # running sum of exp(score - m) * v_j
    for j0 in range(0, T_k, block_size):
        s = q @ k[j0 : j0 + block_size].T / np.sqrt(q.shape[1])  # (T_q, n_k) scores
        m_new = np.maximum(m, s.max(axis=1))
        p = np.exp(s - m_new[:, None])  # (T_q, n_k), every entry <= 1
        alpha = np.exp(m - m_new)  # moves the old sums onto the new maximum
        l = alpha * l + p.sum(axis=1)
        acc = acc + p @ v[j0 : j0 + block_size]  # (T_q, n_k) @ (n_k, d_v) -> (T_q, d_v)
        m = m_new
    return acc / l[:, None]"""


def _online_attention_with(rescale_acc, rescale_l=True):
    def online_attention(q, k, v, block_size=2):
        scores = q @ k.T / np.sqrt(q.shape[1])  # (T_q, T_k)
        m = np.full(q.shape[0], -np.inf)
        l, acc = np.zeros(q.shape[0]), np.zeros((q.shape[0], v.shape[1]))
        for j0 in range(0, k.shape[0], block_size):
            s = scores[:, j0 : j0 + block_size]
            m_new = np.maximum(m, s.max(axis=1))
            p = np.exp(s - m_new[:, None])
            alpha = np.exp(m - m_new)
            l = (alpha * l if rescale_l else l) + p.sum(axis=1)
            acc = rescale_acc(alpha, acc) + p @ v[j0 : j0 + block_size]
            m = m_new
        return acc / l[:, None]

    return online_attention


def _online_attention_cases():
    rng = np.random.default_rng(802)
    ex = THE_CAT_SAT
    return [
        Case('"the cat sat": q, k, v of shape (3, 4), blocks of one key', (ex.q, ex.k, ex.v, 1)),
        Case(
            "5 queries, 7 keys in blocks of 3, d_k=4, d_v=3",
            (rng.normal(size=(5, 4)), rng.normal(size=(7, 4)), rng.normal(size=(7, 3)), 3),
        ),
        Case(
            "scores in the hundreds: 4 queries, 9 keys in blocks of 2, d_k=8, d_v=2",
            (10 * rng.normal(size=(4, 8)), 10 * rng.normal(size=(9, 8)), rng.normal(size=(9, 2)), 2),
        ),
    ]


fix_acc_rescale = FunctionExercise(
    id="ch12.fix_acc_rescale",
    title="Find the bug: blocks that disagree",
    kind="find the bug",
    task=(
        "This function computes attention by online softmax over blocks of `block_size` keys. When "
        "`block_size` is at least the number of keys, so that there is only one block, it agrees with "
        "`attnlib.attention`; with smaller blocks it does not. Compare the two on \"the cat sat\" with "
        "`block_size=1`, find the mistake, and fix it in the cell."
    ),
    starter=_SHIPPED_NO_ACC_RESCALE,
    solution=(
        "def online_attention(q, k, v, block_size=2):\n"
        "    T_q, T_k = q.shape[0], k.shape[0]\n"
        "    m = np.full(T_q, -np.inf)  # running maximum of each query's scores\n"
        "    l = np.zeros(T_q)  # running sum of exp(score - m)\n"
        "    acc = np.zeros((T_q, v.shape[1]))  # running sum of exp(score - m) * v_j\n"
        "    for j0 in range(0, T_k, block_size):\n"
        "        s = q @ k[j0 : j0 + block_size].T / np.sqrt(q.shape[1])  # (T_q, n_k) scores\n"
        "        m_new = np.maximum(m, s.max(axis=1))\n"
        "        p = np.exp(s - m_new[:, None])  # (T_q, n_k), every entry <= 1\n"
        "        alpha = np.exp(m - m_new)  # moves the old sums onto the new maximum\n"
        "        l = alpha * l + p.sum(axis=1)\n"
        "        acc = alpha[:, None] * acc + p @ v[j0 : j0 + block_size]  # the fix: like l\n"
        "        m = m_new\n"
        "    return acc / l[:, None]"
    ),
    answer_name="online_attention",
    cases=_online_attention_cases,
    expected=lambda case: attention_output(*case.args[:3]),
    sizes=attention_sizes,
    mistakes={
        "acc_not_rescaled": Mistake(_online_attention_with(lambda alpha, acc: acc), HINT_ACC_NOT_RESCALED),
        "alpha_not_broadcast": Mistake(
            _online_attention_with(lambda alpha, acc: alpha * acc), HINT_ALPHA_ROWS
        ),
        "nothing_rescaled": Mistake(
            _online_attention_with(lambda alpha, acc: acc, rescale_l=False), HINT_NOTHING_RESCALED
        ),
    },
    explanation=(
        "`l` was moved onto each new maximum but `acc` was not, so the division at the end mixes "
        "sums taken under different maxima. With a single block $\\alpha$ only ever multiplies the "
        "zeros the sums start from, which is why the bug hides when `block_size` covers every key."
    ),
)


# Predict: the blocks a causal tiled pass visits ---------------------------------------


def _visited_blocks(T, block_size, causal=True):
    """How many (query block, key block) pairs attnlib's tiled backend computes scores for."""
    return sum(
        len(list(key_blocks(i0, min(block_size, T - i0), T, block_size, causal)))
        for i0 in range(0, T, block_size)
    )


def _blocks_per_side():
    return -(-CAUSAL_GRID["T"] // CAUSAL_GRID["block_size"])


_GRID_T_TEXT = f"{CAUSAL_GRID['T']:,}".replace(",", "{,}")  # 4{,}096: a thousands comma in LaTeX


causal_blocks = ValueExercise(
    id="ch12.causal_blocks",
    title="How many blocks a causal pass visits",
    kind="predict",
    task=(
        f"The tiled backend runs causal attention on $T = {_GRID_T_TEXT}$ tokens with "
        f"`block_size={CAUSAL_GRID['block_size']}`, so the score matrix falls into "
        f"${_blocks_per_side()} \\times {_blocks_per_side()}$ blocks of queries and keys. How many of "
        "these blocks does it visit, computing at least one score? Set `answer` to the number, then "
        "count with `attnlib.backends.tiled.key_blocks` to see whether you were right."
    ),
    starter="answer = ...  # a number of blocks",
    solution=(
        "from attnlib.backends import tiled\n"
        "\n"
        f"T, block_size = {CAUSAL_GRID['T']}, {CAUSAL_GRID['block_size']}\n"
        "n = T // block_size  # query blocks, and key blocks\n"
        "answer = n * (n + 1) // 2  # the lower triangle of blocks, the diagonal included\n"
        "counted = sum(len(list(tiled.key_blocks(i0, block_size, T, block_size, causal=True)))\n"
        "              for i0 in range(0, T, block_size))\n"
        'print(f"{answer} of {n * n} blocks; key_blocks visits {counted}")'
    ),
    answer_name="answer",
    expected=lambda: _visited_blocks(**CAUSAL_GRID),
    hint="count, for each query block, the key blocks up to and including the one on the diagonal",
    mistakes={
        "half": Mistake(
            lambda: _blocks_per_side() ** 2 / 2,
            "exactly half would cut the diagonal blocks in two, but a block is visited whole: "
            "count the diagonal blocks in full",
        ),
        "below_diagonal_only": Mistake(
            lambda: _visited_blocks(**CAUSAL_GRID) - _blocks_per_side(),
            "the blocks on the diagonal are visited too: each query block sees its own keys",
        ),
        "every_block": Mistake(
            lambda: _visited_blocks(**CAUSAL_GRID, causal=False),
            "a causal pass skips every key block that starts after the query block's last query",
        ),
        "diagonal_only": Mistake(
            _blocks_per_side,
            "the blocks below the diagonal are visited as well; they are the ones that need no mask",
        ),
    },
    explanation=(
        "With $n$ blocks per side a causal pass visits $n(n+1)/2$ of the $n^2$ blocks, a fraction "
        "that falls towards one half as the blocks get small next to $T$. Only the $n$ diagonal "
        "blocks need the mask entry by entry. The Triton kernel, likewise, never loads a tile above the "
        "diagonal."
    ),
)

EXERCISES = (running_sum, online_update, fix_acc_rescale, causal_blocks)
