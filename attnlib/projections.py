"""From token embeddings to queries, keys and values: ``Q = X @ W_Q``.

Row-vector convention: one row per token, so ``x`` is (..., T, d_model) and the
weights are (d_model, d_k). The column-vector form ``q_t = W_Q^T x_t`` used in
some derivations is the same computation, transposed.
"""

from .arrays import array_kind
from .errors import ShapeError
from .validation import check_finite, check_float


def project_qkv(x, w_q, w_k, w_v):
    """Project embeddings to queries, keys and values.

    Parameters
    ----------
    x : array, shape (..., T, d_model)
    w_q, w_k : array, shape (d_model, d_k)
    w_v : array, shape (d_model, d_v)

    Returns
    -------
    q, k : arrays of shape (..., T, d_k)
    v : array of shape (..., T, d_v)
    """
    kind = array_kind(x=x, w_q=w_q, w_k=w_k, w_v=w_v)
    named = {"x": x, "w_q": w_q, "w_k": w_k, "w_v": w_v}
    for name, arr in named.items():
        check_float(name, arr, kind)
        check_finite(name, arr, kind)
    if x.ndim < 2:
        raise ShapeError(f"x must be (..., T, d_model), got shape {tuple(x.shape)}")
    d_model = x.shape[-1]
    for name in ("w_q", "w_k", "w_v"):
        w = named[name]
        if w.ndim != 2 or w.shape[0] != d_model:
            raise ShapeError(
                f"{name} must be (d_model, d_out) with d_model={d_model} to match x of "
                f"shape {tuple(x.shape)}, got {name} of shape {tuple(w.shape)}"
            )
    if w_q.shape[1] != w_k.shape[1]:
        raise ShapeError(
            f"w_q gives d_k={w_q.shape[1]} but w_k gives d_k={w_k.shape[1]}; queries and "
            "keys must have one width to be dotted together"
        )
    q = x @ w_q  # (..., T, d_model) @ (d_model, d_k) -> (..., T, d_k)
    k = x @ w_k  # (..., T, d_model) @ (d_model, d_k) -> (..., T, d_k)
    v = x @ w_v  # (..., T, d_model) @ (d_model, d_v) -> (..., T, d_v)
    return q, k, v
