"""FlexAttention's ``score_mod`` and ``mask_mod`` on attnlib's backends, and rows with no key.

:func:`attnlib.attention` comes here when it is given a ``score_mod``, a
``mask_mod`` or a ``block_mask``, or ``empty_rows="zero"`` (see
:mod:`attnlib.mods`). A key must be allowed by everything at once: ``mask``,
``causal``, ``window`` and ``mask_mod``. Then, per backend:

- ``numpy``, ``torch``: the matrix form, ``softmax(mask(score_mod(Q K^T * scale))) V``,
  with the mods called once on the whole (..., T_q, T_k) grid of indices;
- ``loop``: the same, one query row at a time;
- ``tiled``: online softmax over blocks (as :mod:`.tiled`), the mods called
  on each block's indices; with a ``block_mask`` only the key blocks it lists
  are visited, and its full blocks skip the mask_mod;
- ``triton``: the gallery's mods run inside the kernels of :mod:`.triton_flex`,
  forward and backward, visiting only the tiles a block mask lists (one is made
  from the mods when none is given); anything else, or mods with a ``mask``,
  goes the way of ``sdpa``;
- ``sdpa``: the mask_mod becomes a boolean mask and an additive score_mod
  (:func:`attnlib.mods.alibi`, :func:`attnlib.mods.additive`) an additive mask,
  both (..., T_q, T_k); any other score_mod is refused.

A query row left with no key gets output 0 and sends no gradient anywhere
(SDPA's and FlexAttention's answer) when ``empty_rows="zero"``; with the default
``"raise"`` it is a :class:`~attnlib.errors.MaskError`.
"""

import math

import numpy as np

from ..arrays import is_tensor, torch_module
from ..errors import DTypeError, MaskError, ShapeError
from ..masks import causal_offset

MATERIALIZED = ("sdpa", "triton")  # backends that get the mods as a (..., T_q, T_k) mask
NATIVE = ("numpy", "loop", "torch", "tiled")  # backends that call score_mod themselves


def _shape(x):
    return tuple(int(n) for n in np.shape(x)) if not is_tensor(x) else tuple(int(n) for n in x.shape)


def _call(which, function, args, kind):
    try:
        return function(*args)
    except Exception as exc:  # a mod that cannot run on these arrays: say which and on what
        shapes = ", ".join(str(_shape(a)) for a in args)
        arrays = "torch tensors" if kind == "torch" else "NumPy arrays"
        raise TypeError(f"{which} raised {type(exc).__name__}: {exc}; it was called with {arrays} of shapes "
                        f"{shapes} (broadcasting integer indices b, h, q_idx, kv_idx); write it with "
                        "elementwise operations that work on those") from exc


def _kind_of(x):
    return "torch" if is_tensor(x) else "numpy"


def evaluate_mask_mod(mask_mod, b, h, q_idx, kv_idx, shape):
    """``mask_mod(b, h, q_idx, kv_idx)`` checked (booleans, broadcastable to ``shape``) and broadcast."""
    kind = _kind_of(q_idx)
    result = _call("mask_mod", mask_mod, (b, h, q_idx, kv_idx), kind)
    if isinstance(result, (bool, np.bool_)):
        result = torch_module().tensor(bool(result), device=q_idx.device) if kind == "torch" else np.bool_(result)
    if _kind_of(result) != kind or not hasattr(result, "dtype"):
        raise TypeError(f"mask_mod returned {type(result).__name__} when called with "
                        f"{'torch tensors' if kind == 'torch' else 'NumPy arrays'}; it must return the same kind")
    is_bool = result.dtype == torch_module().bool if kind == "torch" else result.dtype == np.bool_
    if not is_bool:
        raise DTypeError(f"mask_mod returned dtype {result.dtype} (shape {_shape(result)}); it must return "
                         "booleans, True where a query may attend a key (e.g. q_idx >= kv_idx)")
    return _broadcast("mask_mod", result, shape, kind)


def _broadcast(which, result, shape, kind):
    try:
        fits = tuple(np.broadcast_shapes(_shape(result), tuple(shape))) == tuple(shape)
    except ValueError:
        fits = False
    if not fits:
        raise ShapeError(f"{which} returned shape {_shape(result)}, which does not broadcast to the scores' "
                         f"shape {tuple(shape)} (batch..., T_q, T_k): index the arguments elementwise")
    return result.expand(*shape) if kind == "torch" else np.broadcast_to(result, tuple(shape))


def evaluate_score_mod(score_mod, score, b, h, q_idx, kv_idx):
    """``score_mod(score, b, h, q_idx, kv_idx)`` checked (a float array of the score's shape)."""
    kind = _kind_of(score)
    result = _call("score_mod", score_mod, (score, b, h, q_idx, kv_idx), kind)
    if _kind_of(result) != kind or not hasattr(result, "dtype"):
        raise TypeError(f"score_mod returned {type(result).__name__} for a score of kind {kind}; it must "
                        "return the same kind of array (NumPy in, NumPy out; a tensor in, a tensor out)")
    floating = result.is_floating_point() if kind == "torch" else np.issubdtype(result.dtype, np.floating)
    if not floating:
        raise DTypeError(f"score_mod returned dtype {result.dtype} (shape {_shape(result)}); it must return "
                         "floating-point scores")
    result = _broadcast("score_mod", result, _shape(score), kind)
    return result.to(score.dtype) if kind == "torch" else result.astype(score.dtype, copy=False)


class Mods:
    """Everything that decides which keys a query sees, and how its scores are changed.

    Holds the score_mod, mask_mod and block_mask, the causal alignment and window,
    and the user's mask (broadcast to the scores' shape), and applies them to any
    block of scores: :meth:`apply`. ``group`` is G under ``enable_gqa`` (the batch
    shape then ends in (H_kv, G), and head h is ``h_kv * G + g``).
    """

    def __init__(self, score_mod, mask_mod, block_mask, mask, causal, window, batch_shape, t_q, t_k,
                 group=None, like=None):
        self.score_mod, self.mask_mod, self.block_mask = score_mod, mask_mod, block_mask
        self.causal, self.window = causal, window
        self.batch_shape, self.t_q, self.t_k, self.group = tuple(batch_shape), t_q, t_k, group
        self.offset = causal_offset(t_q, t_k, causal) if causal else 0
        self.kind = _kind_of(like)
        self.device = like.device if self.kind == "torch" else None
        self.mask = mask
        # int64 arrays of the batch shape (tensors on the inputs' device for torch: no host copy)
        self.b, self.h = batch_indices(self.batch_shape, group, self._arange)

    def _arange(self, start, stop):
        if self.kind == "torch":
            torch = torch_module()
            return torch.arange(start, stop, dtype=torch.int64, device=self.device)
        return np.arange(start, stop, dtype=np.int64)

    def indices(self, batch, i0, i1, j0, j1):
        """``(b, h, q_idx, kv_idx)`` for rows i0:i1 and keys j0:j1 of the whole batch (``batch`` None)
        or of one batch entry (an index tuple), shaped to broadcast against that block of scores."""
        if batch is None:
            b, h = self.b[..., None, None], self.h[..., None, None]
        else:
            b, h = self.b[batch].reshape(1, 1), self.h[batch].reshape(1, 1)
        return b, h, self._arange(i0, i1).reshape(-1, 1), self._arange(j0, j1).reshape(1, -1)

    def batch_head(self, batch):
        """``(b, h)`` as ints for one batch entry (an index tuple)."""
        return int(self.b[batch]), int(self.h[batch])

    def apply(self, s, batch, i0, i1, j0, j1, full=False):
        """The scores ``s`` of rows i0:i1, keys j0:j1 with score_mod applied and every dropped key -inf.

        ``full``: the block mask says every key of the block is allowed by the mask_mod, which is
        then not called. Returns ``(new scores, scores before score_mod or None)``.
        """
        b, h, q_idx, kv_idx = self.indices(batch, i0, i1, j0, j1)
        raw = None
        if self.score_mod is not None:
            raw = s
            s = evaluate_score_mod(self.score_mod, s, b, h, q_idx, kv_idx)
        keep = None
        if self.causal:
            keep = kv_idx <= q_idx + self.offset
            if self.window is not None:
                keep = keep & (kv_idx > q_idx + self.offset - self.window)
        if self.mask_mod is not None and not full:
            allowed = evaluate_mask_mod(self.mask_mod, b, h, q_idx, kv_idx, _shape(s))
            keep = allowed if keep is None else keep & allowed
        if self.mask is not None:
            block = self.mask[..., i0:i1, j0:j1] if batch is None else self.mask[batch][..., i0:i1, j0:j1]
            if self._is_bool(block):
                keep = block if keep is None else keep & block
            else:
                s = s + block.to(s.dtype) if self.kind == "torch" else s + block
        if keep is not None:
            if self.kind == "torch":
                s = s.masked_fill(~keep.expand(s.shape), float("-inf"))
            else:
                s = np.where(keep, s, -np.inf).astype(s.dtype, copy=False)
        return s, raw

    def _is_bool(self, x):
        return x.dtype == torch_module().bool if self.kind == "torch" else x.dtype == np.bool_

    def score_derivative(self, raw, batch, i0, i1, j0, j1):
        """d score_mod(s) / d s at the raw scores ``raw`` (NumPy): the mod's own ``derivative`` if it
        has one, else torch.autograd on a float64 copy (the mod must then run on tensors)."""
        b, h, q_idx, kv_idx = (np.asarray(x) for x in self.indices(batch, i0, i1, j0, j1))
        own = getattr(self.score_mod, "derivative", None)
        if own is not None:
            return np.broadcast_to(np.asarray(own(raw, b, h, q_idx, kv_idx), dtype=raw.dtype), raw.shape)
        torch = torch_module()
        with torch.enable_grad():
            s = torch.from_numpy(np.array(raw, dtype=np.float64)).requires_grad_()
            out = evaluate_score_mod(self.score_mod, s, *(torch.from_numpy(np.ascontiguousarray(x))
                                                          for x in (b, h, q_idx, kv_idx)))
            finite = torch.isfinite(s)
            (grad,) = torch.autograd.grad(out, s, torch.ones_like(out))
        return np.where(finite.numpy(), grad.numpy(), 0.0).astype(raw.dtype)

    def key_blocks(self, batch, i0, n_q, block_size):
        """The key blocks query rows i0 : i0 + n_q visit, as ``(j0, j1, full)``: causal and window
        skipping as in :func:`.tiled.key_blocks`, then only the blocks the block mask lists."""
        from .tiled import key_blocks

        bm = self.block_mask
        for j0, j1, on_diagonal in key_blocks(i0, n_q, self.t_k, block_size, self.causal, self.t_q, self.window):
            full = False
            if bm is not None:
                b, h = self.batch_head(batch)
                where = (min(b, bm.partial.shape[0] - 1), min(h, bm.partial.shape[1] - 1),
                         i0 // block_size, j0 // block_size)
                if not (bm.partial[where] or bm.full[where]):
                    continue
                full = bool(bm.full[where]) and not on_diagonal
            yield j0, j1, full


def batch_indices(batch_shape, group=None, arange=None):
    """Integer arrays ``(b, h)`` of ``batch_shape``: the head is the last batch dimension (the last two,
    h_kv * G + g, under grouped-query attention), the batch entry the others flattened. ``arange``
    (start, stop) makes the arrays (NumPy int64 by default)."""
    arange = arange or (lambda start, stop: np.arange(start, stop, dtype=np.int64))
    batch_shape = tuple(batch_shape)
    heads = 2 if group else 1
    if len(batch_shape) < heads:
        zero = arange(0, 1).reshape(())
        return zero, zero
    lead, head_dims = batch_shape[:-heads], batch_shape[-heads:]
    n_lead = math.prod(lead)
    b = arange(0, n_lead).reshape(*lead, *(1,) * heads)
    h = arange(0, math.prod(head_dims)).reshape(*(1,) * len(lead), *head_dims)
    return b.expand(*batch_shape) if hasattr(b, "expand") else np.broadcast_to(b, batch_shape), (
        h.expand(*batch_shape) if hasattr(h, "expand") else np.broadcast_to(h, batch_shape))


# ---------------------------------------------------------------- the matrix form, NumPy and torch

def _safe_softmax_numpy(s):
    """Row softmax where a row of -inf only gives weights 0; and which rows were empty."""
    m = s.max(axis=-1, keepdims=True)
    empty = np.isneginf(m)
    e = np.exp(s - np.where(empty, 0.0, m))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1.0, total), empty[..., 0]


def numpy_forward(q, k, v, mods, scale, return_weights=False):
    """``(out, empty rows)`` of the matrix form on NumPy arrays, with the mods; float16 in float32."""
    compute = np.result_type(q.dtype, np.float32)
    s = (q.astype(compute) * compute.type(scale)) @ k.astype(compute).swapaxes(-2, -1)  # (..., T_q, T_k)
    s = np.broadcast_to(s, (*mods.batch_shape, mods.t_q, mods.t_k))
    s, _ = mods.apply(s, None, 0, mods.t_q, 0, mods.t_k)
    p, empty = _safe_softmax_numpy(s)
    if return_weights:
        return p, empty
    return p @ v.astype(compute), empty


def numpy_backward(q, k, v, d_out, mods, scale):
    """``(dq, dk, dv)`` of the matrix form on NumPy arrays, with the mods (broadcast batch shape)."""
    compute = np.result_type(q.dtype, np.float32)
    q, k, v, d_out = (x.astype(compute) for x in (q, k, v, d_out))
    raw = np.broadcast_to((q * compute.type(scale)) @ k.swapaxes(-2, -1), (*mods.batch_shape, mods.t_q, mods.t_k))
    s, _ = mods.apply(raw, None, 0, mods.t_q, 0, mods.t_k)
    p, _ = _safe_softmax_numpy(s)
    out = p @ v
    d_v = p.swapaxes(-2, -1) @ d_out
    d_p = d_out @ v.swapaxes(-2, -1)
    d_s = p * (d_p - (d_out * out).sum(axis=-1, keepdims=True))  # gradient of the modded scores
    if mods.score_mod is not None:
        d_s = d_s * mods.score_derivative(raw, None, 0, mods.t_q, 0, mods.t_k)
    return scale * (d_s @ k), scale * (d_s.swapaxes(-2, -1) @ q), d_v


def loop_forward(q, k, v, mods, scale):
    """The ``loop`` backend with the mods: one query row at a time."""
    compute = np.result_type(q.dtype, np.float32)
    shape = mods.batch_shape
    q, k, v = (np.broadcast_to(x.astype(compute), (*shape, *x.shape[-2:])) for x in (q, k, v))
    out = np.empty((*shape, mods.t_q, v.shape[-1]), dtype=compute)
    empty = np.empty((*shape, mods.t_q), dtype=bool)
    for t in range(mods.t_q):
        s = (q[..., t:t + 1, :] * compute.type(scale)) @ k.swapaxes(-2, -1)  # (..., 1, T_k)
        s, _ = mods.apply(s, None, t, t + 1, 0, mods.t_k)
        p, empty[..., t:t + 1] = _safe_softmax_numpy(s)
        out[..., t:t + 1, :] = p @ v
    return out, empty


def torch_forward(q, k, v, mods, scale, return_weights=False):
    """``(out, empty rows)`` of the matrix form in torch ops (autograd records it), scores in >= float32."""
    torch = torch_module()
    s = (q * scale) @ k.transpose(-2, -1)
    s = s.to(torch.promote_types(s.dtype, torch.float32)).expand(*mods.batch_shape, mods.t_q, mods.t_k)
    s, _ = mods.apply(s, None, 0, mods.t_q, 0, mods.t_k)
    m = s.amax(dim=-1, keepdim=True)
    empty = m == float("-inf")
    e = torch.exp(s - m.masked_fill(empty, 0.0))
    total = e.sum(dim=-1, keepdim=True)
    p = e / total.masked_fill(total == 0, 1.0)
    if return_weights:
        return p.to(q.dtype), empty[..., 0]
    return (p.to(v.dtype) @ v), empty[..., 0]


def torch_backward(q, k, v, d_out, mods, scale):
    """``(dq, dk, dv)`` by torch.autograd through :func:`torch_forward`."""
    torch = torch_module()
    with torch.enable_grad():
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        out, _ = torch_forward(q, k, v, mods, scale)
        return torch.autograd.grad(out, (q, k, v), d_out.to(out.dtype))


# ---------------------------------------------------------------- tiled: blocks, and block skipping

def tiled_forward(q, k, v, mods, scale, *, block_size=None, workers=None):
    """``(out, lse)`` by online softmax over the key blocks the mods leave (NumPy). ``lse`` is -inf
    for a row with no key, whose output is 0. With a block mask, its block size is the tiles'."""
    from .tiled import BLOCK_SIZE, run_tasks

    block_size = mods.block_mask.block_size if mods.block_mask is not None else (block_size or BLOCK_SIZE)
    compute = np.result_type(q.dtype, np.float32)
    shape, t_q, t_k = mods.batch_shape, mods.t_q, mods.t_k
    q_scaled = np.broadcast_to(q.astype(compute) * compute.type(scale), (*shape, t_q, q.shape[-1]))
    k, v = (np.broadcast_to(x.astype(compute), (*shape, t_k, x.shape[-1])) for x in (k, v))
    out = np.zeros((*shape, t_q, v.shape[-1]), dtype=compute)
    lse = np.full((*shape, t_q), -np.inf, dtype=compute)

    def run(task):
        batch, i0 = task
        i1 = min(i0 + block_size, t_q)
        m_i = np.full(i1 - i0, -np.inf, dtype=compute)
        l_i = np.zeros(i1 - i0, dtype=compute)
        acc = np.zeros((i1 - i0, v.shape[-1]), dtype=compute)
        for j0, j1, full in mods.key_blocks(batch, i0, i1 - i0, block_size):
            s = q_scaled[batch][i0:i1] @ k[batch][j0:j1].T  # (n_q, n_k)
            s, _ = mods.apply(s, batch, i0, i1, j0, j1, full=full)
            m_new = np.maximum(m_i, s.max(axis=-1))
            shift = np.where(np.isneginf(m_new), 0.0, m_new)  # a row with no key yet: exp(-inf) = 0
            p = np.exp(s - shift[:, None])
            alpha = np.exp(m_i - shift)
            l_i = alpha * l_i + p.sum(axis=-1)
            acc = acc * alpha[:, None] + p @ v[batch][j0:j1]
            m_i = m_new
        seen = l_i > 0
        out[batch][i0:i1] = np.where(seen[:, None], acc / np.where(seen, l_i, 1.0)[:, None], 0.0)
        lse[batch][i0:i1] = np.where(seen, m_i + np.log(np.where(seen, l_i, 1.0)), -np.inf)

    tasks = [(b, i0) for b in np.ndindex(*shape) for i0 in range(0, t_q, block_size)]
    run_tasks(run, tasks, workers if len(tasks) > 1 else 1)
    return out, lse


def tiled_backward(q, k, v, d_out, mods, scale, *, block_size=None, workers=None):
    """``(dq, dk, dv)`` block by block from the forward's log-sum-exp, over the same blocks (NumPy)."""
    from .tiled import BLOCK_SIZE, run_tasks

    block_size = mods.block_mask.block_size if mods.block_mask is not None else (block_size or BLOCK_SIZE)
    out, lse = tiled_forward(q, k, v, mods, scale, block_size=block_size, workers=workers)
    compute = out.dtype
    shape, t_q, t_k = mods.batch_shape, mods.t_q, mods.t_k
    q_scaled = np.broadcast_to(q.astype(compute) * compute.type(scale), (*shape, t_q, q.shape[-1]))
    k, v = (np.broadcast_to(x.astype(compute), (*shape, t_k, x.shape[-1])) for x in (k, v))
    d_out = np.broadcast_to(d_out.astype(compute), out.shape)
    delta = (d_out * out).sum(axis=-1)  # (..., T_q)
    grads = [np.zeros((*shape, *x.shape[-2:]), dtype=compute) for x in (q_scaled, k, v)]

    def run(batch):
        d_q, d_k, d_v = (g[batch] for g in grads)
        for i0 in range(0, t_q, block_size):
            i1 = min(i0 + block_size, t_q)
            rows_lse = lse[batch][i0:i1, None]
            for j0, j1, full in mods.key_blocks(batch, i0, i1 - i0, block_size):
                raw = q_scaled[batch][i0:i1] @ k[batch][j0:j1].T
                s, _ = mods.apply(raw, batch, i0, i1, j0, j1, full=full)
                p = np.where(np.isneginf(rows_lse), 0.0, np.exp(s - np.where(np.isneginf(rows_lse), 0.0, rows_lse)))
                d_v[j0:j1] += p.T @ d_out[batch][i0:i1]
                d_p = d_out[batch][i0:i1] @ v[batch][j0:j1].T
                d_s = p * (d_p - delta[batch][i0:i1, None])
                if mods.score_mod is not None:
                    d_s = d_s * mods.score_derivative(raw, batch, i0, i1, j0, j1)
                d_q[i0:i1] += scale * (d_s @ k[batch][j0:j1])
                d_k[j0:j1] += d_s.T @ q_scaled[batch][i0:i1]

    tasks = list(np.ndindex(*shape))
    run_tasks(run, tasks, workers if len(tasks) > 1 else 1)
    return tuple(grads)


# ---------------------------------------------------------------- sdpa and triton: a dense mask

def dense_mask(mods, dtype, fold_causal=False):
    """The mods as one mask of the scores' shape for a backend that takes a mask: boolean when there
    is no score_mod, else additive (the score_mod's ``bias``, -inf where a key is dropped).

    ``fold_causal``: the causal alignment and window go into the mask too (the caller then passes
    ``causal=None``). Returns None when nothing needs a mask.
    """
    torch = torch_module() if mods.kind == "torch" else None
    shape = (*mods.batch_shape, mods.t_q, mods.t_k)
    b, h, q_idx, kv_idx = mods.indices(None, 0, mods.t_q, 0, mods.t_k)
    keep = None
    if mods.mask_mod is not None:
        keep = evaluate_mask_mod(mods.mask_mod, b, h, q_idx, kv_idx, shape)
    if fold_causal and mods.causal:
        band = kv_idx <= q_idx + mods.offset
        if mods.window is not None:
            band = band & (kv_idx > q_idx + mods.offset - mods.window)
        keep = band if keep is None else keep & band
    user = mods.mask
    if user is not None and mods._is_bool(user):
        keep = user if keep is None else keep & user
        user = None
    if mods.score_mod is None and user is None:
        return None if keep is None else (keep.expand(*shape) if torch else np.broadcast_to(keep, shape))
    bias = mods.score_mod.bias(b, h, q_idx, kv_idx) if mods.score_mod is not None else 0.0
    if torch:
        bias = torch.as_tensor(bias, device=mods.device).to(dtype).expand(*shape).clone()
        if user is not None:
            bias = bias + user.to(dtype)
        return bias if keep is None else bias.masked_fill(~keep.expand(*shape), float("-inf"))
    bias = np.broadcast_to(np.asarray(bias, dtype=dtype), shape)
    if user is not None:
        bias = bias + user
    return bias if keep is None else np.where(keep, bias, -np.inf).astype(dtype)


def check_score_mod_backend(score_mod, backend):
    """A score_mod with no ``bias`` runs only where the scores are computed in Python."""
    if score_mod is not None and backend in MATERIALIZED and getattr(score_mod, "bias", None) is None:
        raise ValueError(f"backend={backend!r} runs a score_mod only when it adds a bias that does not depend "
                         f"on the score (attnlib.mods.alibi, attnlib.mods.additive(...)), as an additive mask; "
                         f"{score_mod!r} is another function. Backends that call any score_mod: "
                         f"{', '.join(NATIVE)}")


def empty_rows_of(mask, kind):
    """bool (..., T_q): the rows of a boolean or additive mask that allow no key."""
    if kind == "torch":
        allowed = mask if mask.dtype == torch_module().bool else mask > float("-inf")
        return ~allowed.any(dim=-1)
    allowed = mask if mask.dtype == np.bool_ else mask > -np.inf
    return ~allowed.any(axis=-1)


def first_empty_row(empty, kind):
    """The index tuple of the first True in ``empty`` (a host read), or None."""
    if kind == "torch":
        if not bool(empty.any()):
            return None
        return tuple(int(i) for i in torch_module().nonzero(empty)[0].tolist())
    if not empty.any():
        return None
    return tuple(int(i) for i in np.argwhere(empty)[0])


def raise_empty_row(where, mods, score_shape):
    """The MaskError for a query row left with no key, naming what was combined."""
    parts = [name for name, present in (("mask", mods.mask is not None), ("mask_mod", mods.mask_mod is not None),
                                        (f"causal={mods.causal!r}", bool(mods.causal)),
                                        (f"window={mods.window}", mods.window is not None)) if present]
    what = " and ".join(parts) if parts else "the inputs"
    raise MaskError(f"{what} together leave query row {where[-1]} (index {where} of the scores' rows, score "
                    f"shape {tuple(score_shape)}) with no key to attend to; its softmax would be 0/0. Allow "
                    "at least one key per query, or pass empty_rows='zero' for SDPA's answer (output 0, "
                    "no gradient)")


# ---------------------------------------------------------------- the entry points attention() calls

def check_mods(score_mod, mask_mod, block_mask):
    """Check the three arguments; return ``(score_mod, mask_mod, block_mask)``, the mask_mod taken
    from the block mask when only that is given (as FlexAttention does)."""
    from ..block_mask import as_numpy_block_mask

    for name, fn, signature in (("score_mod", score_mod, "(score, b, h, q_idx, kv_idx) -> score"),
                                ("mask_mod", mask_mod, "(b, h, q_idx, kv_idx) -> bool")):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a function {signature} or None, got {type(fn).__name__} {fn!r}")
    if score_mod is not None and getattr(score_mod, "kind", "score") == "mask":
        raise TypeError(f"score_mod got {score_mod!r}, a mask_mod (b, h, q_idx, kv_idx) -> bool; pass it as "
                        "mask_mod=")
    if mask_mod is not None and getattr(mask_mod, "kind", "mask") == "score":
        raise TypeError(f"mask_mod got {mask_mod!r}, a score_mod (score, b, h, q_idx, kv_idx) -> score; pass "
                        "it as score_mod=")
    if block_mask is not None:
        block_mask = as_numpy_block_mask(block_mask)
        if mask_mod is None:
            mask_mod = block_mask.mask_mod
        elif mask_mod is not block_mask.mask_mod:
            raise ValueError(f"mask_mod {mask_mod!r} is not the one block_mask was made from "
                             f"({block_mask.mask_mod!r}); pass block_mask alone, or the same function")
    return score_mod, mask_mod, block_mask


def check_block_mask_shape(block_mask, batch_shape, t_q, t_k, group):
    """The block mask's (B, H, T_q, T_k) must fit the scores' (B or 1, H or 1, T_q, T_k)."""
    if block_mask is None:
        return
    heads = 2 if group else 1
    n_b = math.prod(batch_shape[:-heads]) if len(batch_shape) > heads else 1
    n_h = math.prod(batch_shape[-heads:]) if len(batch_shape) >= heads else 1
    B, H, T_q, T_k = block_mask.shape
    if (T_q, T_k) != (t_q, t_k) or B not in (1, n_b) or H not in (1, n_h):
        raise ShapeError(f"block_mask was made for (B, H, T_q, T_k) = {block_mask.shape} but the scores have "
                         f"B={n_b}, H={n_h}, T_q={t_q}, T_k={t_k} (B and H may be 1 in the block mask); make "
                         f"it with attnlib.block_mask(mask_mod, {n_b}, {n_h}, {t_q}, {t_k})")


def can_have_empty_rows(mask, mask_mod, causal, window, shapes):
    return (mask is not None or mask_mod is not None or window is not None
            or (causal == "bottom-right" and shapes.t_q > shapes.t_k))


def _as_kind(arrays, backend_kind):
    torch = torch_module()
    out = []
    for a in arrays:
        if a is None or _kind_of(a) == backend_kind:
            out.append(a)
        elif backend_kind == "torch":
            out.append(torch.from_numpy(np.ascontiguousarray(a)))
        else:
            raise TypeError("this backend computes on NumPy arrays but got torch tensors; use backend='torch', "
                            "'sdpa' or 'triton', or pass tensor.numpy()")
    return out


def _full_mask(mask, shapes, kind):
    if mask is None:
        return None
    shape = (*shapes.batch_shape, shapes.t_q, shapes.t_k)
    return mask.expand(*shape) if kind == "torch" else np.broadcast_to(mask, shape)


def forward(name, module, q, k, v, mask, causal, window, scale, shapes, score_mod, mask_mod, block_mask,
            empty_rows, group=None, weights=False):
    """attention() (or attention_weights(), ``weights=True``) with mods or empty_rows="zero",
    on validated inputs; returns the backend's result (its array kind)."""
    from ..validation import check_mask, checking_values

    zero = empty_rows == "zero"
    check_block_mask_shape(block_mask, shapes.batch_shape, shapes.t_q, shapes.t_k, group)
    backend_kind = module.ARRAY_KIND
    q, k, v, mask = _as_kind([q, k, v, mask], backend_kind)
    if name in NATIVE or weights:
        mods = Mods(score_mod, mask_mod, block_mask, _full_mask(mask, shapes, backend_kind), causal, window,
                    shapes.batch_shape, shapes.t_q, shapes.t_k, group, like=q)
        if weights:
            result, empty = (torch_forward if backend_kind == "torch" else numpy_forward)(
                q, k, v, mods, scale, return_weights=True)
        elif name == "tiled":
            result, lse = tiled_forward(q, k, v, mods, scale)
            empty = np.isneginf(lse)
        else:
            result, empty = {"numpy": numpy_forward, "loop": loop_forward, "torch": torch_forward}[name](
                q, k, v, mods, scale)
        if not zero and checking_values():
            where = first_empty_row(empty, backend_kind)
            if where is not None:
                raise_empty_row(where, mods, shapes.score_shape)
        return result.to(q.dtype) if backend_kind == "torch" else result.astype(q.dtype, copy=False)
    if name == "triton":
        refuse_user_functions(score_mod, mask_mod)
    if name == "triton" and mask is None:  # the gallery's mods inside the kernel, with block skipping
        out = _triton_in_kernel(q, k, v, causal, window, scale, shapes, score_mod, mask_mod, block_mask, zero,
                                group)
        if out is not None:
            return out
    if name not in MATERIALIZED:  # triton-simple
        raise ValueError(f"backend={name!r} takes no mask, mask_mod, score_mod or block_mask (nor rows with no "
                         f"key); backends that take them: {', '.join(NATIVE + MATERIALIZED)}")
    check_score_mod_backend(score_mod, name)
    mods = Mods(score_mod, mask_mod, block_mask, mask, causal, window, shapes.batch_shape, shapes.t_q,
                shapes.t_k, group, like=q)
    if zero and can_have_empty_rows(mask, mask_mod, causal, window, shapes):
        dense, empty = _dense_without_empty_rows(mods, q.dtype)
        out = module.forward(q, k, v, dense, None, scale)
        return out.masked_fill(empty[..., None], 0.0)
    dense = dense_mask(mods, q.dtype, fold_causal=window is not None)
    if dense is not None and not zero:
        try:
            check_mask(dense, shapes, backend_kind, causal=causal)
        except MaskError as exc:
            raise MaskError(f"{exc} (mask_mod, mask, causal and window combined)") from None
    return module.forward(q, k, v, dense, None if window is not None else causal, scale)


def _dense_without_empty_rows(mods, dtype):
    """The mods as one mask with causal and window folded in, each empty row opened to every key (so
    the backend computes finite numbers there, which the caller replaces by 0), and the empty rows."""
    dense = dense_mask(mods, dtype, fold_causal=True)
    if dense is None:  # bottom-right with T_q > T_k and nothing else: fold_causal made a band, never None
        raise AssertionError("no mask to open")
    empty = empty_rows_of(dense, mods.kind)
    if mods._is_bool(dense):
        dense = dense | empty[..., None]
    elif mods.kind == "torch":
        dense = dense.masked_fill(empty[..., None], 0.0)
    else:
        dense = np.where(empty[..., None], 0.0, dense).astype(dense.dtype)
    return dense, empty


def backward(name, backward_function, backend_kind, q, k, v, d_out, mask, causal, window, scale, shapes,
             score_mod, mask_mod, block_mask, empty_rows, group=None):
    """attention_backward() with mods or empty_rows="zero"; returns (dq, dk, dv) of the broadcast batch
    shape, in the backend's kind (the caller sums them back to the inputs' shapes)."""
    from ..validation import check_mask, checking_values

    zero = empty_rows == "zero"
    check_block_mask_shape(block_mask, shapes.batch_shape, shapes.t_q, shapes.t_k, group)
    q, k, v, d_out, mask = _as_kind([q, k, v, d_out, mask], backend_kind)
    if name in NATIVE:
        mods = Mods(score_mod, mask_mod, block_mask, _full_mask(mask, shapes, backend_kind), causal, window,
                    shapes.batch_shape, shapes.t_q, shapes.t_k, group, like=q)
        if not zero and checking_values():  # the forward finds the empty rows
            if name == "tiled":
                empty = np.isneginf(tiled_forward(q, k, v, mods, scale)[1])
            else:
                empty = (torch_forward if backend_kind == "torch" else numpy_forward)(q, k, v, mods, scale)[1]
            where = first_empty_row(empty, backend_kind)
            if where is not None:
                raise_empty_row(where, mods, shapes.score_shape)
        if name == "tiled":
            return tiled_backward(q, k, v, d_out, mods, scale)
        return (torch_backward if backend_kind == "torch" else numpy_backward)(q, k, v, d_out, mods, scale)
    if name == "triton":
        refuse_user_functions(score_mod, mask_mod)
    if name == "triton" and mask is None:  # the gallery's mods inside the kernels, with block skipping
        grads = _triton_in_kernel_backward(q, k, v, d_out, causal, window, scale, shapes, score_mod, mask_mod,
                                           block_mask, zero, group)
        if grads is not None:
            return grads
    check_score_mod_backend(score_mod, name)
    mods = Mods(score_mod, mask_mod, block_mask, mask, causal, window, shapes.batch_shape, shapes.t_q,
                shapes.t_k, group, like=q)
    if zero and can_have_empty_rows(mask, mask_mod, causal, window, shapes):
        dense, empty = _dense_without_empty_rows(mods, q.dtype)
        d_out = d_out.expand(*shapes.batch_shape, shapes.t_q, d_out.shape[-1]).masked_fill(empty[..., None], 0.0)
        return backward_function(q, k, v, d_out, dense, None, scale)
    dense = dense_mask(mods, q.dtype, fold_causal=window is not None)
    if dense is not None and not zero:
        try:
            check_mask(dense, shapes, backend_kind, causal=causal)
        except MaskError as exc:
            raise MaskError(f"{exc} (mask_mod, mask, causal and window combined)") from None
    return backward_function(q, k, v, d_out, dense, None if window is not None else causal, scale)


# ---------------------------------------------------------------- triton: the gallery inside the kernel

def _is_library_mod(mod):
    """True for a mod of :mod:`attnlib.mods` (or varlen's), combinations of them included."""
    if getattr(mod, "params", {}).get("varlen_tables"):
        return True
    if type(mod).__module__ != "attnlib.mods":
        return False
    parts = mod.params.get("mods") if getattr(mod, "name", None) in ("and_masks", "or_masks") else None
    return parts is None or all(_is_library_mod(part) for part in parts)


def refuse_user_functions(score_mod, mask_mod):
    """backend="triton" compiles the gallery's mods into its kernel; a Python function of one's own it
    cannot run: a ValueError that names the backends that take one."""
    for role, mod in (("mask_mod", mask_mod), ("score_mod", score_mod)):
        if mod is not None and not _is_library_mod(mod):
            takes = "numpy, loop, torch and tiled (any function), sdpa (as a dense mask)" if role == "mask_mod" \
                else "numpy, loop, torch and tiled (any function), sdpa (an additive one, as a dense mask)"
            raise ValueError(f"backend='triton' runs the mods of attnlib.mods inside its kernel, but {role}="
                             f"{getattr(mod, '__name__', mod)!r} is a Python function of your own, which it "
                             f"cannot run; backends that take it: {takes}")


def _triton_in_kernel(q, k, v, causal, window, scale, shapes, score_mod, mask_mod, block_mask, zero, group):
    """The output of :mod:`.triton_flex`'s kernel, or None when it cannot run these mods (the caller then
    passes them to the FlashAttention kernel as a dense mask)."""
    from ..validation import checking_values
    from . import triton_flex

    spec = triton_flex.kernel_spec(score_mod, mask_mod, causal, window, shapes.t_q, shapes.t_k, group)
    if spec is None or (block_mask is not None and block_mask.block_size not in triton_flex.TILES):
        return None
    block_mask = _kernel_block_mask(spec, q, shapes, causal, window, mask_mod, block_mask, group)
    mods = Mods(score_mod, mask_mod, block_mask, None, causal, window, shapes.batch_shape, shapes.t_q, shapes.t_k,
                group, like=q)
    out, lse = TritonFlex.apply(q, k, v, spec, block_mask, scale, mods)
    if not zero and checking_values():
        where = first_empty_row(lse == float("-inf"), "torch")
        if where is not None:
            raise_empty_row(where, mods, shapes.score_shape)
    return out


def _kernel_block_mask(spec, q, shapes, causal, window, mask_mod, block_mask, group=None):
    """The block mask the mod kernel walks: the caller's, or one made from the mods (with causal and
    window folded in) at the kernel's tile."""
    from ..block_mask import block_mask as make_block_mask
    from ..mods import and_masks, causal as causal_mod, sliding_window
    from . import triton_flex

    if block_mask is None or causal:
        parts = [m for m in (mask_mod,) if m is not None]
        if causal:
            parts.append(sliding_window(window) if window is not None else causal_mod())
        if not parts:  # a score_mod alone: every tile is full
            parts.append(lambda b, h, q_idx, kv_idx: (q_idx >= 0) & (kv_idx >= 0))
        combined = parts[0] if len(parts) == 1 else and_masks(*parts)
        per_batch = spec["HAS_DOC"] and spec["doc"].ndim == 2 or spec["HAS_PREFIX"] and spec["prefix"].size > 1
        heads = 2 if group else 1
        n_b = math.prod(shapes.batch_shape[:-heads]) if len(shapes.batch_shape) > heads else 1
        block_mask = make_block_mask(combined, n_b if per_batch else None, None, shapes.t_q, shapes.t_k,
                                     block_size=block_mask.block_size if block_mask is not None
                                     else triton_flex.tile_for(q.dtype)[0])
    return block_mask


def _triton_flex_function():
    torch = torch_module()
    from . import triton_backward, triton_flash, triton_flex

    class TritonFlexFunction(torch.autograd.Function):
        """:mod:`.triton_flex`'s forward with :mod:`.triton_backward`'s kernels, the mods as a dense mask."""

        @staticmethod
        def forward(ctx, q, k, v, spec, bm, scale, mods):
            batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
            q4, k4, v4 = (triton_flash._as_4d(x, batch_shape) for x in (q, k, v))
            ctx.n_kv = batch_shape[-2] if mods.group else 1  # grouped: (..., H_kv, G) views
            out, lse = triton_flex.forward_with_lse(q4, k4, v4, spec, bm, scale, ctx.n_kv)
            out = out.to(q.dtype)
            ctx.save_for_backward(q4, k4, v4, out, lse)
            ctx.scale, ctx.mods, ctx.batch_shape, ctx.spec, ctx.bm = scale, mods, batch_shape, spec, bm
            ctx.shapes = (q.shape, k.shape, v.shape)
            shape = (*batch_shape, q.shape[-2])
            return out.reshape(*shape, v.shape[-1]), lse.reshape(shape)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, d_out, _d_lse):
            q4, k4, v4, out, lse = ctx.saved_tensors
            d_out4 = triton_flash._as_4d(d_out, ctx.batch_shape)
            grads = triton_flex.grads_from_lse(q4, k4, v4, out, lse, d_out4, ctx.spec, ctx.bm, ctx.scale,
                                               ctx.n_kv)
            dq, dk, dv = triton_backward._to_input_shapes(grads, ctx.shapes, ctx.batch_shape, q4.dtype)
            return dq, dk, dv, None, None, None, None

    return TritonFlexFunction


class _Lazy:
    """TritonFlex.apply(...), the autograd Function made on first use (it imports torch and triton)."""

    function = None

    def apply(self, *args):
        if _Lazy.function is None:
            _Lazy.function = _triton_flex_function()
        return _Lazy.function.apply(*args)


TritonFlex = _Lazy()


def _triton_in_kernel_backward(q, k, v, d_out, causal, window, scale, shapes, score_mod, mask_mod, block_mask,
                               zero, group):
    """``(dq, dk, dv)`` (broadcast batch shape) from :mod:`.triton_flex`'s kernels, or None when they cannot
    run these mods."""
    from ..validation import checking_values
    from . import triton_flash, triton_flex

    spec = triton_flex.kernel_spec(score_mod, mask_mod, causal, window, shapes.t_q, shapes.t_k, group)
    if spec is None or (block_mask is not None and block_mask.block_size not in triton_flex.TILES):
        return None
    block_mask = _kernel_block_mask(spec, q, shapes, causal, window, mask_mod, block_mask, group)
    batch_shape = tuple(shapes.batch_shape)
    q4, k4, v4, d4 = (triton_flash._as_4d(x, batch_shape) for x in (q, k, v, d_out))
    n_kv = batch_shape[-2] if group else 1  # grouped: (..., H_kv, G) views
    out, lse = triton_flex.forward_with_lse(q4, k4, v4, spec, block_mask, scale, n_kv)
    if not zero and checking_values():
        where = first_empty_row(lse.reshape(*batch_shape, -1) == float("-inf"), "torch")
        if where is not None:
            mods = Mods(score_mod, mask_mod, block_mask, None, causal, window, batch_shape, shapes.t_q,
                        shapes.t_k, group, like=q)
            raise_empty_row(where, mods, shapes.score_shape)
    grads = triton_flex.grads_from_lse(q4, k4, v4, out.to(q.dtype), lse, d4, spec, block_mask, scale, n_kv)
    return tuple(g.reshape(*batch_shape, *g.shape[-2:]) for g in grads)
