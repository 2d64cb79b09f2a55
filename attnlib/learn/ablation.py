"""Ablations of chapter 7's pointer model: take one part out, and count what it still gets right.

An attention map shows where a head's weight goes, not whether the model needs
what the head fetches. An ablation tests that: run the model with one piece
removed and measure its held-out accuracy. Two pieces, in the one attention
layer of :class:`~attnlib.learn.model.AttentionPointer`:

- ``zero_head=h, at=[i]``: head ``h`` adds nothing to the vectors of tokens ``i``
  (its output there is zeroed before ``W_O``); the other heads and tokens are
  untouched;
- ``blocked=[(queries, key)]``: the queries may not attend to that key; each of
  their rows is the softmax over the other keys, as if the key were masked.

With neither, :func:`layer_output` is ``layer(x)``.
"""

import torch

from ..attention import attention
from ..multi_head import merge_heads, split_heads
from ..projections import project_qkv


@torch.no_grad()
def layer_output(layer, x, *, zero_head=None, at=(), blocked=()):
    """An :class:`~attnlib.learn.layers.AttentionLayer` on ``x`` (B, T, d_model), with a part taken out.

    Parameters
    ----------
    layer : AttentionLayer
    x : tensor, (B, T, d_model)
    zero_head : int, optional
        A head whose output is zeroed at the positions ``at``.
    at : sequence of int
        Positions (token indices) where ``zero_head`` adds nothing.
    blocked : sequence of (queries, key)
        Each query in ``queries`` (a sequence of positions) may not attend to ``key``.

    Returns
    -------
    tensor, (B, T, d_model): ``x`` plus what the remaining heads gathered.
    """
    T = x.shape[-2]
    if zero_head is not None and not 0 <= zero_head < layer.n_heads:
        raise ValueError(f"zero_head={zero_head} is not a head of a layer with n_heads={layer.n_heads}")
    if any(not -T <= i < T for i in at):
        raise ValueError(f"at={list(at)} names a position outside the T={T} tokens of x")
    may_attend = torch.ones(T, T, dtype=torch.bool)  # (T_q, T_k), True = may attend
    for queries, key in blocked:
        may_attend[list(queries), key] = False
    q, k, v = project_qkv(x, layer.w_q, layer.w_k, layer.w_v)  # (B, T, d_model) each
    q, k, v = (split_heads(t, layer.n_heads) for t in (q, k, v))  # (B, H, T, d_head) each
    heads = attention(q, k, v, mask=may_attend, backend="torch")  # (B, H, T, d_head)
    if zero_head is not None:
        heads[:, zero_head, list(at)] = 0.0  # what that head gathered never reaches those tokens
    return x + merge_heads(heads) @ layer.w_o  # (B, T, d_model) @ (d_model, d_model)


@torch.no_grad()
def pointer_accuracy(model, tokens, targets, **ablation):
    """Held-out accuracy of an :class:`~attnlib.learn.model.AttentionPointer` with ``ablation`` applied.

    ``tokens`` (B, T) and ``targets`` (B, P, 1), as :func:`attnlib.learn.training.accuracy`
    takes them; ``ablation`` is passed to :func:`layer_output` for every attention layer.
    """
    x = model.embed(tokens)  # (B, T, d_model)
    for layer in model.layers:
        x = layer_output(layer, x, **ablation)
    scores = model.pointer.scores(x)[:, model.read_at, None, :]  # (B, P, 1, T)
    return (scores.argmax(dim=-1) == targets).float().mean().item()
