"""The book's running examples, defined once so every chapter uses the same numbers.

``THE_CAT_SAT``
    "the cat sat": three tokens with hand-picked 4-dimensional embeddings X and
    query, key and value rows Q, K and V. The weight matrices W_Q, W_K and W_V
    are the minimum-norm solutions of ``X @ W = Q`` (and likewise for K and V):
    one of many weight matrices that produce exactly these rows.

``SOFTMAX_ILLUSTRATION_SCORES``
    A made-up score row, [2, 4, 6], with ``SOFTMAX_ILLUSTRATION_D_K = 4``: a plain
    illustration of softmax, not computed from any Q and K.

``ANIMAL_SENTENCE``
    "The animal didn't cross the street because it was too tired.", the
    coreference example: "it" should attend to "animal".
    :func:`animal_sentence_embeddings` gives it seeded *random* (untrained)
    embeddings, so any pattern in its attention is chance; chapter 7 trains a
    model whose "it" does look at the right noun.
"""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RunningExample:
    """A tiny sentence with everything attention needs, all float64."""

    tokens: tuple
    x: np.ndarray  # (T, d_model) embeddings, one row per token
    q: np.ndarray  # (T, d_k) queries
    k: np.ndarray  # (T, d_k) keys
    v: np.ndarray  # (T, d_v) values
    w_q: np.ndarray  # (d_model, d_k), x @ w_q == q
    w_k: np.ndarray  # (d_model, d_k), x @ w_k == k
    w_v: np.ndarray  # (d_model, d_v), x @ w_v == v

    @property
    def d_k(self):
        return self.q.shape[-1]

    def index(self, token):
        """Row number of ``token`` (e.g. ``"cat"`` -> 1)."""
        return self.tokens.index(token)


def _min_norm_weights(x, target):
    """The smallest W (Frobenius norm) with ``x @ W == target``."""
    w, *_ = np.linalg.lstsq(x, target, rcond=None)
    assert np.allclose(x @ w, target, atol=1e-12), "X must have full row rank"
    return w


def _the_cat_sat():
    tokens = ("the", "cat", "sat")
    x = np.array([[0.2, 0.7, 0.1, 0.4], [0.8, 0.3, 0.5, 0.2], [0.1, 0.6, 0.9, 0.4]])
    q = np.array([[0.3, 0.6, 0.1, 0.2], [0.7, 0.4, 0.5, 0.3], [0.2, 0.5, 0.8, 0.4]])
    k = np.array([[0.5, 0.2, 0.4, 0.1], [0.6, 0.7, 0.3, 0.2], [0.4, 0.3, 0.7, 0.6]])
    v = np.array([[0.1, 0.4, 0.2, 0.5], [0.5, 0.6, 0.3, 0.1], [0.7, 0.2, 0.4, 0.8]])
    return RunningExample(
        tokens=tokens,
        x=x,
        q=q,
        k=k,
        v=v,
        w_q=_min_norm_weights(x, q),
        w_k=_min_norm_weights(x, k),
        w_v=_min_norm_weights(x, v),
    )


THE_CAT_SAT = _the_cat_sat()

SOFTMAX_ILLUSTRATION_SCORES = np.array([2.0, 4.0, 6.0])
SOFTMAX_ILLUSTRATION_D_K = 4

ANIMAL_SENTENCE = (
    "The", "animal", "didn't", "cross", "the", "street", "because", "it", "was", "too", "tired", ".",
)


def animal_sentence_embeddings(d_model=16, seed=0):
    """Seeded random (untrained) embeddings for :data:`ANIMAL_SENTENCE`, shape (12, d_model)."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(len(ANIMAL_SENTENCE), d_model))
