"""Which heads of the GPT on real text copy, measured the way chapter 8 measures its induction heads.

Two scores for every head (a (layers, heads) grid per model), each a mean attention weight:

- **previous-token score**: the weight a query at position i puts on key i - 1;
- **induction score**: the weight a query puts on the keys that an induction head would pick,
  the position just after an earlier copy of what the query holds.

Both are measured on two kinds of input:

- :func:`repeated_letters`: random lowercase letters, repeated once (``"qzkf…qzkf…"``). In the
  second copy the query at position i (predicting i + 1) should look at key i + 1 - half, the
  letter that followed the same letter last time. Nothing in the first copy can be predicted,
  everything in the second can, by copying.
- held-out text (:func:`attnlib.learn.gpt.heldout_windows`): a query holding characters ``ab`` at
  positions i - 1, i has as induction keys every earlier j whose characters j - 2, j - 1 are also
  ``ab`` (so key j holds what followed ``ab`` then). Only queries with at least one such key count.

:func:`ablation_deltas` removes one head at a time by **mean ablation** (its output replaced by
its mean over the held-out windows, position by position, with :func:`attnlib.learn.patching.run_with_heads`)
and reports how much the held-out loss and the loss on the repeated letters' second copy rise.
"""

import string

import torch
from torch.nn import functional

from .memo import stored
from .patching import run_with_heads


def repeated_letters(n, half, vocab, generator):
    """``n`` sequences of ``half`` random lowercase letters, each repeated once: ids (n, 2 * half).

    ``vocab`` is the tokenizer's vocabulary (one character per id); ``generator`` draws the letters.
    """
    letters = torch.tensor([vocab.index(ch) for ch in string.ascii_lowercase])  # (26,)
    first = letters[torch.randint(len(letters), (n, half), generator=generator)]  # (n, half)
    return torch.cat([first, first], dim=1)  # (n, 2 * half)


def repeat_targets(tokens):
    """The induction keys of repeated sequences (n, 2 * half): a bool (n, T, T), True at (query, key).

    The query at position i >= half - 1 (its next token is the copy of token i + 1 - half) has one
    induction key, i + 1 - half; the query at half - 1 would need the key half, which it cannot see,
    so it starts at i = half.
    """
    n, T = tokens.shape
    half = T // 2
    targets = torch.zeros(n, T, T, dtype=torch.bool)
    queries = torch.arange(half, T - 1)
    targets[:, queries, queries + 1 - half] = True
    return targets


def text_targets(tokens):
    """The induction keys of text windows (n, T): bool (n, T, T), True where key j < query i has
    tokens j - 2, j - 1 equal to the query's tokens i - 1, i."""
    n, T = tokens.shape
    same_now = tokens[:, :, None] == tokens[:, None, :]  # (n, T, T): token i == token j
    targets = torch.zeros(n, T, T, dtype=torch.bool)
    # key j (>= 2) matches query i (>= 1) when token j - 1 == token i and token j - 2 == token i - 1
    targets[:, 1:, 2:] = same_now[:, 1:, 1:-1] & same_now[:, :-1, :-2]
    return targets & torch.ones(T, T, dtype=torch.bool).tril(-1)  # earlier keys only


@torch.no_grad()
def head_scores(model, tokens, targets):
    """Previous-token and induction scores of every head on ``tokens`` (n, T): two (L, H) tensors.

    ``targets`` (n, T, T) marks each query's induction keys; queries with none are left out of
    the induction score.
    """
    maps = model.attention_maps(tokens)  # one (n, H, T, T) per layer
    T = tokens.shape[1]
    i = torch.arange(1, T)
    previous = torch.stack([m[:, :, i, i - 1].mean((0, 2)) for m in maps])  # (L, H)
    counted = targets.any(-1)  # (n, T): queries that have an induction key
    induction = torch.stack([(m * targets[:, None]).sum(-1).permute(0, 2, 1)[counted].mean(0)
                             for m in maps])  # (L, H)
    return previous, induction


@torch.no_grad()
def mean_loss(logits, tokens, start=0):
    """Mean next-token cross-entropy of the predictions made at positions ``start`` ... T - 2."""
    predictions, targets = logits[:, start:-1], tokens[:, start + 1:]  # (n, T', V), (n, T')
    return functional.cross_entropy(predictions.flatten(0, 1).double(), targets.flatten()).item()


@torch.no_grad()
def ablation_deltas(model, heldout, repeated):
    """Mean-ablate each head in turn: the rise in held-out loss and in loss on the repeats' second copy.

    Parameters
    ----------
    model : Decoder
    heldout : LongTensor (n, T)
        Held-out text windows: the loss over all their predictions, and each head's mean output
        (per position) that replaces it.
    repeated : LongTensor (m, T)
        :func:`repeated_letters`: the loss of the predictions made in the second copy.

    Returns
    -------
    dict with ``heldout`` and ``repeat`` (L, H) tensors of loss rises (nats per character), and
    the unablated losses ``heldout_base`` and ``repeat_base``.
    """
    if heldout.shape[1] != repeated.shape[1]:
        raise ValueError(f"heldout {tuple(heldout.shape)} and repeated {tuple(repeated.shape)} must have "
                         f"the same length T, so that a head's mean output exists at every position")
    half = repeated.shape[1] // 2
    logits, outputs = run_with_heads(model, heldout)
    means = {key: value.mean(0) for key, value in outputs.items()}  # (T, d_head) each
    base_heldout = mean_loss(logits, heldout)
    base_repeat = mean_loss(run_with_heads(model, repeated)[0], repeated, start=half)
    L, H = len(model.blocks), model.blocks[0].attention.n_heads
    rise_heldout, rise_repeat = torch.zeros(L, H), torch.zeros(L, H)
    everywhere = torch.ones(1, 1, dtype=torch.bool)
    for (layer, head), mean in means.items():
        replace = {(layer, head): (mean, everywhere)}
        rise_heldout[layer, head] = mean_loss(run_with_heads(model, heldout, replace)[0], heldout) - base_heldout
        rise_repeat[layer, head] = mean_loss(run_with_heads(model, repeated, replace)[0], repeated,
                                             start=half) - base_repeat
    return dict(heldout=rise_heldout, repeat=rise_repeat, heldout_base=base_heldout, repeat_base=base_repeat)


REPEAT_SEED = 7  # the generator of the repeated letters


@torch.no_grad()
@stored  # seconds per model; make test measures each stored model once
def measure(model, vocab, heldout, n_repeated=256):
    """Everything the chapter reports about one model's heads, on ``heldout`` windows (n, T).

    Returns a dict of (L, H) tensors: ``previous_repeat``, ``induction_repeat`` (on
    ``n_repeated`` sequences of :func:`repeated_letters` of the same length T, drawn with
    ``REPEAT_SEED``), ``previous_text``, ``induction_text`` (on ``heldout``), and the
    :func:`ablation_deltas` ``heldout``, ``repeat`` with their bases.
    """
    T = heldout.shape[1]
    repeated = repeated_letters(n_repeated, T // 2, vocab, torch.Generator().manual_seed(REPEAT_SEED))
    previous_repeat, induction_repeat = head_scores(model, repeated, repeat_targets(repeated))
    previous_text, induction_text = head_scores(model, heldout, text_targets(heldout))
    return dict(previous_repeat=previous_repeat, induction_repeat=induction_repeat,
                previous_text=previous_text, induction_text=induction_text,
                **ablation_deltas(model, heldout, repeated))


def uniform_induction(targets):
    """The induction score of a head that spreads its weight evenly over keys 0 ... i (a baseline)."""
    T = targets.shape[1]
    counts = targets.sum(-1).double()  # (n, T): induction keys of each query
    share = counts / torch.arange(1, T + 1)  # a uniform head's weight on them
    return share[targets.any(-1)].mean().item()
