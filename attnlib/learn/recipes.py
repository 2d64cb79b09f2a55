"""The book's trained models: sizes, steps and seeds in one place.

Chapter 7 trains them in front of the reader; chapters 5 and 6 borrow the
coreference model through :func:`trained_coreference_model`, which runs the
same recipe (a few seconds) once per process and caches the result.

The recipes import without torch (the exercises read them); the functions
import the models when they build one.
"""

import functools

from .coreference import IT_POSITION, SENTENCE_LENGTH, VOCAB

# Task 1: one attention layer of 2 heads, then the pointer head.
COREFERENCE = dict(d_model=32, n_heads=2, n_layers=1, steps=300, batch_size=64, lr=3e-3, seed=0)
# Task 1 answered with a word instead: two attention layers of 2 heads, then a linear read-out.
WORD_READER = dict(d_model=32, n_heads=2, n_layers=2, steps=600, batch_size=64, lr=3e-3, seed=0)
# Task 2: one attention layer of 2 heads, then a linear read-out at every position.
REVERSAL = dict(d_model=32, n_heads=2, n_layers=1, steps=300, batch_size=64, lr=3e-3, seed=0)


def coreference_model(recipe=COREFERENCE):
    """An untrained pointer for Task 1: it answers at "it" by pointing at a token."""
    from .model import AttentionPointer

    return AttentionPointer(len(VOCAB), SENTENCE_LENGTH, recipe["d_model"], recipe["n_heads"],
                            recipe["n_layers"], read_at=[IT_POSITION], seed=recipe["seed"])


def word_reader_model(recipe=WORD_READER):
    """An untrained classifier for Task 1: it answers at "it" with a word of the vocabulary."""
    from .model import AttentionClassifier

    return AttentionClassifier(len(VOCAB), SENTENCE_LENGTH, recipe["d_model"], recipe["n_heads"],
                               recipe["n_layers"], n_classes=len(VOCAB), read_at=[IT_POSITION],
                               seed=recipe["seed"])


def train_coreference(data, model, recipe=COREFERENCE, *, words=False, log=None):
    """Train ``model`` on ``data.train``, scoring it on ``data.test`` every 25 steps; a History.

    ``words=True`` trains on the referents' token ids (for :func:`word_reader_model`)
    instead of their positions.
    """
    from .training import accuracy, batches_from, train

    train_targets, test_targets = ((data.train.word_targets, data.test.word_targets) if words
                                   else (data.train.targets, data.test.targets))
    return train(model, batches_from(data.train.tokens, train_targets, recipe["batch_size"]),
                 steps=recipe["steps"], lr=recipe["lr"], seed=recipe["seed"],
                 evaluate=lambda m: accuracy(m, data.test.tokens, test_targets), eval_every=25, log=log)


@functools.cache
def trained_coreference_model():
    """``(data, model, history)`` for Task 1 trained with :data:`COREFERENCE`, cached per process."""
    from .coreference import make_coreference_data

    data = make_coreference_data()
    model = coreference_model()
    history = train_coreference(data, model)
    return data, model, history


def reversal_model(recipe=REVERSAL):
    """An untrained classifier for Task 2: two answers (reversed, previous) at every position."""
    from .model import AttentionClassifier
    from .reversal import N_DIGITS, QUESTIONS, SEQUENCE_LENGTH

    return AttentionClassifier(N_DIGITS, SEQUENCE_LENGTH, recipe["d_model"], recipe["n_heads"],
                               recipe["n_layers"], n_classes=N_DIGITS, n_targets=len(QUESTIONS),
                               seed=recipe["seed"])


def train_reversal(model, test_tokens, test_targets, recipe=REVERSAL, log=None):
    """Train ``model`` on fresh random sequences every step, scoring it on a test set every 25 steps."""
    from .reversal import random_sequences
    from .training import accuracy, train

    return train(model, lambda generator: random_sequences(recipe["batch_size"], generator),
                 steps=recipe["steps"], lr=recipe["lr"], seed=recipe["seed"],
                 evaluate=lambda m: accuracy(m, test_tokens, test_targets), eval_every=25, log=log)
