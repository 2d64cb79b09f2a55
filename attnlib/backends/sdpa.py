"""PyTorch's fused ``torch.nn.functional.scaled_dot_product_attention``.

SDPA takes either ``is_causal=True`` or an ``attn_mask``, not both, so a causal
call with an extra mask folds the two into one mask here.
"""

ARRAY_KIND = "torch"


def forward(q, k, v, mask, causal, scale):
    import torch
    import torch.nn.functional as F

    batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q = q.expand(*batch_shape, *q.shape[-2:])
    k = k.expand(*batch_shape, *k.shape[-2:])
    v = v.expand(*batch_shape, *v.shape[-2:])
    squeeze = q.ndim == 2
    if squeeze:  # SDPA wants at least one leading dimension
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    if causal and mask is not None:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        if mask.dtype == torch.bool:
            mask = mask & keep
        else:
            mask = mask.masked_fill(~keep, float("-inf"))
        causal = False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    return out.squeeze(0) if squeeze else out
