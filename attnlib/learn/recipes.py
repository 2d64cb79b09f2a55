"""The book's trained models: sizes, steps and seeds in one place.

Chapter 7 trains them in front of the reader; chapters 5 and 6 borrow the
coreference model through :func:`trained_coreference_model`, which runs the
same recipe (a few seconds) once per process and caches the result. Chapter 8
trains :data:`INDUCTION`'s model through :func:`trained_induction_model`, cached
the same way, which chapter 9 decodes with.

:func:`train_coreference`, :func:`train_reversal` and :func:`train_induction` are wrapped in
:func:`.memo.stored`: in ``make test`` (``ATTNLIB_TRAINING_CACHE`` set) each training
runs once per session and every later process loads its result; for a reader they
simply train.

The recipes import without torch (the exercises read them); the functions
import the models when they build one.
"""

import functools

from .coreference import IT_POSITION, SENTENCE_LENGTH, VOCAB
from .memo import stored

# Task 1: one attention layer of 2 heads, then the pointer head.
COREFERENCE = dict(d_model=32, n_heads=2, n_layers=1, steps=300, batch_size=64, lr=3e-3, seed=0)
# Task 1 answered with a word instead: two attention layers of 2 heads, then a linear read-out. Its
# learning rate decays to 0: at a constant rate its heads' weights kept moving with differences as
# small as rounding (see attnlib.learn.training.train).
WORD_READER = dict(d_model=32, n_heads=2, n_layers=2, steps=600, batch_size=64, lr=3e-3, seed=0,
                   lr_decay=True)
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


@stored
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
                 evaluate=lambda m: accuracy(m, data.test.tokens, test_targets), eval_every=25, log=log,
                 lr_decay=recipe.get("lr_decay", False))


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


@stored
def train_reversal(model, test_tokens, test_targets, recipe=REVERSAL, log=None):
    """Train ``model`` on fresh random sequences every step, scoring it on a test set every 25 steps."""
    from .reversal import random_sequences
    from .training import accuracy, train

    return train(model, lambda generator: random_sequences(recipe["batch_size"], generator),
                 steps=recipe["steps"], lr=recipe["lr"], seed=recipe["seed"],
                 evaluate=lambda m: accuracy(m, test_tokens, test_targets), eval_every=25, log=log)


# Chapter 8: an induction head. Two attention-only blocks of 2 heads, RoPE, width 32, trained on
# next-token prediction over fresh random sequences with a repeated segment (attnlib.learn.induction).
# How often the circuit forms within these steps, over seeds: `python -m attnlib.learn.sweep` (stored in
# attnlib/data/learn/induction_seeds.json).
INDUCTION = dict(d_model=32, n_heads=2, n_layers=2, positions="rope", embedding_std=0.3, steps=800,
                 batch_size=64, lr=4e-3, seed=0, eval_every=50, eval_sequences=256, eval_seed=1)


def induction_model(recipe=INDUCTION):
    """An untrained attention-only decoder for chapter 8's task, float64."""
    from .induction import SEQUENCE_LENGTH, VOCAB_SIZE
    from .transformer import Decoder

    return Decoder(VOCAB_SIZE, recipe["d_model"], recipe["n_heads"], recipe["n_layers"],
                   positions=recipe["positions"], max_len=SEQUENCE_LENGTH, mlp=False,
                   embedding_std=recipe["embedding_std"], seed=recipe["seed"])


def induction_eval_data(recipe=INDUCTION):
    """The fixed sequences every snapshot is scored on (seeded apart from the training batches)."""
    import torch

    from .induction import SEGMENT_LENGTHS, induction_sequences

    return induction_sequences(recipe["eval_sequences"], torch.Generator().manual_seed(recipe["eval_seed"]),
                               segment_lengths=recipe.get("segment_lengths", SEGMENT_LENGTHS))


def induction_batches(recipe=INDUCTION):
    """The recipe's ``sample_batch``: fresh sequences of its task at every step."""
    from .induction import SEGMENT_LENGTHS, next_token_batches

    return next_token_batches(recipe["batch_size"], segment_lengths=recipe.get("segment_lengths", SEGMENT_LENGTHS))


@stored
def train_induction(model, recipe=INDUCTION, *, log=None):
    """Train ``model`` on fresh sequences every step; ``(history, snapshots)``.

    ``snapshots`` holds the weights (state dicts) before training and every
    ``eval_every`` steps after; ``history.eval_accuracy`` the accuracy on the
    repeated tokens of :func:`induction_eval_data` at those steps.
    """
    import copy

    from .induction import repeat_scores
    from .training import train

    data = induction_eval_data(recipe)
    snapshots = [copy.deepcopy(model.state_dict())]

    def evaluate(trained):
        snapshots.append(copy.deepcopy(trained.state_dict()))
        return repeat_scores(trained, data)["repeat_accuracy"]

    history = train(model, induction_batches(recipe), steps=recipe["steps"], lr=recipe["lr"],
                    seed=recipe["seed"], evaluate=evaluate, eval_every=recipe["eval_every"], log=log)
    return history, snapshots


@functools.cache
def trained_induction_model():
    """``(model, history, snapshots)`` for chapter 8's model trained with :data:`INDUCTION`, cached per process.

    Chapter 9 decodes with this model.
    """
    model = induction_model()
    history, snapshots = train_induction(model)
    return model, history, snapshots


# The GPT on real text (attnlib.learn.gpt): chapter 8's decoder with its MLP and RoPE, one character a token,
# trained on the King James Bible's training split; float32 weights and arithmetic. Held-out loss on a fixed
# set of eval_windows windows of `context` + 1 characters, drawn with eval_seed.
GPT = dict(tokenizer="characters", d_model=64, n_heads=4, n_layers=2, embedding_std=0.3, context=64,
           batch_size=64, steps=3000, lr=3e-3, warmup_steps=100, final_lr_fraction=0.1, dtype="float32",
           log_every=10, eval_every=500, eval_windows=1024, eval_seed=1000)
# The same model and budget on byte-pair tokens (chapter 10's comparison): the characters and 256 merges
# learned from the training text, so a window of `context` tokens holds about 2.4 times as many characters.
GPT_BPE = dict(GPT, tokenizer="bpe", bpe_merges=256)
