"""Split-KV (flash-decoding), step by step in NumPy.

When a decoder generates, each sequence has one new query (or a few) and a long
cache of keys. A kernel that gives each (sequence, key/value head) one program
launches B x H_kv programs: 8 for one sequence with 8 KV heads, on a GPU with
132 SMs. Split-KV cuts each sequence's keys into ``num_splits`` chunks, computes
each chunk independently, and merges the partial results exactly.

Each chunk returns its output ``o_s`` (softmax over the chunk's keys only) and
the log-sum-exp ``lse_s`` of its scores. The full softmax's denominator is
``sum_s exp(lse_s)``, so

    lse = logsumexp(lse_s over s)
    o   = sum_s exp(lse_s - lse) * o_s

which is chapter 9's online-softmax rescaling, done once at the end instead
of after every block. The functions below are short on purpose: a chapter
shows them.

- :func:`split_bounds`: where each chunk starts and stops.
- :func:`attend_chunk`: one chunk's output and log-sum-exp.
- :func:`merge_chunks`: the exact merge.
- :func:`decode_one_sequence`: one sequence, every head, every chunk, merged.
- :func:`choose_num_splits`: the heuristic behind ``num_splits=0``.
"""

import math

import numpy as np

DEFAULT_NUM_SMS = 132  # an H100 SXM; the heuristic's SM count where no GPU answers
MIN_KEYS_PER_SPLIT = 256  # a chunk shorter than this costs more to merge than it saves
MAX_SPLITS = 128


def split_bounds(n_keys, num_splits):
    """(start, stop) of each chunk: ``num_splits`` chunks of ceil(n_keys / num_splits) keys, the last
    one shorter; fewer chunks when there are fewer keys than splits (no chunk is empty)."""
    chunk = math.ceil(n_keys / num_splits)
    return [(start, min(start + chunk, n_keys)) for start in range(0, n_keys, chunk)]


def allowed_keys(n_new, n_keys, start, stop, causal, window):
    """Which keys start..stop-1 each of the n_new queries may see: (n_new, stop - start) booleans.

    The new queries are the last n_new positions of the sequence (bottom-right causal):
    query t sits at position n_keys - n_new + t and sees keys j <= that position, and with a
    window only the ``window`` most recent of them.
    """
    position = n_keys - n_new + np.arange(n_new)[:, None]  # (n_new, 1)
    key = np.arange(start, stop)[None, :]  # (1, chunk)
    allowed = np.ones((n_new, stop - start), dtype=bool)
    if causal:
        allowed &= key <= position
    if window is not None:
        allowed &= key > position - window
    return allowed


def attend_chunk(q, k, v, allowed, scale):
    """Attention of the queries over one chunk of keys, and the log-sum-exp of its scores.

    q (n_new, H_kv, G, d): the G query heads that share each key/value head
    k (chunk, H_kv, d), v (chunk, H_kv, d_v), allowed (n_new, chunk)
    returns out (n_new, H_kv, G, d_v) and lse (n_new, H_kv, G); a query that sees no key of
    this chunk gets out 0 and lse -inf, so the merge gives it weight 0.
    """
    scores = np.einsum("tkgd,skd->tkgs", q, k) * scale  # (n_new, H_kv, G, chunk)
    scores = np.where(allowed[:, None, None, :], scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)  # (n_new, H_kv, G, 1)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # a row with no key: avoid inf - inf
    p = np.exp(scores - row_max)  # unnormalised weights, 0 where not allowed
    total = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.einsum("tkgs,skd->tkgd", p, v) / total
        lse = (np.log(total) + row_max)[..., 0]  # log(sum_j exp(score_j)); -inf with no key
    out = np.where(total > 0, out, 0.0)
    return out, lse


def merge_chunks(outs, lses):
    """Merge the chunks' outputs exactly: weights exp(lse_s - lse), lse the log-sum-exp of all.

    outs: list of (n_new, H_kv, G, d_v); lses: list of (n_new, H_kv, G)
    returns out (n_new, H_kv, G, d_v) and lse (n_new, H_kv, G)
    """
    lses = np.stack(lses)  # (S, n_new, H_kv, G)
    top = lses.max(axis=0)  # finite: every query sees a key in some chunk
    lse = top + np.log(np.exp(lses - top).sum(axis=0))
    weights = np.exp(lses - lse)  # (S, n_new, H_kv, G), sums to 1 over S
    out = (weights[..., None] * np.stack(outs)).sum(axis=0)
    return out, lse


def decode_one_sequence(q, k, v, *, scale, causal=True, window=None, num_splits=1):
    """One sequence: q (n_new, H, d) over its n_keys valid keys k (n_keys, H_kv, d), v (n_keys, H_kv, d_v).

    Splits the keys into chunks, attends each chunk, merges; returns (n_new, H, d_v).
    """
    n_new, n_heads, d = q.shape
    n_keys, n_kv_heads, _ = k.shape
    group = n_heads // n_kv_heads
    q = q.reshape(n_new, n_kv_heads, group, d)  # query head h uses key/value head h // group
    outs, lses = [], []
    for start, stop in split_bounds(n_keys, num_splits):
        allowed = allowed_keys(n_new, n_keys, start, stop, causal, window)
        out, lse = attend_chunk(q, k[start:stop], v[start:stop], allowed, scale)
        outs.append(out)
        lses.append(lse)
    out, _ = merge_chunks(outs, lses)
    return out.reshape(n_new, n_heads, v.shape[-1])


def choose_num_splits(batch, n_kv_heads, max_keys, *, num_sms=None):
    """The number of splits ``num_splits=0`` picks: enough programs to fill the GPU, no more.

    The decode kernel runs one program per (sequence, key/value head, split). With
    ``batch * n_kv_heads`` programs already filling 80% of the SMs, splitting only adds a
    merge: 1. Otherwise, enough splits for every SM to get a program
    (ceil(num_sms / (batch * n_kv_heads))), but no chunk shorter than 256 keys and at most 128
    splits. ``num_sms`` defaults to the current CUDA device's count, or 132 (an H100) where
    there is none.

    >>> choose_num_splits(1, 8, 32768, num_sms=132)  # one sequence: 8 programs -> 17 splits
    17
    >>> choose_num_splits(64, 8, 32768, num_sms=132)  # 512 programs already fill 132 SMs
    1
    """
    for name, value in (("batch", batch), ("n_kv_heads", n_kv_heads), ("max_keys", max_keys)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if num_sms is None:
        num_sms = device_sm_count()
    programs = batch * n_kv_heads
    if programs >= 0.8 * num_sms:
        return 1
    wanted = math.ceil(num_sms / programs)
    by_length = max(1, max_keys // MIN_KEYS_PER_SPLIT)
    return int(min(wanted, by_length, MAX_SPLITS))


def device_sm_count():
    """SMs of the current CUDA device; 132 (an H100) without one, or when torch is not loaded (NumPy
    input never imports it)."""
    import sys
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return DEFAULT_NUM_SMS
