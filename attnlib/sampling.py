"""Sampling the next token: temperature, top-k and top-p, with a seeded generator.

Greedy decoding (chapter 9) always takes the most likely token. Sampling draws the next
token at random with the probabilities the model gives it, after three optional changes:

- **temperature** τ: the logits are divided by τ before the softmax. τ < 1 sharpens the
  distribution, τ > 1 flattens it, τ = 0 is greedy decoding;
- **top-k** {Fan et al. 2018}: only the k most likely tokens may be drawn;
- **top-p**, nucleus sampling {Holtzman et al. 2020}: only the fewest most likely tokens
  whose probabilities add up to at least p.

The draw itself uses one uniform number u in [0, 1) from :class:`Uniform`, a small
generator (mulberry32) whose every step is 32-bit integer arithmetic, so the page's
JavaScript (``attnlib/live_writer.js``) draws the same numbers from the same seed: the token
drawn is the first whose cumulative probability exceeds u.

:func:`generate` runs chapter 9's loop, with a KV cache (``cached=True``) or recomputing
every position, choosing each token with :func:`sample_next`.
"""

import numpy as np
import torch

from .decoding import _check_generate_args, forward_step
from .kv_cache import KVCache

MASK32 = 0xFFFFFFFF


class Uniform:
    """Uniform numbers in [0, 1) from a 32-bit seed: mulberry32, the same in JavaScript."""

    def __init__(self, seed):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MASK32:
            raise ValueError(f"seed must be an int in 0 ... 2**32 - 1, got {seed!r}")
        self.state = int(seed)

    def next(self):
        self.state = (self.state + 0x6D2B79F5) & MASK32
        t = self.state
        t = ((t ^ (t >> 15)) * (t | 1)) & MASK32
        t ^= (t + (((t ^ (t >> 7)) * (t | 61)) & MASK32)) & MASK32
        return ((t ^ (t >> 14)) & MASK32) / 2**32


def sample_next(logits, *, temperature=1.0, top_k=None, top_p=None, generator=None):
    """The id of the next token, drawn from one row of logits (V,).

    ``temperature=0`` takes the largest logit (the first, on a tie) and needs no generator.
    Otherwise the probabilities are ``softmax(logits / temperature)`` in float64, cut to
    the ``top_k`` most likely tokens and then to the fewest most likely whose total reaches
    ``top_p`` (ties keep the lower id first), renormalised, and one uniform number from
    ``generator`` (a :class:`Uniform`) picks the token.
    """
    logits = _check_sampling_args(logits, temperature, top_k, top_p, generator)
    if temperature == 0:
        return int(np.argmax(logits))  # greedy: the first of the largest
    p = np.exp((logits - logits.max()) / temperature)  # (V,), the largest is exp(0) = 1
    p /= p.sum()
    order = np.argsort(-p, kind="stable")  # most likely first, lower id first on a tie
    keep = len(p) if top_k is None else min(top_k, len(p))
    if top_p is not None:
        before = np.cumsum(p[order]) - p[order]  # the total of the tokens ranked before each
        keep = min(keep, int((before < top_p).sum()))  # at least one: before[0] is 0
    kept = order[:keep]  # the tokens that may be drawn, most likely first
    cumulative = np.cumsum(p[kept] / p[kept].sum())
    u = generator.next()
    return int(kept[min(int((cumulative <= u).sum()), keep - 1)])


@torch.no_grad()
def generate(model, prompt, n_new, *, temperature=1.0, top_k=None, top_p=None, seed=0,
             cached=True, window=None):
    """Continue ``prompt`` (1, T_0) by ``n_new`` tokens, each chosen by :func:`sample_next`.

    With ``cached=True`` it is chapter 9's cached loop (``window=W``: each block keeps its
    last W positions, so the model can write past the length it was trained on); with
    ``cached=False`` every step runs the model over the whole sequence (with the same
    window). Both give the same tokens. Returns the tokens (1, T_0 + n_new).
    """
    _check_generate_args(model, prompt, n_new)
    if prompt.shape[0] != 1:
        raise ValueError(f"prompt must hold one sequence, shape (1, T_0), got {tuple(prompt.shape)}")
    generator = None if temperature == 0 else Uniform(seed)
    options = {} if window is None else {"window": window}
    caches = [KVCache(window=window) for _ in model.blocks] if cached else None
    tokens, new = prompt, prompt
    for _ in range(n_new):
        if cached:
            start = caches[0].seen  # the position of the first new token
            positions = torch.arange(start, start + new.shape[1])
            logits = forward_step(model, new, positions, caches, **options)[0, -1]  # (V,)
        else:
            positions = torch.arange(tokens.shape[1])
            logits = forward_step(model, tokens, positions, **options)[0, -1]  # (V,)
        next_id = sample_next(logits.double().numpy(), temperature=temperature, top_k=top_k,
                              top_p=top_p, generator=generator)
        new = torch.tensor([[next_id]])  # (1, 1): all the next cached step runs
        tokens = torch.cat([tokens, new], dim=1)
    return tokens


def _check_sampling_args(logits, temperature, top_k, top_p, generator):
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 1 or logits.shape[0] < 1:
        raise ValueError(f"logits must be one row of scores, shape (V,), got shape {logits.shape}")
    if not np.isfinite(logits).all():
        raise ValueError("logits must be finite; got NaN or infinity")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
            not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))
                              or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                              or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")
    if temperature > 0 and not isinstance(generator, Uniform):
        raise ValueError("generator must be an attnlib.sampling.Uniform when temperature > 0, "
                         f"got {type(generator).__name__}")
    return logits
