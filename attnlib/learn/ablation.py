"""Ablations of chapter 7's models: take one part out, and count what they still get right.

An attention map shows where a head's weight goes, not whether the model needs
what the head fetches. An ablation tests that: run the model with one piece
removed and measure its held-out accuracy. In an attention layer
(:class:`~attnlib.learn.layers.AttentionLayer`), :func:`layer_output` removes

- ``zero_head=h, at=[i]``: head ``h`` adds nothing to the vectors of tokens ``i``
  (its output there is zeroed before ``W_O``); the other heads and tokens are
  untouched;
- ``blocked=[(queries, key)]``: the queries may not attend to that key; each of
  their rows is the softmax over the other keys, as if the key were masked;
- ``weights=A``: every head mixes its values with the fixed weights ``A``
  (H, T, T) instead of its own softmax rows, so what the keys hold no longer
  moves the weights;
- ``values_from=x0``: the values are projected from ``x0`` instead of ``x``
  (the token embeddings without their position vectors, say).

With none of them, :func:`layer_output` is ``layer(x)``. :func:`pointer_accuracy`
applies them to Task 1's pointer model, :func:`classifier_accuracy` (with two
model-level ablations built on them) to Task 2's classifier.
"""

import torch

from ..attention import attention
from ..multi_head import merge_heads, split_heads
from ..projections import project_qkv


@torch.no_grad()
def layer_output(layer, x, *, zero_head=None, at=(), blocked=(), weights=None, values_from=None):
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
    weights : tensor, (H, T, T) or (B, H, T, T), optional
        Fixed attention weights that replace every head's softmax rows (not with ``blocked``).
    values_from : tensor, (B, T, d_model), optional
        What the values are projected from, instead of ``x``.

    Returns
    -------
    tensor, (B, T, d_model): ``x`` plus what the remaining heads gathered.
    """
    T = x.shape[-2]
    if zero_head is not None and not 0 <= zero_head < layer.n_heads:
        raise ValueError(f"zero_head={zero_head} is not a head of a layer with n_heads={layer.n_heads}")
    if any(not -T <= i < T for i in at):
        raise ValueError(f"at={list(at)} names a position outside the T={T} tokens of x")
    if weights is not None and blocked:
        raise ValueError("weights= fixes every attention row, so blocked= has nothing left to block")
    if weights is not None and weights.shape[-3:] != (layer.n_heads, T, T):
        raise ValueError(f"weights has shape {tuple(weights.shape)}, "
                         f"expected (..., {layer.n_heads}, {T}, {T}) "
                         f"for a layer with n_heads={layer.n_heads} and T={T}")
    may_attend = torch.ones(T, T, dtype=torch.bool)  # (T_q, T_k), True = may attend
    for queries, key in blocked:
        may_attend[list(queries), key] = False
    q, k, _ = project_qkv(x, layer.w_q, layer.w_k, layer.w_v)  # (B, T, d_model) each
    v = (x if values_from is None else values_from) @ layer.w_v  # (B, T, d_model)
    q, k, v = (split_heads(t, layer.n_heads) for t in (q, k, v))  # (B, H, T, d_head) each
    if weights is None:
        heads = attention(q, k, v, mask=may_attend, backend="torch")  # (B, H, T, d_head)
    else:
        heads = weights @ v  # ([B,] H, T, T) @ (B, H, T, d_head) -> (B, H, T, d_head)
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


@torch.no_grad()
def classifier_accuracy(model, tokens, targets, *, average_weights=False, values_without_positions=False):
    """Accuracy of a one-layer :class:`~attnlib.learn.model.AttentionClassifier` per position and question.

    Parameters
    ----------
    model : AttentionClassifier
        With one attention layer and a read-out at every position (Task 2's model).
    tokens : LongTensor, (B, T)
    targets : LongTensor, (B, T, n_targets)
    average_weights : bool
        Replace every head's weights by their mean over the B sequences of
        ``tokens``: each query keeps how much it gives each position on average,
        but no longer responds to the digits the keys hold.
    values_without_positions : bool
        Project the values from the token embeddings alone, without the position
        vectors; queries and keys keep them.

    Returns
    -------
    tensor, (T, n_targets): the fraction of the B sequences answered right, at
    each position, for each question.
    """
    if len(model.layers) != 1 or model.read_at is not None:
        raise ValueError("classifier_accuracy takes a model with 1 attention layer, read out at every "
                         f"position; got {len(model.layers)} layers and read_at={model.read_at}")
    layer = model.layers[0]
    x = model.embed(tokens)  # (B, T, d_model)
    ablation = {}
    if average_weights:
        ablation["weights"] = layer.weights(x).mean(dim=0)  # (B, H, T, T) -> (H, T, T)
    if values_without_positions:
        ablation["values_from"] = model.embedding[tokens]  # (B, T, d_model), no position vectors
    x = layer_output(layer, x, **ablation)
    logits = model.read_out(x)  # (B, T, n_targets * n_classes)
    logits = logits.unflatten(-1, (model.n_targets, model.n_classes))  # (B, T, n_targets, n_classes)
    return (logits.argmax(dim=-1) == targets).double().mean(dim=0)  # (T, n_targets)
