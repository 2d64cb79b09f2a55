"""Chapter 8, Attention inside a Transformer: a block's parameter count, a RoPE score after a shift,
the map an induction head needs, and a block whose residual carries the wrong vector.

The checks that need torch import it when they run, so ``import attnlib.exercises``
stays free of torch. Nothing here needs a trained model.
"""

import numpy as np

from ..positions import rope
from .core import Case, FunctionExercise, Mistake, ValueExercise

# --- By hand: the parameters of one block ---------------------------------------------------

BLOCK_D_MODEL, BLOCK_HEADS = 64, 4


def _block_parameters(d_hidden=None, biases=True, norms=True, attention_matrices=4, per_head=1):
    """Numbers in one pre-LN block of width BLOCK_D_MODEL, counted from attnlib's Block, with variations."""
    import torch

    from ..learn.transformer import Block

    d = BLOCK_D_MODEL
    block = Block(d, BLOCK_HEADS, torch.Generator().manual_seed(0))
    total = sum(p.numel() for p in block.parameters())
    if d_hidden is not None:  # an MLP of another width
        total += 2 * d * (d_hidden - 4 * d) + (d_hidden - 4 * d)
    if not biases:
        total -= 4 * d + d
    if not norms:
        total -= 2 * 2 * d
    total += (attention_matrices - 4) * d * d + (per_head - 1) * 4 * d * d
    return total


block_parameters = ValueExercise(
    id="ch8.block_parameters",
    title="Count a block's parameters",
    kind="by hand",
    task=(
        f"A pre-LayerNorm block of width $d_{{model}} = {BLOCK_D_MODEL}$ with {BLOCK_HEADS} heads holds: "
        "two LayerNorms (a gain and a bias of $d_{model}$ numbers each); the attention's $W_Q$, $W_K$, "
        "$W_V$ and $W_O$, each $d_{model} \\times d_{model}$, no biases; and an MLP whose middle layer is "
        "4 times wider, with a weight matrix and a bias in each of its two layers. How many numbers does "
        "training adjust in one block?"
    ),
    starter="answer = ...  # a whole number",
    solution=(
        "import torch\n"
        "\n"
        "from attnlib.learn.transformer import Block\n"
        "\n"
        f"d = {BLOCK_D_MODEL}\n"
        "attention = 4 * d * d  # W_Q, W_K, W_V, W_O; the heads split their columns\n"
        "mlp = d * 4 * d + 4 * d + 4 * d * d + d  # W_1, b_1, W_2, b_2\n"
        "norms = 2 * 2 * d  # a gain and a bias in each LayerNorm\n"
        "answer = attention + mlp + norms\n"
        f"block = Block(d, {BLOCK_HEADS}, torch.Generator().manual_seed(0))\n"
        "assert answer == sum(p.numel() for p in block.parameters())\n"
        "print(f\"{attention:,} + {mlp:,} + {norms:,} = {answer:,}\")"
    ),
    answer_name="answer",
    expected=_block_parameters,
    hint="add the four attention matrices, the MLP's two matrices and two biases, and the two LayerNorms",
    mistakes={
        "per_head": Mistake(
            lambda: _block_parameters(per_head=BLOCK_HEADS),
            "the heads share the four (d_model, d_model) matrices, each head using a slice of their "
            "columns: the number of heads does not change the count",
        ),
        "mlp_same_width": Mistake(
            lambda: _block_parameters(d_hidden=BLOCK_D_MODEL),
            "the MLP's middle layer is 4 times wider than d_model: W_1 is (d_model, 4 d_model)",
        ),
        "no_biases": Mistake(
            lambda: _block_parameters(biases=False),
            "the MLP's two layers each have a bias: 4 d_model numbers, then d_model",
        ),
        "no_norms": Mistake(
            lambda: _block_parameters(norms=False),
            "the two LayerNorms are trained too: a gain and a bias of d_model numbers each",
        ),
        "three_attention_matrices": Mistake(
            lambda: _block_parameters(attention_matrices=3),
            "attention has four matrices: W_Q, W_K, W_V and the output projection W_O",
        ),
    },
    explanation=(
        "Attention holds $4 d^2$ numbers, the MLP $8 d^2 + 5d$ and the two LayerNorms $4d$: "
        "$12 d^2 + 9d$ in all. Two thirds of a block sit in its MLP, and the number of heads "
        "changes nothing, since the heads divide $d_{model}$ between them."
    ),
)

# --- By hand: a RoPE score after a shift -------------------------------------------------------

ROPE_Q, ROPE_K = np.array([1.0, 0.0]), np.array([0.0, 1.0])
ROPE_POSITIONS = (12, 15)  # query, key


def _rope_score(query_position, key_position):
    """The dot product of ROPE_Q rotated to one position with ROPE_K rotated to another (d = 2)."""
    q = rope(ROPE_Q[None], [query_position])  # (1, 2)
    k = rope(ROPE_K[None], [key_position])  # (1, 2)
    return float((q @ k.T)[0, 0])


rope_shift = ValueExercise(
    id="ch8.rope_shift",
    title="A RoPE score, far from the start",
    kind="by hand",
    task=(
        "Take $d = 2$, so RoPE has a single pair of features, turned by an angle of "
        "(position) $\\times\\, \\omega$ with $\\omega = 1$ radian ($10000^{-0/2} = 1$). The query "
        f"$q = ({ROPE_Q[0]:g}, {ROPE_Q[1]:g})$ sits at position {ROPE_POSITIONS[0]} and the key "
        f"$k = ({ROPE_K[0]:g}, {ROPE_K[1]:g})$ at position {ROPE_POSITIONS[1]}. Rotating $(a, b)$ by an "
        "angle $\\alpha$ gives $(a\\cos\\alpha - b\\sin\\alpha,\\ a\\sin\\alpha + b\\cos\\alpha)$. What is "
        "the dot product of the rotated query with the rotated key (no $1/\\sqrt{d}$)? Work it out "
        "with as few angles as you can; three decimal places are enough."
    ),
    starter="answer = ...  # a number",
    solution=(
        f"q, k = np.array({ROPE_Q.tolist()}), np.array({ROPE_K.tolist()})\n"
        f"offset = {ROPE_POSITIONS[1]} - {ROPE_POSITIONS[0]}  # only the offset matters\n"
        "k_turned = np.array([k[0] * np.cos(offset) - k[1] * np.sin(offset),\n"
        "                     k[0] * np.sin(offset) + k[1] * np.cos(offset)])\n"
        "answer = float(q @ k_turned)  # = -sin(3)\n"
        f"q_turned = attnlib.rope(q[None], [{ROPE_POSITIONS[0]}])  # (1, 2)\n"
        f"k_both = attnlib.rope(k[None], [{ROPE_POSITIONS[1]}])  # (1, 2)\n"
        "both_turned = (q_turned @ k_both.T).item()\n"
        'print(f"key turned by the offset alone: {answer:.4f}; both turned: {both_turned:.4f}")'
    ),
    answer_name="answer",
    expected=lambda: _rope_score(*ROPE_POSITIONS),
    atol=5e-4,
    tolerance_text="to 3 decimal places",
    hint=(
        "turning the query by m radians and the key by n radians gives the same dot product as turning "
        "the key alone by n - m"
    ),
    mistakes={
        "unrotated": Mistake(
            lambda: float(ROPE_Q @ ROPE_K),
            "that is the score without any rotation: RoPE turns the key by n - m relative to the query, "
            "and that changes the score",
        ),
        "cosine": Mistake(
            lambda: float(np.cos(ROPE_POSITIONS[1] - ROPE_POSITIONS[0])),
            "cos(n - m) is the score of two equal unit vectors; here q and k start at right angles, so "
            "the score is q . (k turned by n - m)",
        ),
        "wrong_direction": Mistake(
            lambda: _rope_score(*ROPE_POSITIONS[::-1]),
            "you turned the key by m - n: the key, at the later position, turns further than the "
            "query, by n - m",
        ),
    },
    explanation=(
        "Turning both vectors by the same angle leaves their dot product unchanged, so only the "
        f"difference of the angles counts: the key turns by {ROPE_POSITIONS[1] - ROPE_POSITIONS[0]} "
        "radians relative to the query, and $q \\cdot R(3)\\,k = -\\sin 3$. At positions 2 and 5, or "
        "1012 and 1015, the score is the same."
    ),
)

# --- Implement: where an induction head looks --------------------------------------------------------


def _induction_targets_reference(tokens):
    """For each position i: (the last j < i with tokens[j] == tokens[i]) + 1, or -1."""
    tokens = np.asarray(tokens)
    last_seen, targets = {}, np.full(len(tokens), -1)
    for i, token in enumerate(tokens.tolist()):
        if token in last_seen:
            targets[i] = last_seen[token] + 1
        last_seen[token] = i
    return targets


def _induction_cases():
    rng = np.random.default_rng(1101)
    pattern = rng.integers(0, 24, size=7)
    repeated = np.concatenate([rng.integers(0, 24, size=3), pattern, rng.integers(0, 24, size=2), pattern])
    return [
        Case("a sequence of 20 tokens whose 7-token segment repeats", (repeated,)),
        Case("the tokens [5, 1, 5, 2, 5]: the token 5 three times", (np.array([5, 1, 5, 2, 5]),)),
        Case("30 random tokens of a vocabulary of 10", (rng.integers(0, 10, size=30),)),
        Case("4 different tokens: nothing to copy", (np.array([3, 0, 2, 1]),)),
    ]


def _first_occurrence(tokens):
    tokens = np.asarray(tokens)
    targets = np.full(len(tokens), -1)
    for i in range(len(tokens)):
        earlier = np.flatnonzero(tokens[:i] == tokens[i])
        if len(earlier):
            targets[i] = earlier[0] + 1
    return targets


induction_targets = FunctionExercise(
    id="ch8.induction_targets",
    title="Where an induction head looks",
    kind="implement",
    task=(
        "An induction head at position i finds an earlier position j < i that holds the same token "
        "as i, and reads the token *after* it, at j + 1, to predict what comes next. Where the token "
        "occurred more than once before, take the most recent occurrence. Write "
        "`induction_targets(tokens)` that takes a 1-D array of token ids and returns, for every "
        "position i, that position j + 1, or -1 where the token at i did not occur before."
    ),
    starter="def induction_targets(tokens):\n    ...  # your code here",
    solution=(
        "def induction_targets(tokens):\n"
        "    targets = np.full(len(tokens), -1)\n"
        "    last_seen = {}  # token -> the last position it was seen at\n"
        "    for i, token in enumerate(tokens):\n"
        "        if token in last_seen:\n"
        "            targets[i] = last_seen[token] + 1  # the token after that occurrence\n"
        "        last_seen[token] = i\n"
        "    return targets"
    ),
    answer_name="induction_targets",
    cases=_induction_cases,
    expected=lambda case: _induction_targets_reference(*case.args),
    mistakes={
        "the_occurrence_itself": Mistake(
            lambda tokens: np.where(_induction_targets_reference(tokens) >= 0,
                                    _induction_targets_reference(tokens) - 1, -1),
            "that is the earlier occurrence of the current token: the head reads the token after it, "
            "j + 1, which is what came next last time",
        ),
        "first_occurrence": Mistake(
            _first_occurrence,
            "when a token occurred more than once, take its most recent earlier occurrence, not its first",
        ),
        "includes_itself": Mistake(
            lambda tokens: np.arange(1, len(tokens) + 1),
            "every position points at i + 1: the current position is not an earlier occurrence, search "
            "j < i only",
        ),
    },
    rtol=0,
    atol=0,
    explanation=(
        "If the current token occurred once before, as every letter of the chapter's example segment "
        "did, the token at j + 1 is the one that followed it then, so copying it predicts the repeat. "
        "If it occurred more than once, as 5 does in [5, 1, 5, 2, 5], the rule uses the most recent "
        "occurrence, and what followed that need not come next: the rule can guess wrong. A "
        "trained model follows the rule with two heads: one in the first "
        "layer writes into every position which token came before it, and one in the second layer "
        "matches the current token against those, then copies the token it finds."
    ),
)

# --- Find the bug: a residual that carries the normalised vector ---------------------------------------

_BUGGY_BLOCK = """def block_forward(block, x):
    h = block.norm_1(x)
    x = h + block.attention(h)  # gather from the other tokens, add to the stream
    h = block.norm_2(x)
    return x + block.mlp(h)  # then work on each token on its own"""

_FIXED_BLOCK = """def block_forward(block, x):
    h = block.norm_1(x)
    x = x + block.attention(h)  # the fix: add to x itself, not to its normalised copy
    h = block.norm_2(x)
    return x + block.mlp(h)  # then work on each token on its own"""


def _block_cases():
    import torch

    from ..learn.transformer import Block

    cases = []
    for seed, (d, heads, T) in ((1111, (8, 2, 5)), (1112, (16, 4, 7))):
        generator = torch.Generator().manual_seed(seed)
        block = Block(d, heads, generator).double()
        x = 3.0 * torch.randn(2, T, d, generator=generator, dtype=torch.float64) + 1.0
        cases.append(Case(f"a block of width {d} with {heads} heads, x of shape (2, {T}, {d})", (block, x)))
    return cases


def _block_expected(case):
    import torch

    (block, x), _ = case.fresh()
    with torch.no_grad():
        return block(x).numpy()


def _normalised_residual(block, x):
    """The starter's bug, however the learner rewrote the rest: the residual adds to LN(x)."""
    h = block.norm_1(x)
    x = h + block.attention(h)
    return x + block.mlp(block.norm_2(x))


def _post_ln(block, x):
    x = block.norm_1(x + block.attention(x))
    return block.norm_2(x + block.mlp(x))


def _no_residual(block, x):
    x = block.attention(block.norm_1(x))
    return x + block.mlp(block.norm_2(x))


fix_residual = FunctionExercise(
    id="ch8.fix_residual",
    title="Find the bug: a block that forgets its input",
    kind="find the bug",
    task=(
        "This pre-LayerNorm block runs, keeps the shapes, and its output even looks well scaled, but "
        "it does not compute $x + \\operatorname{attention}(\\operatorname{LN}(x))$, then "
        "$x + \\operatorname{MLP}(\\operatorname{LN}(x))$. Find the mistake and fix it. A useful test: "
        "multiply `x` by 10 and see whether the output follows."
    ),
    starter=_BUGGY_BLOCK,
    solution=_FIXED_BLOCK,
    answer_name="block_forward",
    cases=_block_cases,
    expected=_block_expected,
    mistakes={
        "normalised_residual": Mistake(
            _normalised_residual,
            "the residual adds attention's output to LN(x), so the stream loses x's scale and mean: "
            "add it to x itself",
        ),
        "post_ln": Mistake(
            _post_ln,
            "that is the original Transformer's post-LN order, LN(x + attention(x)): this block is "
            "pre-LN, x + attention(LN(x))",
        ),
        "no_residual": Mistake(
            _no_residual,
            "the first half lost its residual: x + attention(LN(x)) keeps x and adds what attention gathered",
        ),
    },
    rtol=1e-10,
    atol=1e-12,
    explanation=(
        "The residual stream must carry $x$ itself from block to block: every block reads a normalised "
        "copy, $\\operatorname{LN}(x)$, and adds its result to $x$. Adding to the normalised copy "
        "instead throws away the scale and the mean of $x$ at every block, so what earlier blocks wrote "
        "is partly lost; nothing fails loudly, but the model computes something else."
    ),
)


EXERCISES = (block_parameters, rope_shift, induction_targets, fix_residual)
