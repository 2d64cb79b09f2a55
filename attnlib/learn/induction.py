"""Chapter 8's task: random tokens in which a segment repeats, so that only copying predicts it.

Each sequence holds T random tokens. A segment of L of them (L from 8 to 16)
starting at ``first`` appears again, token for token, at a later ``second``
(``second >= first + L``), both drawn at random, so that no fixed offset finds
the earlier copy. Random tokens cannot be predicted, and neither can the first
token of the repeat; every later token of the repeat can, by the rule an
*induction head* implements (Olsson et al., 2022): find the earlier occurrence
of the current token and copy the token that followed it.

For query position i inside the repeat, the token to copy sits at
``i - (second - first) + 1``, :meth:`InductionData.source`. A model that has
learned the rule puts its attention there.
"""

import copy
from dataclasses import dataclass

import torch
from torch.nn import functional

VOCAB_SIZE = 24
SEQUENCE_LENGTH = 32
SEGMENT_LENGTHS = (8, 16)  # shortest and longest repeated segment
# With segments of 4 to 10, a third of the tokens a copy could predict, the circuit formed within
# 1,000 steps in 2 of 6 seeds (0 and 5) and within 3,000 in 3; with 8 to 16 it formed by step 400 in each
# of seeds 0-3 (attnlib.learn.sweep stores the full sweep of the recipe the book uses).


@dataclass(frozen=True)
class InductionData:
    """A batch of sequences and where their segment and its repeat are.

    Attributes
    ----------
    tokens : LongTensor (N, T)
    first, second, length : LongTensor (N,)
        The segment is ``tokens[n, first:first + length]``; its repeat starts at ``second``.
    """

    tokens: torch.Tensor
    first: torch.Tensor
    second: torch.Tensor
    length: torch.Tensor

    def __len__(self):
        return len(self.tokens)

    def repeated(self):
        """(N, T) bool: True at the tokens a copy predicts, ``second + 1 ... second + length - 1``."""
        position = torch.arange(self.tokens.shape[1])  # (T,)
        start, end = self.second[:, None], (self.second + self.length)[:, None]  # (N, 1)
        return (position > start) & (position < end)  # (N, T)

    def source(self):
        """(N, T) long: for query i whose next token is repeated, the key holding that token; -1 elsewhere.

        The current token i also occurs at ``i - (second - first)``; the token after
        that occurrence, at ``i - (second - first) + 1``, is the next one.
        """
        position = torch.arange(self.tokens.shape[1])  # (T,)
        offset = (self.second - self.first)[:, None]  # (N, 1)
        predicts_a_repeat = functional.pad(self.repeated()[:, 1:], (0, 1))  # (N, T): token i + 1 is repeated
        return torch.where(predicts_a_repeat, position - offset + 1, -1)


def induction_sequences(n, generator, *, length=SEQUENCE_LENGTH, vocab_size=VOCAB_SIZE,
                        segment_lengths=SEGMENT_LENGTHS):
    """``n`` random sequences, each with one segment repeated later: an :class:`InductionData`.

    Parameters
    ----------
    n : int
    generator : torch.Generator
        Draws everything, so a seed gives the same sequences.
    length, vocab_size : int
    segment_lengths : (int, int)
        Shortest and longest segment; ``2 * longest <= length``.
    """
    shortest, longest = segment_lengths
    if not 2 <= shortest <= longest or 2 * longest > length:
        raise ValueError(f"segment_lengths={segment_lengths} must satisfy 2 <= shortest <= longest and "
                         f"2 * longest <= length={length}")
    tokens = torch.randint(vocab_size, (n, length), generator=generator)  # (n, T)
    seg = torch.randint(shortest, longest + 1, (n,), generator=generator)  # (n,)
    first = (torch.rand(n, generator=generator, dtype=torch.float64) * (length - 2 * seg + 1)).long()
    room = length - seg - (first + seg) + 1  # starts left for the repeat, after the segment
    second = first + seg + (torch.rand(n, generator=generator, dtype=torch.float64) * room).long()
    position = torch.arange(length)  # (T,)
    in_repeat = (position >= second[:, None]) & (position < (second + seg)[:, None])  # (n, T)
    copied_from = (position - (second - first)[:, None]).clamp(min=0)  # (n, T)
    tokens = torch.where(in_repeat, tokens.gather(1, copied_from), tokens)
    return InductionData(tokens, first, second, seg)


def next_token_batches(batch_size, **options):
    """A ``sample_batch`` for :func:`attnlib.learn.training.train`: fresh sequences every step.

    Returns ``(tokens[:, :-1], tokens[:, 1:])``: the model reads T - 1 tokens and
    is scored on each next one, which is :func:`~.transformer.next_token_loss`.
    """

    def sample_batch(generator):
        tokens = induction_sequences(batch_size, generator, **options).tokens  # (B, T)
        return tokens[:, :-1], tokens[:, 1:]

    return sample_batch


@torch.no_grad()
def repeat_scores(model, data):
    """Loss and accuracy of ``model`` on the repeated tokens (those a copy predicts) and on the others.

    Returns a dict of floats: ``repeat_loss``, ``repeat_accuracy``, ``other_loss``.
    """
    logits = model(data.tokens)[:, :-1]  # (N, T-1, V): position t predicts token t + 1
    targets = data.tokens[:, 1:]  # (N, T-1)
    losses = functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (N, T-1)
    right = logits.argmax(-1) == targets  # (N, T-1)
    repeated = data.repeated()[:, 1:]  # (N, T-1)
    return dict(repeat_loss=losses[repeated].mean().item(),
                repeat_accuracy=right[repeated].double().mean().item(),
                other_loss=losses[~repeated].mean().item())


@torch.no_grad()
def head_scores(maps, data):
    """How much each head follows the two rules: (layers, heads) tensors of mean attention weight.

    Parameters
    ----------
    maps : list of (N, H, T, T) tensors
        :meth:`~.transformer.Decoder.attention_maps` on ``data.tokens``.
    data : InductionData

    Returns
    -------
    induction : (L, H)
        Mean weight of the queries that predict a repeated token on the key holding it
        (:meth:`InductionData.source`).
    previous : (L, H)
        Mean weight of every query i >= 1 on key i - 1, the previous token.
    """
    source = data.source()  # (N, T)
    rows, queries = torch.nonzero(source >= 0, as_tuple=True)  # the queries of repeated tokens
    keys = source[rows, queries]
    T = data.tokens.shape[1]
    position = torch.arange(1, T)
    induction = torch.stack([m[rows, :, queries, keys].mean(0) for m in maps])  # (L, H)
    previous = torch.stack([m[:, :, position, position - 1].mean((0, 2)) for m in maps])  # (L, H)
    return induction, previous


@torch.no_grad()
def scores_over_training(model, snapshots, data):
    """:func:`repeat_scores` and :func:`head_scores` of every snapshot of a training run.

    Parameters
    ----------
    model : Decoder
        Any model of the trained one's shape; a copy is loaded with each snapshot.
    snapshots : list of state dicts
    data : InductionData

    Returns
    -------
    dict
        ``repeat_loss``, ``repeat_accuracy``, ``other_loss``: tensors (S,);
        ``induction``, ``previous``: tensors (S, layers, heads).
    """
    replay = copy.deepcopy(model)
    rows = {name: [] for name in ("repeat_loss", "repeat_accuracy", "other_loss", "induction", "previous")}
    for state in snapshots:
        replay.load_state_dict(state)
        for name, value in repeat_scores(replay, data).items():
            rows[name].append(value)
        induction, previous = head_scores(replay.attention_maps(data.tokens), data)
        rows["induction"].append(induction)
        rows["previous"].append(previous)
    return {name: torch.tensor(values, dtype=torch.float64) if name.endswith(("loss", "accuracy"))
            else torch.stack(values) for name, values in rows.items()}
