"""Input checks shared by every attention function and every backend.

Attention fails quietly when its inputs are wrong: a transposed ``k`` with
d_k == T gives an answer of the right shape, and a NaN in one key spreads to
every output row. So every public entry point runs these checks first and
raises an error that names the argument and the shapes.

Mask convention (the one ``torch.nn.functional.scaled_dot_product_attention``
uses): a boolean mask is True where a query *may attend* to a key; a float mask
is added to the scores, 0 to keep a key and -inf to drop it.
"""

import contextlib
import threading
from dataclasses import dataclass

import numpy as np

from .arrays import array_kind, is_tensor, torch_module
from .errors import DeviceError, DTypeError, MaskError, MixedArrayTypesError, NonFiniteError, ShapeError
from .masks import causal_alignment, causal_offset


_STATE = threading.local()  # .unchecked: True inside `with unchecked():`, in this thread only


@contextlib.contextmanager
def unchecked():
    """Skip the checks that read values, in this thread, inside the block.

    attnlib checks every input's *values* by default: NaN or inf in ``q``, ``k``,
    ``v``, ``d_out`` or a float mask, a mask that leaves a query no key, scores
    that overflow the dtype. On a GPU each such check copies a flag to the host
    and waits for the device (a *sync*), and under ``torch.compile`` it breaks
    the graph. Inside ``with attnlib.unchecked():`` those checks are skipped;
    the checks that read only metadata (ranks, shapes, dtypes, devices, the
    kind of mask, the backend's name) still run. Bad values then give what the
    backend computes (NaN, or a row of zeros), as in PyTorch.

    Use it where you time a loop, or inside a compiled function, after the same
    inputs have been checked once. Blocks nest; the setting is restored on exit,
    also after an exception.
    """
    before = getattr(_STATE, "unchecked", False)
    _STATE.unchecked = True
    try:
        yield
    finally:
        _STATE.unchecked = before


def checking_values():
    """False inside :func:`unchecked` (in this thread), True otherwise."""
    return not getattr(_STATE, "unchecked", False)


@dataclass(frozen=True)
class AttentionShapes:
    """The sizes read off validated ``q``, ``k`` and ``v``."""

    batch_shape: tuple  # leading dims, broadcast over q, k and v
    t_q: int  # number of queries
    t_k: int  # number of keys (and values)
    d_k: int  # query/key width
    d_v: int  # value width (0 when no v was given)

    @property
    def score_shape(self):
        return (*self.batch_shape, self.t_q, self.t_k)


def _shape(x):
    return tuple(int(s) for s in x.shape)


def _is_float(x, kind):
    if kind == "torch":
        return x.is_floating_point()
    return np.issubdtype(x.dtype, np.floating)


def check_has_values(name, x, kind):
    """Raise :class:`DeviceError` for a tensor on the ``meta`` device, which holds no values."""
    if kind == "torch" and x.device.type == "meta":
        raise DeviceError(
            f"{name} (shape {_shape(x)}) is on the meta device: it has a shape but no values, so "
            "attention can neither check nor compute it; create it on 'cpu' or 'cuda'"
        )


def check_float(name, x, kind):
    """Raise unless ``x`` holds real floating-point numbers attnlib can compute with.

    :class:`DeviceError` for a tensor on the ``meta`` device; :class:`DTypeError`
    for integers, booleans and complex numbers, and for the two NumPy float
    arrays torch cannot take: big-endian ones (``'>f8'``) and ``np.longdouble``.
    """
    check_has_values(name, x, kind)
    if not _is_float(x, kind):
        raise DTypeError(
            f"{name} must be a floating-point array, got dtype {x.dtype} with shape "
            f"{_shape(x)}; convert it with .astype(np.float32) or .float()"
        )
    if kind == "numpy" and not x.dtype.isnative:
        raise DTypeError(
            f"{name} has dtype {x.dtype.str} (shape {_shape(x)}), stored in the other byte order; "
            f"attnlib computes in this machine's byte order: pass "
            f"{name}.astype({name}.dtype.newbyteorder('='))"
        )
    if kind == "numpy" and x.dtype.itemsize > 8:
        raise DTypeError(
            f"{name} has dtype {x.dtype} (np.longdouble, shape {_shape(x)}); attnlib computes in "
            f"float16, float32 or float64: pass {name}.astype(np.float64)"
        )


def all_finite(x, kind):
    """Whether every value of ``x`` is finite.

    For a torch tensor this asks whether the largest magnitude is finite: ``amax``
    propagates NaN, so that holds exactly when every value is finite, and on a CPU it
    costs a quarter of ``isfinite(x).all()`` (which a training step pays per call).
    """
    if kind == "torch":
        if x.numel() == 0 or not (x.is_floating_point() or x.is_complex()):
            return True
        return bool(torch_module().isfinite(x.detach().abs().amax()))
    return bool(np.isfinite(x).all())


def check_finite(name, x, kind):
    """Raise :class:`NonFiniteError` if ``x`` holds NaN or +-inf (skipped under :func:`unchecked`)."""
    if checking_values() and not all_finite(x, kind):
        raise NonFiniteError(
            f"{name} (shape {_shape(x)}) contains NaN or inf; attention would return "
            "NaN for every query that sees it"
        )


def check_qkv(q, k, v=None):
    """Check ranks, dtypes, finiteness and sizes of ``q``, ``k`` and ``v``.

    Parameters
    ----------
    q : array, shape (..., T_q, d_k)
    k : array, shape (..., T_k, d_k)
    v : array or None, shape (..., T_k, d_v)

    Returns
    -------
    kind : {"numpy", "torch"}
    shapes : AttentionShapes
    """
    kind = array_kind(q=q, k=k, v=v)
    named = {"q": q, "k": k} if v is None else {"q": q, "k": k, "v": v}
    for name, x in named.items():
        if x.ndim < 2:
            raise ShapeError(
                f"{name} must have at least 2 dimensions (..., T, d), got shape {_shape(x)}"
            )
    for name, x in named.items():
        check_float(name, x, kind)
    dtypes = {name: x.dtype for name, x in named.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{name} is {dt}" for name, dt in dtypes.items())
        raise DTypeError(f"q, k and v must share one dtype ({listed})")
    if q.shape[-1] != k.shape[-1]:
        raise ShapeError(
            f"k has d_k={k.shape[-1]} but q has d_k={q.shape[-1]} "
            f"(q shape {_shape(q)}, k shape {_shape(k)})"
        )
    if v is not None and v.shape[-2] != k.shape[-2]:
        raise ShapeError(
            f"v has T_k={v.shape[-2]} rows but k has T_k={k.shape[-2]}: every key needs "
            f"one value (k shape {_shape(k)}, v shape {_shape(v)})"
        )
    batch_shapes = {name: _shape(x)[:-2] for name, x in named.items()}
    try:
        batch_shape = tuple(np.broadcast_shapes(*batch_shapes.values()))
    except ValueError:
        listed = ", ".join(f"{name} {_shape(x)}" for name, x in named.items())
        raise ShapeError(
            f"the leading (batch, head) dimensions of q, k and v do not broadcast: {listed}"
        ) from None
    for name, x in named.items():
        if 0 in _shape(x)[-2:]:
            raise ShapeError(
                f"{name} has shape {_shape(x)}: its length and width must both be at least 1"
            )
    for name, x in named.items():
        check_finite(name, x, kind)
    shapes = AttentionShapes(
        batch_shape=batch_shape,
        t_q=int(q.shape[-2]),
        t_k=int(k.shape[-2]),
        d_k=int(q.shape[-1]),
        d_v=0 if v is None else int(v.shape[-1]),
    )
    return kind, shapes


def check_scale(scale, d_k):
    """Return the factor the scores are multiplied by, as a float: ``1/sqrt(d_k)`` for None.

    A scale must be a real number: a Python int or float, a NumPy real scalar or
    0-d array, or a 0-d tensor of a real dtype. Refused with a :class:`TypeError`:
    strings (``"0.5"``), bools (``True`` is not 1.0 here) and complex numbers.
    Refused with a :class:`ValueError`: 0 (every key would get the same weight,
    whatever q and k), a negative scale (it reverses the ranking: the key least
    like the query would get the most weight), inf and NaN (every score would be
    infinite or NaN).
    """
    if scale is None:
        return 1.0 / float(np.sqrt(d_k))
    value = _real_number(scale)
    if np.isnan(value):
        raise ValueError(f"scale is NaN ({scale!r}): every score would be NaN")
    if np.isinf(value):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}: every nonzero score "
                         "would be infinite and the softmax NaN")
    if value == 0:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}: a scale of 0 gives every "
                         "key the same weight whatever q and k; for the default 1/sqrt(d_k) pass "
                         "scale=None")
    if value < 0:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}: a negative scale reverses "
                         "the ranking, so the key least like the query would get the most weight")
    return value


def _real_number(scale):
    """``scale`` as a float, if it is a real number (see :func:`check_scale`); else a TypeError."""
    def refuse(what):
        return TypeError(f"scale must be a real number (a Python or NumPy float, or a 0-d tensor), "
                         f"got {what}")

    if isinstance(scale, (bool, np.bool_)):
        raise refuse(f"the bool {scale!r}")
    if isinstance(scale, (int, float, np.integer, np.floating)):
        return float(scale)
    if isinstance(scale, np.ndarray) or is_tensor(scale):
        kind = "torch" if is_tensor(scale) else "numpy"
        if scale.ndim != 0:
            raise refuse(f"an array of shape {_shape(scale)}")
        check_has_values("scale", scale, kind)
        torch = torch_module() if kind == "torch" else None
        real = (scale.dtype != torch.bool and not scale.dtype.is_complex) if torch else scale.dtype.kind in "iuf"
        if not real:
            raise refuse(f"a 0-d array of dtype {dtype_name(scale.dtype)}")
        return float(scale.item())
    if isinstance(scale, (complex, np.complexfloating)):
        raise refuse(f"the complex number {scale!r}")
    raise refuse(f"{type(scale).__name__} {scale!r}")


BACKENDS_WITHOUT_MASK_GRADIENT = ("triton",)  # their backward kernels give dq, dk and dv only


def check_mask_gradient(mask, backend):
    """Refuse a float mask that requires grad on a backend that computes no gradient for it.

    ``backend="triton"`` differentiates with its own kernels, which return the
    gradients of q, k and v only. While autograd records (``torch.is_grad_enabled()``),
    a mask that requires grad raises a :class:`ValueError` there, whether or not q,
    k and v require grad: pass ``mask.detach()``, or use ``backend="torch"`` or
    ``"sdpa"``, which differentiate through an additive mask.
    """
    if backend not in BACKENDS_WITHOUT_MASK_GRADIENT or mask is None or not is_tensor(mask):
        return
    if mask.requires_grad and torch_module().is_grad_enabled():
        raise ValueError(
            f"mask (shape {_shape(mask)}) requires grad, but backend={backend!r} computes no gradient "
            "for a mask (only for q, k and v); pass mask.detach(), or use backend='torch' or 'sdpa' "
            "to differentiate through the mask"
        )


def check_backend(backend):
    """``backend`` must be None (the default for the input kind) or a non-empty name."""
    if backend is None or (isinstance(backend, str) and backend):
        return backend
    raise ValueError(f"backend must be None or a backend name such as 'numpy', got {backend!r}")


def _mask_in_dtype(mask, kind, dtype):
    """A float mask converted to ``dtype``, the dtype every backend computes the mask in."""
    if dtype is None or mask.dtype == dtype:
        return mask
    if kind == "torch":
        return mask.to(dtype)
    with np.errstate(over="ignore"):  # overflow is reported by check_mask, in words
        return mask.astype(dtype)


def check_mask(mask, shapes, kind, causal=None, dtype=None, rows=True):
    """Check a boolean or additive float mask, and the causal alignment, against the scores.

    Parameters
    ----------
    mask : array or None
        Boolean (True = may attend) or float (added to the scores).
    shapes : AttentionShapes
    kind : {"numpy", "torch"}
    causal : None, "top-left" or "bottom-right"
        As returned by :func:`attnlib.masks.causal_alignment`.
    dtype : dtype, optional
        The inputs' dtype. A float mask is converted to it *before* it is
        checked, since that is what the backends compute with: -1e5 becomes
        -inf in float16, and 1e40 becomes inf in float32.
    rows : bool
        Check that every query row keeps a key (False under ``empty_rows="zero"``,
        where such a row gets output 0).

    Returns
    -------
    The mask, a float one converted to ``dtype``.

    Raises
    ------
    MaskError
        When the mask does not broadcast to ``(..., T_q, T_k)``, when a float
        mask holds NaN or +inf (or a value that overflows ``dtype``), or when
        some query row is left with no key it may attend to (its softmax would
        be 0/0), by the mask, by the causal alignment, or by both.
    """
    if mask is None:
        if rows and causal == "bottom-right" and shapes.t_q > shapes.t_k:
            raise MaskError(
                f"causal='bottom-right' with T_q={shapes.t_q} queries and only T_k={shapes.t_k} "
                f"keys leaves the first {shapes.t_q - shapes.t_k} query rows with no key to attend "
                "to; bottom-right alignment needs T_q <= T_k (use causal=True for top-left)"
            )
        return None
    mask_kind = array_kind(mask=mask)
    if mask_kind != kind:
        raise MixedArrayTypesError(
            f"mask is a {mask_kind} array but q, k and v are {kind} arrays; "
            "convert the mask to the same kind"
        )
    check_has_values("mask", mask, kind)
    score_shape = shapes.score_shape
    is_bool = (mask.dtype == torch_module().bool) if kind == "torch" else mask.dtype == np.bool_
    if not is_bool and not _is_float(mask, kind):
        raise DTypeError(
            f"mask must be boolean (True = may attend) or float (added to the scores), "
            f"got dtype {mask.dtype} with shape {_shape(mask)}"
        )
    try:
        broadcast = tuple(np.broadcast_shapes(_shape(mask), score_shape))
    except ValueError:
        broadcast = None
    if broadcast != score_shape:
        raise MaskError(
            f"mask of shape {_shape(mask)} does not broadcast to the score shape "
            f"{score_shape} (batch..., T_q={shapes.t_q}, T_k={shapes.t_k})"
        )
    values = checking_values()  # False under unchecked(): nothing below reads the mask's values
    if is_bool:
        allowed = mask
    else:
        if values and _has_nan_or_posinf(mask, kind):
            raise MaskError(
                f"float mask (shape {_shape(mask)}) contains NaN or +inf; use 0 to keep "
                "a key and -inf to drop it"
            )
        converted = _mask_in_dtype(mask, kind, dtype)
        if values and _has_nan_or_posinf(converted, kind):
            raise MaskError(
                f"float mask (shape {_shape(mask)}, dtype {dtype_name(mask.dtype)}) holds a value "
                f"too large for {dtype_name(dtype)}, the dtype of q, k and v, so it becomes +inf "
                "there; keep mask values within that dtype's range"
            )
        mask = converted
        if not values:
            return mask
        allowed = mask > float("-inf")
    if not values or not rows:
        return mask
    _check_every_row_has_a_key(allowed, shapes, kind, causal, converted=not is_bool and dtype is not None,
                               boolean=is_bool)
    return mask


EMPTY_ROWS = ("raise", "zero")


def check_empty_rows(empty_rows):
    """``empty_rows`` must be "raise" (a query with no key is a MaskError) or "zero" (its output is 0)."""
    if not isinstance(empty_rows, str) or empty_rows not in EMPTY_ROWS:
        raise ValueError(f"empty_rows must be 'raise' (a query left with no key is an error) or 'zero' (its "
                         f"output is 0 and it sends no gradient, as SDPA answers), got {empty_rows!r}")
    return empty_rows


def check_window_rows(shapes, causal, window):
    """Raise MaskError when ``causal`` with ``window`` leaves the last queries no key (shapes only).

    Query i sees keys ``i + offset - window < j <= i + offset``. Top-left, the
    last queries of T_q >= T_k + window see none: their window starts after the
    last key.
    """
    if window is None or not causal:
        return
    offset = causal_offset(shapes.t_q, shapes.t_k, causal)
    last = shapes.t_q - 1
    if last + offset - window + 1 > shapes.t_k - 1:
        first_empty = shapes.t_k - 1 + window - offset
        raise MaskError(
            f"causal={causal!r} with window={window} leaves query rows {first_empty}..{last} with no key: "
            f"with T_q={shapes.t_q} queries and T_k={shapes.t_k} keys, query i sees keys "
            f"i - {window} < j <= i, and for those rows that window starts "
            "after the last key. Use causal='bottom-right' (the last query lines up with the last key), or "
            "empty_rows='zero' for output 0 there"
        )


def dtype_name(dtype):
    """``float32`` for both ``np.float32`` and ``torch.float32``."""
    return str(dtype).removeprefix("torch.")


def _has_nan_or_posinf(x, kind):
    if kind == "torch":
        torch = torch_module()
        return bool((torch.isnan(x) | (x == float("inf"))).any())
    return bool((np.isnan(x) | (x == np.inf)).any())


def _check_every_row_has_a_key(allowed, shapes, kind, causal, converted=False, boolean=False):
    """Raise MaskError if some query row may attend to no key.

    When a boolean mask fails and its inverse ``~mask`` would not, the message
    asks whether the mask is in the other convention (True = blocked, as in
    ``torch.nn.MultiheadAttention``).
    """
    where = _first_empty_row(allowed, shapes, kind, causal)
    if where is None:
        return
    causal_note = f" together with causal={causal!r}" if causal else ""
    dtype_note = (" (after conversion to the dtype of q, k and v, where large negative values "
                  "become -inf)") if converted else ""
    inverted_note = ""
    if boolean and _first_empty_row(~allowed, shapes, kind, causal) is None:
        inverted_note = (". Did you mean `~mask`? attnlib's True means may attend (as in "
                         "scaled_dot_product_attention), where nn.MultiheadAttention's True means blocked, "
                         "and the inverted mask leaves every query a key")
    raise MaskError(
        f"the mask{dtype_note}{causal_note} leaves query row {where[-1] if where else 0} "
        f"(index {where} of the mask's rows, score shape {shapes.score_shape}) with no key to "
        f"attend to; its softmax would be 0/0. Allow at least one key per query, or drop that query"
        f"{inverted_note}"
    )


def _first_empty_row(allowed, shapes, kind, causal):
    """The index (in the mask's rows) of the first query row left with no key, or None.

    Works on the mask's own (possibly broadcast) shape: under a causal mask a
    row i is empty when its first allowed key comes after ``i + offset``, so no
    (T_q, T_k) array is built here even for very long sequences.
    """
    rows = allowed.shape[-2] if allowed.ndim >= 2 else 1
    offset = causal_offset(shapes.t_q, shapes.t_k, causal) if causal else 0
    if kind == "torch":
        torch = torch_module()
        empty = ~allowed.any(dim=-1)
        if causal:
            first = allowed.to(torch.uint8).argmax(dim=-1)  # index of the first allowed key
            row_index = torch.arange(shapes.t_q, device=allowed.device) if rows == shapes.t_q else 0
            empty = empty | (first > row_index + offset)
        if not bool(empty.any()):
            return None
        where = tuple(int(i) for i in torch.nonzero(empty)[0].tolist())
    else:
        empty = ~np.any(allowed, axis=-1)
        if causal:
            first = np.argmax(allowed, axis=-1)  # index of the first allowed key
            row_index = np.arange(shapes.t_q) if rows == shapes.t_q else 0
            empty = empty | (first > row_index + offset)
        if not empty.any():
            return None
        where = tuple(int(i) for i in np.argwhere(empty)[0])
    if rows == 1 and causal:  # a mask row shared by every query: the earliest query is the one left empty
        where = (*where[:-1], 0) if where else (0,)
    return where
