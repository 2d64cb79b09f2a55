"""The matrix form in explicit torch ops: matmul -> softmax -> matmul.

This is the readable path nanoGPT keeps next to its fused call. On a GPU it
writes the whole (T_q, T_k) score matrix to memory and reads it back, which is
what the fused kernels avoid.
"""

ARRAY_KIND = "torch"


def masked_scores(q, k, mask, causal, scale):
    """Scaled scores with masked entries set to -inf, shape (..., T_q, T_k)."""
    import torch

    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T_q, d_k) @ (..., d_k, T_k) -> (..., T_q, T_k)
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
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
    # half precision: softmax in fp32, as fused kernels do
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(v.dtype)
    return weights @ v  # (..., T_q, T_k) @ (..., T_k, d_v) -> (..., T_q, d_v)
