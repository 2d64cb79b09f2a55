"""Test a circuit by changing what one head writes: mean ablation and activation patching.

Chapter 8's story is that two heads copy together: a *previous-token head* in
block 0 writes into every position which token came before it, and an *induction
head* in block 1 looks for the position whose previous token equals the current
one and copies the token there. Attention maps suggest the story; these functions
test it by running the model with one head's output replaced.

A head's *output* here is what it gathered, ``weights @ V`` of that head,
(B, T, d_head), before ``W_O`` mixes the heads back into the residual stream.

- :func:`run_with_heads` runs a :class:`~attnlib.learn.transformer.Decoder` and
  returns its logits and every head's output, replacing the outputs you name.
- *Zero ablation* replaces a head's output by 0 (what
  :func:`~attnlib.learn.transformer.without_head` does with W_O). *Mean ablation*
  replaces it by its average over many sequences, position by position
  (:func:`head_means`): the head then adds what it adds on average, and only the
  information specific to each sequence is removed. A zero the model never saw
  can hurt for reasons unrelated to the circuit; the mean cannot.
- *Activation patching*: run the model on two sequences that differ in one place,
  and copy one head's output from one run into the other (:func:`patching_experiment`).
"""

import torch

from ..attention import attention
from ..multi_head import merge_heads
from .induction import InductionData


@torch.no_grad()
def run_with_heads(model, tokens, replace=None):
    """Logits of ``model`` on ``tokens`` (B, T), with some heads' outputs replaced.

    Parameters
    ----------
    model : Decoder
    tokens : LongTensor (B, T)
    replace : dict, optional
        ``{(layer, head): (values, where)}``: ``values`` (B, T, d_head) or anything
        that broadcasts to it, written into that head's output at the positions
        where ``where`` (a bool tensor broadcasting to (B, T)) is True.

    Returns
    -------
    logits : (B, T, V)
    outputs : dict ``{(layer, head): (B, T, d_head)}``, every head's output as used
        (after any replacement).
    """
    replace = replace or {}
    for layer, head in replace:
        if not (0 <= layer < len(model.blocks) and 0 <= head < model.blocks[layer].attention.n_heads):
            raise ValueError(
                f"replace names head {head} of block {layer}, which the model "
                f"({len(model.blocks)} blocks of {model.blocks[0].attention.n_heads} heads) lacks"
            )
    x = model.embed(tokens)  # (B, T, d)
    outputs = {}
    for layer, block in enumerate(model.blocks):
        attn = block.attention
        q, k, v = attn.qkv(block.norm_1(x))  # (B, H, T, d_head) each
        heads = attention(q, k, v, causal="bottom-right")  # (B, H, T, d_head)
        for head in range(attn.n_heads):
            if (layer, head) in replace:
                values, where = replace[(layer, head)]
                heads[:, head] = torch.where(where[..., None], values, heads[:, head])
            outputs[(layer, head)] = heads[:, head].clone()
        x = x + merge_heads(heads) @ attn.w_o  # (B, T, d_model)
        x = block.mlp_step(x)
    return model.logits(x), outputs


@torch.no_grad()
def head_means(model, tokens):
    """Every head's output averaged over the sequences ``tokens`` (N, T), per position: ``{(l, h): (T, d_head)}``."""
    _, outputs = run_with_heads(model, tokens)
    return {key: value.mean(0) for key, value in outputs.items()}


@torch.no_grad()
def repeat_accuracy(logits, data, targets=None):
    """Fraction of the repeated tokens of ``data`` that ``logits`` (N, T, V) predict.

    ``targets`` (N, T) are the tokens to predict at each next position; ``data.tokens``
    by default. Only the queries whose next token a copy predicts are counted
    (:meth:`InductionData.repeated`).
    """
    targets = data.tokens if targets is None else targets
    right = logits[:, :-1].argmax(-1) == targets[:, 1:]  # (N, T-1)
    return right[data.repeated()[:, 1:]].double().mean().item()


@torch.no_grad()
def ablation_accuracies(model, data, mean_data=None):
    """Accuracy on the repeated tokens with each head zero-ablated and mean-ablated.

    Parameters
    ----------
    model : Decoder
    data : InductionData
        The sequences scored.
    mean_data : InductionData, optional
        The sequences the means are taken over; ``data`` by default.

    Returns
    -------
    dict: ``"none"`` -> accuracy of the intact model; ``("zero", l, h)`` and
    ``("mean", l, h)`` -> accuracy with head h of block l replaced.
    """
    means = head_means(model, (mean_data or data).tokens)
    n, t = data.tokens.shape
    everywhere = torch.ones(n, t, dtype=torch.bool)
    result = {"none": repeat_accuracy(run_with_heads(model, data.tokens)[0], data)}
    for key, mean in means.items():
        for name, values in (("zero", torch.zeros_like(mean)), ("mean", mean)):
            logits, _ = run_with_heads(model, data.tokens, {key: (values, everywhere)})
            result[(name, *key)] = repeat_accuracy(logits, data)
    return result


def corrupt_first_copy(data, generator):
    """``data`` with the first copy of each segment replaced by other random tokens.

    Every token of ``tokens[n, first:first + length]`` changes (to a different
    id); the second copy stays. Returns an :class:`InductionData` with the same
    ``first``, ``second`` and ``length``: its repeat no longer repeats anything.
    """
    tokens = data.tokens.clone()
    n, t = tokens.shape
    vocab = int(tokens.max()) + 1
    position = torch.arange(t)
    in_first = (position >= data.first[:, None]) & (position < (data.first + data.length)[:, None])  # (n, T)
    shift = torch.randint(1, vocab, (n, t), generator=generator)  # never 0: every token changes
    tokens = torch.where(in_first, (tokens + shift) % vocab, tokens)
    return InductionData(tokens, data.first, data.second, data.length)


@torch.no_grad()
def patching_experiment(model, data, previous_head, other_head, generator):
    """Move the previous-token head's output between a repeated sequence and its corrupted copy.

    ``clean`` is ``data``; ``corrupted`` is :func:`corrupt_first_copy` of it, so
    its repeat has no earlier copy. The positions patched are those of the first
    copy after its first token, ``first + 1 ... first + length - 1``: the keys an
    induction head needs.

    Two experiments, each also run with ``other_head`` (the other head of block 0)
    as a control:

    - *into the corrupted run*: the head's output there comes from the clean run,
      so it says "the token before me was a", as in the clean sequence, while the
      tokens themselves are the corrupted ones. If the story holds, the induction
      head now finds these positions and copies the *corrupted* tokens there:
      ``follows_patch`` is the fraction of repeated positions whose prediction is
      the corrupted run's token at the key the induction rule names.
    - *into the clean run*: the head's output there comes from the corrupted run;
      ``clean_accuracy`` is the accuracy on the repeated tokens that remains.

    Returns
    -------
    dict of floats: ``clean_accuracy`` (intact model, clean run),
    ``follows_patch`` for ``"none"``, ``"previous"``, ``"other"`` (patch into the
    corrupted run), and ``clean_accuracy_patched`` for ``"previous"``, ``"other"``.
    """
    clean = data
    corrupted = corrupt_first_copy(data, generator)
    n, t = data.tokens.shape
    position = torch.arange(t)
    where = (position > data.first[:, None]) & (position < (data.first + data.length)[:, None])  # (n, T)
    clean_logits, clean_out = run_with_heads(model, clean.tokens)
    corrupt_logits, corrupt_out = run_with_heads(model, corrupted.tokens)
    source = data.source()  # (n, T): for repeat queries, the key holding the next token
    queries = source >= 0
    key_tokens = corrupted.tokens.gather(1, source.clamp(min=0))  # (n, T): corrupted token at that key

    def follows(logits):
        return (logits.argmax(-1) == key_tokens)[queries].double().mean().item()

    result = {
        "clean_accuracy": repeat_accuracy(clean_logits, clean),
        "follows_patch": {"none": follows(corrupt_logits)},
        "clean_accuracy_patched": {},
    }
    for name, head in (("previous", previous_head), ("other", other_head)):
        key = (0, head)
        patched, _ = run_with_heads(model, corrupted.tokens, {key: (clean_out[key], where)})
        result["follows_patch"][name] = follows(patched)
        patched, _ = run_with_heads(model, clean.tokens, {key: (corrupt_out[key], where)})
        result["clean_accuracy_patched"][name] = repeat_accuracy(patched, clean)
    return result
