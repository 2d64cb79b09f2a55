"""Continuous batching over a paged KV cache: the loop a server runs, small enough to read.

A server does not wait for a whole batch to finish. Requests arrive at any step; each
step it admits those that fit, runs the prompt of each newcomer once (the *prefill*),
then decodes one token for every sequence it is running, in one batch, and lets go of
the sequences that are done, whose pages the next requests reuse. Every sequence has
its own length, so the attention of a decode step is
:func:`attnlib.attention_with_kvcache` over a :class:`attnlib.PagedKVCache`, one per
layer (transformer block) of the model.

- :class:`Request`: a prompt, how many tokens to write, when it arrives, how to sample.
- :func:`paged_forward_step`: chapter 9's ``forward_step`` for B sequences at their own
  positions, their keys and values kept in pages.
- :func:`serve`: the scheduling loop; returns each request's tokens and a trace of every
  step (who ran, which pages each held).

Each sequence's tokens are those :func:`attnlib.sampling.generate` gives it alone, with
the same seed: batching changes when the work is done, not its result.
"""

import math
from dataclasses import dataclass

import torch

from .kvcache_attention import attention_with_kvcache
from .multi_head import merge_heads
from .paged import PagedKVCache
from .sampling import Uniform, sample_next


@dataclass(frozen=True)
class Request:
    """One request: write ``n_new`` tokens after ``prompt`` (a list of token ids).

    ``arrival`` is the step it reaches the server; ``seed``, ``temperature``, ``top_k``
    and ``top_p`` choose its tokens as :func:`attnlib.sampling.generate` would.
    """

    name: str
    prompt: tuple
    n_new: int
    arrival: int = 0
    seed: int = 0
    temperature: float = 1.0
    top_k: int = None
    top_p: float = None

    def final_length(self):
        """Positions its cache holds at the end: the prompt and every new token but the last
        (the last is written, never fed back)."""
        return len(self.prompt) + self.n_new - 1


@torch.no_grad()
def paged_forward_step(model, tokens, positions, caches, seq_ids, *, num_splits=1, backend=None):
    """Logits (B, T_new, V) of ``tokens`` (B, T_new) at ``positions`` (B, T_new), sequence b being
    ``seq_ids[b]``, after what ``caches`` (one :class:`PagedKVCache` per layer) hold for it.

    Each layer appends the new keys and values to its pages, then its queries attend over
    each sequence's own cache: B sequences of B lengths, in one call.
    """
    x = model.embedding[tokens]  # (B, T_new, d_model)
    if model.position_scheme in ("learned", "sinusoidal"):
        x = x + model.position[positions]  # each sequence at its own positions
    for block, cache in zip(model.blocks, caches):
        attention = block.attention
        q, k, v = attention.qkv(block.norm_1(x), positions[:, None, :])  # (B, H, T_new, d_head) each
        cache.append_batch(seq_ids, k.transpose(1, 2), v.transpose(1, 2))  # (B, T_new, H, d_head)
        heads = attention_with_kvcache(
            q.transpose(1, 2), cache.k_cache, cache.v_cache,  # q (B, T_new, H, d_head)
            cache_seqlens=cache.seqlens(seq_ids), block_table=cache.block_table(seq_ids),
            causal=True, num_splits=num_splits, backend=backend)  # (B, T_new, H, d_head)
        x = x + merge_heads(heads.transpose(1, 2)) @ attention.w_o  # (B, T_new, d_model)
        x = block.mlp_step(x)
    return model.logits(x)  # (B, T_new, V)


@dataclass
class _Running:
    request: Request
    tokens: list  # prompt and new tokens so far
    generator: Uniform
    started: int  # the step of its prefill


def _sample(logits, running):
    r = running.request
    return sample_next(logits.double().cpu().numpy(), temperature=r.temperature, top_k=r.top_k,
                       top_p=r.top_p, generator=running.generator)


def _check_requests(model, requests, num_blocks, page_size):
    names = [r.name for r in requests if isinstance(r, Request)]
    if len(names) != len(requests):
        bad = next(r for r in requests if not isinstance(r, Request))
        raise TypeError(f"requests must be attnlib.serving.Request objects, got {type(bad).__name__}")
    if len(set(names)) != len(names):
        raise ValueError(f"request names must differ, got {names}")
    for r in requests:
        if not r.prompt or any(not isinstance(t, int) or not 0 <= t < model.vocab_size for t in r.prompt):
            raise ValueError(f"request {r.name!r}: prompt must be a non-empty sequence of token ids in "
                             f"0 ... {model.vocab_size - 1}, got {list(r.prompt)[:8]}")
        if isinstance(r.n_new, bool) or not isinstance(r.n_new, int) or r.n_new < 1:
            raise ValueError(f"request {r.name!r}: n_new must be an int >= 1, got {r.n_new!r}")
        if isinstance(r.arrival, bool) or not isinstance(r.arrival, int) or r.arrival < 0:
            raise ValueError(f"request {r.name!r}: arrival must be an int >= 0, got {r.arrival!r}")
        pages = math.ceil(r.final_length() / page_size)
        if pages > num_blocks:
            raise ValueError(f"request {r.name!r} needs {pages} pages of {page_size} positions "
                             f"(prompt {len(r.prompt)} + n_new {r.n_new} - 1), more than the pool's "
                             f"num_blocks={num_blocks}: it could never run")


@torch.no_grad()
def serve(model, requests, *, num_blocks, page_size, num_splits=1, backend=None):
    """Run ``requests`` by continuous batching, each layer's cache a pool of ``num_blocks`` pages.

    ``num_blocks`` counts pages (vLLM's name for a page is a block).

    Each step: (1) admit, in order of arrival, the requests that have arrived and fit (the
    pool keeps the pages every admitted sequence will need by its end, so no sequence ever
    waits for a page once started) and run each one's prompt, which gives its first new
    token; (2) decode one more token for every sequence started before this step, all in
    one batch; (3) release the sequences that have all their tokens.

    Returns ``(tokens, trace)``: ``tokens[name]`` is the request's prompt and new tokens; the
    trace has one dict per step with ``step``, ``admitted``, ``decoded`` (the batch),
    ``finished``, ``pages`` ({name: page ids held after the step}) and ``waiting``.
    """
    requests = list(requests)
    _check_requests(model, requests, num_blocks, page_size)
    first = model.blocks[0].attention
    n_heads = first.n_heads
    d_head = first.w_q.shape[1] // n_heads
    caches = [PagedKVCache(num_blocks, page_size, n_heads, d_head, dtype=model.embedding.dtype,
                           device=model.embedding.device) for _ in model.blocks]
    pool = caches[0]  # every layer's pool holds the same pages for the same sequences
    waiting = sorted(requests, key=lambda r: r.arrival)  # stable: same step, list order
    running, done, trace, step = {}, {}, [], 0

    def pages_still_needed():  # by the running sequences before they finish
        return sum(math.ceil(s.request.final_length() / page_size) - len(_pages(pool, name))
                   for name, s in running.items())

    while waiting or running:
        admitted, decoded, finished = [], [], []
        while waiting and waiting[0].arrival <= step:
            r = waiting[0]
            if math.ceil(r.final_length() / page_size) > pool.free_blocks - pages_still_needed():
                break  # first come, first served: later arrivals wait behind it
            waiting.pop(0)
            for cache in caches:
                cache.add(r.name)
            state = _Running(r, list(r.prompt), Uniform(r.seed), step)
            prompt = torch.tensor([r.prompt], device=model.embedding.device)
            positions = torch.arange(len(r.prompt), device=prompt.device)[None, :]
            logits = paged_forward_step(model, prompt, positions, caches, [r.name],
                                        num_splits=num_splits, backend=backend)
            state.tokens.append(_sample(logits[0, -1], state))  # the prefill's token
            running[r.name] = state
            admitted.append(r.name)
        batch = [name for name, s in running.items()
                 if s.started < step and len(s.tokens) - len(s.request.prompt) < s.request.n_new]
        if batch:
            last = torch.tensor([[running[n].tokens[-1]] for n in batch], device=model.embedding.device)
            positions = torch.tensor([[len(running[n].tokens) - 1] for n in batch], device=last.device)
            logits = paged_forward_step(model, last, positions, caches, batch, num_splits=num_splits,
                                        backend=backend)  # (B, 1, V): one batch, B lengths
            for b, name in enumerate(batch):
                running[name].tokens.append(_sample(logits[b, -1], running[name]))
            decoded = batch
        for name, s in list(running.items()):
            if len(s.tokens) - len(s.request.prompt) == s.request.n_new:
                done[name] = s.tokens
                finished.append(name)
        trace.append({"step": step, "admitted": admitted, "decoded": decoded, "finished": finished,
                      "pages": {name: _pages(pool, name) for name in running},
                      "waiting": [r.name for r in waiting if r.arrival <= step]})
        for name in finished:
            del running[name]
            for cache in caches:
                cache.release(name)
        step += 1
    return {r.name: done[r.name] for r in requests}, trace


def _pages(cache, name):
    row = cache.block_table([name])[0]
    return [int(p) for p in row if int(p) >= 0]
