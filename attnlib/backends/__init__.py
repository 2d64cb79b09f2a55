"""The backends behind :func:`attnlib.attention`, one file each.

Every backend module has ``forward(q, k, v, mask, causal, scale)``, called on
inputs that :mod:`attnlib.validation` has already checked, and a module-level
``ARRAY_KIND`` ("numpy" or "torch") saying which arrays it computes on.

- ``numpy``: the matrix form, softmax(Q K^T * scale) V.
- ``loop``: one query at a time, as the token-by-token derivation writes it.
- ``torch``: the same matrix form in explicit torch ops (the book's CUDA path).
- ``sdpa``: PyTorch's fused ``scaled_dot_product_attention``.
- ``tiled``: online softmax over key blocks in NumPy; never builds the T x T matrix.
- ``triton``: a FlashAttention-2-style Triton kernel (CUDA, or CPU under TRITON_INTERPRET=1).
- ``triton-simple``: the same algorithm in one short kernel, for teaching (forward only;
  no mask other than causal; fp16, bf16 or fp32; d a power of two up to 128).
"""
