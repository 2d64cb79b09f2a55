"""Interactive figures that work in the static book: plain HTML, a little inline JavaScript.

Each function returns an :class:`InteractiveFigure`. A notebook cell that ends with
one shows it as HTML: tables of numbers coloured like the book's matplotlib figures,
with real HTML controls (Previous / Next buttons and a slider) or a readout of the
value under the cursor. Everything is inline: no script, stylesheet or font is
loaded from anywhere, so the figures work in the HTML book offline, with no kernel.

Why hand-written HTML rather than matplotlib's ``to_jshtml``: an animation there
is a PNG per frame (tens of kB each, text that cannot be selected or read by a
screen reader), while these tables are a few kB and show the exact numbers.

Readers of the notebook in JupyterLab see the first frame without controls, since
JupyterLab does not run scripts in untrusted notebooks; every figure therefore has
a :meth:`InteractiveFigure.static_figure`, a matplotlib version the chapter shows
beside it. The HTML is deterministic (ids are a hash of the content), so nbval can
compare it with a fresh run.

>>> from attnlib.examples import THE_CAT_SAT
>>> figure = stages(THE_CAT_SAT, token="cat")
>>> figure.frames
4
"""

import hashlib
import html
import math
from importlib import resources

import numpy as np

from attnlib.plotting import ROLE_CMAPS, SCORES_CMAP, WEIGHTS_CMAP

# The figures' stylesheet and the one piece of JavaScript every figure carries live in their
# own files beside this one (package data), read once and inlined into each figure. A figure
# with several frames gets Previous / Next buttons and a slider; a cell with data-readout
# shows its text in the readout line under the pointer (or on focus or a tap, for keyboards
# and phones). The script is a %-template: %(id)s and %(slider_label)s are filled per figure.
CSS = resources.files(__package__).joinpath("interactive.css").read_text(encoding="utf-8")
SCRIPT = resources.files(__package__).joinpath("interactive.js").read_text(encoding="utf-8").rstrip("\n")


class InteractiveFigure:
    """An interactive figure as one self-contained piece of HTML.

    Attributes
    ----------
    kind : str
        Which builder made it (``"stages"``, ``"heatmap"``, ...).
    title : str
        One line saying what the figure shows; also its ``repr``.
    frames : int
        How many frames a reader can step through (1 for a figure with a readout).
    html : str
        The HTML, inline CSS and JavaScript included.
    """

    def __init__(self, kind, title, frames_html, *, readout=None, draw_static=None, slider_label="frame",
                 start=0):
        self.kind = kind
        self.title = title
        self.frames = len(frames_html)
        if not 0 <= start < self.frames:
            raise ValueError(f"start must be a frame index from 0 to {self.frames - 1}, got {start}")
        self.start = start
        body = "".join(
            f'<div class="attn-frame" data-title="{_attr(frame_title)}"{" hidden" if k != start else ""}>'
            f"{content}</div>"
            for k, (frame_title, content) in enumerate(frames_html)
        )
        if readout is not None:
            body += f'<p class="attn-readout" aria-live="polite">{html.escape(readout)}</p>'
        digest = hashlib.sha1(f"{kind}|{title}|{body}".encode()).hexdigest()[:12]
        self.id = f"attn-{kind}-{digest}"
        script = SCRIPT % {"id": self.id, "slider_label": _attr(slider_label), "start": start}
        self.html = (
            f'<div class="attn-interactive attn-{kind}" id="{self.id}" data-frames="{self.frames}">'
            f"<style>{CSS.strip()}</style>"
            f'<p class="attn-title">{html.escape(title)}</p>{body}'
            f"<script>{script}</script></div>"
        )
        self._draw_static = draw_static

    def _repr_html_(self):
        return self.html

    def __repr__(self):
        return f"<interactive figure, {self.frames} frame{'s' * (self.frames != 1)}: {self.title}>"

    def static_figure(self):
        """The same content as a matplotlib figure, for readers of the notebook."""
        return self._draw_static()


# ---------------------------------------------------------------------------------------
# Building blocks: a matrix as a coloured HTML table.


def _attr(text):
    return html.escape(str(text), quote=True)


def _colour(cmap_name, value, vmin, vmax):
    """Background and text colour of one cell, as the matplotlib figures would draw it."""
    from matplotlib import colormaps

    if not np.isfinite(value):
        return "#ffffff", "#222222"
    t = 0.5 if vmax == vmin else (value - vmin) / (vmax - vmin)
    red, green, blue, _ = colormaps[cmap_name](float(np.clip(t, 0.0, 1.0)))
    luminance = 0.2126 * red + 0.7152 * green + 0.0722 * blue
    background = "#{:02x}{:02x}{:02x}".format(*(round(255 * c) for c in (red, green, blue)))
    return background, ("#ffffff" if luminance < 0.5 else "#000000")


def _number(value, fmt):
    if np.isneginf(value):
        return "\u2212\u221e"
    return fmt.format(value).replace("-", "\u2212")


def matrix_table(matrix, *, row_labels, col_labels, cmap, caption, fmt="{:.2f}", vmin=None,
                 vmax=None, highlight_row=None, readout=None, cell_class=None):
    """One matrix as an HTML table with coloured cells and its numbers written in them.

    ``readout(i, j, value)`` gives the text shown for a cell under the pointer;
    ``cell_class(i, j)`` an extra CSS class for a cell (or None).
    """
    matrix = np.atleast_2d(np.asarray(matrix, dtype=float))
    finite = matrix[np.isfinite(matrix)]
    vmin = float(finite.min()) if vmin is None else vmin
    vmax = float(finite.max()) if vmax is None else vmax
    head = "".join(f'<th class="attn-col" scope="col">{html.escape(str(c))}</th>' for c in col_labels)
    rows = []
    for i, label in enumerate(row_labels):
        cells = []
        for j in range(matrix.shape[1]):
            value = matrix[i, j]
            background, ink = _colour(cmap, value, vmin, vmax)
            classes = cell_class(i, j) if cell_class else None
            attrs = f' class="{classes}"' if classes else ""
            if readout:
                text = _attr(readout(i, j, value))
                attrs += f' data-readout="{text}" title="{text}"'
            cells.append(f'<td style="background:{background};color:{ink}"{attrs}>{_number(value, fmt)}</td>')
        marked = ' class="attn-hl"' if i == highlight_row else ""
        rows.append(f'<tr{marked}><th scope="row">{html.escape(str(label))}</th>{"".join(cells)}</tr>')
    return (f'<table class="attn-matrix"><caption>{caption}</caption>'
            f"<thead><tr><th></th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _row(*tables):
    return f'<div class="attn-row">{"".join(tables)}</div>'


def _caption(text):
    return f'<p class="attn-caption">{text}</p>'


def _dims(n, name="d"):
    return [f"{name}{i}" for i in range(n)]


def _softmax(x):
    z = np.exp(x - np.max(x))
    return z / z.sum()


# ---------------------------------------------------------------------------------------
# The figures.


def stages(example, token="cat"):
    """Step through the four stages of attention for one token of a running example.

    1 projections (Q, K, V from X), 2 scores (the token's query against every key),
    3 scale and softmax (scores to weights), 4 weighted sum (weights times values).
    The token's row is outlined in every matrix.
    """
    tokens = list(example.tokens)
    t = tokens.index(token)
    q, k, v, d_k = example.q, example.k, example.v, example.d_k
    scores = q @ k.T  # (T, d_k) @ (d_k, T) -> (T, T)
    scaled = scores / math.sqrt(d_k)
    weights = np.apply_along_axis(_softmax, -1, scaled)  # (T, T), rows sum to 1
    terms = weights[t][:, None] * v  # (T, d_v): row j is A[t, j] * V[j]
    output = weights @ v  # (T, T) @ (T, d_v) -> (T, d_v)
    name = f"\u201c{html.escape(token)}\u201d"

    def role_table(matrix, role, label, highlight=None, rows=None):
        return matrix_table(matrix, row_labels=rows or tokens, col_labels=_dims(matrix.shape[1]),
                            cmap=ROLE_CMAPS[role], caption=label, vmin=0.0,
                            vmax=max(1.0, float(matrix.max())), highlight_row=highlight)

    x_table = matrix_table(example.x, row_labels=tokens, col_labels=_dims(example.x.shape[1], "e"),
                           cmap="Greys", caption="X (embeddings)", vmin=0.0, vmax=2.0, highlight_row=t)
    frame_projections = (
        _caption(f"Each token's embedding (a row of X) is multiplied by three weight matrices: "
                 f"Q = X W<sub>Q</sub>, K = X W<sub>K</sub>, V = X W<sub>V</sub>. "
                 f"The row of {name} is outlined.")
        + _row(x_table, role_table(q, "query", "Q (queries)", t), role_table(k, "key", "K (keys)"),
               role_table(v, "value", "V (values)"))
    )
    score_parts = " + ".join(f"{q[t, c]:.1f}\u00b7{k[1, c]:.1f}" for c in range(d_k))
    frame_scores = (
        _caption(f"The query of {name} is compared with every key by a dot product: row {name} of "
                 f"S = Q K<sup>\u22a4</sup>. For example q<sub>{html.escape(token)}</sub> \u00b7 "
                 f"k<sub>{html.escape(tokens[1])}</sub> = {score_parts} = {scores[t, 1]:.2f}.")
        + _row(role_table(q[t:t + 1], "query", f"q ({html.escape(token)})", rows=[token]),
               role_table(k, "key", "K (keys)"),
               matrix_table(scores, row_labels=tokens, col_labels=tokens, cmap=SCORES_CMAP,
                            caption="S = Q K\u1d40", vmin=-1.0, vmax=1.0, highlight_row=t))
    )
    frame_softmax = (
        _caption(f"Divide by \u221ad<sub>k</sub> = {math.sqrt(d_k):g}, then take a softmax along the "
                 f"row: the weights of {name} are non-negative and sum to 1 "
                 f"({' + '.join(f'{w:.3f}' for w in weights[t])} = {weights[t].sum():.3f}).")
        + _row(matrix_table(np.vstack([scores[t], scaled[t]]), row_labels=["S", "S / \u221ad_k"],
                            col_labels=tokens, cmap=SCORES_CMAP, caption=f"row {name}",
                            vmin=-1.0, vmax=1.0, fmt="{:.3f}"),
               matrix_table(weights, row_labels=tokens, col_labels=tokens, cmap=WEIGHTS_CMAP,
                            caption="A = softmax(S / \u221ad_k)", vmin=0.0, vmax=1.0, fmt="{:.3f}",
                            highlight_row=t))
    )
    term_names = [f"{w:.3f}\u00b7V[{s}]" for w, s in zip(weights[t], tokens)]
    frame_sum = (
        _caption(f"The output of {name} is the weighted sum of the value rows: "
                 f"{html.escape(' + '.join(term_names))}. Every token's output is a row of O = A V.")
        + _row(matrix_table(terms, row_labels=term_names,
                            col_labels=_dims(v.shape[1]), cmap=ROLE_CMAPS["value"],
                            caption=f"terms for {name}", vmin=0.0, vmax=1.0, fmt="{:.3f}"),
               role_table(output, "value", "O = A V (outputs)", t))
    )
    frames = [
        ("projections", frame_projections),
        ("scores", frame_scores),
        ("scale and softmax", frame_softmax),
        ("weighted sum", frame_sum),
    ]
    frames = [(f"{title}", f'<p class="attn-frame-title">Stage {i} of 4: {title}</p>{content}')
              for i, (title, content) in enumerate(frames, 1)]

    def draw():
        from attnlib.plotting import plot_stages

        return plot_stages(example, token)

    return InteractiveFigure("stages", f"The four stages of attention for {token!r}, step by step",
                             frames, draw_static=draw, slider_label="stage")


def heatmap(weights, query_tokens, key_tokens=None, *, title="attention weights", annotate=None):
    """Attention weights as a heatmap whose readout names the query, the key and the weight.

    Rows are queries, columns keys. Numbers are written in the cells when ``annotate``
    (by default for at most 8 keys); the readout always gives the weight to 3 decimals.
    """
    weights = np.asarray(weights, dtype=float)
    key_tokens = list(query_tokens if key_tokens is None else key_tokens)
    query_tokens = list(query_tokens)
    if weights.shape != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"weights has shape {weights.shape} but there are {len(query_tokens)} query "
                         f"tokens and {len(key_tokens)} key tokens")
    annotate = len(key_tokens) <= 8 if annotate is None else annotate
    labels = [f"{j}" for j in range(len(key_tokens))] if not annotate else key_tokens

    def readout(i, j, value):
        return (f"query {i} \u201c{query_tokens[i]}\u201d \u2192 key {j} \u201c{key_tokens[j]}\u201d: "
                f"weight {value:.3f}")

    table = matrix_table(weights, row_labels=[f"{i} {s}" for i, s in enumerate(query_tokens)],
                         col_labels=labels if annotate else [f"{j}" for j in range(len(key_tokens))],
                         cmap=WEIGHTS_CMAP, caption="query (row) \u2192 key (column)", vmin=0.0,
                         vmax=1.0, fmt="{:.2f}" if annotate else "\u2009", readout=readout)
    legend = "" if annotate else _caption(
        "Columns are keys: " + ", ".join(f"{j} {html.escape(s)}" for j, s in enumerate(key_tokens)) + ".")
    content = legend + table

    def draw():
        from attnlib.plotting import plot_attention

        return plot_attention(weights, query_tokens, key_tokens, title=title, annotate=annotate).figure

    return InteractiveFigure("heatmap", title, [("weights", content)],
                             readout="Point at a cell (or tap it) to read its weight.", draw_static=draw)


def online_softmax_trace(scores, values, *, block_size, key_tokens, query_token):
    """Step through the online softmax of one query, one block of keys at a time.

    After each block: the running maximum ``m``, the rescale factor ``alpha = exp(m_old - m)``,
    the running sum ``l`` and the accumulator ``a`` (unnormalised output). The last frame
    compares ``a / l`` with the one-pass softmax.
    """
    scores = np.asarray(scores, dtype=float)
    values = np.asarray(values, dtype=float)
    if scores.ndim != 1 or values.shape[0] != scores.shape[0]:
        raise ValueError(f"scores must have shape (T_k,) and values (T_k, d_v), got {scores.shape} "
                         f"and {values.shape}")
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    key_tokens = list(key_tokens)
    n_keys = len(scores)
    starts = list(range(0, n_keys, block_size))
    m, l, a = -np.inf, 0.0, np.zeros(values.shape[1])
    history = []
    for b, start in enumerate(starts):
        stop = min(start + block_size, n_keys)
        block = scores[start:stop]
        m_new = max(m, float(block.max()))
        alpha = math.exp(m - m_new)  # 0 for the first block: nothing to rescale
        p = np.exp(block - m_new)  # (block,)
        l = alpha * l + float(p.sum())
        a = alpha * a + p @ values[start:stop]  # (block,) @ (block, d_v) -> (d_v,)
        history.append({"block": b, "start": start, "stop": stop, "m_old": m, "m": m_new, "alpha": alpha,
                        "l": l, "a": a.copy()})
        m = m_new
    exact = _softmax(scores) @ values
    name = html.escape(query_token)

    def scores_row(current):
        def cell_class(_i, j):
            block = j // block_size
            return "attn-current" if block == current else ("attn-pending" if block > current else None)

        return matrix_table(scores[None, :], row_labels=[f"s ({name})"], col_labels=key_tokens,
                            cmap=SCORES_CMAP, caption=f"scores of {name}, key blocks of {block_size}",
                            fmt="{:.2f}", vmin=-float(np.abs(scores).max()),
                            vmax=float(np.abs(scores).max()), cell_class=cell_class)

    def state_table(h):
        rows = [["m", h["m"]], ["\u03b1", h["alpha"]], ["\u2113", h["l"]]]
        body = "".join(f"<tr><th scope='row'>{n}</th><td>{_number(val, '{:.4f}')}</td></tr>" for n, val in rows)
        acc = " ".join(_number(x, "{:.4f}") for x in h["a"])
        body += f"<tr><th scope='row'>a</th><td>[{acc}]</td></tr>"
        return f'<table class="attn-matrix"><caption>after block {h["block"] + 1}</caption>{body}</table>'

    frames = []
    for h in history:
        keys = ", ".join(key_tokens[h["start"]:h["stop"]])
        if h["block"] == 0:
            story = (f"First block ({html.escape(keys)}): the maximum so far is m = {h['m']:.4f}. There is "
                     f"nothing to rescale yet (\u03b1 = e<sup>\u2212\u221e</sup> = 0), so \u2113 and a "
                     f"start from this block alone.")
        elif h["alpha"] < 1.0:
            story = (f"Block {h['block'] + 1} ({html.escape(keys)}) raises the maximum from "
                     f"{h['m_old']:.4f} to {h['m']:.4f}, so the old \u2113 and a are multiplied by "
                     f"\u03b1 = e<sup>{h['m_old']:.4f} \u2212 {h['m']:.4f}</sup> = {h['alpha']:.4f} "
                     f"before this block's terms are added.")
        else:
            story = (f"Block {h['block'] + 1} ({html.escape(keys)}) does not raise the maximum "
                     f"(m stays {h['m']:.4f}), so \u03b1 = 1 and its terms are simply added.")
        content = _caption(story) + _row(scores_row(h["block"]), state_table(h))
        frames.append((f"block {h['block'] + 1} of {len(history)}", content))
    last = history[-1]
    online = last["a"] / last["l"]
    final = (_caption(f"All keys seen. The output is a / \u2113; it equals the one-pass softmax "
                      f"output to within {float(np.abs(online - exact).max()):.1e}, and no row of "
                      f"{n_keys} weights was ever stored.")
             + _row(matrix_table(np.vstack([online, exact]), row_labels=["a / \u2113", "softmax(s) V"],
                                 col_labels=_dims(values.shape[1]), cmap=ROLE_CMAPS["value"],
                                 caption=f"output of {name}", fmt="{:.4f}")))
    frames.append(("a / \u2113: the output", final))
    frames = [(title, f'<p class="attn-frame-title">{html.escape(title[0].upper() + title[1:])}</p>{body}')
              for title, body in frames]

    def draw():
        from attnlib.plotting import plot_online_softmax

        return plot_online_softmax(history, key_tokens, block_size, query_token)

    return InteractiveFigure("online-softmax",
                             f"Online softmax of {query_token!r}, {len(history)} blocks of "
                             f"{block_size} keys", frames, draw_static=draw, slider_label="block")


def softmax_temperature(scores, tokens, factors=(0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0), *,
                        query_token=None, start_factor=None):
    """Slide a factor c that multiplies a row of scores and watch softmax(c * scores) sharpen.

    Small c flattens the weights towards uniform; large c pushes nearly all the weight
    onto the largest score (softmax saturates). ``start_factor``, one of ``factors``, is
    the frame the figure opens on (the first factor if None).
    """
    scores = np.asarray(scores, dtype=float)
    tokens = list(tokens)
    if scores.shape != (len(tokens),):
        raise ValueError(f"scores has shape {scores.shape} but there are {len(tokens)} tokens")
    factors = [float(c) for c in factors]
    if start_factor is None:
        start = 0
    elif not any(np.isclose(float(start_factor), c) for c in factors):
        raise ValueError(f"start_factor must be one of factors {factors}, got {start_factor}")
    else:
        start = next(k for k, c in enumerate(factors) if np.isclose(float(start_factor), c))
    who = f" of \u201c{html.escape(query_token)}\u201d" if query_token else ""
    frames = []
    for c in factors:
        weights = _softmax(c * scores)
        bars = "".join(
            f'<div class="attn-bar"><span class="attn-bar-label">{html.escape(s)}</span>'
            f'<span class="attn-bar-track"><span class="attn-bar-fill" style="display:block;'
            f'width:{100 * w:.1f}%"></span></span><span>{w:.3f}</span></div>'
            for s, w in zip(tokens, weights)
        )
        story = (f"c = {c:g}: the scores{who} become [{', '.join(f'{x:.2f}' for x in c * scores)}]; "
                 f"the largest weight is {weights.max():.3f}.")
        frames.append((f"c = {c:g}", f'<p class="attn-frame-title">softmax(c \u00b7 s), c = {c:g}</p>'
                       + _caption(story) + bars))

    def draw():
        from attnlib.plotting import plot_softmax_temperature

        return plot_softmax_temperature(scores, tokens, factors)

    return InteractiveFigure("temperature", "How a factor c on the scores sharpens the softmax",
                             frames, draw_static=draw, slider_label="factor c", start=start)
