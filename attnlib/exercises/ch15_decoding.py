"""Chapter 15, Decoding at scale: what a cache costs per token, the pages a batch holds, and the
exact merge of split-KV decoding."""

import math

import numpy as np

from .core import Case, FunctionExercise, Mistake, ValueExercise

# --- Bytes of cache per token ----------------------------------------------------------------

MODEL = dict(layers=24, n_heads=16, n_kv_heads=4, head_dim=64, itemsize=2)  # bf16


def _bytes_per_token(*, keys_and_values=2, heads="n_kv_heads"):
    m = MODEL
    return keys_and_values * m["layers"] * m[heads] * m["head_dim"] * m["itemsize"]


cache_per_token = ValueExercise(
    id="ch15.cache_per_token",
    title="What one token costs in the cache",
    kind="by hand",
    task=(
        "A decoder has {layers} layers; each has {n_heads} query heads that share {n_kv_heads} key/value "
        "heads (grouped-query attention), with head dimension {head_dim}, and its cache is stored in "
        "bfloat16 ({itemsize} bytes a number). How many bytes of cache does one token add, over every "
        "layer?"
    ).format(**MODEL),
    starter="answer = ...  # bytes",
    solution=(
        "layers, n_kv_heads, head_dim, itemsize = 24, 4, 64, 2\n"
        "answer = 2 * layers * n_kv_heads * head_dim * itemsize  # a key and a value per KV head\n"
        'print(answer, "bytes per token")'
    ),
    answer_name="answer",
    expected=_bytes_per_token,
    hint="a token stores one key and one value per key/value head in every layer",
    mistakes={
        "keys_only": Mistake(lambda: _bytes_per_token(keys_and_values=1),
                             "that counts the keys only: the cache holds a value beside every key"),
        "query_heads": Mistake(lambda: _bytes_per_token(heads="n_heads"),
                               "that counts every query head: with grouped-query attention the cache holds "
                               "one key and one value per key/value head, shared by the query heads of its "
                               "group"),
        "one_layer": Mistake(lambda: _bytes_per_token() // MODEL["layers"],
                             "that is one layer's share: every layer keeps its own keys and values"),
    },
    explanation=(
        "2 x layers x H_kv x d x bytes: here a quarter of what the same model would store with one "
        "key/value head per query head. A decode step reads all of it, for every token in the cache."
    ),
)

# --- Pages held ------------------------------------------------------------------------------

PAGE_LENGTHS, PAGE_SIZE = (100, 37, 250, 16, 1, 70), 16


def _pages(rounding="up"):
    if rounding == "down":
        return sum(n // PAGE_SIZE for n in PAGE_LENGTHS)
    if rounding == "pooled":
        return math.ceil(sum(PAGE_LENGTHS) / PAGE_SIZE)
    return sum(math.ceil(n / PAGE_SIZE) for n in PAGE_LENGTHS)


pages_held = ValueExercise(
    id="ch15.pages_held",
    title="The pages a batch holds",
    kind="by hand",
    task=(
        "Six sequences hold {} positions in a paged cache whose pages hold {} positions each. No two "
        "sequences share a page. How many pages do they hold in all?"
    ).format(", ".join(map(str, PAGE_LENGTHS)), PAGE_SIZE),
    starter="answer = ...  # pages",
    solution=(
        "import math\n\n"
        "lengths, page_size = [100, 37, 250, 16, 1, 70], 16\n"
        "answer = sum(math.ceil(n / page_size) for n in lengths)  # last pages count whole\n"
        'print(answer, "pages for", sum(lengths), "positions")'
    ),
    answer_name="answer",
    expected=_pages,
    hint="each sequence needs ceil(length / page size) pages",
    mistakes={
        "down": Mistake(lambda: _pages("down"),
                        "you rounded down: a sequence's last page is held even when it is only partly full"),
        "pooled": Mistake(lambda: _pages("pooled"),
                          "that divides all the positions together, as if sequences shared pages; each "
                          "sequence rounds up on its own"),
    },
    explanation=(
        "Each sequence wastes less than one page, so a batch of B sequences reserves at most B x (page "
        "size - 1) positions it does not use, whatever the lengths; a contiguous cache reserves the "
        "longest length for each."
    ),
)

# --- The exact merge -------------------------------------------------------------------------


def _merge(o1, lse1, o2, lse2):
    lse = np.logaddexp(lse1, lse2)  # log(exp(lse1) + exp(lse2)), computed stably
    return np.exp(lse1 - lse)[..., None] * o1 + np.exp(lse2 - lse)[..., None] * o2


def _chunk(scores, values):
    top = scores.max(axis=-1, keepdims=True)
    p = np.exp(scores - top)
    return (p @ values) / p.sum(axis=-1, keepdims=True), (np.log(p.sum(axis=-1)) + top[..., 0])


def _merge_cases():
    rng = np.random.default_rng(15)
    cases = []
    for description, n_rows, n1, n2, d, shift in [
        ("2 queries, chunks of 5 and 3 keys", 2, 5, 3, 4, 0.0),
        ("4 queries, a chunk of 1 key and one of 9", 4, 1, 9, 3, 0.0),
        ("3 queries whose second chunk scores 40 higher (the first chunk's weight underflows if "
         "you exponentiate without subtracting)", 3, 6, 6, 5, 40.0),
        ("1 query, chunks of 700 and 800 keys, scores near 800", 1, 700, 800, 8, 800.0),
    ]:
        s1 = rng.standard_normal((n_rows, n1)) * 2 + (shift if shift >= 700 else 0.0)
        s2 = rng.standard_normal((n_rows, n2)) * 2 + shift
        v1, v2 = rng.standard_normal((n1, d)), rng.standard_normal((n2, d))
        (o1, lse1), (o2, lse2) = _chunk(s1, v1), _chunk(s2, v2)
        cases.append(Case(description, (o1, lse1, o2, lse2)))
    return cases


def _merge_expected(case):
    return _merge(*case.args)


merge_two = FunctionExercise(
    id="ch15.merge_two",
    title="Merging two chunks exactly",
    kind="implement",
    task=(
        "Split-KV attends each chunk of keys on its own. Chunk 1 returns its output `o1` (shape (n, d): "
        "the softmax-weighted sum over its keys only) and `lse1` (shape (n,): the log of the sum of "
        "exp(score) over its keys); chunk 2 the same. Write `merge_two(o1, lse1, o2, lse2)` returning "
        "the output of attention over both chunks' keys, (n, d). Keep it stable when the scores are "
        "large (use `np.logaddexp`, or subtract the larger lse before exponentiating)."
    ),
    starter="def merge_two(o1, lse1, o2, lse2):\n    ...  # your code here",
    solution=(
        "def merge_two(o1, lse1, o2, lse2):\n"
        "    lse = np.logaddexp(lse1, lse2)  # log of the sum over both chunks\n"
        "    w1, w2 = np.exp(lse1 - lse), np.exp(lse2 - lse)  # each chunk's share, summing to 1\n"
        "    return w1[:, None] * o1 + w2[:, None] * o2"
    ),
    answer_name="merge_two",
    cases=_merge_cases,
    expected=_merge_expected,
    rtol=1e-9,
    atol=1e-12,
    mistakes={
        "average": Mistake(lambda o1, l1, o2, l2: (o1 + o2) / 2,
                           "you averaged the two outputs: each chunk counts in proportion to its sum of "
                           "exp(score), exp(lse), not equally"),
        "unnormalised": Mistake(lambda o1, l1, o2, l2: np.exp(l1)[:, None] * o1 + np.exp(l2)[:, None] * o2,
                                "you weighted by exp(lse) without dividing by their total: the two weights "
                                "must sum to 1"),
        "swapped": Mistake(lambda o1, l1, o2, l2: _merge(o1, l2, o2, l1),
                           "each output takes its own chunk's weight: o1 with lse1, o2 with lse2"),
    },
    explanation=(
        "exp(lse_s) is chunk s's softmax denominator, so exp(lse_s - lse) is the share of the whole "
        "softmax's weight that falls in chunk s: the merge is exact, in any order and for any number of "
        "chunks (merge two, then merge the result with a third). It is the online softmax's rescaling, "
        "done once at the end."
    ),
)

EXERCISES = (cache_per_token, pages_held, merge_two)
