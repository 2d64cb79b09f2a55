"""Shared test helpers: an independent float64 reference and input generators."""

import math

import numpy as np
import pytest


def reference_attention(q, k, v, *, mask=None, causal=False, scale=None):
    """Attention in float64 with explicit loops over queries and keys.

    Written without attnlib, so that a bug shared by every backend still shows.
    Boolean mask: True = may attend. Float mask: added to the scores.
    causal: True or "top-left" (key j allowed for query i iff j <= i), or
    "bottom-right" (iff j <= i + T_k - T_q).
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    t_q, d_k = q.shape[-2:]
    t_k, d_v = v.shape[-2:]
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    offset = t_k - t_q if causal == "bottom-right" else 0
    q, k, v = (np.broadcast_to(a, (*batch, *a.shape[-2:])) for a in (q, k, v))
    if mask is not None:
        mask = np.broadcast_to(np.asarray(mask), (*batch, t_q, t_k))
    out = np.zeros((*batch, t_q, d_v))
    for b in np.ndindex(*batch):
        for i in range(t_q):
            scores = []
            for j in range(t_k):
                s = sum(q[b][i, c] * k[b][j, c] for c in range(d_k)) * scale
                allowed = not (causal and j > i + offset)
                if mask is not None:
                    m = mask[b][i, j]
                    if mask.dtype == np.bool_:
                        allowed = allowed and bool(m)
                    else:
                        s = s + float(m)
                scores.append(s if allowed else -math.inf)
            top = max(scores)
            exps = [0.0 if s == -math.inf else math.exp(s - top) for s in scores]
            total = sum(exps)
            out[b][i] = sum(e / total * v[b][j] for j, e in enumerate(exps))
    return out


def random_qkv(rng, batch=(), t_q=5, t_k=7, d_k=3, d_v=4, dtype=np.float64):
    q = rng.standard_normal((*batch, t_q, d_k)).astype(dtype)
    k = rng.standard_normal((*batch, t_k, d_k)).astype(dtype)
    v = rng.standard_normal((*batch, t_k, d_v)).astype(dtype)
    return q, k, v


def random_bool_mask(rng, shape, causal=False):
    """A random "may attend" mask in which every query keeps at least one key.

    Key 0 is always kept: it is allowed under a causal mask too.
    """
    mask = rng.random(shape) < 0.6
    mask[..., 0] = True
    return mask


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def make_nbval_commands(target):
    """The nbval commands ``make -n target`` prints, each on one line (continuations joined)."""
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("needs make")
    printed = subprocess.run(["make", "-n", "--no-print-directory", target],
                             cwd=Path(__file__).resolve().parent.parent,
                             capture_output=True, text=True, check=True).stdout
    return [line for line in printed.replace("\\\n", " ").splitlines() if "--nbval" in line]
