"""Pictures of how attention runs on a GPU, for the opening pages of chapters 11 to 15.

Each function draws one diagram with matplotlib and returns its figure; none reads data.

- :func:`plot_naive_vs_fused`: the naive path writes the (T, T) scores to GPU memory and
  reads them back; a fused kernel keeps one tile of them on the chip.
- :func:`plot_tile_stream`: one tile of queries held on the chip while tiles of keys and
  values stream past it, updating the running maximum, sum and output.
- :func:`plot_backward_flow`: what the backward pass reads, recomputes and writes.
- :func:`plot_backward_sizes`: the forward and backward passes by the sizes of their arrays.
- :func:`plot_paged_cache`: a contiguous cache against a pool of pages and its block table.
"""

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

CHIP = "#fde9c8"  # on-chip memory (registers, shared memory)
HBM = "#dde7f3"  # the GPU's main memory
QUERY = "#6a51a3"
KEY = "#2b8cbe"
VALUE = "#41ab5d"
SCORE = "#d62728"


def _box(ax, x, y, w, h, colour, label=None, fontsize=9, edge="black", **text):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=colour,
                                ec=edge, lw=1))
    if label:
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=fontsize,
                **text)


def _arrow(ax, start, end, colour="black", style="-|>", **kwargs):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12,
                                 color=colour, lw=1.3, **kwargs))


def _tiles(ax, x, y, n, w, h, colour, gap=0.05, alpha=1.0):
    for i in range(n):
        ax.add_patch(Rectangle((x + i * (w + gap), y), w, h, fc=colour, ec="white",
                               alpha=alpha))


def _blank(ax, xlim=(0, 10), ylim=(0, 6)):
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")


def plot_naive_vs_fused(figsize=(10, 4.2)):
    """Two panels: the naive path's round trips of the T x T matrix through GPU memory,
    and a fused kernel that reads Q, K, V once and writes only O."""
    fig, (naive, fused) = plt.subplots(1, 2, figsize=figsize, constrained_layout=True)
    for ax, title in ((naive, "naive path: three kernels,\nthe T × T matrices through GPU memory"),
                      (fused, "fused kernel: one pass,\nno T × T matrix in GPU memory")):
        _blank(ax)
        ax.set_title(title, fontsize=11)
        _box(ax, 0.2, 0.2, 9.6, 2.2, HBM, None)
        ax.text(0.4, 0.45, "GPU memory (HBM): large, slower", fontsize=8, va="bottom")
        _box(ax, 0.2, 3.6, 9.6, 2.2, CHIP, None)
        ax.text(0.4, 5.45, "on the chip: small, fast", fontsize=8, va="bottom")
    # naive: Q, K, V, the T x T scores and the weights all sit in HBM
    for i, (name, colour) in enumerate((("Q", QUERY), ("K", KEY), ("V", VALUE))):
        _box(naive, 0.5 + i * 0.8, 1.0, 0.6, 1.0, colour, name, color="white")
    _box(naive, 3.4, 0.8, 1.5, 1.5, SCORE, "scores\nT × T", fontsize=8, color="white")
    _box(naive, 5.3, 0.8, 1.5, 1.5, "#f4a582", "weights\nT × T", fontsize=8)
    _box(naive, 8.4, 1.0, 0.6, 1.0, "#969696", "O", color="white")
    # each kernel: where it reads from, where it sits, where it writes to
    steps = (("QKᵀ", 1.3, 1.9, 4.15), ("softmax", 4.15, 5.05, 6.05),
             ("× V", 6.05, 8.0, 8.7))
    for label, x_from, x_box, x_out in steps:
        _box(naive, x_box - 0.55, 4.1, 1.3, 0.8, "white", label, fontsize=8)
        _arrow(naive, (x_from, 2.35), (x_box - 0.2, 4.05))
        _arrow(naive, (x_box + 0.5, 4.05), (x_out, 2.35), colour=SCORE)
    # fused: one tile of scores lives on the chip; HBM sees only Q, K, V and O
    for i, (name, colour) in enumerate((("Q", QUERY), ("K", KEY), ("V", VALUE))):
        _box(fused, 0.5 + i * 0.8, 1.0, 0.6, 1.0, colour, name, color="white")
    _box(fused, 8.4, 1.0, 0.6, 1.0, "#969696", "O", color="white")
    _box(fused, 3.3, 3.85, 3.4, 1.4, "white", None)
    _tiles(fused, 3.85, 4.0, 4, 0.5, 0.5, SCORE, gap=0.1)
    fused.text(5.0, 4.75, "one tile of scores at a time", ha="center", fontsize=8)
    _arrow(fused, (1.6, 2.1), (3.7, 4.0))
    _arrow(fused, (6.3, 4.0), (8.6, 2.1), colour="#636363")
    return fig


def plot_tile_stream(n_key_tiles=5, figsize=(9.5, 4.4)):
    """One tile of queries held on the chip while tiles of keys and values stream past;
    each tile of keys gives scores, and their weights times the tile of values update the
    running m, l and a of every query row of the tile."""
    if n_key_tiles < 2:
        raise ValueError(f"n_key_tiles must be at least 2, got {n_key_tiles}")
    fig, ax = plt.subplots(figsize=figsize, constrained_layout=True)
    _blank(ax, (0, 12), (0, 6.2))
    _box(ax, 0.2, 0.2, 11.6, 1.9, HBM, None)
    ax.text(0.4, 0.35, "GPU memory: K and V, cut into tiles", fontsize=8)
    _box(ax, 0.2, 3.0, 11.6, 3.0, CHIP, None)
    ax.text(0.4, 5.65, "on the chip, one program", fontsize=8)
    # the stream of key and value tiles in HBM
    tile_w = 1.6
    for i in range(n_key_tiles):
        x = 2.0 + i * (tile_w + 0.35)
        done = i < 2
        current = i == 2
        alpha = 0.35 if done else 1.0
        ax.add_patch(Rectangle((x, 1.15), tile_w, 0.45, fc=KEY, ec="white", alpha=alpha))
        ax.add_patch(Rectangle((x, 0.7), tile_w, 0.45, fc=VALUE, ec="white", alpha=alpha))
        if i == 0:
            ax.text(x - 0.15, 1.37, "K", ha="right", va="center", fontsize=9)
            ax.text(x - 0.15, 0.92, "V", ha="right", va="center", fontsize=9)
        label = "done" if done else ("now" if current else "next")
        ax.text(x + tile_w / 2, 1.75, label, ha="center", fontsize=7, color="#444444")
        if current:
            # K meets the queries in the scores; V goes to the weighted sum a
            _arrow(ax, (x + 0.45, 1.95), (5.9, 3.45), colour=KEY)
            ax.text(x + 0.2, 2.5, "K", ha="right", va="center", fontsize=8, color=KEY)
            _arrow(ax, (x + tile_w - 0.3, 1.95), (8.9, 3.45), colour=VALUE)
            ax.text(x + tile_w + 0.35, 2.25, "V", ha="left", va="center", fontsize=8,
                    color=VALUE)
    # the query tile, held for the whole loop
    _box(ax, 0.6, 3.5, 1.8, 1.8, QUERY, "tile of\nqueries\n(held)", fontsize=8,
         color="white")
    # the scores of this tile pair, then the running state
    _box(ax, 4.6, 3.5, 2.2, 1.8, SCORE, "scores of\nquery tile ×\nkey tile", fontsize=8,
         color="white")
    _arrow(ax, (2.5, 4.4), (4.5, 4.4))
    _box(ax, 8.2, 3.5, 3.2, 1.8, "white", "running, per query row:\nmax m, sum ℓ,\n"
         "weighted sum a", fontsize=8)
    _arrow(ax, (6.9, 4.4), (8.1, 4.4))
    ax.text(7.5, 4.6, "weights", ha="center", fontsize=7)
    ax.text(10.2, 2.55, "after the last tile:\nO = a / ℓ, written once", ha="center",
            va="center", fontsize=8)
    ax.set_title("A fused kernel: a tile of queries stays on the chip, "
                 "tiles of keys and values stream past", fontsize=10)
    return fig


def plot_backward_flow(figsize=(10.5, 4.8)):
    """The backward pass's data flow: what the forward kept, what the backward recomputes
    block by block, and the three gradients it writes. Inputs a gradient reads from far
    away (dO for dV, K for dQ, Q for dK) are drawn a second time beside it, so that no
    arrow crosses another."""
    fig, ax = plt.subplots(figsize=figsize, constrained_layout=True)
    _blank(ax, (0, 15.3), (0, 6.6))

    def node(x, y, label, colour="white", w=1.5, h=0.7, **text):
        _box(ax, x - w / 2, y - h / 2, w, h, colour, label, fontsize=9, **text)

    grey = "#636363"
    # inputs: kept from the forward pass, and dO from the loss
    ax.text(1.2, 6.3, "kept from the forward,\nand dO", ha="center", va="center",
            fontsize=8)
    node(1.2, 5.6, "Q", QUERY, color="white")
    node(1.2, 4.6, "K", KEY, color="white")
    node(1.2, 3.6, "lse", "#bdbdbd")
    node(1.2, 2.6, "V", VALUE, color="white")
    _box(ax, 0.45, 1.25, 1.5, 0.7, "#fdd0a2", "dO, from\nthe loss", fontsize=8)
    node(1.2, 0.6, "O", "#969696", color="white")
    # recomputed, a block at a time: the red boxes are T x T blocks
    ax.text(7.4, 6.3, "recomputed, a block at a time", ha="center", va="center",
            fontsize=8)
    node(4.3, 4.6, "S → P", SCORE, color="white")
    node(6.6, 2.6, "dP = dO Vᵀ", SCORE, color="white")
    node(6.6, 1.1, "D = rowsum(dO∘O)", w=2.6)  # one number per query: small
    node(10.0, 2.6, "dS̃ = P∘(dP − D)", SCORE, w=2.4, color="white")
    for start, end in (((1.95, 5.6), (3.5, 4.85)), ((1.95, 4.6), (3.5, 4.6)),
                       ((1.95, 3.6), (3.5, 4.35)),  # Q, K, lse -> S -> P
                       ((1.95, 2.6), (5.8, 2.6)), ((1.95, 1.7), (5.8, 2.35)),  # V, dO
                       ((1.95, 1.5), (5.25, 1.2)), ((1.95, 0.6), (5.25, 0.95)),  # dO, O
                       ((7.4, 2.6), (8.75, 2.6)), ((7.95, 1.2), (9.2, 2.2))):
        _arrow(ax, start, end, colour=grey)
    _arrow(ax, (5.1, 4.45), (9.2, 3.0), colour=SCORE)  # P to dS~
    # gradients written
    ax.text(13.0, 6.3, "written", ha="center", va="center", fontsize=8)
    node(13.0, 5.4, "dV = Pᵀ dO", "#fdd0a2", w=2.4)
    node(13.0, 3.6, "dQ = scale · dS̃ K", "#fdd0a2", w=2.4)
    node(13.0, 1.9, "dK = scale · dS̃ᵀ Q", "#fdd0a2", w=2.4)
    _arrow(ax, (5.1, 4.8), (11.75, 5.4), colour=SCORE)  # P to dV
    _arrow(ax, (11.25, 2.75), (11.75, 3.45), colour=SCORE)
    _arrow(ax, (11.25, 2.45), (11.75, 2.0), colour=SCORE)
    # what each gradient also reads, drawn again beside it: dV reads dO, dQ reads K,
    # dK reads Q
    for y, name, colour, edge in ((5.4, "dO", "#fdd0a2", grey), (3.6, "K", KEY, KEY),
                                  (1.9, "Q", QUERY, QUERY)):
        _box(ax, 14.55, y - 0.3, 0.65, 0.6, colour, name, fontsize=9,
             color="black" if name == "dO" else "white")
        _arrow(ax, (14.5, y), (14.25, y), colour=edge)
    ax.set_title("The backward pass: the T × T blocks (red: P, dP, dS̃) exist only inside "
                 "one block's work", fontsize=10)
    return fig


def plot_paged_cache(page_size=4, figsize=(10, 4.4)):
    """Left: a contiguous cache reserves the longest length for every sequence. Right: a pool
    of pages; each sequence's row of the block table lists its pages, wherever they lie."""
    if page_size < 2:
        raise ValueError(f"page_size must be at least 2, got {page_size}")
    lengths = {"a": 10, "b": 3, "c": 7}  # positions each sequence holds
    colours = {"a": QUERY, "b": KEY, "c": VALUE}
    fig, (left, right) = plt.subplots(1, 2, figsize=figsize, constrained_layout=True,
                                      gridspec_kw={"width_ratios": [1, 1.25]})
    longest = 12
    _blank(left, (0, longest + 2), (0, 6))
    left.set_title(f"contiguous: each sequence reserves {longest} positions", fontsize=10)
    for row, (name, n) in enumerate(lengths.items()):
        y = 4.2 - row * 1.5
        left.text(0.6, y + 0.3, name, ha="center", va="center", fontsize=10)
        for p in range(longest):
            used = p < n
            left.add_patch(Rectangle((1.2 + p, y), 0.9, 0.6, fc=colours[name] if used else "white",
                                     ec="#777777", lw=0.8))
    left.text(1.2, 0.35, "white: reserved, never used", fontsize=8)
    # the pool: pages handed out in the order the sequences grew, so they interleave
    pages = {"a": [0, 3, 5], "b": [1], "c": [2, 4]}
    n_pages = 7
    _blank(right, (0, 12), (0, 6))
    right.set_title(f"paged: a pool of pages of {page_size} positions", fontsize=10)
    owner = {page: name for name, held in pages.items() for page in held}
    for page in range(n_pages):
        x = 0.4 + page * 1.6
        right.text(x + 0.7, 5.45, f"page {page}", ha="center", fontsize=7)
        name = owner.get(page)
        filled = 0 if name is None else min(page_size, lengths[name] - pages[name].index(page) * page_size)
        for slot in range(page_size):
            right.add_patch(Rectangle((x, 4.9 - (slot + 1) * 0.3), 1.4, 0.28,
                                      fc=colours[name] if slot < filled else "white",
                                      ec="#777777", lw=0.6))
        if name is None:
            right.text(x + 0.7, 3.45, "free", ha="center", fontsize=7, color="#444444")
    right.text(0.4, 3.0, "block table", fontsize=9, weight="bold")
    for row, (name, held) in enumerate(pages.items()):
        y = 2.55 - row * 0.85
        right.text(0.7, y, name, ha="center", va="center", fontsize=10)
        for i, page in enumerate(held):
            _box(right, 1.3 + i * 1.0, y - 0.3, 0.8, 0.6, "white", str(page), fontsize=9)
        right.text(1.3 + 3 * 1.0 + 0.2, y, f"{lengths[name]} positions", va="center", fontsize=8)
    right.text(6.2, 0.3, "the last page of each is partly empty: at most\n"
               f"{page_size - 1} positions reserved and unused per sequence", fontsize=8)
    return fig


def plot_backward_sizes(figsize=(10, 5.0)):
    """Sizes only: the forward pass from Q, K, V to O along the top, the backward pass
    from dO back to dQ, dK (and, from P and dO, dV) along the bottom; T x T arrays are red."""
    fig, ax = plt.subplots(figsize=figsize, constrained_layout=True)
    _blank(ax, (0, 12.4), (-1.3, 5.6))

    def node(x, y, label, colour, w, **text):
        _box(ax, x - w / 2, y - 0.75, w, 1.5, colour, label, fontsize=9, **text)

    xs = (1.3, 4.5, 7.7, 10.9)  # the four columns, shared by both rows
    widths = (1.6, 2.0, 2.0, 1.6)  # T x d strips at the ends, T x T squares between
    for y, word, forward in ((4.1, "forward", True), (1.3, "backward", False)):
        ax.text(0.05, y + 1.0, word, fontsize=9, fontweight="bold")
        for i in range(3):
            left = xs[i] + widths[i] / 2 + 0.08
            right = xs[i + 1] - widths[i + 1] / 2 - 0.08
            _arrow(ax, *(((left, y), (right, y)) if forward else ((right, y), (left, y))),
                   colour="#636363")
    node(xs[0], 4.1, "Q, K, V\nT × d each", "#dadaeb", widths[0])
    node(xs[1], 4.1, "scores S\nT × T", SCORE, widths[1], color="white")
    node(xs[2], 4.1, "weights P\nT × T", SCORE, widths[2], color="white")
    node(xs[3], 4.1, "output O\nT × d", "#d9d9d9", widths[3])
    node(xs[3], 1.3, "dO\nT × d\n(from the loss)", "#fdd0a2", widths[3])
    node(xs[2], 1.3, "P again (from\nQ, K), and its\ngradient dP\nT × T each", SCORE, widths[2],
         color="white")
    node(xs[1], 1.3, "dS̃, the scaled\nscores' gradient\nT × T", SCORE, widths[1], color="white")
    node(xs[0], 1.3, "dQ, dK\nT × d each", "#fdd0a2", widths[0])
    _box(ax, xs[2] + 1.6, -1.15, 1.6, 0.9, "#fdd0a2", "dV, T × d", fontsize=9)
    _arrow(ax, (xs[2] + 0.6, 0.47), (xs[2] + 1.5, -0.55), colour="#636363")  # from P
    _arrow(ax, (xs[3] - 0.3, 0.47), (xs[3] - 0.5, -0.2), colour="#636363")  # from dO
    ax.text(6.1, 2.75, "red: T × T, one number per query and key; the block-by-block kernels hold "
            "one block of each at a time", ha="center", va="center", fontsize=8.5,
            color=SCORE)
    ax.set_title("Attention's forward and backward passes, by size", fontsize=10)
    return fig
