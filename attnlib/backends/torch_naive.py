"""The matrix form in explicit torch ops: matmul -> softmax -> matmul.

This is the readable path nanoGPT keeps next to its fused call. On a GPU it
writes the whole (T_q, T_k) score matrix to memory and reads it back, which is
what the fused kernels avoid.
"""

ARRAY_KIND = "torch"


def causal_keep(t_q, t_k, alignment, device):
    """Boolean (T_q, T_k) tensor, True where query i may attend key j (``j <= i + offset``)."""
    import torch

    from ..masks import causal_offset

    keep = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
    return keep.tril(diagonal=causal_offset(t_q, t_k, alignment))


def masked_scores(q, k, mask, causal, scale):
    """Scaled scores with masked entries set to -inf, shape (..., T_q, T_k), at least float32.

    The scale multiplies q before the product, so a raw q . k too large for
    float16 cannot overflow on the way to a scaled score that fits; the scores
    are then kept in float32 for the softmax, as fused kernels do.
    """
    import torch

    scores = (q * scale) @ k.transpose(-2, -1)  # (..., T_q, d_k) @ (..., d_k, T_k) -> (..., T_q, T_k)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if causal:
        keep = causal_keep(q.shape[-2], k.shape[-2], causal, q.device)
        scores = scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))  # True = may attend
        else:
            scores = scores + mask.to(scores.dtype)  # additive: 0 keeps, -inf drops
    return scores


def forward(q, k, v, mask, causal, scale):
    import torch

    scores = masked_scores(q, k, mask, causal, scale)  # (..., T_q, T_k)
    weights = torch.softmax(scores, dim=-1).to(v.dtype)
    return weights @ v  # (..., T_q, T_k) @ (..., T_k, d_v) -> (..., T_q, d_v)
