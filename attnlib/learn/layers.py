"""The two trainable pieces the models stack: an attention layer and a pointer head.

Both hold their weights as ``torch.nn.Parameter`` and compute with attnlib's
own functions on torch tensors, so gradients flow through the same code the
earlier chapters run on NumPy arrays.
"""

import math

import torch
from torch import nn

from ..attention import attention_weights
from ..multi_head import multi_head_attention, split_heads
from ..projections import project_qkv
from ..scores import score_matrix


def initial_normal(shape, generator, dtype=torch.float64):
    """Standard normal entries of ``shape`` from ``generator``, in ``dtype``, the same on every CPU.

    ``torch.randn`` in float32 applies its Box-Muller transform (two uniforms ->
    two normals) with vectorised code on CPUs that have AVX2 or AVX-512, and with
    scalar code on others; the two round differently in the last bits, and training
    amplifies that into other printed digits. This draws the float32 uniforms
    ``torch.randn`` would draw, in the same order, and applies the transform in
    float64, where what a CPU changes is about 1e-16. The result is float32
    ``torch.randn`` to within float32 rounding, so a seed keeps the start it gave
    before, on any machine and in any dtype.
    """
    n = math.prod(shape)
    if n < 16:  # torch draws so few one by one; any CPU-independent draw will do
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    uniforms = torch.rand(n, generator=generator, dtype=torch.float32).double()  # (n,)
    normals = torch.empty(n, dtype=torch.float64)
    whole = n - n % 16
    normals[:whole] = _box_muller(uniforms[:whole].view(-1, 16)).flatten()
    if n % 16:  # torch redraws the last 16 (overlapping the last whole block) and transforms them
        last = torch.rand(16, generator=generator, dtype=torch.float32).double()
        normals[-16:] = _box_muller(last.view(1, 16)).flatten()
    return normals.view(shape).to(dtype)


def _box_muller(uniforms):
    """Rows of 16 uniforms in [0, 1) -> rows of 16 normals, as torch pairs them: (k, 16) -> (k, 16)."""
    u1, u2 = 1 - uniforms[:, :8], uniforms[:, 8:]  # 1 - u is in (0, 1], safe for log
    radius, theta = torch.sqrt(-2 * torch.log(u1)), 2 * math.pi * u2
    return torch.cat([radius * torch.cos(theta), radius * torch.sin(theta)], dim=1)


def _weight(d_in, d_out, generator, dtype):
    """A (d_in, d_out) parameter with normal entries of standard deviation 1/sqrt(d_in)."""
    return nn.Parameter(initial_normal((d_in, d_out), generator, dtype) / math.sqrt(d_in))


class AttentionLayer(nn.Module):
    """Multi-head self-attention with a residual connection: ``x + MHA(x)``.

    Parameters
    ----------
    d_model : int
        Width of the token vectors.
    n_heads : int
        Heads; each works in ``d_model / n_heads`` dimensions.
    generator : torch.Generator
        Draws the initial weights: normal entries with standard deviation
        ``1 / sqrt(d_model)``, as :class:`attnlib.SelfAttention` uses.
    dtype : torch.dtype
        The weights' dtype, float64 by default (see :mod:`attnlib.learn.training`).

    ``w_q``, ``w_k``, ``w_v``, ``w_o`` are the arguments of
    :func:`attnlib.multi_head_attention`, held as trainable parameters.
    """

    def __init__(self, d_model, n_heads, generator, dtype=torch.float64):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads = n_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (_weight(d_model, d_model, generator, dtype)
                                                  for _ in range(4))

    def forward(self, x):
        """(B, T, d_model) -> (B, T, d_model)."""
        weights = (self.w_q, self.w_k, self.w_v, self.w_o)  # (d_model, d_model) each
        mixed = multi_head_attention(x, *weights, self.n_heads, backend="torch")  # (B, T, d_model)
        return x + mixed

    def weights(self, x):
        """Every head's attention matrix for input ``x``: (B, T, d_model) -> (B, H, T, T)."""
        q, k, _ = project_qkv(x, self.w_q, self.w_k, self.w_v)  # (B, T, d_model) each
        q, k = split_heads(q, self.n_heads), split_heads(k, self.n_heads)  # (B, H, T, d_head)
        return attention_weights(q, k)  # (B, H, T, T)


class PointerHead(nn.Module):
    """One head that answers by pointing: its attention weights *are* the prediction.

    Query i's scores ``q_i . k_j / sqrt(d_k)`` over the keys j are the logits of
    "the answer for token i is token j" (logits: the scores a softmax turns into
    probabilities); their softmax is the head's attention row. No values and no
    output projection: the weights are the output, as in pointer networks
    (Vinyals, Fortunato and Jaitly, 2015).

    Parameters
    ----------
    d_model, d_k : int
    generator : torch.Generator
    dtype : torch.dtype
    """

    def __init__(self, d_model, d_k, generator, dtype=torch.float64):
        super().__init__()
        self.w_q, self.w_k = _weight(d_model, d_k, generator, dtype), _weight(d_model, d_k, generator, dtype)

    def scores(self, x):
        """Scaled scores, the logits the softmax turns into weights: (B, T, d_model) -> (B, T, T)."""
        q, k = x @ self.w_q, x @ self.w_k  # (B, T, d_k) each
        return score_matrix(q, k) / math.sqrt(self.w_q.shape[1])  # (B, T, T)

    def weights(self, x):
        """The head's attention matrix: (B, T, d_model) -> (B, 1, T, T), one head."""
        return attention_weights(x @ self.w_q, x @ self.w_k)[:, None]  # (B, 1, T, T)
