"""A single-head self-attention layer that holds its weights and a ``max_seq_len``."""

import warnings

import numpy as np

from .arrays import as_array
from .attention import attention, attention_weights
from .errors import SequenceTooLongError, ShapeError
from .projections import project_qkv


class SelfAttention:
    """Single-head self-attention with seeded weights W_Q, W_K, W_V.

    Parameters
    ----------
    d_model, d_k, d_v : int
        Embedding width, query/key width, value width.
    max_seq_len : int
        The longest sequence the layer accepts. Real models have one because
        their positional encodings and training stop there (GPT-2: 1024,
        GPT-3: 2048).
    seed : int
        Seeds the weight initialisation: normal entries scaled by
        ``1/sqrt(d_model)``, so Q, K and V have roughly unit-variance entries.
    """

    def __init__(self, d_model, d_k, d_v, max_seq_len, seed=0):
        for name, value in (("d_model", d_model), ("d_k", d_k), ("d_v", d_v), ("max_seq_len", max_seq_len)):
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.d_model, self.d_k, self.d_v = int(d_model), int(d_k), int(d_v)
        self.max_seq_len = int(max_seq_len)
        rng = np.random.default_rng(seed)
        std = 1.0 / np.sqrt(d_model)
        self.w_q = rng.normal(0.0, std, size=(d_model, d_k))  # (d_model, d_k)
        self.w_k = rng.normal(0.0, std, size=(d_model, d_k))  # (d_model, d_k)
        self.w_v = rng.normal(0.0, std, size=(d_model, d_v))  # (d_model, d_v)

    def __repr__(self):
        return (
            f"SelfAttention(d_model={self.d_model}, d_k={self.d_k}, d_v={self.d_v}, "
            f"max_seq_len={self.max_seq_len})"
        )

    def _fit_length(self, x, truncate):
        if x.ndim < 2 or x.shape[-1] != self.d_model:
            raise ShapeError(
                f"x must be (..., T, d_model={self.d_model}), got shape {tuple(x.shape)}"
            )
        T = x.shape[-2]
        if T <= self.max_seq_len:
            return x
        if not truncate:
            raise SequenceTooLongError(
                f"the input has T={T} tokens but this layer was built with "
                f"max_seq_len={self.max_seq_len}; shorten it, or pass truncate=True to keep "
                f"the first {self.max_seq_len}"
            )
        warnings.warn(
            f"truncated the input from T={T} to max_seq_len={self.max_seq_len} tokens; "
            f"the last {T - self.max_seq_len} were dropped",
            UserWarning,
            stacklevel=4,  # _fit_length <- project <- __call__/weights <- the caller's line
        )
        return x[..., : self.max_seq_len, :]

    def project(self, x, *, truncate=False):
        """``(q, k, v)`` for ``x`` of shape (..., T, d_model)."""
        x = self._fit_length(as_array(x), truncate)
        return project_qkv(x, self.w_q, self.w_k, self.w_v)

    def weights(self, x, *, causal=False, truncate=False):
        """The (..., T, T) attention matrix for ``x``."""
        q, k, _ = self.project(x, truncate=truncate)
        return attention_weights(q, k, causal=causal)

    def __call__(self, x, *, causal=False, truncate=False, backend=None):
        """Attend over ``x`` of shape (..., T, d_model); returns (..., T, d_v).

        Raises :class:`~attnlib.errors.SequenceTooLongError` when
        T > max_seq_len, unless ``truncate=True``, which keeps the first
        ``max_seq_len`` tokens and warns.
        """
        q, k, v = self.project(x, truncate=truncate)
        return attention(q, k, v, causal=causal, backend=backend)
