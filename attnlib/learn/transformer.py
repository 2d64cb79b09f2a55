"""A decoder-only Transformer: pre-LayerNorm blocks, positions, logits and the next-token loss.

Chapter 8 builds it from chapter 6's multi-head attention, in the shape of
nanoGPT's ``model.py``:

- :class:`LayerNorm`: each token's vector rescaled to mean 0 and variance 1,
  then a learned gain and bias;
- :class:`MLP`: the same two-layer network applied to every token on its own;
- :class:`CausalSelfAttention`: multi-head attention with the causal mask, and
  RoPE on its queries and keys when the model uses it;
- :class:`Block`: ``x + attention(LN(x))``, then ``x + MLP(LN(x))`` (pre-LN);
- :class:`Decoder`: embeddings, positions, a stack of blocks, a last
  LayerNorm and the unembedding that gives logits (one score per vocabulary
  token, at every position); :func:`next_token_loss` scores them.

Every weight is drawn from a seeded ``torch.Generator`` (the model never touches
torch's global random state) and the model computes in float64 by default, so
that a training run's printed numbers do not depend on the CPU's rounding.

Interface for a decoder with a KV cache (chapter 9)
----------------------------------------------------
Stable since it was first committed; any change will be noted here.

The full forward pass, ``model(tokens)``, recomputes every key and value. A
cached decoder does the same computation in pieces, one block at a time,
keeping each block's keys and values:

``model.embed(tokens, positions)``
    Token ids (B, T_new) at absolute ``positions`` (LongTensor (T_new,)) ->
    (B, T_new, d_model). Adds learned or sinusoidal position vectors at those
    positions (none for RoPE).
``block.attention.qkv(h, positions)``
    ``h = block.norm_1(x)`` (B, T_new, d_model) -> ``q, k, v``, each
    (B, H, T_new, d_head), with RoPE already applied to q and k at
    ``positions`` when the model uses RoPE. These k and v are what a cache stores.
``block.attention.attend(q, k, v, **options)``
    q (B, H, T_q, d_head) against keys and values (B, H, T_k, d_head), which may
    come from a cache (T_k >= T_q): ``attnlib.attention(..., causal="bottom-right")``,
    so the last query lines up with the last key, then heads merged and
    projected by W_O -> (B, T_q, d_model). ``options`` go to
    :func:`attnlib.attention` unchanged (``mask=``, ``backend=``, and whatever
    it gains later). With T_k == T_q this is ordinary causal attention.
``block.mlp_step(x)``
    ``x + MLP(norm_2(x))``, the block's second half (``x`` unchanged in an
    attention-only block).
``model.logits(x)``
    The last LayerNorm and the unembedding: (B, T, d_model) -> (B, T, V).

One step of cached decoding, for every block in ``model.blocks``::

    q, k, v = block.attention.qkv(block.norm_1(x), positions)
    keys, values = torch.cat([past_k, k], dim=-2), torch.cat([past_v, v], dim=-2)
    x = x + block.attention.attend(q, keys, values)
    x = block.mlp_step(x)

which is exactly ``Block.forward`` with the keys and values of the earlier
positions supplied from the cache (``tests/test_transformer.py`` checks that
token-by-token decoding this way gives the full forward pass's logits).
"""

import copy
import math

import torch
from torch import nn
from torch.nn import functional

from ..attention import attention, attention_weights
from ..multi_head import merge_heads, split_heads
from ..positions import rope, sinusoidal_positions
from ..projections import project_qkv
from .layers import initial_normal

POSITION_SCHEMES = ("learned", "sinusoidal", "rope", "none")


def _normal(rows, cols, generator, std=1.0):
    """A (rows, cols) float64 parameter of normal entries with standard deviation ``std``.

    Drawn by :func:`~attnlib.learn.layers.initial_normal`, the same on every CPU
    (float32 ``torch.randn`` is not).
    """
    return nn.Parameter(initial_normal((rows, cols), generator) * std)


def _weight(d_in, d_out, generator):
    """A (d_in, d_out) weight matrix, entries of standard deviation 1/sqrt(d_in)."""
    return _normal(d_in, d_out, generator, std=1 / math.sqrt(d_in))


class LayerNorm(nn.Module):
    """Normalise each token's vector to mean 0 and variance 1, then scale and shift it.

    ``(x - mean) / sqrt(variance + eps) * gain + bias``, over the last axis
    (Ba, Kiros and Hinton, 2016). ``gain`` starts at 1 and ``bias`` at 0.
    """

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gain = nn.Parameter(torch.ones(d_model))  # (d_model,)
        self.bias = nn.Parameter(torch.zeros(d_model))  # (d_model,)

    def forward(self, x):
        """(..., d_model) -> (..., d_model)."""
        mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
        variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # (..., 1)
        return (x - mean) / torch.sqrt(variance + self.eps) * self.gain + self.bias


class MLP(nn.Module):
    """Two layers applied to every token on its own: ``GELU(x W_1 + b_1) W_2 + b_2``.

    Parameters
    ----------
    d_model : int
    d_hidden : int
        Width of the middle layer; 4 * d_model in GPT-2.
    generator : torch.Generator
    """

    def __init__(self, d_model, d_hidden, generator):
        super().__init__()
        self.w_1, self.b_1 = _weight(d_model, d_hidden, generator), nn.Parameter(torch.zeros(d_hidden))
        self.w_2, self.b_2 = _weight(d_hidden, d_model, generator), nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        """(B, T, d_model) -> (B, T, d_model)."""
        hidden = functional.gelu(x @ self.w_1 + self.b_1)  # (B, T, d_model) @ (d_model, d_hidden)
        return hidden @ self.w_2 + self.b_2  # (B, T, d_hidden) @ (d_hidden, d_model)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, split into the two steps a KV cache needs.

    Parameters
    ----------
    d_model, n_heads : int
        Each head works in ``d_head = d_model / n_heads`` dimensions.
    generator : torch.Generator
    rope : bool
        Rotate each head's queries and keys by their positions
        (:func:`attnlib.rope`, ``style="half"``).

    ``w_q``, ``w_k``, ``w_v``, ``w_o`` are (d_model, d_model), the arguments
    of :func:`attnlib.multi_head_attention`: head j owns columns
    ``j * d_head`` to ``(j + 1) * d_head`` of the first three, and rows
    ``j * d_head`` to ``(j + 1) * d_head`` of ``w_o``.
    """

    def __init__(self, d_model, n_heads, generator, *, rope=False):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads, self.rope = n_heads, rope
        self.w_q, self.w_k, self.w_v, self.w_o = (_weight(d_model, d_model, generator) for _ in range(4))

    def qkv(self, x, positions=None):
        """Queries, keys and values of every head: (B, T, d_model) -> 3 x (B, H, T, d_head).

        ``positions`` (T,) are the tokens' positions, 0 ... T - 1 by default;
        only RoPE uses them here.
        """
        q, k, v = project_qkv(x, self.w_q, self.w_k, self.w_v)  # (B, T, d_model) each
        q, k, v = (split_heads(t, self.n_heads) for t in (q, k, v))  # (B, H, T, d_head) each
        if self.rope:
            q, k = rope(q, positions), rope(k, positions)  # rotated by position, pair by pair
        return q, k, v

    def attend(self, q, k, v, **options):
        """Causal attention of q (B, H, T_q, d_head) over k, v (B, H, T_k, d_head), then W_O.

        Bottom-right alignment: the last query lines up with the last key, so
        keys and values of earlier positions (a cache) may come first.
        Returns (B, T_q, d_model).
        """
        heads = attention(q, k, v, causal="bottom-right", **options)  # (B, H, T_q, d_head)
        return merge_heads(heads) @ self.w_o  # (B, T_q, d_model) @ (d_model, d_model)

    def forward(self, x, positions=None):
        """(B, T, d_model) -> (B, T, d_model)."""
        return self.attend(*self.qkv(x, positions))

    def weights(self, x, positions=None):
        """Every head's causal attention matrix: (B, T, d_model) -> (B, H, T, T)."""
        q, k, _ = self.qkv(x, positions)
        return attention_weights(q, k, causal=True)


class Block(nn.Module):
    """A pre-LayerNorm decoder block: ``x + attention(LN(x))``, then ``x + MLP(LN(x))``.

    Parameters
    ----------
    d_model, n_heads : int
    generator : torch.Generator
    rope : bool
        Passed to :class:`CausalSelfAttention`.
    mlp : bool
        False for an attention-only block (no second half).
    """

    def __init__(self, d_model, n_heads, generator, *, rope=False, mlp=True):
        super().__init__()
        self.norm_1 = LayerNorm(d_model)
        self.attention = CausalSelfAttention(d_model, n_heads, generator, rope=rope)
        self.norm_2 = LayerNorm(d_model) if mlp else None
        self.mlp = MLP(d_model, 4 * d_model, generator) if mlp else None

    def forward(self, x, positions=None):
        """(B, T, d_model) -> (B, T, d_model)."""
        x = x + self.attention(self.norm_1(x), positions)  # each token gathers from the others
        return self.mlp_step(x)

    def mlp_step(self, x):
        """The second half, ``x + MLP(LN(x))``: each token on its own. ``x`` itself without an MLP."""
        if self.mlp is None:
            return x
        return x + self.mlp(self.norm_2(x))  # (B, T, d_model)


class Decoder(nn.Module):
    """A decoder-only Transformer that returns next-token logits.

    Parameters
    ----------
    vocab_size : int
        Number of token ids, V.
    d_model, n_heads, n_layers : int
    positions : {"learned", "sinusoidal", "rope", "none"}
        Where order comes from: learned vectors added to the embeddings (one per
        position), :func:`attnlib.sinusoidal_positions` added the same way,
        :func:`attnlib.rope` on every head's queries and keys, or nothing (the
        model then cannot tell positions apart, except through the causal mask).
    max_len : int, optional
        Longest sequence; needed for learned and sinusoidal positions (one
        vector per position). RoPE and "none" accept any length.
    mlp : bool
        False builds attention-only blocks.
    embedding_std : float
        Standard deviation of the initial token vectors (and learned position
        vectors); 1 by default. Smaller, what the blocks add to the residual
        stream stands out more against the embeddings from the start.
    seed : int
        Seeds every initial weight.
    dtype : torch.dtype
        float64 by default.

    ``model(tokens)``: LongTensor (B, T) -> logits (B, T, V); row t scores
    every possible token t + 1.
    """

    def __init__(self, vocab_size, d_model, n_heads, n_layers, *, positions="learned", max_len=None,
                 mlp=True, embedding_std=1.0, seed=0, dtype=torch.float64):
        super().__init__()
        if positions not in POSITION_SCHEMES:
            raise ValueError(f"positions must be one of {POSITION_SCHEMES}, got {positions!r}")
        if positions in ("learned", "sinusoidal") and max_len is None:
            raise ValueError(f"positions={positions!r} needs max_len, the number of position vectors")
        generator = torch.Generator().manual_seed(seed)
        self.vocab_size, self.position_scheme, self.max_len = vocab_size, positions, max_len
        self.embedding = _normal(vocab_size, d_model, generator, embedding_std)  # (V, d)
        if positions == "learned":
            self.position = _normal(max_len, d_model, generator, embedding_std)  # (T_max, d)
        elif positions == "sinusoidal":
            self.register_buffer("position", torch.from_numpy(sinusoidal_positions(max_len, d_model)))
        self.blocks = nn.ModuleList(Block(d_model, n_heads, generator, rope=positions == "rope", mlp=mlp)
                                    for _ in range(n_layers))
        self.norm = LayerNorm(d_model)
        self.unembedding = _weight(d_model, vocab_size, generator)  # (d, V)
        self.to(dtype)  # drawn in float64; a seed gives the same start in any dtype

    def embed(self, tokens, positions=None):
        """Token ids (B, T) -> token vectors, plus position vectors when the model adds them: (B, T, d)."""
        positions = self._check(tokens, positions)
        x = self.embedding[tokens]  # (B, T, d)
        if self.position_scheme in ("learned", "sinusoidal"):
            x = x + self.position[positions]  # (B, T, d) + (T, d)
        return x

    def logits(self, x):
        """The last LayerNorm, then the unembedding: (B, T, d) -> (B, T, V)."""
        return self.norm(x) @ self.unembedding  # (B, T, d) @ (d, V)

    def forward(self, tokens, positions=None):
        """Token ids (B, T) -> logits (B, T, V)."""
        x = self.embed(tokens, positions)  # (B, T, d)
        for block in self.blocks:
            x = block(x, positions)  # (B, T, d) -> (B, T, d)
        return self.logits(x)

    @torch.no_grad()
    def attention_maps(self, tokens):
        """Each block's attention matrices: a list with one (B, H, T, T) tensor per block."""
        x, maps = self.embed(tokens), []
        for block in self.blocks:
            maps.append(block.attention.weights(block.norm_1(x)))  # (B, H, T, T)
            x = block(x)
        return maps

    def _check(self, tokens, positions):
        """Validate token ids (B, T) and positions (T,); return the positions (default 0 ... T - 1)."""
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2 or tokens.is_floating_point():
            shape = tuple(tokens.shape) if hasattr(tokens, "shape") else type(tokens).__name__
            raise ValueError(f"tokens must be a (B, T) tensor of token ids, got {shape}")
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ValueError(f"tokens must be ids in 0 ... {self.vocab_size - 1} (vocab_size={self.vocab_size}), "
                             f"got values from {int(tokens.min())} to {int(tokens.max())}")
        T = tokens.shape[1]
        if positions is None:
            positions = torch.arange(T, device=tokens.device)
        elif not isinstance(positions, torch.Tensor) or positions.shape != (T,) or positions.is_floating_point():
            shape = tuple(positions.shape) if hasattr(positions, "shape") else type(positions).__name__
            raise ValueError(f"positions must be a ({T},) tensor of whole numbers, one per token of "
                             f"tokens {tuple(tokens.shape)}, got {shape}")
        if self.max_len is not None and self.position_scheme in ("learned", "sinusoidal") and T and \
                int(positions.max()) >= self.max_len:
            raise ValueError(f"position {int(positions.max())} is past max_len={self.max_len}, the number of "
                             f"{self.position_scheme} position vectors (tokens {tuple(tokens.shape)})")
        return positions


def next_token_loss(logits, tokens):
    """Mean cross-entropy of predicting each next token: logits (B, T, V), tokens (B, T).

    Position t's logits score token t + 1, so the last position has no target
    and the first token is never a target.
    """
    predictions, targets = logits[:, :-1], tokens[:, 1:]  # (B, T-1, V), (B, T-1)
    return functional.cross_entropy(predictions.flatten(0, 1), targets.flatten())


def without_head(model, layer, head):
    """A copy of ``model`` whose head ``head`` of block ``layer`` adds nothing: its rows of W_O zeroed.

    The head still computes its weights, but what it gathers never reaches the
    residual stream: an ablation.
    """
    ablated = copy.deepcopy(model)
    attention_layer = ablated.blocks[layer].attention
    d_head = attention_layer.w_o.shape[0] // attention_layer.n_heads
    with torch.no_grad():
        attention_layer.w_o[head * d_head:(head + 1) * d_head] = 0.0  # (d_head, d_model) rows of head
    return ablated
