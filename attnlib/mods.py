"""Masks and scores as functions: FlexAttention's ``mask_mod`` and ``score_mod``, and a gallery.

FlexAttention (PyTorch's ``torch.nn.attention.flex_attention``) describes a
variant of attention by two small functions of the indices:

- ``mask_mod(b, h, q_idx, kv_idx) -> bool``: True where query ``q_idx`` of
  batch entry ``b``, head ``h`` *may attend* to key ``kv_idx``.
- ``score_mod(score, b, h, q_idx, kv_idx) -> score``: the scaled score
  ``q . k * scale`` rewritten before the softmax (a bias added, a cap applied).

attnlib calls them with integer index arrays (NumPy arrays for NumPy input,
tensors for torch input) that broadcast against each other and against
``score``, so a mod written with elementwise operations (``&``, ``|``, ``==``,
``+``, ``*``, indexing a lookup table by an index) works on every backend. The
functions below build the mods the book uses; each returns a callable with a
readable ``repr``:

- :func:`causal`, :func:`sliding_window`, :func:`document` (packed sequences),
  :func:`prefix_lm` and :func:`attention_sinks` are ``mask_mod`` s;
- :func:`alibi` and :func:`soft_cap` are ``score_mod`` s; :func:`additive` turns a
  bias ``f(b, h, q_idx, kv_idx)`` into a score_mod;
- :func:`and_masks` and :func:`or_masks` combine mask_mods (as torch's do).

Indices: ``h`` is the head (dimension -3 of q), ``b`` the batch entry (the
dimensions before it, flattened); inputs with no head dimension have b = h = 0.
They are int64. On tensors, torch turns ``index * 0.1`` into float32 (NumPy
keeps float64): multiply the score in first (``0.1 * (h * score)``) where the
float64 digits matter.
"""

import sys

import numpy as np

from .arrays import is_tensor, torch_module


class _Table:
    """A lookup table (document ids, slopes) kept as a NumPy array and, once torch is loaded, a CPU
    tensor, so that a mod traced by torch (FlexAttention's vmap and dynamo) only moves it to a device."""

    def __init__(self, values):
        self.numpy = values.detach().cpu().numpy() if is_tensor(values) else np.asarray(values)
        self._cpu = None
        if "torch" in sys.modules:
            self._cpu = sys.modules["torch"].from_numpy(np.ascontiguousarray(self.numpy))

    def like(self, index):
        """The table as the kind (and device) of ``index``."""
        if isinstance(index, (np.ndarray, np.generic, int)):
            return self.numpy
        if self._cpu is None:
            self._cpu = torch_module().from_numpy(np.ascontiguousarray(self.numpy))
        return self._cpu if index.device.type == "cpu" else self._cpu.to(index.device)

    def __repr__(self):
        return f"<array of shape {self.numpy.shape}>"

    @property
    def shape(self):
        return self.numpy.shape

    @property
    def ndim(self):
        return self.numpy.ndim


def _like(table, index):
    return table.like(index)


def _tanh(x):
    return torch_module().tanh(x) if is_tensor(x) else np.tanh(x)


class Mod:
    """A named mask_mod or score_mod. ``kind`` is "mask" or "score"."""

    kind = "mask"

    def __init__(self, name, function, **params):
        self.name, self.function, self.params = name, function, params

    def __call__(self, b, h, q_idx, kv_idx):  # four named arguments: torch's flex_attention counts them
        return self.function(b, h, q_idx, kv_idx)

    def __repr__(self):
        listed = ", ".join(f"{k}={_short(v)}" for k, v in self.params.items())
        return f"{self.name}({listed})"


def _short(value):
    if is_tensor(value) or isinstance(value, np.ndarray):
        return f"<array of shape {tuple(int(n) for n in value.shape)}>"
    return repr(value)


class ScoreMod(Mod):
    """A score_mod. ``bias(b, h, q_idx, kv_idx)`` is set when it adds a bias that does not depend
    on the score (the backends that take an additive mask, ``sdpa`` and ``triton``, can run it), and
    ``derivative(score, b, h, q_idx, kv_idx)`` gives d(new score)/d(score) for the NumPy backward."""

    kind = "score"

    def __init__(self, name, function, bias=None, derivative=None, **params):
        super().__init__(name, function, **params)
        self.bias, self.derivative = bias, derivative

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.function(score, b, h, q_idx, kv_idx)


def _positive_int(name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def causal():
    """Query i sees keys j <= i (top-left, as ``causal=True``)."""
    return Mod("causal", lambda b, h, q_idx, kv_idx: q_idx >= kv_idx)


def sliding_window(window):
    """Causal, and each query sees at most its ``window`` most recent keys: ``i - window < j <= i``.

    The same keys as ``causal=True, window=window``.
    """
    window = _positive_int("window", window)
    return Mod("sliding_window", lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx < window),
               window=window)


def document(doc_ids, doc_ids_k=None):
    """Packed sequences: a query sees only the keys of its own document.

    ``doc_ids`` holds each position's document number, shape (T,) (one packing
    for the whole batch) or (B, T) (one per batch entry); ``doc_ids_k`` the keys'
    when they differ from the queries' (defaults to ``doc_ids``). Combine with
    :func:`causal` (``and_masks``) for packed decoder training.
    """
    doc_ids = _Table(_doc_table("doc_ids", doc_ids))
    doc_ids_k = doc_ids if doc_ids_k is None else _Table(_doc_table("doc_ids_k", doc_ids_k))

    def mask_mod(b, h, q_idx, kv_idx):
        ids_q, ids_k = _like(doc_ids, q_idx), _like(doc_ids_k, kv_idx)
        if ids_q.ndim == 1:
            return ids_q[q_idx] == ids_k[kv_idx]
        return ids_q[b, q_idx] == ids_k[b, kv_idx]

    return Mod("document", mask_mod, doc_ids=doc_ids)


def _doc_table(name, ids):
    if not (is_tensor(ids) or isinstance(ids, np.ndarray)):
        ids = np.asarray(ids)
    kind_ok = (not ids.dtype.is_floating_point and not ids.dtype.is_complex and ids.dtype != torch_module().bool
               if is_tensor(ids) else ids.dtype.kind in "iu")
    if not kind_ok or ids.ndim not in (1, 2):
        raise ValueError(f"{name} must be an integer array of shape (T,) or (B, T), got dtype {ids.dtype} "
                         f"and shape {tuple(int(n) for n in ids.shape)}")
    return ids


def prefix_lm(prefix_length):
    """Prefix-LM: every query sees the first ``prefix_length`` keys (the prompt, bidirectional),
    and the keys up to its own position (causal). ``prefix_length``: an int, or one per batch
    entry (shape (B,))."""
    table = None if isinstance(prefix_length, (int, np.integer)) else _Table(prefix_length)
    if table is None and prefix_length < 0:
        raise ValueError(f"prefix_length must be at least 0, got {prefix_length!r}")

    def mask_mod(b, h, q_idx, kv_idx):
        prefix = prefix_length if table is None else _like(table, b)[b]
        return (kv_idx < prefix) | (q_idx >= kv_idx)

    return Mod("prefix_lm", mask_mod, prefix_length=prefix_length)


def attention_sinks(n_sinks, window):
    """StreamingLLM (Xiao et al. 2023): causal, each query sees its ``window`` most recent keys and
    the first ``n_sinks`` keys (the attention sinks), whatever its position."""
    n_sinks, window = _positive_int("n_sinks", n_sinks), _positive_int("window", window)

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & ((kv_idx < n_sinks) | (q_idx - kv_idx < window))

    return Mod("attention_sinks", mask_mod, n_sinks=n_sinks, window=window)


def alibi_slopes(n_heads):
    """ALiBi's head slopes (Press et al. 2022): ``2 ** (-8 (h + 1) / n_heads)``, shape (n_heads,)."""
    n_heads = _positive_int("n_heads", n_heads)
    return 2.0 ** (-8.0 * np.arange(1, n_heads + 1) / n_heads)


def alibi(slopes):
    """ALiBi: score + slope[h] * (kv_idx - q_idx), a penalty growing with the distance.

    ``slopes``: one per head (shape (H,)), or an int H for :func:`alibi_slopes` (H).
    """
    if isinstance(slopes, (int, np.integer)) and not isinstance(slopes, bool):
        slopes = alibi_slopes(slopes)
    slopes = np.asarray(slopes.detach().cpu() if is_tensor(slopes) else slopes, dtype=np.float64)
    if slopes.ndim != 1:
        raise ValueError(f"slopes must have shape (H,), got {slopes.shape}")
    table = _Table(slopes)

    def bias(b, h, q_idx, kv_idx):
        return _like(table, h)[h] * (kv_idx - q_idx)

    return ScoreMod("alibi", lambda score, b, h, q_idx, kv_idx: score + bias(b, h, q_idx, kv_idx), bias=bias,
                    derivative=lambda score, *idx: 1.0, slopes=slopes)


def soft_cap(cap):
    """Soft-capping (Gemma 2, Grok): ``cap * tanh(score / cap)``, every score kept in (-cap, cap)."""
    if isinstance(cap, (bool, np.bool_)) or not isinstance(cap, (int, float, np.integer, np.floating)) \
            or not np.isfinite(cap) or cap <= 0:
        raise ValueError(f"cap must be a positive finite number, got {cap!r}")
    cap = float(cap)

    def derivative(score, b, h, q_idx, kv_idx):
        return 1.0 - _tanh(score / cap) ** 2

    return ScoreMod("soft_cap", lambda score, b, h, q_idx, kv_idx: cap * _tanh(score / cap),
                    derivative=derivative, cap=cap)


def additive(bias, name="additive"):
    """A score_mod that adds ``bias(b, h, q_idx, kv_idx)`` to the score; ``sdpa`` and ``triton``
    run it as an additive mask."""
    if not callable(bias):
        raise TypeError(f"bias must be a function bias(b, h, q_idx, kv_idx), got {type(bias).__name__}")
    return ScoreMod(name, lambda score, b, h, q_idx, kv_idx: score + bias(b, h, q_idx, kv_idx), bias=bias,
                    derivative=lambda score, *idx: 1.0, bias_function=getattr(bias, "__name__", "bias"))


def and_masks(*mask_mods):
    """A mask_mod that allows a key when every one of ``mask_mods`` does."""
    def mask_mod(b, h, q_idx, kv_idx):
        result = mask_mods[0](b, h, q_idx, kv_idx)
        for other in mask_mods[1:]:
            result = result & other(b, h, q_idx, kv_idx)
        return result

    _check_mods(mask_mods, "and_masks")
    return Mod("and_masks", mask_mod, mods=list(mask_mods))


def or_masks(*mask_mods):
    """A mask_mod that allows a key when any one of ``mask_mods`` does."""
    def mask_mod(b, h, q_idx, kv_idx):
        result = mask_mods[0](b, h, q_idx, kv_idx)
        for other in mask_mods[1:]:
            result = result | other(b, h, q_idx, kv_idx)
        return result

    _check_mods(mask_mods, "or_masks")
    return Mod("or_masks", mask_mod, mods=list(mask_mods))


def _check_mods(mods, name):
    if not mods or not all(callable(m) for m in mods):
        raise TypeError(f"{name} takes one or more mask_mod functions, got {mods!r}")


GALLERY = ("causal", "sliding_window", "document", "prefix_lm", "attention_sinks", "alibi", "soft_cap")
