"""Two small attention-only models built from attnlib's own multi-head attention.

Both embed tokens, add learned positions and run ``n_layers`` attention layers
(each ``x + multi_head_attention(x)``). They differ in how they answer:

- :class:`AttentionClassifier` reads a label off chosen positions with a linear
  read-out (Task 2, reversing a sequence);
- :class:`AttentionPointer` answers by pointing: a last, single attention head
  whose weights over the tokens are the prediction (Task 1, what "it" refers to).

There is no MLP and no layer norm: everything a token learns about the others
reaches it through attention, so the attention maps show all the model does.
"""

import torch
from torch import nn

from .layers import AttentionLayer, PointerHead, initial_normal


class AttentionModel(nn.Module):
    """Token embeddings, learned positions and a stack of attention layers.

    Parameters
    ----------
    vocab_size : int
        Number of token ids.
    max_len : int
        Longest sequence (one learned position vector each).
    d_model, n_heads, n_layers : int
    generator : torch.Generator
        Draws every initial weight. The models never touch torch's global
        random state, so two models built with one seed are identical.
    dtype : torch.dtype
        Every weight's dtype: float64 by default, so that what training learns
        does not depend on the CPU's rounding (see :mod:`attnlib.learn.training`).
    """

    def __init__(self, vocab_size, max_len, d_model, n_heads, n_layers, generator, dtype=torch.float64):
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Parameter(initial_normal((vocab_size, d_model), generator, dtype))  # (V, d)
        self.position = nn.Parameter(initial_normal((max_len, d_model), generator, dtype))  # (T_max, d)
        self.layers = nn.ModuleList(AttentionLayer(d_model, n_heads, generator, dtype)
                                    for _ in range(n_layers))

    def embed(self, tokens):
        """Token ids (B, T) -> token vectors plus position vectors, (B, T, d_model)."""
        if tokens.ndim != 2 or tokens.shape[1] > self.max_len:
            raise ValueError(f"tokens must be (B, T) with T <= max_len={self.max_len}, "
                             f"got shape {tuple(tokens.shape)}")
        return self.embedding[tokens] + self.position[: tokens.shape[1]]  # (B, T, d) + (T, d)

    def encode(self, tokens):
        """Token ids (B, T) -> token vectors after every attention layer, (B, T, d_model)."""
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)  # (B, T, d) -> (B, T, d)
        return x

    @torch.no_grad()
    def attention_maps(self, tokens):
        """Each layer's attention matrices: a list with one (B, H, T, T) tensor per layer."""
        x, maps = self.embed(tokens), []
        for layer in self.layers:
            maps.append(layer.weights(x))  # (B, H, T, T)
            x = layer(x)
        return maps


class AttentionClassifier(AttentionModel):
    """An :class:`AttentionModel` with a linear read-out: labels read off token vectors.

    Parameters
    ----------
    n_classes : int
        Size of each answer's label set.
    n_targets : int
        Answers read out at every read-out position.
    read_at : sequence of int, optional
        Positions the read-out looks at; all positions when None.
    seed : int
        Seeds every initial weight.
    Others as for :class:`AttentionModel`.

    ``model(tokens)``: LongTensor (B, T) -> logits (B, P, n_targets, n_classes),
    P = ``len(read_at)`` or T.
    """

    def __init__(self, vocab_size, max_len, d_model, n_heads, n_layers, n_classes, *, n_targets=1,
                 read_at=None, seed=0, dtype=torch.float64):
        generator = torch.Generator().manual_seed(seed)
        super().__init__(vocab_size, max_len, d_model, n_heads, n_layers, generator, dtype)
        self.n_targets, self.n_classes = n_targets, n_classes
        self.read_at = None if read_at is None else list(read_at)
        self.read_out = nn.Linear(d_model, n_targets * n_classes, dtype=dtype)
        with torch.no_grad():
            weight = initial_normal((n_targets * n_classes, d_model), generator, dtype)
            self.read_out.weight.copy_(weight / d_model**0.5)
            self.read_out.bias.zero_()

    def forward(self, tokens):
        """Token ids (B, T) -> logits (B, P, n_targets, n_classes)."""
        x = self.encode(tokens)  # (B, T, d)
        if self.read_at is not None:
            x = x[:, self.read_at]  # (B, P, d)
        logits = self.read_out(x)  # (B, P, n_targets * n_classes)
        return logits.unflatten(-1, (self.n_targets, self.n_classes))


class AttentionPointer(AttentionModel):
    """An :class:`AttentionModel` that answers by pointing with a last, single head.

    Parameters
    ----------
    read_at : sequence of int
        The query positions whose pointer rows are the answers ("it").
    seed : int
        Seeds every initial weight.
    Others as for :class:`AttentionModel`; the pointer head works in d_model dimensions.

    ``model(tokens)``: LongTensor (B, T) -> logits (B, P, 1, T): for each
    read-out query, its scores over the T tokens; their softmax is the
    pointer head's attention row, the probability that the answer is token j.
    """

    def __init__(self, vocab_size, max_len, d_model, n_heads, n_layers, *, read_at, seed=0,
                 dtype=torch.float64):
        generator = torch.Generator().manual_seed(seed)
        super().__init__(vocab_size, max_len, d_model, n_heads, n_layers, generator, dtype)
        self.read_at = list(read_at)
        self.pointer = PointerHead(d_model, d_model, generator, dtype)

    def forward(self, tokens):
        """Token ids (B, T) -> logits (B, P, 1, T)."""
        scores = self.pointer.scores(self.encode(tokens))  # (B, T, T)
        return scores[:, self.read_at, None, :]  # (B, P, 1, T)

    @torch.no_grad()
    def attention_maps(self, tokens):
        """The layers' maps, then the pointer's: a list of (B, H, T, T) tensors, the last with H = 1."""
        return super().attention_maps(tokens) + [self.pointer.weights(self.encode(tokens))]
