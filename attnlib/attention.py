"""Scaled dot-product attention: ``softmax(Q K^T / sqrt(d_k) + mask) V``.

:func:`attention` checks its inputs once and hands them to one of several
backends that compute the same thing in different ways (see
:mod:`attnlib.backends`). :func:`attention_weights` returns the attention
matrix A itself, for plotting and for teaching.
"""

import contextlib
import importlib
import importlib.util
import os

import numpy as np

from .arrays import as_arrays, is_tensor, torch_available, torch_module
from .backends.numpy_matrix import masked_scores
from .errors import MaskError, NonFiniteError
from .gqa import check_gqa_heads, group_heads
from .masks import causal_alignment, check_window, with_window
from .softmax import stable_softmax
from .validation import (all_finite, check_backend, check_empty_rows, check_mask, check_mask_gradient, check_qkv,
                         check_scale, check_window_rows, checking_values, dtype_name)

_BACKEND_MODULES = {
    "numpy": "attnlib.backends.numpy_matrix",
    "loop": "attnlib.backends.loop",
    "torch": "attnlib.backends.torch_naive",
    "sdpa": "attnlib.backends.sdpa",
    "tiled": "attnlib.backends.tiled",
    "triton": "attnlib.backends.triton_autograd",
    "triton-simple": "attnlib.backends.triton_simple",
}

_LOADED = {}  # backend name -> its imported module


def _triton_usable():
    """Triton is installed, and there is a GPU or the CPU interpreter is switched on."""
    if importlib.util.find_spec("triton") is None or not torch_available():
        return False
    return os.environ.get("TRITON_INTERPRET") == "1" or torch_module().cuda.is_available()


def _usable(name):
    """Can backend ``name`` run here? NumPy backends always can, without importing torch."""
    if name in ("torch", "sdpa"):
        return torch_available()
    if name in ("triton", "triton-simple"):
        return _triton_usable()
    return name in _BACKEND_MODULES


def backends():
    """The names of the backends that can run on this machine, readable ones first."""
    return [name for name in ("numpy", "loop", "tiled", "torch", "sdpa", "triton-simple", "triton") if _usable(name)]


def backend_module(name):
    """The module implementing backend ``name``; a ValueError lists the valid names."""
    if not isinstance(name, str) or not _usable(name):
        raise ValueError(f"unknown or unavailable backend {name!r}; available here: {backends()}")
    module = _LOADED.get(name)
    if module is None:
        module = _LOADED[name] = _import_backend(name)
    return module


def _import_backend(name):
    """Import backend ``name``'s module with import statements, which torch.compile can trace
    (it refuses ``importlib.import_module``); the names are those of ``_BACKEND_MODULES``."""
    if name == "numpy":
        from .backends import numpy_matrix as module
    elif name == "loop":
        from .backends import loop as module
    elif name == "torch":
        from .backends import torch_naive as module
    elif name == "sdpa":
        from .backends import sdpa as module
    elif name == "tiled":
        from .backends import tiled as module
    elif name == "triton":
        from .backends import triton_autograd as module
    else:
        from .backends import triton_simple as module
    assert module.__name__ == _BACKEND_MODULES[name], (name, module.__name__)
    return module


def _to_backend_kind(arrays, kind, backend_kind, backend):
    """Convert NumPy inputs for a torch backend; refuse tensors for a NumPy backend."""
    if kind == backend_kind:
        return arrays
    if backend_kind == "numpy":
        raise TypeError(
            f"backend {backend!r} computes on NumPy arrays but got torch tensors; "
            "use backend='torch' or 'sdpa', or pass tensor.numpy()"
        )
    torch = torch_module()
    return [None if a is None else torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]


def attention(q, k, v, *, mask=None, causal=False, scale=None, backend=None, window=None,
              enable_gqa=False, score_mod=None, mask_mod=None, block_mask=None, empty_rows="raise"):
    """Scaled dot-product attention.

    Parameters
    ----------
    q : array or tensor, shape (..., T_q, d_k)
        Queries, one row per token. Leading (batch, head) dimensions broadcast.
    k : array or tensor, shape (..., T_k, d_k)
    v : array or tensor, shape (..., T_k, d_v)
    mask : array or tensor, optional
        Broadcastable to (..., T_q, T_k). Boolean: True where a query *may
        attend* to a key (SDPA's convention). Float: added to the scores
        (0 keeps a key, -inf drops it). A float tensor mask that requires grad
        gets its gradient from ``torch`` and ``sdpa``; ``triton`` computes none
        and raises a ValueError (pass ``mask.detach()``).
    causal : bool or str
        Let each query attend only to the keys up to its own position (a decoder,
        as in GPT). ``True`` or ``"top-left"``: query i sees keys j <= i, the
        alignment of PyTorch's ``is_causal=True``. ``"bottom-right"``: the last
        query lines up with the last key, so query i sees keys
        j <= i + T_k - T_q (flash_attn's alignment, what decoding with a KV cache
        needs: one new query over T cached keys sees all of them). The two agree
        when T_q == T_k. ``False`` or ``None``: no causal mask.
    scale : float, optional
        Multiplies the scores; defaults to ``1 / sqrt(d_k)``. A positive, finite
        real number: a Python or NumPy int or float, or a 0-d array or tensor.
        Strings, bools and complex numbers raise a TypeError; 0, negative
        numbers, inf and NaN a ValueError saying why
        (:func:`attnlib.validation.check_scale`).
    backend : str, optional
        One of :func:`backends`. Defaults to ``"numpy"`` for NumPy input and
        ``"torch"`` for tensors.
    window : int, optional
        A sliding window: each query sees at most the ``window`` most recent keys
        its causal alignment allows, keys ``i + offset - window < j <= i + offset``.
        Needs ``causal``. The ``tiled`` backend skips the key blocks outside the
        window; the others apply it as a mask.
    enable_gqa : bool
        Grouped-query attention (SDPA's name and meaning): q has H heads at
        dimension -3, k and v have H_kv, H divisible by H_kv, and query head h
        uses key/value head ``h // (H / H_kv)``. Nothing is copied (see
        :mod:`attnlib.gqa`). A mask then broadcasts to (..., H, T_q, T_k).
    score_mod : function ``(score, b, h, q_idx, kv_idx) -> score``, optional
        FlexAttention's: rewrites each scaled score before the softmax (see
        :mod:`attnlib.mods`: :func:`~attnlib.mods.alibi`, :func:`~attnlib.mods.soft_cap`).
        Called with arrays of the input's kind: integer indices that broadcast
        against the scores (``h`` the head, dimension -3; ``b`` the batch entry).
        ``numpy``, ``loop``, ``torch`` and ``tiled`` call any score_mod;
        ``triton`` runs the gallery's (ALiBi, soft cap) in its kernel and any
        that adds a bias (``mods.additive``) as a mask; ``sdpa`` only the
        latter.
    mask_mod : function ``(b, h, q_idx, kv_idx) -> bool``, optional
        FlexAttention's: True where a query may attend a key. It combines with
        ``mask``, ``causal`` and ``window``: a key must be allowed by all.
        ``triton`` runs the gallery's mask_mods (and-ed) in a kernel of its own
        (:mod:`attnlib.backends.triton_flex`) that skips the key tiles no query
        of a tile sees; other functions, or any mask_mod with a ``mask``, become
        a (..., T_q, T_k) boolean mask.
    block_mask : attnlib.BlockMask, optional
        From :func:`attnlib.block_mask`; its mask_mod is used (pass the same
        function as ``mask_mod``, or none). ``tiled`` and ``triton`` visit only
        the key blocks it lists (``tiled`` in tiles of its block size); the
        others apply the mask_mod.
    empty_rows : "raise" or "zero"
        What a query left with no key gets: a MaskError (the default), or, with
        ``"zero"``, output 0 and no gradient, as SDPA and FlexAttention answer
        (e.g. the padding rows of a left-padded batch).

    Returns
    -------
    Same kind as the input, shape (..., T_q, d_v): NumPy in, NumPy out; a
    tensor in, a tensor out on the same device with the same dtype.

    Raises
    ------
    ShapeError, MaskError, NonFiniteError (ValueError)
        Shapes that do not fit, a mask that leaves a query no key, NaN or inf
        in an input, or scores too large for the dtype (finite inputs whose
        q . k overflows).
    DTypeError, MixedArrayTypesError, DeviceError (TypeError)
        Integer or complex arrays, big-endian or ``np.longdouble`` arrays,
        NumPy and torch mixed, or tensors on the ``meta`` device (no values).
        A NumPy masked array raises a TypeError too: pass its data and a
        boolean ``mask`` instead.

    Python lists (and tuples) are accepted anywhere an array is, and become
    float64 NumPy arrays (a list of bools, a boolean mask).
    """
    q, k, v, mask = as_arrays(q=q, k=k, v=v, mask=mask)
    causal = causal_alignment(causal)
    window = check_window(window, causal)
    score_mod, mask_mod, block_mask, zero = check_mod_arguments(score_mod, mask_mod, block_mask, empty_rows)
    ungroup = group = None
    if check_enable_gqa(enable_gqa):  # q (..., H_kv, G, T_q, d); k and v (..., H_kv, 1, T_k, d): views
        group = gqa_group(q, k, v)
        q, k, v, mask, _, ungroup = group_heads(q, k, v, mask)
    kind, shapes = check_qkv(q, k, v)
    mask = check_mask(mask, shapes, kind, causal=causal, dtype=q.dtype, rows=not zero)
    if not zero:
        check_window_rows(shapes, causal, window)
    scale = check_scale(scale, shapes.d_k)
    name = check_backend(backend) or ("torch" if kind == "torch" else "numpy")
    check_mask_gradient(mask, name)  # the triton kernels give no gradient for a mask
    module = backend_module(name)
    if name == "triton-simple" and window is not None:
        raise ValueError(f"the triton-simple backend takes no sliding window (got window={window}): its kernel "
                         "knows only causal=; use backend='triton'")
    if uses_mods(score_mod, mask_mod, block_mask, zero):  # FlexAttention's mods, or zeros for empty rows
        from .backends import flex

        with quiet_overflow(kind, module.ARRAY_KIND):
            out = flex.forward(name, module, q, k, v, mask, causal, window, scale, shapes, score_mod, mask_mod,
                               block_mask, empty_rows, group)
        if kind == "numpy" and is_tensor(out):
            out = out.numpy()
        check_scores_fit("attention", out, q.dtype, kind)
        return out if ungroup is None else ungroup(out)
    mask, window_option = window_arguments(mask, shapes, kind, causal, window, q, native=skips_window(module))
    q_b, k_b, v_b, mask_b = _to_backend_kind([q, k, v, mask], kind, module.ARRAY_KIND, name)
    with quiet_overflow(kind, module.ARRAY_KIND):  # overflow is reported below, in words
        out = module.forward(q_b, k_b, v_b, mask_b, causal, scale, **window_option)
    if kind == "numpy" and is_tensor(out):
        out = out.numpy()
    check_scores_fit("attention", out, q.dtype, kind)
    return out if ungroup is None else ungroup(out)  # (..., H, T_q, d_v)


def check_mod_arguments(score_mod, mask_mod, block_mask, empty_rows):
    """``(score_mod, mask_mod, block_mask, zero)`` checked; ``zero`` is ``empty_rows == "zero"``."""
    zero = check_empty_rows(empty_rows) == "zero"
    if score_mod is None and mask_mod is None and block_mask is None:
        return None, None, None, zero
    from .backends.flex import check_mods

    return (*check_mods(score_mod, mask_mod, block_mask), zero)


def uses_mods(score_mod, mask_mod, block_mask, zero):
    return zero or score_mod is not None or mask_mod is not None or block_mask is not None


def gqa_group(q, k, v):
    """G = H / H_kv under enable_gqa (checked by group_heads)."""
    n_heads, n_kv_heads = check_gqa_heads(q, k, v)
    return n_heads // n_kv_heads


def quiet_overflow(*kinds):
    """NumPy's overflow warnings silenced where NumPy computes; nothing for torch alone.

    (torch.compile cannot trace ``np.errstate``, and torch does not warn.)
    """
    if "numpy" in kinds:
        return np.errstate(over="ignore", invalid="ignore")
    return contextlib.nullcontext()


def check_enable_gqa(enable_gqa):
    """``enable_gqa`` must be a bool (a string such as "False" would read as true)."""
    if not isinstance(enable_gqa, (bool, np.bool_)):
        raise TypeError(f"enable_gqa must be True or False, got {enable_gqa!r}")
    return bool(enable_gqa)


def skips_window(module):
    """Does backend ``module`` take ``window=`` itself (and skip the key blocks outside it)?"""
    return getattr(module, "SKIPS_WINDOW_BLOCKS", False)


def window_arguments(mask, shapes, kind, causal, window, like, native=False):
    """``(mask, extra keyword arguments)`` that apply a sliding window on a backend.

    A backend that skips blocks itself gets ``window=W``; the others get the
    window's band folded into the mask (:func:`attnlib.masks.with_window`). A
    user's mask is always folded with the band and checked again, since the two
    together may leave a query no key.
    """
    if window is None:
        return mask, {}
    option = {"window": window} if native else {}
    if mask is None and native:
        return None, option
    user_mask = mask is not None
    mask = with_window(mask, shapes.t_q, shapes.t_k, causal, window, like)
    if user_mask:
        try:
            check_mask(mask, shapes, kind, causal=causal)
        except MaskError as exc:
            raise MaskError(f"{exc} (with window={window}, each query sees at most the {window} most "
                            "recent keys its causal alignment allows)") from None
    return mask, option


def check_scores_fit(what, result, dtype, kind):
    """Raise NonFiniteError when ``result`` of finite, validated inputs holds NaN or inf.

    The inputs were checked to be finite and the mask to leave every query a
    key, so the only way to get here is scores ``q . k * scale`` beyond the
    dtype's range: the softmax then computes inf - inf = NaN. Skipped under
    :func:`attnlib.unchecked`.
    """
    if not checking_values():
        return
    finite = all_finite(result, "torch" if is_tensor(result) else "numpy")
    if finite:
        return
    limit = float(torch_module().finfo(dtype).max) if kind == "torch" else float(np.finfo(dtype).max)
    raise NonFiniteError(
        f"{what} got finite inputs but its scores q . k * scale overflow {dtype_name(dtype)} (largest "
        f"finite value {limit:.3g}), so the result would be NaN; rescale q and k (e.g. "
        "normalise the embeddings) or compute in a wider dtype"
    )


def attention_weights(q, k, *, mask=None, causal=False, scale=None, window=None, enable_gqa=False,
                      score_mod=None, mask_mod=None, block_mask=None, empty_rows="raise"):
    """The attention matrix ``A = softmax(Q K^T * scale + mask)``; every row sums to 1.

    Parameters
    ----------
    q : array or tensor, shape (..., T_q, d_k)
    k : array or tensor, shape (..., T_k, d_k)
    mask, causal, scale, window, enable_gqa, score_mod, mask_mod, block_mask, empty_rows
        As for :func:`attention`.

    Returns
    -------
    Same kind as the input, shape (..., T_q, T_k). Row i holds how much query i
    takes from each key; masked keys get exactly 0 (and, under ``empty_rows="zero"``,
    a query with no key a row of zeros).
    """
    q, k, mask = as_arrays(q=q, k=k, mask=mask)
    causal = causal_alignment(causal)
    window = check_window(window, causal)
    score_mod, mask_mod, block_mask, zero = check_mod_arguments(score_mod, mask_mod, block_mask, empty_rows)
    ungroup = group = None
    if check_enable_gqa(enable_gqa):
        group = gqa_group(q, k, k)
        q, k, _, mask, _, ungroup = group_heads(q, k, k, mask)
    kind, shapes = check_qkv(q, k)
    mask = check_mask(mask, shapes, kind, causal=causal, dtype=q.dtype, rows=not zero)
    if not zero:
        check_window_rows(shapes, causal, window)
    scale = check_scale(scale, shapes.d_k)
    if uses_mods(score_mod, mask_mod, block_mask, zero):
        from .backends import flex

        module = backend_module("torch" if kind == "torch" else "numpy")
        with quiet_overflow(kind):
            weights = flex.forward("weights", module, q, k, k, mask, causal, window, scale, shapes, score_mod,
                                   mask_mod, block_mask, empty_rows, group, weights=True)
        check_scores_fit("attention_weights", weights, q.dtype, kind)
        return weights if ungroup is None else ungroup(weights)
    mask, _ = window_arguments(mask, shapes, kind, causal, window, q)
    if kind == "numpy":
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below, in words
            weights = stable_softmax(masked_scores(q, k, mask, causal, scale), axis=-1).astype(q.dtype)
    else:
        torch = torch_module()
        from .backends.torch_naive import masked_scores as masked_scores_torch

        scores = masked_scores_torch(q, k, mask, causal, scale)  # (..., T_q, T_k), at least float32
        weights = torch.softmax(scores, dim=-1).to(q.dtype)
    check_scores_fit("attention_weights", weights, q.dtype, kind)
    return weights if ungroup is None else ungroup(weights)  # (..., H, T_q, T_k)
