"""Chapter 14, Many sequences in one batch: padding's waste, a mask written as a function, and
the tiles a block mask computes."""

import numpy as np

from .. import mods
from ..block_mask import block_mask
from .core import Case, FunctionExercise, Mistake, ValueExercise

# --- Padding by hand -------------------------------------------------------------------------

PADDED_LENGTHS = (100, 400, 250, 50)  # four sequences padded to the longest


def _padding_waste(lengths=PADDED_LENGTHS, *, per="entry"):
    """The share of a padded batch's score entries (query-key pairs of one head) that are padding."""
    longest = max(lengths)
    if per == "token":
        return 1 - sum(lengths) / (len(lengths) * longest)
    return 1 - sum(t * t for t in lengths) / (len(lengths) * longest * longest)


padding_waste = ValueExercise(
    id="ch14.padding_waste",
    title="What padding wastes",
    kind="by hand",
    task=(
        "Four sequences of {} tokens are padded to the longest and attended to in one batch, without "
        "a causal mask. What fraction of the batch's score entries (query-key pairs, per head) pair a "
        "padding token with anything, so that packing would not compute them? Give a number between 0 "
        "and 1."
    ).format(", ".join(map(str, PADDED_LENGTHS))),
    starter="answer = ...  # a fraction between 0 and 1",
    solution=(
        "lengths = [100, 400, 250, 50]\n"
        "longest = max(lengths)\n"
        "padded = len(lengths) * longest**2  # every sequence as long as the longest\n"
        "packed = sum(t**2 for t in lengths)  # each sequence against itself only\n"
        "answer = 1 - packed / padded\n"
        'print(f"{answer:.3f} of the score entries are padding")'
    ),
    answer_name="answer",
    expected=_padding_waste,
    rtol=1e-3,
    tolerance_text="to 3 significant digits",
    hint="the padded batch has 4 x 400 x 400 entries; each sequence needs only its own length squared",
    mistakes={
        "tokens": Mistake(lambda: _padding_waste(per="token"),
                          "that is the share of padding *tokens*: the score matrix grows with the square "
                          "of the length, so count query-key pairs, t x t per sequence"),
        "kept_share": Mistake(lambda: 1 - _padding_waste(),
                              "that is the share of entries packing keeps: the question asks for the waste"),
    },
    explanation=(
        "Score entries grow with the square of the length, so a few long sequences make padding "
        "expensive: here most of the batch's entries pair something with padding, though only half "
        "of its tokens are padding."
    ),
)

# --- A mask as a function -------------------------------------------------------------------

PREFIX = 4


def _prefix_expected(case):
    b, h, q_idx, kv_idx = case.args
    return np.asarray((kv_idx <= q_idx) | (kv_idx < PREFIX))


def _prefix_cases():
    cases = []
    for description, T in [("8 tokens", 8), ("a prefix longer than the sequence: 3 tokens", 3),
                           ("20 tokens", 20)]:
        q_idx, kv_idx = np.arange(T)[:, None], np.arange(T)[None, :]
        cases.append(Case(description, (np.zeros((1, 1), dtype=int), np.zeros((1, 1), dtype=int), q_idx, kv_idx)))
    return cases


prefix_mask = FunctionExercise(
    id="ch14.prefix_mask",
    title="A prefix-LM mask as a function",
    kind="implement",
    task=(
        f"Write `prefix_lm(b, h, q_idx, kv_idx)`, a `mask_mod` for a prefix language model whose first "
        f"{PREFIX} tokens (positions 0 to {PREFIX - 1}) are a prompt every token may see, while every "
        "other key stays causal. It returns True where the query may attend. The index arguments are "
        "integer arrays that broadcast (here `q_idx` is a column and `kv_idx` a row), so use elementwise "
        "operations, not `if`."
    ),
    starter="def prefix_lm(b, h, q_idx, kv_idx):\n    ...  # your code here",
    solution=(
        "def prefix_lm(b, h, q_idx, kv_idx):\n"
        "    causal = kv_idx <= q_idx  # the keys up to the query\n"
        "    prompt = kv_idx < 4  # the first 4 tokens, seen by every query\n"
        "    return causal | prompt"
    ),
    answer_name="prefix_lm",
    cases=_prefix_cases,
    expected=_prefix_expected,
    mistakes={
        "causal_only": Mistake(lambda b, h, q, k: k <= q,
                               "that is the causal mask alone: every query must also see the prompt's "
                               f"first {PREFIX} tokens"),
        "and": Mistake(lambda b, h, q, k: (k <= q) & (k < PREFIX),
                       "you combined the two with 'and': a key is allowed if it is causal *or* in the prompt"),
        "one_too_many": Mistake(lambda b, h, q, k: (k <= q) | (k <= PREFIX),
                                f"the prompt is positions 0 to {PREFIX - 1}: use kv_idx < {PREFIX}"),
        "strict": Mistake(lambda b, h, q, k: (k < q) | (k < PREFIX),
                          "a query may see itself: kv_idx <= q_idx"),
    },
    explanation=(
        "Written with elementwise operations, the same function runs on NumPy index arrays, on torch "
        "tensors, and inside FlexAttention: `attnlib.mods.prefix_lm` is this function."
    ),
)

# --- Tiles computed -------------------------------------------------------------------------

TILE_T, TILE_BLOCK = 3328, 128


def _causal_tiles():
    return int(block_mask(mods.causal(), 1, 1, TILE_T, TILE_T, block_size=TILE_BLOCK).visited.sum())


tiles_computed = ValueExercise(
    id="ch14.tiles_computed",
    title="The tiles a causal block mask computes",
    kind="by hand",
    task=(
        f"A sequence of {TILE_T:,} tokens is cut into blocks of {TILE_BLOCK} queries and {TILE_BLOCK} keys. "
        "With a causal mask, how many (query block, key block) tiles hold at least one allowed key, "
        "so that a block-skipping kernel computes them?"
    ),
    starter="answer = ...  # a number of tiles",
    solution=(
        "n = 3328 // 128  # 26 query blocks and 26 key blocks\n"
        "answer = n * (n + 1) // 2  # the tiles below the diagonal and the diagonal's own\n"
        'print(answer, "of", n * n)'
    ),
    answer_name="answer",
    expected=_causal_tiles,
    hint="count, for query block i, the key blocks 0 ... i",
    mistakes={
        "half": Mistake(lambda: (TILE_T // TILE_BLOCK) ** 2 // 2,
                        "that is half of the tiles: the diagonal tiles are only half masked, and are computed"),
        "below_only": Mistake(lambda: (TILE_T // TILE_BLOCK) * (TILE_T // TILE_BLOCK - 1) // 2,
                              "you left out the diagonal tiles: each holds allowed keys (a query sees itself)"),
        "all": Mistake(lambda: (TILE_T // TILE_BLOCK) ** 2, "that is every tile: the causal mask leaves out "
                                                           "the tiles wholly above the diagonal"),
    },
    explanation=(
        "n(n + 1)/2 of n² tiles: the sparsity tends to one half as the blocks shrink, and is below it "
        "for any block size because the diagonal tiles are computed whole (and masked inside)."
    ),
)

EXERCISES = (padding_waste, prefix_mask, tiles_computed)
