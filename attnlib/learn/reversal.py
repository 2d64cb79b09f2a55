"""Task 2 data: reverse a sequence, and name each token's left neighbour.

A sequence of T random digits goes in. At every position i the model answers
two questions at once:

- *reversed*: which digit is at position ``T - 1 - i``? (the sequence read backwards)
- *previous*: which digit is at position ``i - 1``? (position 0 wraps round to T - 1)

Each answer sits at one other position, so a head that solves one of them must
put its weight on one key per query: the anti-diagonal for *reversed*, the
diagonal just below the main one for *previous*. A reader can draw both maps
before training starts.
"""

import torch

N_DIGITS = 10
SEQUENCE_LENGTH = 8
QUESTIONS = ("reversed", "previous")


def source_positions(length=SEQUENCE_LENGTH):
    """Where each answer is read from: LongTensor (2, T), row 0 reversed, row 1 previous."""
    positions = torch.arange(length)  # (T,)
    return torch.stack([length - 1 - positions, (positions - 1) % length])  # (2, T)


def targets_for(tokens):
    """The answers for a batch of sequences: (B, T) -> (B, T, 2), [..., 0] reversed, [..., 1] previous."""
    sources = source_positions(tokens.shape[-1])  # (2, T)
    return tokens[:, sources].transpose(1, 2)  # (B, 2, T) -> (B, T, 2)


def random_sequences(n, generator, length=SEQUENCE_LENGTH, n_digits=N_DIGITS):
    """``n`` random digit sequences and their answers: (n, T) and (n, T, 2), drawn from ``generator``."""
    tokens = torch.randint(n_digits, (n, length), generator=generator)  # (n, T)
    return tokens, targets_for(tokens)
