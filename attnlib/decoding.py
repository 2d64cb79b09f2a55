"""Generating text: a decoder's loop, recomputing everything or with a KV cache.

A decoder-only model turns tokens (B, T) into logits (B, T, V): row t scores
every candidate for token t + 1. To generate, take the last row's best token
(greedy decoding), append it, and run again:

- :func:`generate_recompute` runs the model over the whole sequence at every
  step, so step t recomputes the keys and values of all t earlier positions;
- :func:`generate_cached` runs it over the prompt once (the *prefill*), then
  over one new token per step, each block keeping its keys and values in a
  :class:`~attnlib.kv_cache.KVCache`; the new query attends over the cache with
  ``causal="bottom-right"``.

Both give the same tokens and logits: a cached key is exactly the key the
recomputation would produce, since no position sees the ones after it.

The model is chapter 8's :class:`attnlib.learn.transformer.Decoder`, or any
model with the same five pieces (its docstring lists them): ``model.embed``,
``model.blocks`` (each with ``norm_1``, ``attention.qkv``, ``attention.attend``
and ``mlp_step``) and ``model.logits``. :func:`forward_step` is the one place
that calls them.
"""

import torch

from .kv_cache import KVCache


def forward_step(model, tokens, positions, caches=None, **options):
    """Logits (B, T_new, V) of ``tokens`` (B, T_new) at ``positions`` (T_new,), after what ``caches`` hold.

    With ``caches``, one :class:`~attnlib.kv_cache.KVCache` per block, each block appends
    its new keys and values and its queries attend over all the cache holds; without,
    over ``tokens`` alone (the full forward pass). ``options`` go to :func:`attnlib.attention`.
    """
    x = model.embed(tokens, positions)  # (B, T_new, d_model)
    for i, block in enumerate(model.blocks):
        q, k, v = block.attention.qkv(block.norm_1(x), positions)  # (B, H, T_new, d_head) each
        if caches is not None:
            k, v = caches[i].update(k, v)  # (B, H, T_cached + T_new, d_head): earlier positions first
        x = x + block.attention.attend(q, k, v, **options)  # bottom-right: the new queries come last
        x = block.mlp_step(x)  # (B, T_new, d_model)
    return model.logits(x)  # (B, T_new, V)


@torch.no_grad()
def generate_recompute(model, prompt, n_new, **options):
    """Greedy decoding that runs the model over the whole sequence at every step.

    ``prompt`` (B, T_0) token ids, ``n_new`` tokens to add, ``options`` for
    :func:`attnlib.attention`. Returns the tokens (B, T_0 + n_new) and the logits
    each step chose from (B, n_new, V).
    """
    _check_generate_args(model, prompt, n_new)
    tokens, step_logits = prompt, []
    for _ in range(n_new):
        positions = torch.arange(tokens.shape[1], device=tokens.device)  # 0 ... T - 1, every step
        logits = forward_step(model, tokens, positions, **options)[:, -1]  # (B, V): the last row
        next_token = logits.argmax(dim=-1, keepdim=True)  # (B, 1), the highest score
        tokens = torch.cat([tokens, next_token], dim=1)  # (B, T + 1)
        step_logits.append(logits)
    return tokens, torch.stack(step_logits, dim=1)


@torch.no_grad()
def generate_cached(model, prompt, n_new, *, window=None, caches=None, **options):
    """Greedy decoding with a KV cache: the prompt once (the prefill), then one token per step.

    Arguments and results as for :func:`generate_recompute`. ``window=W``: attention
    sees the last W positions, and each block's cache keeps only those. ``caches``:
    empty caches to fill (one per block), to look at afterwards.
    """
    _check_generate_args(model, prompt, n_new)
    caches = _empty_caches(model, window, caches)
    options = options if window is None else {**options, "window": window}
    tokens, new_tokens, step_logits = prompt, prompt, []  # the first step runs the whole prompt: the prefill
    for _ in range(n_new):
        start = caches[0].seen  # the position of the first new token
        positions = torch.arange(start, start + new_tokens.shape[1], device=prompt.device)
        logits = forward_step(model, new_tokens, positions, caches, **options)[:, -1]  # (B, V)
        new_tokens = logits.argmax(dim=-1, keepdim=True)  # (B, 1): all the next step runs
        tokens = torch.cat([tokens, new_tokens], dim=1)
        step_logits.append(logits)
    return tokens, torch.stack(step_logits, dim=1)


def _empty_caches(model, window, caches):
    """New caches, one per block, or the ``caches`` given, checked to be empty and to match ``window``."""
    if caches is None:
        return [KVCache(window=window) for _ in model.blocks]
    if len(caches) != len(model.blocks) or any(c.seen or c.window != window for c in caches):
        raise ValueError(f"caches must be {len(model.blocks)} empty KVCache objects, one per block, with "
                         f"window={window}; got {len(caches)} (windows {[c.window for c in caches]}, "
                         f"positions seen {[c.seen for c in caches]})")
    return caches


def _check_generate_args(model, prompt, n_new):
    if not isinstance(prompt, torch.Tensor) or prompt.ndim != 2 or prompt.is_floating_point() \
            or prompt.shape[1] < 1:
        shape = tuple(prompt.shape) if hasattr(prompt, "shape") else type(prompt).__name__
        raise ValueError(f"prompt must be a (B, T_0) LongTensor of token ids with T_0 >= 1, got {shape}")
    if isinstance(n_new, bool) or not isinstance(n_new, int) or n_new < 1:
        raise ValueError(f"n_new must be a positive int (the tokens to generate), got {n_new!r}")
    for name in ("embed", "blocks", "logits"):
        if not hasattr(model, name):
            raise TypeError(f"model must be a decoder with embed, blocks and logits (see "
                            f"attnlib.learn.transformer.Decoder); {type(model).__name__} has no {name!r}")
