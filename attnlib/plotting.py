"""The book's figures: one colour per role, token names on every axis.

Queries are always blue, keys always orange, values always green, in every
chapter, so a reader can tell which matrix is which at a glance.

Importing this module sets matplotlib's text sizes for the book (:data:`BOOK_RC`):
the pages show a figure at most 752 px wide, so a figure up to about 11 inches wide
(1,100 px at 100 dpi) keeps its smallest text, 11 pt, above 9 px on the page.
"""

import matplotlib
import numpy as np

ROLE_COLORS = {"query": "#1f77b4", "key": "#ff7f0e", "value": "#2ca02c"}
ROLE_CMAPS = {"query": "Blues", "key": "Oranges", "value": "Greens"}
ROLE_PLURALS = {"query": "queries", "key": "keys", "value": "values"}
WEIGHTS_CMAP = "Purples"  # attention weights, always in [0, 1]
SCORES_CMAP = "RdBu_r"  # raw scores, centred on zero
SMALLEST_TEXT_PT = 11  # no text in a book figure is smaller than this
BOOK_RC = {
    "figure.dpi": 100,
    "font.size": 12,
    "axes.titlesize": 12,
    "axes.labelsize": 12,
    "xtick.labelsize": SMALLEST_TEXT_PT,
    "ytick.labelsize": SMALLEST_TEXT_PT,
    "legend.fontsize": SMALLEST_TEXT_PT,
    "legend.title_fontsize": SMALLEST_TEXT_PT,
    "figure.titlesize": 13,
}
matplotlib.rcParams.update(BOOK_RC)


def _pyplot():
    import matplotlib.pyplot as plt

    return plt


def plot_matrix(ax, matrix, *, row_labels=None, col_labels=None, cmap="viridis", title=None,
                annotate=True, fmt="{:.2f}", vmin=None, vmax=None, xlabel=None, ylabel=None):
    """Draw ``matrix`` as a labelled grid on ``ax``, with each cell's value written in it.

    Masked entries (-inf) are drawn blank and labelled "-inf". Returns the image.
    """
    matrix = np.asarray(matrix, dtype=float)
    shown = np.ma.masked_invalid(np.where(np.isneginf(matrix), np.nan, matrix))
    image = ax.imshow(shown, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    rows, cols = matrix.shape
    ax.set_xticks(range(cols), col_labels if col_labels is not None else range(cols))
    ax.set_yticks(range(rows), row_labels if row_labels is not None else range(rows))
    ax.tick_params(top=True, labeltop=True, bottom=False, labelbottom=False)
    if xlabel:
        ax.set_xlabel(xlabel)
        ax.xaxis.set_label_position("top")
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, pad=28 if col_labels is not None else 6)
    if annotate:
        for i in range(rows):
            for j in range(cols):
                value = matrix[i, j]
                text = "-inf" if np.isneginf(value) else fmt.format(value)
                ax.text(j, i, text, ha="center", va="center", fontsize=SMALLEST_TEXT_PT,
                        color=_text_colour(image, value))
    return image


def _text_colour(image, value):
    """White on dark cells, black on light ones, judged by the cell's own colour."""
    if not np.isfinite(value):
        return "black"
    red, green, blue, _ = image.cmap(image.norm(value))
    luminance = 0.2126 * red + 0.7152 * green + 0.0722 * blue
    return "white" if luminance < 0.5 else "black"


def plot_qkv(tokens, q, k, v, *, figsize=(11, 3)):
    """Q, K and V side by side as labelled grids, each in its role's colour."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=figsize, constrained_layout=True)
    for ax, (role, matrix, name) in zip(axes, [("query", q, "Q"), ("key", k, "K"), ("value", v, "V")]):
        dims = [f"d{i}" for i in range(np.shape(matrix)[1])]
        plot_matrix(ax, matrix, row_labels=tokens, col_labels=dims, cmap=ROLE_CMAPS[role],
                    title=f"{name} ({ROLE_PLURALS[role]})", vmin=0, vmax=max(1.0, float(np.max(matrix))))
        ax.title.set_color(ROLE_COLORS[role])
    return fig


def plot_attention(weights, query_tokens, key_tokens=None, *, ax=None, title="attention weights",
                   annotate=True):
    """Heatmap of an attention matrix: rows are queries, columns are keys, cells in [0, 1]."""
    plt = _pyplot()
    key_tokens = query_tokens if key_tokens is None else key_tokens
    if ax is None:
        size = max(3.0, 0.55 * len(key_tokens) + 1.5)
        _, ax = plt.subplots(figsize=(size + 1, size), constrained_layout=True)
    image = plot_matrix(ax, weights, row_labels=query_tokens, col_labels=key_tokens,
                        cmap=WEIGHTS_CMAP, title=title, vmin=0.0, vmax=1.0, annotate=annotate,
                        xlabel="key (attended to)", ylabel="query (attending)")
    ax.figure.colorbar(image, ax=ax, shrink=0.8)
    return ax


def _outline_row(ax, row, n_cols, colour=ROLE_COLORS["query"]):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((-0.5, row - 0.5), n_cols, 1, fill=False, edgecolor=colour, linewidth=2.5))


def plot_stages(example, token="cat", *, figsize=(10, 7.5)):
    """The four stages of attention for ``token`` as four panels: Q, S, A and O = A V.

    The static twin of :func:`attnlib.interactive.stages`; ``token``'s row is outlined.
    """
    plt = _pyplot()
    tokens = list(example.tokens)
    t = tokens.index(token)
    scores = example.q @ example.k.T  # (T, d_k) @ (d_k, T) -> (T, T)
    scaled = scores / np.sqrt(example.d_k)
    weights = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)  # (T, T), rows sum to 1
    output = weights @ example.v  # (T, T) @ (T, d_v) -> (T, d_v)
    fig, axes = plt.subplots(2, 2, figsize=figsize, constrained_layout=True)
    dims = [f"d{i}" for i in range(example.q.shape[1])]
    panels = [
        (example.q, dims, ROLE_CMAPS["query"], "1 projections: Q = X W_Q", 0.0, 1.0),
        (scores, tokens, SCORES_CMAP, "2 scores: S = Q Kᵀ", -1.0, 1.0),
        (weights, tokens, WEIGHTS_CMAP, "3 scale and softmax: A", 0.0, 1.0),
        (output, [f"d{i}" for i in range(output.shape[1])], ROLE_CMAPS["value"], "4 weighted sum: O = A V",
         0.0, 1.0),
    ]
    for ax, (matrix, cols, cmap, title, vmin, vmax) in zip(axes.flat, panels):
        plot_matrix(ax, matrix, row_labels=tokens, col_labels=cols, cmap=cmap, title=title, vmin=vmin,
                    vmax=vmax, fmt="{:.2f}")
        _outline_row(ax, t, matrix.shape[1])
    fig.suptitle(f"The four stages of attention; the row of {token!r} is outlined")
    return fig


def plot_online_softmax(history, key_tokens, block_size, query_token, *, figsize=(10, 3.6)):
    """The running maximum m, running sum l and accumulator a after each key block.

    The static twin of :func:`attnlib.interactive.online_softmax_trace`; ``history``
    holds one dict per block with keys ``m``, ``l`` and ``a``.
    """
    plt = _pyplot()
    blocks = np.arange(1, len(history) + 1)
    fig, (ax_m, ax_l, ax_a) = plt.subplots(1, 3, figsize=figsize, constrained_layout=True)
    ax_m.plot(blocks, [h["m"] for h in history], "o-", color=ROLE_COLORS["query"])
    ax_m.set_title("running max m")
    ax_l.plot(blocks, [h["l"] for h in history], "o-", color=ROLE_COLORS["key"])
    ax_l.set_title("running sum ℓ")
    acc = np.array([h["a"] for h in history])  # (blocks, d_v)
    for c in range(acc.shape[1]):
        ax_a.plot(blocks, acc[:, c], "o-", label=f"a[{c}]")
    ax_a.set_title("accumulator a")
    ax_a.legend(loc="upper left")
    for ax in (ax_m, ax_l, ax_a):
        ax.set_xlabel(f"after key block (of {block_size})")
        ax.set_xticks(blocks)
    fig.suptitle(f"Online softmax of {query_token!r} over {len(key_tokens)} keys")
    return fig


def plot_softmax_temperature(scores, tokens, factors, *, figsize=(7, 4)):
    """Each token's weight in softmax(c * scores) against the factor c (log axis).

    The static twin of :func:`attnlib.interactive.softmax_temperature`.
    """
    plt = _pyplot()
    scores = np.asarray(scores, dtype=float)
    factors = np.asarray(factors, dtype=float)
    logits = factors[:, None] * scores[None, :]  # (factors, T)
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    fig, ax = plt.subplots(figsize=figsize, constrained_layout=True)
    for j, token in enumerate(tokens):
        ax.plot(factors, weights[:, j], "o-", label=token)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("factor c on the scores")
    ax.set_ylabel("softmax(c · s) weight")
    ax.set_ylim(0, 1)
    ax.legend(title="key")
    return fig
