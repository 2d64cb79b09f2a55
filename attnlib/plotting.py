"""The book's figures: one colour per role, token names on every axis.

Queries are always blue, keys always orange, values always green, in every
chapter, so a reader can tell which matrix is which at a glance.
"""

import numpy as np

ROLE_COLORS = {"query": "#1f77b4", "key": "#ff7f0e", "value": "#2ca02c"}
ROLE_CMAPS = {"query": "Blues", "key": "Oranges", "value": "Greens"}
ROLE_PLURALS = {"query": "queries", "key": "keys", "value": "values"}
WEIGHTS_CMAP = "Purples"  # attention weights, always in [0, 1]
SCORES_CMAP = "RdBu_r"  # raw scores, centred on zero


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
                ax.text(j, i, text, ha="center", va="center", fontsize=9, color=_text_colour(image, value))
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
