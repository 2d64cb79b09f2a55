"""Where a token is: sinusoidal position vectors and rotary position embedding (RoPE).

Attention by itself ignores order: permute the tokens and its outputs permute
with them. A model learns order only from something that depends on position.
Three answers, in the order they appeared:

- learned position vectors, one trainable row per position, added to the token
  embeddings (chapter 7's models, and :class:`attnlib.learn.transformer.Decoder`
  with ``positions="learned"``);
- fixed sinusoidal vectors added the same way, :func:`sinusoidal_positions`
  (Vaswani et al., 2017, "Attention Is All You Need", section 3.5);
- rotary position embedding, :func:`rope` (Su et al., 2021, "RoFormer"): nothing
  is added to the tokens; instead each head's queries and keys are rotated, pair
  of features by pair of features, by angles proportional to their position.
  A query rotated by ``m * theta`` dotted with a key rotated by ``n * theta``
  equals the unrotated pair with the key rotated by ``(n - m) * theta``, so a
  score depends on the two positions only through their offset ``n - m``.

Both functions take NumPy arrays or torch tensors and return the same kind;
the torch path is differentiable.
"""

import numpy as np

from .arrays import array_kind, as_array, torch_module
from .errors import ShapeError
from .validation import check_finite, check_float

ROPE_STYLES = ("half", "interleaved")


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_base(base):
    if isinstance(base, bool) or not isinstance(base, (int, float, np.integer, np.floating)) or not base > 1:
        raise ValueError(f"base must be a real number greater than 1, got {base!r}")
    if not np.isfinite(base):
        raise ValueError(f"base must be finite, got {base!r}")
    return float(base)


def sinusoidal_positions(T, d, *, base=10000.0):
    """The position vectors of "Attention Is All You Need": sines at even features, cosines at odd.

    ``P[t, 2i] = sin(t * w_i)`` and ``P[t, 2i + 1] = cos(t * w_i)``, with
    ``w_i = base ** (-2i / d)``: pair i turns around a circle at its own speed,
    from once every ``2 pi`` positions (i = 0) to once every ``2 pi * base``.

    Parameters
    ----------
    T : int
        Number of positions, 0 ... T - 1.
    d : int
        Width of each vector (d_model). An odd d ends with a lone sine.
    base : float
        Sets the slowest frequency; 10000 in the paper.

    Returns
    -------
    ndarray, shape (T, d), float64. Every entry lies in [-1, 1], and each pair
    (sin, cos) has norm 1.
    """
    T, d, base = _positive_int("T", T), _positive_int("d", d), _check_base(base)
    angles = np.arange(T)[:, None] * base ** (-np.arange(0, d, 2) / d)  # (T, 1) * (ceil(d/2),)
    table = np.empty((T, d))
    table[:, 0::2] = np.sin(angles)  # features 0, 2, 4, ...
    table[:, 1::2] = np.cos(angles[:, : d // 2])  # features 1, 3, 5, ...
    return table


def rope_angles(positions, d, base=10000.0):
    """Angle of every feature pair at every position: ``positions[..., None] * base ** (-2i / d)``.

    ``positions`` is a float64 array or tensor (..., T); the result is (..., T, d/2),
    the same kind, fastest-turning pair first.
    """
    frequencies = base ** (-np.arange(0, d, 2) / d)  # (d/2,)
    if isinstance(positions, np.ndarray):
        return positions[..., None] * frequencies  # (..., T, 1) * (d/2,) -> (..., T, d/2)
    torch = torch_module()
    return positions[..., None] * torch.as_tensor(frequencies, device=positions.device)


def rope(x, positions=None, *, base=10000.0, style="half"):
    """Rotary position embedding: rotate each pair of features of ``x`` by its position's angle.

    Feature pair i of the row at position m is turned by the angle
    ``m * base ** (-2i / d)``:
    ``(a, b) -> (a cos - b sin, a sin + b cos)``. Applied to a head's queries
    and keys (not its values), it makes the score of a query at m and a key at n
    depend on m and n only through ``n - m`` (Su et al., 2021).

    Parameters
    ----------
    x : array or tensor, shape (..., T, d)
        Queries or keys, one row per position; d must be even.
    positions : array, tensor or list, optional
        The position of each row, shape (T,) or any shape that broadcasts to
        ``x.shape[:-1]`` and ends in T. Defaults to 0, 1, ..., T - 1. Whole
        numbers or floats; a cached decoder passes the positions of the new tokens.
    base : float
        Sets the slowest angle; 10000 as in RoFormer and Llama.
    style : {"half", "interleaved"}
        Which features form a pair. ``"half"`` pairs feature i with i + d/2
        (GPT-NeoX, and Llama as Hugging Face stores it); ``"interleaved"`` pairs
        2i with 2i + 1 (the RoFormer paper, and Meta's reference Llama code, which
        rotates through complex numbers). The two are the same rotation with the
        features listed in another order: Hugging Face's Llama conversion permutes
        each head's columns of W_Q and W_K (rows, in PyTorch's (out, in) layout) so
        that ``"half"`` gives the scores ``"interleaved"`` gives with the original
        weights.

    Returns
    -------
    Same kind, shape and dtype as ``x``: NumPy in, NumPy out; a tensor in, a tensor
    out (differentiable). The angles are computed in float64, then cast to x's dtype.

    Raises
    ------
    ShapeError
        An odd d, x with fewer than 2 dimensions, or positions whose shape does
        not end in T or does not broadcast to ``x.shape[:-1]``.
    ValueError
        An unknown ``style``, a ``base`` not greater than 1, positions that are not finite.
    TypeError
        An integer ``x``, or NumPy mixed with torch.
    """
    x = as_array(x, "x")
    kind = array_kind(x=x)
    check_float("x", x, kind)
    if x.ndim < 2:
        raise ShapeError(f"x must be (..., T, d), got shape {tuple(x.shape)}")
    *_, T, d = (int(s) for s in x.shape)
    if d % 2:
        raise ShapeError(f"rope rotates pairs of features, so d must be even; x has shape {tuple(x.shape)}, d={d}")
    if style not in ROPE_STYLES:
        raise ValueError(f"style must be one of {ROPE_STYLES}, got {style!r}")
    base = _check_base(base)
    positions = _check_positions(positions, x, kind)  # float64, broadcasts to (..., T)
    angles = rope_angles(positions, d, base)  # (..., T, d/2)
    if kind == "numpy":
        cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    else:
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    return rotate_pairs(x, cos, sin, style)


def rotate_pairs(x, cos, sin, style="half"):
    """Turn each feature pair (a, b) of ``x`` into ``(a cos - b sin, a sin + b cos)``.

    x : (..., T, d); cos, sin : (..., T, d/2), one angle per pair. NumPy or torch.
    """
    if style == "interleaved":  # pairs (2i, 2i + 1): the same turns, another order
        return _rotate_interleaved(x, cos, sin)
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]  # (..., T, d/2) each: pair i is (a_i, b_i)
    concatenate = np.concatenate if isinstance(x, np.ndarray) else torch_module().cat
    return concatenate((a * cos - b * sin, a * sin + b * cos), -1)  # (..., T, d)


def _rotate_interleaved(x, cos, sin):
    """``rotate_pairs`` with feature 2i paired with 2i + 1."""
    stack = np.stack if isinstance(x, np.ndarray) else torch_module().stack
    a, b = x[..., 0::2], x[..., 1::2]  # (..., T, d/2) each
    turned = stack((a * cos - b * sin, a * sin + b * cos), -1)  # (..., T, d/2, 2)
    return turned.reshape(x.shape)  # (..., T, d)


def _check_positions(positions, x, kind):
    """``positions`` as float64 of x's kind, shape ending in T and broadcasting to x.shape[:-1]."""
    T = int(x.shape[-2])
    if positions is None:
        if kind == "numpy":
            return np.arange(T, dtype=np.float64)
        torch = torch_module()
        return torch.arange(T, dtype=torch.float64, device=x.device)
    positions = as_array(positions, "positions")
    if array_kind(positions=positions) != kind:
        if kind == "numpy":
            array_kind(x=x, positions=positions)  # raises MixedArrayTypesError, naming both
        torch = torch_module()
        positions = torch.as_tensor(np.asarray(positions), device=x.device)
    if kind == "numpy":
        real = positions.dtype.kind in "iuf"
    else:
        real = positions.dtype != torch_module().bool and not positions.dtype.is_complex
    if not real:
        raise TypeError(f"positions must hold real numbers, got dtype {positions.dtype} "
                        f"with shape {tuple(positions.shape)}")
    shape = tuple(int(s) for s in positions.shape)
    lead = tuple(int(s) for s in x.shape[:-1])
    try:
        fits = len(shape) >= 1 and shape[-1] == T and np.broadcast_shapes(shape, lead) == lead
    except ValueError:
        fits = False
    if not fits:
        raise ShapeError(
            f"positions must have shape (T,) = ({T},) or a shape ending in T that broadcasts to "
            f"x.shape[:-1] = {lead}; got positions of shape {shape} for x of shape {tuple(x.shape)}"
        )
    if kind == "numpy":
        positions = positions.astype(np.float64)
    else:
        positions = positions.to(dtype=torch_module().float64, device=x.device)
    check_finite("positions", positions, kind)
    return positions
