"""Chapter 10, A GPT that writes: a BPE merge by hand, the loss in perplexity and bits, a
temperature, top-p, and the cache of the chapter's model.

The chapter prints the cache of one full window, so the cache exercise asks for a batch
of windows. The loss exercises start from 1.19 nats per character, about the chapter's
held-out loss.
"""

import collections
import math
from dataclasses import dataclass

import numpy as np

from ..kv_cache import kv_cache_bytes
from ..learn import recipes
from ..softmax import softmax
from ..text import bpe, corpus
from .core import (
    Case,
    Exercise,
    Failure,
    FunctionExercise,
    Mistake,
    ValueExercise,
    as_numeric_array,
    describe_value,
    stub_text,
)

# The characters the King James text uses, the model's vocabulary: corpus.ALPHABET less "X",
# which the text never uses (tests/test_exercises.py checks this against the tokenizer).
N_CHARACTERS = len(corpus.ALPHABET) - 1

# --- A BPE merge by hand ---------------------------------------------------------------

# A phrase of the King James Bible, chosen so that each typical mistake below picks a
# different pair.
BPE_TEXT = "the house to the house"


def _first_merge():
    """The string of the first token the book's BPE (attnlib.text.bpe) learns from BPE_TEXT."""
    return bpe.train_bpe(BPE_TEXT, 1).vocab[-1]


def _pair_counts(sequences):
    """(left, right) -> occurrences of that pair of neighbouring characters, in order of first sight."""
    counts = collections.Counter()
    for sequence in sequences:
        for pair in zip(sequence, sequence[1:]):
            counts[pair] += 1
    return counts


def _most_frequent(counts, tie="smallest"):
    """The most frequent pair as one string; ties to the smallest pair or to the first seen."""
    top = max(counts.values())
    tied = [pair for pair, n in counts.items() if n == top]  # in order of first occurrence
    return "".join(tied[0] if tie == "first seen" else min(tied))


def _merge_across_words():
    """The mistake of counting pairs over the whole text, spaces between words included."""
    return _most_frequent(_pair_counts([BPE_TEXT]))


def _merge_first_seen():
    """The mistake of breaking ties by first occurrence instead of by the smallest ids."""
    return _most_frequent(_pair_counts(bpe.PIECE.findall(BPE_TEXT)), tie="first seen")


def _merge_without_spaces():
    """The mistake of leaving the spaces out of the pieces (or sorting the space last)."""
    return _most_frequent(_pair_counts([piece.strip() for piece in bpe.PIECE.findall(BPE_TEXT)]))


_COUNTS = _pair_counts(bpe.PIECE.findall(BPE_TEXT))
_TOP = max(_COUNTS.values())
_N_TIED = sum(n == _TOP for n in _COUNTS.values())


@dataclass(frozen=True, eq=False, kw_only=True)
class MergeExercise(Exercise):
    """The answer is the string of a merged token, compared exactly (a space counts) with ``expected()``.

    Parameters
    ----------
    expected : callable
        ``expected() -> str``, computed with attnlib at check time.
    text : str
        The text the token is learned from: an answer that is no pair of neighbouring
        characters inside one of its pieces gets a hint that says so.
    hint : str
        Shown for a wrong answer that matches no typical mistake.
    """

    expected: object
    text: str
    hint: str = ""

    def check(self, answer):
        if answer is None or answer is Ellipsis:
            return self.not_solved(
                f"`{self.answer_name}` is still `{stub_text(answer)}`: set it to the new token's "
                "string, then run the cell to check it."
            )
        if (isinstance(answer, (tuple, list)) and len(answer) == 2
                and all(isinstance(part, str) for part in answer)):
            return self.failed(
                "expected one string.",
                Failure(("expected: one string, the merged token", f"given:    {describe_value(answer)}"),
                        'join the two parts into one string: "a" + "b" gives "ab"'),
            )
        if not isinstance(answer, str):
            return self.failed(
                "expected one string.",
                Failure(("expected: one string, the merged token", f"given:    {describe_value(answer)}"),
                        f'set `{self.answer_name}` to a string in quotes, such as "ab"'),
            )
        if answer == self.expected():
            return self.passed()
        shown = answer if len(answer) <= 40 else answer[:37] + "..."
        return self.failed(f"{shown!r} is not the first merge.", Failure((), self._hint(answer)))

    def _hint(self, answer):
        for mistake in self.mistakes.values():
            if answer == mistake.answer():
                return mistake.hint
        if len(answer) != 2:
            return (f"that is {len(answer)} character{'' if len(answer) == 1 else 's'}: a first merge "
                    "joins two characters, so the new token is 2 characters long (a space counts: "
                    '" a" is a space and a)')
        counts = _pair_counts(bpe.PIECE.findall(self.text))
        if tuple(answer) not in counts:
            return ("those two characters are never neighbours inside one piece of the text; "
                    "cut it into pieces first, each word with the space before it")
        if counts[tuple(answer)] == max(counts.values()):
            return ("that pair is one of the most frequent, but others occur as often: the tie goes "
                    "to the pair with the smallest left id, then the smallest right id, the ids in "
                    "sorted character order (the space first)")
        return ("that pair occurs inside the pieces, but other pairs occur more often; "
                + (self.hint or "count every pair"))


first_merge = MergeExercise(
    id="ch10.first_merge",
    title="The first merge",
    kind="by hand",
    task=(
        f'Train the first merge of BPE, as the chapter\'s tokenizer does, on the text `"{BPE_TEXT}"`. '
        "Cut it into pieces, each word with the space before it; count every pair of neighbouring "
        "characters inside each piece; the most frequent pair is merged first. If several pairs tie, "
        "the pair with the smallest (left id, right id) wins, where the ids are the text's characters "
        "in sorted order: the space first, then the letters from a to z. Set `answer` to the new "
        'token\'s string: `"ab"` for a merge of a and b, `" a"` for a space and a.'
    ),
    starter='answer = ...  # a string of two characters, such as "ab"',
    solution=(
        "import collections\n\n"
        "from attnlib.text.bpe import train_bpe\n\n"
        f'text = "{BPE_TEXT}"\n'
        'pieces = ["the", " house", " to", " the", " house"]  # each word with its space\n'
        "counts = collections.Counter(\n"
        "    pair for piece in pieces for pair in zip(piece, piece[1:]))\n"
        "top = max(counts.values())\n"
        "tied = sorted(pair for pair, n in counts.items() if n == top)  # space first\n"
        'print(f"{len(tied)} pairs occur {top} times:", ["".join(pair) for pair in tied])\n'
        'answer = "".join(tied[0])\n'
        'print("the book\'s BPE agrees:", train_bpe(text, 1).vocab[-1] == answer)'
    ),
    answer_name="answer",
    expected=_first_merge,
    text=BPE_TEXT,
    hint=(
        "cut the text into pieces (each word with the space before it), count the pairs of "
        "neighbouring characters inside the pieces, and break a tie by the smallest "
        "(left id, right id)"
    ),
    mistakes={
        "across_words": Mistake(
            _merge_across_words,
            "that pair spans two words: its letter ends one word and its space starts the next "
            "piece. Pairs are counted inside pieces only, and the space belongs to the word after it",
        ),
        "first_seen": Mistake(
            _merge_first_seen,
            "several pairs tie for the most occurrences: a tie goes to the smallest "
            "(left id, right id), the ids in sorted character order, not to the pair seen first",
        ),
        "no_space": Mistake(
            _merge_without_spaces,
            'the space is a character of its piece: " house" holds the pair (" ", "h"), which counts '
            "like any other, and the space sorts before every letter",
        ),
    },
    explanation=(
        f"{_N_TIED} pairs occur {_TOP} times here, so the tie rule decides, and the space, the "
        "smallest id, wins. "
        "Because the space starts each piece, BPE learns tokens such as `\" the\"` that begin a "
        "word, and never one that spans two words. The tie rule makes training deterministic: the "
        "same text always gives the same merges."
    ),
)

# --- The loss in perplexity and bits ---------------------------------------------------

LOSS = 1.19  # nats per character, the order of the chapter's held-out losses


def _perplexity(loss=LOSS):
    return math.exp(loss)


def _bits(loss=LOSS):
    return loss / math.log(2)


perplexity = ValueExercise(
    id="ch10.perplexity",
    title="From a loss to a perplexity",
    kind="by hand",
    task=(
        f"A character model scores a held-out loss of {LOSS} nats per character: the mean of "
        "$-\\ln p$ over the characters it predicts. What is its perplexity per character? "
        "Three decimal places are enough."
    ),
    starter="answer = ...  # a number of equally likely characters",
    solution=(
        f"loss = {LOSS}  # nats per character: natural logarithms\n"
        "answer = np.exp(loss)  # undo the logarithm\n"
        'print(f"perplexity {answer:.3f}: as uncertain as a choice among that many '
        'characters")'
    ),
    answer_name="answer",
    expected=_perplexity,
    atol=5e-4,
    tolerance_text="to 3 decimal places",
    hint="the perplexity undoes the logarithm of the loss: the loss is in nats, natural logarithms",
    mistakes={
        "base_2": Mistake(
            lambda: 2**LOSS,
            "that is 2 to the loss: the loss is in nats, natural logarithms, so take e to the loss",
        ),
        "base_10": Mistake(
            lambda: 10**LOSS,
            "that is 10 to the loss: the loss is in nats, natural logarithms, so take e to the loss",
        ),
        "probability": Mistake(
            lambda: math.exp(-LOSS),
            "that is e to minus the loss, the geometric mean of the probabilities the model gave the "
            "right characters; the perplexity is its inverse",
        ),
        "bits": Mistake(_bits, "that is the loss in bits: the perplexity is e to the loss in nats"),
    },
    explanation=(
        f"$e^{{{LOSS}}} \\approx {_perplexity():.2f}$: predicting the next character is as uncertain "
        f"as a fair choice among that many characters, against the {N_CHARACTERS} of the "
        "text's alphabet. Whatever the base of the logarithm, the perplexity is the same: "
        "$2^{\\text{bits}} = e^{\\text{nats}}$."
    ),
)

bits_per_character = ValueExercise(
    id="ch10.bits_per_character",
    title="From nats to bits",
    kind="by hand",
    task=(
        f"The same model's loss, {LOSS} nats per character, in bits per character: how many "
        "yes-or-no questions does the next character cost it on average? Three decimal places are "
        "enough."
    ),
    starter="answer = ...  # bits per character",
    solution=(
        f"loss = {LOSS}  # nats per character\n"
        "answer = loss / np.log(2)  # one bit is ln 2 nats, about 0.693\n"
        'print(f"{answer:.3f} bits per character")'
    ),
    answer_name="answer",
    expected=_bits,
    atol=5e-4,
    tolerance_text="to 3 decimal places",
    hint="change the base of the logarithm: log2 p = ln p / ln 2",
    mistakes={
        "times_ln_2": Mistake(
            lambda: LOSS * math.log(2),
            "you multiplied by ln 2: one bit is ln 2, about 0.693, nats, so a loss has more bits than "
            "nats; divide by ln 2",
        ),
        "base_10": Mistake(
            lambda: LOSS / math.log(10),
            "that is in base-10 digits (you divided by ln 10): bits are base 2, divide by ln 2",
        ),
        "log_of_loss": Mistake(
            lambda: math.log2(LOSS),
            "that is the logarithm of the loss; the loss is a logarithm already: change its base by "
            "dividing by ln 2",
        ),
        "perplexity": Mistake(_perplexity, "that is the perplexity, e to the loss: bits are the loss / ln 2"),
    },
    explanation=(
        "$\\log_2 p = \\ln p / \\ln 2$, so a loss in nats divided by $\\ln 2$ is in bits. A uniform "
        f"guess over the {N_CHARACTERS} characters of the text's alphabet would cost "
        f"$\\log_2 {N_CHARACTERS} \\approx {math.log2(N_CHARACTERS):.2f}$ bits; the model "
        f"needs {_bits():.2f}."
    ),
)

# --- Temperature -----------------------------------------------------------------------

HINT_TEMPERATURE_ZERO = (
    "at temperature 0 dividing by the temperature gives inf: treat 0 apart and put all the "
    "probability on the largest logit (np.argmax), as greedy decoding does"
)
HINT_LOGITS_OVERFLOW = (
    "your output overflowed to inf/nan for large logits: subtract each row's maximum "
    "(keepdims=True) from logits / temperature before exp"
)


def _greedy(logits):
    """All the probability on the first largest logit of each row (the last axis)."""
    best = np.argmax(logits, axis=-1)[..., None]
    return (np.arange(logits.shape[-1]) == best).astype(np.float64)


def _temperature_expected(case):
    logits, temperature = case.args
    if temperature == 0:
        return _greedy(logits)
    return softmax(logits / temperature, axis=-1)


def _temperature_cases():
    rng = np.random.default_rng(1301)
    tied = np.array([[1.0, 3.0, 0.5, 3.0, -1.0], [2.0, 0.1, -0.3, 0.7, 1.9], [0.0, -2.0, 4.0, 4.0, 4.0]])
    return [
        Case("6 logits, temperature 1", (rng.normal(size=6) * 2, 1.0)),
        Case("6 logits, temperature 0.5", (rng.normal(size=6) * 2, 0.5)),
        Case("a batch of shape (3, 7), temperature 2", (rng.normal(size=(3, 7)) * 2, 2.0)),
        Case("shape (2, 3, 5), temperature 0.8", (rng.normal(size=(2, 3, 5)) * 2, 0.8)),
        Case("logits near 1,000, shape (2, 5), temperature 0.5",
             (1000 + rng.normal(size=(2, 5)) * 3, 0.5)),
        Case("temperature 0, shape (3, 5), with ties for the largest logit", (tied, 0.0)),
        Case("temperature 0, 8 logits", (rng.normal(size=8) * 2, 0.0)),
    ]


def _times_temperature(logits, temperature):
    return softmax(logits * temperature, axis=-1)


def _naive_temperature(logits, temperature):
    exps = np.exp(logits / temperature)
    return exps / exps.sum(axis=-1, keepdims=True)


def _first_axis_temperature(logits, temperature):
    return softmax(logits / temperature, axis=0)


def _ties_shared(logits, temperature):
    if temperature == 0:
        best = (logits == logits.max(axis=-1, keepdims=True)).astype(np.float64)
        return best / best.sum(axis=-1, keepdims=True)
    return softmax(logits / temperature, axis=-1)


def _temperature_diagnose(case, given, answer):
    logits, temperature = case.args
    given = as_numeric_array(given)
    if given is None or given.shape != np.shape(logits) or given.dtype == np.bool_:
        return None
    if np.isfinite(given.astype(np.float64)).all():
        return None
    if temperature == 0:
        return HINT_TEMPERATURE_ZERO
    return HINT_LOGITS_OVERFLOW if np.abs(logits / temperature).max() > 700 else None


with_temperature = FunctionExercise(
    id="ch10.with_temperature",
    title="Sampling at a temperature",
    kind="implement",
    task=(
        "Write `with_temperature(logits, temperature)` that returns the next-token probabilities at a "
        "temperature $\\tau$: the softmax of `logits / temperature` along the last axis, the "
        "vocabulary. `logits` may hold one row or a batch of rows. The result must stay finite for "
        "logits in the thousands, and at temperature 0 put all the probability on the largest logit "
        "of each row (the first one, where several tie), as greedy decoding does."
    ),
    starter="def with_temperature(logits, temperature):\n    ...  # your code here",
    solution=(
        "def with_temperature(logits, temperature):\n"
        "    logits = np.asarray(logits, dtype=float)\n"
        "    if temperature == 0:  # greedy: all the mass on the first largest logit\n"
        "        best = np.argmax(logits, axis=-1)[..., None]\n"
        "        return (np.arange(logits.shape[-1]) == best).astype(float)\n"
        "    scaled = logits / temperature  # tau < 1 sharpens, tau > 1 flattens\n"
        "    scaled = scaled - scaled.max(axis=-1, keepdims=True)  # largest exp is 1\n"
        "    exps = np.exp(scaled)\n"
        "    return exps / exps.sum(axis=-1, keepdims=True)"
    ),
    answer_name="with_temperature",
    cases=_temperature_cases,
    expected=_temperature_expected,
    diagnose=_temperature_diagnose,
    mistakes={
        "times_temperature": Mistake(
            _times_temperature,
            "you multiplied the logits by the temperature: divide them by it, so that a temperature "
            "below 1 sharpens the distribution",
        ),
        "no_max": Mistake(_naive_temperature, HINT_LOGITS_OVERFLOW),
        "first_axis": Mistake(
            _first_axis_temperature,
            "your probabilities sum to 1 down the first axis: take the softmax over the last axis, "
            "the vocabulary (axis=-1)",
        ),
        "ties_shared": Mistake(
            _ties_shared,
            "at temperature 0 a tie goes to the first largest logit, all its probability on one "
            "token (np.argmax), not shared among the tied ones",
        ),
    },
    explanation=(
        "Dividing by $\\tau$ scales the gaps between logits: $\\tau \\to 0$ leaves only the largest, "
        "greedy decoding, and $\\tau \\to \\infty$ flattens the distribution towards uniform. The "
        "order of the tokens never changes, so the most likely one stays the most likely."
    ),
)

# --- Top-p -----------------------------------------------------------------------------


def _top_p(probs, p, *, keep_rule="reaches", tie="lower index", renormalise=True, in_order=True):
    """Top-p filtering of one distribution; the keyword arguments make the typical mistakes."""
    probs = np.asarray(probs, dtype=np.float64)
    if tie == "lower index":
        order = np.argsort(-probs, kind="stable")       # most probable first, ties: lower index
    else:
        order = np.argsort(probs, kind="stable")[::-1]  # ties: higher index first
    ranked = probs[order]
    total = np.cumsum(ranked)
    before = total - ranked
    keep = {"reaches": before < p, "below": total < p, "at most": total <= p,
            "exceeds": np.concatenate([[True], total[:-1] <= p])}[keep_rule]
    kept = np.where(keep, ranked, 0.0)
    if renormalise:
        kept = kept / kept.sum()
    if not in_order:
        return kept
    out = np.zeros_like(probs)
    out[order] = kept
    return out


def _top_p_expected(case):
    probs, p = case.args
    return _top_p(probs, p)


def _top_p_cases():
    rng = np.random.default_rng(1302)

    def distribution(n, spread):
        return softmax(rng.normal(size=n) * spread)

    with_a_zero = softmax(np.concatenate([rng.normal(size=7), [-np.inf]]))
    return [
        Case("4 tokens, p = 0.6", (np.array([0.1, 0.4, 0.2, 0.3]), 0.6)),
        Case("4 tokens, the two largest add up to exactly p = 0.75",
             (np.array([0.125, 0.5, 0.125, 0.25]), 0.75)),
        Case("4 tokens with ties at the cut, p = 0.7", (np.array([0.2, 0.3, 0.2, 0.3]), 0.7)),
        Case("6 tokens, p = 0.01: the largest alone reaches it", (distribution(6, 1.0), 0.01)),
        Case("8 tokens, one of probability 0, p = 1", (with_a_zero, 1.0)),
        Case("12 tokens, p = 0.9", (distribution(12, 1.5), 0.9)),
        Case("12 tokens, p = 0.5", (distribution(12, 1.5), 0.5)),
    ]


HINT_ONE_SHORT = (
    "you kept one token too few: keep the token whose probability makes the total reach p "
    "(a token is kept while the total of the tokens ranked before it is still below p)"
)

top_p_filter = FunctionExercise(
    id="ch10.top_p_filter",
    title="Top-p filtering",
    kind="implement",
    task=(
        "Write `top_p_filter(probs, p)` for one next-token distribution `probs` (a 1-D array that "
        "sums to 1): keep the smallest set of the most probable tokens whose probabilities add up "
        "to at least `p`, set every other token's probability to 0, and rescale the kept ones so "
        "that they sum to 1. Return the result in the vocabulary's order. Where tokens of equal "
        "probability compete for the last place, the lower index goes first; at least one token is "
        "always kept."
    ),
    starter="def top_p_filter(probs, p):\n    ...  # your code here",
    solution=(
        "def top_p_filter(probs, p):\n"
        "    probs = np.asarray(probs, dtype=float)\n"
        "    order = np.argsort(-probs, kind=\"stable\")  # most probable first, ties: lower index\n"
        "    ranked = probs[order]\n"
        "    before = np.cumsum(ranked) - ranked  # the total of the tokens ranked before each\n"
        "    kept = np.where(before < p, ranked, 0.0)  # the first token is always kept\n"
        "    out = np.zeros_like(probs)\n"
        "    out[order] = kept / kept.sum()  # back in the vocabulary's order\n"
        "    return out"
    ),
    answer_name="top_p_filter",
    cases=_top_p_cases,
    expected=_top_p_expected,
    mistakes={
        "one_short": Mistake(lambda probs, p: _top_p(probs, p, keep_rule="below"), HINT_ONE_SHORT),
        "one_short_at_most": Mistake(lambda probs, p: _top_p(probs, p, keep_rule="at most"), HINT_ONE_SHORT),
        "one_too_many": Mistake(
            lambda probs, p: _top_p(probs, p, keep_rule="exceeds"),
            "you kept one token too many: stop as soon as the total reaches p (>= p), even when it "
            "equals p exactly",
        ),
        "not_renormalised": Mistake(
            lambda probs, p: _top_p(probs, p, renormalise=False),
            "you kept the right tokens but did not rescale them: divide the kept probabilities by "
            "their sum, so that they sum to 1",
        ),
        "ties_higher_first": Mistake(
            lambda probs, p: _top_p(probs, p, tie="higher index"),
            "among tokens of equal probability the lower index goes first: sort with "
            "np.argsort(-probs, kind=\"stable\"); np.argsort(probs)[::-1] puts the higher index first",
        ),
        "sorted_order": Mistake(
            lambda probs, p: _top_p(probs, p, in_order=False),
            "you returned the probabilities in sorted order: put each back at its token's index "
            "(out[order] = kept)",
        ),
    },
    explanation=(
        "Top-p adapts the number of candidates to the model's confidence: after a confident "
        "distribution one or two tokens reach p, after an uncertain one many do. Top-k keeps the same "
        "number of tokens every time."
    ),
)

# --- The cache of the chapter's model ----------------------------------------------------

CACHE_BATCH = 8  # continuations sampled at once, each with a full window


def _gpt_cache_bytes(head_dim=None, dtype=None, batch=CACHE_BATCH, keys_and_values=2):
    gpt = recipes.GPT
    head_dim = head_dim or gpt["d_model"] // gpt["n_heads"]
    full = kv_cache_bytes(gpt["n_layers"], gpt["n_heads"], head_dim, dtype or gpt["dtype"],
                          seq_len=gpt["context"], batch=batch)
    return full * keys_and_values // 2


_LLAMA_PER_TOKEN = kv_cache_bytes(32, 32, 128, "float16")  # bytes per token

cache_bytes = ValueExercise(
    id="ch10.cache_bytes",
    title="The cache of the chapter's model",
    kind="by hand",
    task=(
        "The chapter's model has {n_layers} layers of {n_heads} attention heads, a model width "
        "$d_\\text{{model}} = {d_model}$ split evenly among the heads, and keeps its cache in float32 "
        "(4 bytes a number). It samples {batch} continuations of a prompt at once, each with a full "
        "window of {context} characters. How many bytes do the cached keys and values take? Give "
        "the answer in bytes."
    ).format(batch=CACHE_BATCH, **recipes.GPT),
    starter="answer = ...  # a number of bytes",
    solution=(
        "layers, heads, d_model, bytes_per_number = 2, 4, 64, 4  # float32\n"
        "d = d_model // heads  # each head's keys and values are 16 wide\n"
        f"window, batch = 64, {CACHE_BATCH}\n"
        "per_character = 2 * layers * heads * d * bytes_per_number  # keys and values\n"
        "answer = per_character * window * batch\n"
        'print(f"{per_character:,} bytes per character, {answer:,} in all")\n'
        'print("attnlib agrees:", answer == attnlib.kv_cache_bytes(\n'
        '    layers, heads, d, "float32", seq_len=window, batch=batch))'
    ),
    answer_name="answer",
    expected=_gpt_cache_bytes,
    atol=0.5,
    tolerance_text="exactly, in bytes",
    hint="multiply 2 (keys and values), the layers, the heads, each head's width, the bytes per "
         "number, the characters of the window and the continuations",
    mistakes={
        "keys_only": Mistake(
            lambda: _gpt_cache_bytes(keys_and_values=1),
            "that is half: the cache holds keys and values, both of the same size",
        ),
        "d_model_per_head": Mistake(
            lambda: _gpt_cache_bytes(head_dim=recipes.GPT["d_model"]),
            "that gives every head the full model width: the heads split d_model, so each is "
            "d_model / heads wide",
        ),
        "float64": Mistake(
            lambda: _gpt_cache_bytes(dtype="float64"),
            "that is 8 bytes a number, float64: float32 takes 4",
        ),
        "one_sequence": Mistake(
            lambda: _gpt_cache_bytes(batch=1),
            "that is one continuation: each of the continuations sampled at once has a cache of its own",
        ),
        "kib": Mistake(
            lambda: _gpt_cache_bytes() / 2**10,
            "that looks like KiB: give the answer in bytes (1 KiB = 1,024 bytes)",
        ),
    },
    explanation=(
        f"{_gpt_cache_bytes(batch=1) // recipes.GPT['context']:,} bytes per character of each window. "
        "A model of 32 layers with 32 heads of width 128 in float16, the shape of Llama 2 7B, caches "
        f"{_LLAMA_PER_TOKEN // 2**10:,} KiB for every single token, "
        f"{_LLAMA_PER_TOKEN * recipes.GPT['context'] // _gpt_cache_bytes(batch=1):,} times as much."
    ),
)

EXERCISES = (first_merge, perplexity, bits_per_character, with_temperature, top_p_filter, cache_bytes)
