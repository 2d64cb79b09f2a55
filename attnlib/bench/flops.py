"""How much work one attention forward (and backward) pass does, and how many bytes it must move.

All counts are for one forward pass of attention on q, k, v of shape
(B, H, T, d): B sequences, H heads, T tokens, head dimension d (d_k = d_v = d).

FLOPs
-----
Two matrix products dominate: the scores ``S = Q K^T`` (T x d times d x T) and
the output ``O = A V`` (T x T times T x d). Each costs 2 * T * T * d FLOPs per
head (one multiply and one add per term), so a forward pass is

    flops = 4 * B * H * T**2 * d,

and half of that with a causal mask, because only the lower triangle is
needed. This is the convention of the FlashAttention papers and of Triton's
fused-attention benchmark, so achieved FLOP/s here can be compared with theirs.
The softmax (a max, an exp, a sum and a division per score) is left out, as
it is there: it is O(T^2), not O(T^2 d).

The backward pass (see :mod:`attnlib.backends.tiled_backward`) does four
products of the same size, ``dV = P^T dO``, ``dP = dO V^T``, ``dQ = dS K`` and
``dK = dS^T Q``, where the forward does two, and a FlashAttention-style
backward also recomputes ``S = Q K^T`` from the saved log-sum-exp: five in
all, 2.5 times the forward's FLOPs (the convention of FlashAttention-2 and of
Triton's tutorial benchmark; :func:`attention_backward_flops`).

Bytes
-----
The least traffic to and from main memory (DRAM on a CPU, HBM on a GPU) that
each way of computing attention cannot avoid, counting each tensor once per
kernel that reads or writes it, with perfect reuse inside a kernel.
"""

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def attention_flops(B, H, T, d, causal=False):
    """Forward-pass FLOPs: ``4 * B * H * T**2 * d``, halved when ``causal``.

    >>> attention_flops(1, 1, 2, 3)
    48
    >>> attention_flops(1, 1, 2, 3, causal=True)
    24
    """
    full = 4 * B * H * T * T * d  # two (T, T, d) matmuls, 2 FLOPs per multiply-add
    return full // 2 if causal else full


BACKWARD_OVER_FORWARD = 2.5  # counted as 5 products of size (T, T, d) against the forward's 2

# The (T, T, d) products each implementation really does, forward and backward. FLOPs in this
# package are *counted as* FlashAttention does (2 for the forward, 5 for the backward, causal
# halved), whatever the kernel computes, so that TFLOP/s compare time for the same work; compare
# algorithms by time. Backward, per implementation:
#   matrix form (numpy, torch, sdpa-math): the weights P are stored, so dV = P^T dO, dP = dO V^T,
#       dQ = dS K, dK = dS^T Q: 4;
#   FlashAttention-2's paper loop and the tiled NumPy backward: S = Q K^T recomputed, then the 4: 5;
#   the book's Triton backward: the dK/dV kernel recomputes S and dP (S, dV, dP, dK: 4) and the dQ
#       kernel recomputes both again (S, dP, dQ: 3), so that no two programs add into one memory: 7.
# SDPA's fused kernels are PyTorch's (flash: FlashAttention-2; cuDNN and efficient: their own) and
# are not counted here.
PRODUCTS_DONE = {
    "fwd": {"numpy": 2, "loop": 2, "torch": 2, "sdpa-math": 2, "tiled": 2, "triton": 2, "triton-simple": 2},
    "bwd": {"numpy": 4, "torch": 4, "sdpa-math": 4, "tiled": 5, "triton": 7},
}


def products_done(kernel, direction):
    """How many (T, T, d) products ``kernel`` really does in ``direction``; None when not known.

    >>> products_done("triton", "fwd+bwd"), products_done("torch", "bwd"), products_done("sdpa-flash", "fwd")
    (9, 4, None)
    """
    parts = {"fwd": ["fwd"], "bwd": ["bwd"], "fwd+bwd": ["fwd", "bwd"]}[direction]
    counts = [PRODUCTS_DONE[part].get(kernel) for part in parts]
    return None if None in counts else sum(counts)


def attention_backward_flops(B, H, T, d, causal=False):
    """Backward-pass FLOPs: ``2.5 *`` :func:`attention_flops` (``10 * B * H * T**2 * d``).

    >>> attention_backward_flops(1, 1, 2, 3)
    120
    >>> attention_backward_flops(1, 1, 2, 3, causal=True)
    60
    """
    return attention_flops(B, H, T, d, causal) * 5 // 2  # exactly BACKWARD_OVER_FORWARD times


DIRECTIONS = ("fwd", "bwd", "fwd+bwd")


def direction_flops(direction, B, H, T, d, causal=False):
    """FLOPs of one call in ``direction``: the forward, the backward, or both."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    forward = attention_flops(B, H, T, d, causal) if direction != "bwd" else 0
    backward = attention_backward_flops(B, H, T, d, causal) if direction != "fwd" else 0
    return forward + backward


def fused_bytes(B, H, T, d, itemsize, block_q=None):
    """Memory traffic of a fused kernel (FlashAttention, SDPA's flash/efficient/cuDNN).

    One kernel reads Q, K and V and writes O, each (B, H, T, d); the scores and
    the weights live only in on-chip memory (registers, shared memory)::

        bytes = 4 * B * H * T * d * itemsize

    That is the least it can move. A real fused kernel walks over K and V once
    for every block of ``block_q`` queries; if every one of those passes came
    from main memory rather than from cache, the traffic would be::

        bytes = (2 + 2 * ceil(T / block_q)) * B * H * T * d * itemsize

    (Q read and O written once, K and V read once per query block). The two
    bound what a fused kernel can move. A causal mask does not change the
    first count: every row of Q, K, V and O is still read or written once.
    """
    if block_q is None:
        return 4 * B * H * T * d * itemsize
    passes_over_kv = -(-T // block_q)  # ceil(T / block_q)
    return (2 + 2 * passes_over_kv) * B * H * T * d * itemsize


def naive_bytes(B, H, T, d, itemsize):
    """Memory traffic of the naive path: three kernels, matmul -> softmax -> matmul.

    1. ``S = Q K^T * scale`` reads Q and K, writes S:   ``2*B*H*T*d + B*H*T*T``
    2. ``A = softmax(S)``    reads S, writes A:         ``2*B*H*T*T``
    3. ``O = A V``           reads A and V, writes O:   ``B*H*T*T + 2*B*H*T*d``

    in elements, so in total::

        bytes = (4 * B * H * T * d + 4 * B * H * T**2) * itemsize

    The T x T matrix is written twice and read twice; for T much larger than
    d that term dominates. This is still a lower bound for attnlib's ``torch``
    backend: it scales S in a separate kernel (another read and write of the
    T x T matrix), applies a causal mask in another, and for float16/bfloat16
    inputs its softmax writes float32 weights that are then cast back. A
    causal mask does not save traffic here: the full T x T matrix is computed.
    """
    vectors = 4 * B * H * T * d  # Q, K read once, V read once, O written once
    matrix = 4 * B * H * T * T  # S written and read, A written and read
    return (vectors + matrix) * itemsize


def arithmetic_intensity(flops, n_bytes):
    """FLOPs per byte moved. Above a device's ridge point (see
    :func:`attnlib.bench.devices.ridge_point`) a kernel can be limited by
    compute; below it, by memory bandwidth."""
    return flops / n_bytes
