"""PyTorch's fused ``torch.nn.functional.scaled_dot_product_attention``.

SDPA takes either ``is_causal=True`` (top-left aligned) or an ``attn_mask``,
not both. So a causal call with an extra mask, and a bottom-right causal call
with T_q != T_k, fold everything into one boolean or additive mask here. Two
bottom-right cases need no mask: with T_q == T_k it is the top-left mask, which
``is_causal=True`` gives without a (T, T) array (and lets SDPA skip the blocks
above the diagonal), and a single query sees every key (one decoding step over a
KV cache).
"""

ARRAY_KIND = "torch"


def forward(q, k, v, mask, causal, scale):
    import torch
    import torch.nn.functional as F

    from .torch_naive import causal_keep

    batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    t_q, t_k = q.shape[-2], k.shape[-2]
    q = q.expand(*batch_shape, *q.shape[-2:])
    k = k.expand(*batch_shape, *k.shape[-2:])
    v = v.expand(*batch_shape, *v.shape[-2:])
    squeeze = q.ndim == 2
    if squeeze:  # SDPA wants at least one leading dimension
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    if causal == "bottom-right" and mask is None and t_q in (1, t_k):
        causal = "top-left" if t_q == t_k else None  # the same keys, no (T_q, T_k) array
    if causal and (mask is not None or causal == "bottom-right"):
        keep = causal_keep(t_q, t_k, causal, q.device)  # (T_q, T_k)
        if mask is None:
            mask = keep
        elif mask.dtype == torch.bool:
            mask = mask & keep
        else:
            mask = mask.masked_fill(~keep, float("-inf"))
        causal = None
    if mask is not None:
        # SDPA indexes the mask's last two dimensions as (T_q, T_k): give it exactly that shape
        mask = mask.expand(*q.shape[:-2], t_q, t_k)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=bool(causal), scale=scale)
    return out.squeeze(0) if squeeze else out
