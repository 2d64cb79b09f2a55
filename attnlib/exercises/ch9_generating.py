"""Chapter 9, Generating text: the size of a cache, its alignment, shared heads, and intensity."""

import numpy as np

from ..attention import attention
from .core import Case, FunctionExercise, Mistake, ValueExercise

# The by-hand exercise: a model shaped like a 13B-parameter GQA model, serving a batch.
CACHE_CONFIG = {"n_layers": 40, "n_kv_heads": 8, "head_dim": 128, "bytes_per_number": 2, "seq_len": 8192,
                "batch": 4, "n_heads": 40}


def _cache_bytes(n_layers, n_kv_heads, head_dim, bytes_per_number, seq_len, batch, n_heads=None,
                 keys_and_values=2):
    return keys_and_values * n_layers * n_kv_heads * head_dim * bytes_per_number * seq_len * batch


cache_bytes = ValueExercise(
    id="ch9.cache_bytes",
    title="How big is the cache?",
    kind="by hand",
    task=(
        "A model has {n_layers} layers, each with {n_heads} query heads and {n_kv_heads} key/value heads "
        "(grouped-query attention) of width $d = {head_dim}$, and stores its cache in bf16 "
        "({bytes_per_number} bytes a number). It serves a batch of {batch} sequences of "
        "{seq_len:,} tokens each. How many bytes do the keys and values of all its layers take? "
        "Give the answer in bytes."
    ).format(**CACHE_CONFIG),
    starter="answer = ...  # a number of bytes",
    solution=(
        "layers, kv_heads, d, bytes_per_number = 40, 8, 128, 2  # bf16\n"
        "tokens, batch = 8192, 4\n"
        "per_token = 2 * layers * kv_heads * d * bytes_per_number  # keys and values\n"
        "answer = per_token * tokens * batch\n"
        'print(f"{per_token / 1e3:.0f} kB per token, {answer / 1e9:.1f} GB in all")'
    ),
    answer_name="answer",
    expected=lambda: _cache_bytes(**CACHE_CONFIG),
    rtol=1e-3,
    tolerance_text="in bytes",
    hint="multiply 2 (keys and values), the layers, the key/value heads, d, the bytes per number, "
         "the tokens and the sequences",
    mistakes={
        "query_heads": Mistake(
            lambda: _cache_bytes(**{**CACHE_CONFIG, "n_kv_heads": CACHE_CONFIG["n_heads"]}),
            "that counts all 40 query heads: only the 8 key/value heads are cached, the query heads of "
            "a group share theirs",
        ),
        "keys_only": Mistake(
            lambda: _cache_bytes(**CACHE_CONFIG, keys_and_values=1),
            "that is half: the cache holds keys and values, both of the same size",
        ),
        "one_sequence": Mistake(
            lambda: _cache_bytes(**{**CACHE_CONFIG, "batch": 1}),
            "that is one sequence: every sequence of the batch has a cache of its own",
        ),
        "gb": Mistake(
            lambda: _cache_bytes(**CACHE_CONFIG) / 1e9,
            "that looks like GB: give the answer in bytes (1 GB = 10**9 bytes)",
        ),
        "gib": Mistake(
            lambda: _cache_bytes(**CACHE_CONFIG) / 2**30,
            "that looks like GiB: give the answer in bytes (1 GiB = 2**30 bytes)",
        ),
    },
    explanation=(
        "164 kB per token, 5.4 GB for the batch. With a key/value head for every query head it would be "
        "five times as large, 26.8 GB, and each sequence added to the batch would add another quarter of that."
    ),
)

_SHIPPED_TOP_LEFT = """def attend_to_cache(q_new, k_cache, v_cache):
    \"\"\"The n newest queries (H, n, d) over the cached keys and values (H, T, d).\"\"\"
    return attnlib.attention(q_new, k_cache, v_cache, causal=True)"""


def _cache_cases():
    rng = np.random.default_rng(1212)
    cases = []
    for description, n_heads, n, t, d in [
        ("one new query over 6 cached keys, 2 heads", 2, 1, 6, 4),
        ("3 new queries (a prompt chunk) over 8 keys, 1 head", 1, 3, 8, 4),
        ("one new query over 1 key", 1, 1, 1, 3),
    ]:
        q = rng.standard_normal((n_heads, n, d))
        k = rng.standard_normal((n_heads, t, d))
        v = rng.standard_normal((n_heads, t, d))
        cases.append(Case(description, (q, k, v)))
    return cases


def _cache_expected(case):
    return attention(*case.args, causal="bottom-right")


def _cache_diagnose(case, given, answer):
    q, k, v = case.args
    top_left = attention(q, k, v, causal=True)
    if np.shape(given) == top_left.shape and np.allclose(given, top_left) and k.shape[-2] > q.shape[-2]:
        return ("that is top-left alignment: the first new query sees only key 0. The new queries are "
                "the last positions of the sequence, so line the last query up with the last key")
    return None


attend_to_cache = FunctionExercise(
    id="ch9.attend_to_cache",
    title="Find the bug: the new token sees only the first one",
    kind="find the bug",
    task=(
        "This function runs the queries of the newest positions against everything in the cache, the "
        "new positions' own keys included (they come last). With as many queries as keys it is right; "
        "in a decoding step, one query over the cache, it returns nonsense. Find the mistake and fix it."
    ),
    starter=_SHIPPED_TOP_LEFT,
    solution=(
        "def attend_to_cache(q_new, k_cache, v_cache):\n"
        '    """The n newest queries (H, n, d) over the cached keys and values (H, T, d)."""\n'
        "    # the last query lines up with the last key: query i sees keys j <= i + T - n\n"
        '    return attnlib.attention(q_new, k_cache, v_cache, causal="bottom-right")'
    ),
    answer_name="attend_to_cache",
    cases=_cache_cases,
    expected=_cache_expected,
    diagnose=_cache_diagnose,
    mistakes={
        "no_mask": Mistake(lambda q, k, v: attention(q, k, v),
                           "with no causal mask, the new queries of a chunk see each other's future"),
    },
    explanation=(
        "`causal=True` is PyTorch's top-left alignment: query i sees keys $j \\le i$, right when the "
        "queries and keys are the same positions. In a cached step the queries are the *last* $n$ of "
        "$T$ positions, so query i sees keys $j \\le i + T - n$: bottom-right alignment."
    ),
)

_SHIPPED_TILE = """def gqa_attention(q, k, v):
    \"\"\"q (H, T, d) over k, v (H_kv, T, d): H / H_kv query heads per key/value head.\"\"\"
    n_rep = q.shape[-3] // k.shape[-3]
    k = np.tile(k, (n_rep, 1, 1))  # (H, T, d)
    v = np.tile(v, (n_rep, 1, 1))
    return attnlib.attention(q, k, v, causal=True)"""


def _gqa_cases():
    rng = np.random.default_rng(1213)
    cases = []
    for description, n_heads, n_kv_heads in [
        ("H = 4 query heads, H_kv = 2", 4, 2),
        ("H = 6 query heads, H_kv = 3", 6, 3),
        ("H = 4 query heads, H_kv = 1 (multi-query)", 4, 1),
    ]:
        q = rng.standard_normal((n_heads, 5, 4))
        k = rng.standard_normal((n_kv_heads, 5, 4))
        v = rng.standard_normal((n_kv_heads, 5, 3))
        cases.append(Case(description, (q, k, v)))
    return cases


def _gqa_expected(case):
    return attention(*case.args, causal=True, enable_gqa=True)


def _tiled_gqa(q, k, v):
    n_rep = q.shape[-3] // k.shape[-3]
    return attention(q, np.tile(k, (n_rep, 1, 1)), np.tile(v, (n_rep, 1, 1)), causal=True)


gqa_heads = FunctionExercise(
    id="ch9.gqa_heads",
    title="Find the bug: the wrong heads share",
    kind="find the bug",
    task=(
        "This function computes grouped-query attention by giving every query head its key/value head, "
        "copied, then running ordinary attention. Query head $h$ should use key/value head "
        "$\\lfloor h / G \\rfloor$, where $G = H / H_\\text{kv}$ query heads share one, as "
        "`attnlib.attention(..., enable_gqa=True)` and PyTorch's `scaled_dot_product_attention` (SDPA) do. It passes when $H_\\text{kv} = 1$ "
        "(multi-query attention) or $G = 1$, and fails whenever both exceed 1. Find the mistake and fix it."
    ),
    starter=_SHIPPED_TILE,
    solution=(
        "def gqa_attention(q, k, v):\n"
        '    """q (H, T, d) over k, v (H_kv, T, d): H / H_kv query heads per key/value head."""\n'
        "    n_rep = q.shape[-3] // k.shape[-3]\n"
        "    k = np.repeat(k, n_rep, axis=-3)  # heads 0, 0, 1, 1, ...: neighbours share\n"
        "    v = np.repeat(v, n_rep, axis=-3)\n"
        "    return attnlib.attention(q, k, v, causal=True)"
    ),
    answer_name="gqa_attention",
    cases=_gqa_cases,
    expected=_gqa_expected,
    mistakes={
        "tile": Mistake(_tiled_gqa,
                        "np.tile repeats the whole stack of heads (0, 1, 0, 1, ...), so query head h gets "
                        "key/value head h % H_kv; each key/value head must serve consecutive query heads "
                        "(0, 0, 1, 1, ...), which np.repeat gives"),
    },
    explanation=(
        "`np.repeat(k, G, axis=-3)` gives heads 0, 0, 1, 1, ...; `np.tile` gives 0, 1, 0, 1, .... "
        "With one key/value head, or one query head per key/value head, the two agree, which is how such a "
        "bug survives a test of multi-query or of plain multi-head attention. "
        "`attnlib.attention(..., enable_gqa=True)` computes the same without any copy."
    ),
)


def _decode_intensity(n_heads=64, n_kv_heads=8, bytes_per_number=2):
    """FLOPs per byte of one decoding step's attention: 4 T d H FLOPs over 2 T d H_kv numbers read."""
    T, d = 4096, 128
    flops = 4 * T * d * n_heads  # q . k and the weighted sum, per query head
    bytes_read = 2 * T * d * n_kv_heads * bytes_per_number  # every cached key and value, once
    return flops / bytes_read


decode_intensity = ValueExercise(
    id="ch9.decode_intensity",
    title="The intensity of a grouped-query step",
    kind="predict",
    task=(
        "In one decoding step, each of $H = 64$ query heads scores its one query against $T$ cached keys "
        "and mixes $T$ cached values, $4 T d$ FLOPs per head. The cache holds $H_\\text{kv} = 8$ "
        "key/value heads in fp16 and the step reads each cached number once. How many FLOPs does the "
        "step do per byte it reads? (With $H_\\text{kv} = H$ the answer is 1.)"
    ),
    starter="answer = ...  # FLOPs per byte",
    solution=(
        "H, H_kv, bytes_per_number = 64, 8, 2\n"
        "T, d = 4096, 128  # any T and d: they cancel\n"
        "flops = 4 * T * d * H\n"
        "bytes_read = 2 * T * d * H_kv * bytes_per_number  # keys and values\n"
        "answer = flops / bytes_read\n"
        'print(f"{answer:g} FLOPs per byte")'
    ),
    answer_name="answer",
    expected=_decode_intensity,
    rtol=1e-6,
    tolerance_text="exactly",
    hint="the FLOPs grow with the query heads, the bytes with the key/value heads",
    mistakes={
        "inverted": Mistake(lambda: 1 / _decode_intensity(), "that is bytes per FLOP: divide FLOPs by bytes"),
        "mha": Mistake(lambda: _decode_intensity(n_kv_heads=64),
                       "that is multi-head attention: here 8 key/value heads serve 64 query heads"),
        "fp32": Mistake(lambda: _decode_intensity(bytes_per_number=4), "fp16 takes 2 bytes a number, not 4"),
    },
    explanation=(
        "$4TdH / (2TdH_\\text{kv} \\cdot 2) = H / H_\\text{kv} = 8$: each byte read serves 8 query heads, "
        "the shape of Llama 2 70B. Still far below an H100's ridge point of about 300, so the step stays "
        "memory-bound, 8 times less so."
    ),
)

EXERCISES = (cache_bytes, attend_to_cache, gqa_heads, decode_intensity)
