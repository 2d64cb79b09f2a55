"""The decoder-only Transformer drawn as a diagram, with the shapes a real forward pass produced.

:func:`decoder_shapes` runs a :class:`attnlib.learn.transformer.Decoder` piece by
piece on a batch of tokens and records the shape of every tensor that flows
between the pieces; :func:`draw_decoder` draws the model as boxes and arrows
with those shapes written on the arrows, so the figure cannot disagree with
the code.
"""

from .plotting import ROLE_COLORS, _pyplot


def decoder_shapes(model, tokens):
    """Shapes along one forward pass of ``model`` on ``tokens`` (B, T), through its first block.

    Returns a dict of tuples: ``tokens``, ``x`` (the residual stream),
    ``qkv`` (one head split off), ``weights``, ``heads``, ``mlp_hidden``
    (absent without an MLP), ``logits``.
    """
    import torch

    with torch.no_grad():
        x = model.embed(tokens)  # (B, T, d)
        block = model.blocks[0]
        q, k, v = block.attention.qkv(block.norm_1(x))  # (B, H, T, d_head)
        shapes = dict(tokens=tuple(tokens.shape), x=tuple(x.shape), qkv=tuple(q.shape),
                      weights=tuple(block.attention.weights(block.norm_1(x)).shape))
        shapes["heads"] = tuple(block.attention.attend(q, k, v).shape)
        if block.mlp is not None:
            shapes["mlp_hidden"] = tuple((block.norm_2(x) @ block.mlp.w_1).shape)
        shapes["logits"] = tuple(model(tokens).shape)
    return shapes


def _shape_text(symbols, shape):
    return f"({', '.join(symbols)}) = {shape}"


def draw_decoder(shapes, n_layers, *, positions="learned", figsize=(10, 10)):
    """Draw the decoder: tokens, embedding, ``n_layers`` pre-LN blocks, last LayerNorm, logits, loss.

    ``shapes`` comes from :func:`decoder_shapes`; each arrow carries its tensor's
    symbolic shape and the numbers. ``positions`` is the model's position scheme
    (``model.position_scheme``): "learned" and "sinusoidal" add position vectors to
    the embedding, "rope" turns the queries and keys inside attention, "none" has no
    positions. Symbols follow the book's notation: ``d_k`` is one head's width,
    ``N_vocab`` the vocabulary's size. Returns the figure.
    """
    entry = {"learned": "embedding + position vectors", "sinusoidal": "embedding + sinusoids",
             "rope": "token embedding", "none": "token embedding"}
    if positions not in entry:
        raise ValueError(f"positions must be one of {sorted(entry)}, got {positions!r}")
    plt = _pyplot()
    from matplotlib.patches import Circle, FancyBboxPatch

    fig, ax = plt.subplots(figsize=figsize, constrained_layout=True)
    ax.set(xlim=(-6.2, 8.6), ylim=(-0.8, 13.2))
    ax.axis("off")
    stream_x, side_x, note_x = -1.6, 2.0, 3.75
    line = dict(color="0.2", lw=1.4)

    def box(x, y, text, colour="white", width=3.2):
        ax.add_patch(FancyBboxPatch((x - width / 2, y - 0.34), width, 0.68, boxstyle="round,pad=0.06",
                                    facecolor=colour, edgecolor="0.2"))
        ax.text(x, y, text, ha="center", va="center", fontsize=12)

    def arrow(start, end, **style):
        ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", **line, **style))

    def label(x, y, text, colour="0.25", ha="right"):
        ax.text(x, y, text, ha=ha, va="center", fontsize=11, color=colour)

    def plus(y):
        ax.add_patch(Circle((stream_x, y), 0.28, facecolor="white", edgecolor="0.2"))
        ax.text(stream_x, y, "+", ha="center", va="center", fontsize=15)

    def branch(y_from, y_box, y_plus, name, colour, hidden=None):
        """LayerNorm, then ``name``, off the stream at ``y_from``, added back at ``y_plus``."""
        ax.plot([stream_x, stream_x, side_x - 1.3], [y_from, y_box + 1.2, y_box + 1.2], **line)
        box(side_x, y_box + 1.2, "LayerNorm", width=2.6)
        arrow((side_x, y_box + 0.85), (side_x, y_box + 0.36))
        box(side_x, y_box, name, colour=colour, width=2.6)
        ax.plot([side_x, side_x], [y_box - 0.36, y_plus], **line)
        arrow((side_x, y_plus), (stream_x + 0.3, y_plus))
        plus(y_plus)
        if hidden:
            label(note_x, y_box, hidden, ha="left")

    stream = _shape_text(("B", "T", "d_model"), shapes["x"])
    box(stream_x, 12.6, "token ids")
    arrow((stream_x, 12.25), (stream_x, 11.65))
    label(stream_x - 0.25, 11.95, _shape_text(("B", "T"), shapes["tokens"]))
    box(stream_x, 11.3, entry[positions], width=3.8)
    ax.add_patch(FancyBboxPatch((-5.9, 3.0), 14.2, 7.55, boxstyle="round,pad=0.1", facecolor="0.96",
                                edgecolor="0.5", linestyle="--"))
    ax.text(-5.7, 10.3, f"one block, repeated {n_layers} times", ha="left", va="center", fontsize=12,
            color="0.3")
    branch(10.95, 8.2, 7.2, "causal multi-head\nattention", "#dbe9f6")
    label(note_x, 8.75, "q, k, v: " + _shape_text(("B", "H", "T", "d_k"), shapes["qkv"]),
          colour=ROLE_COLORS["query"], ha="left")
    if positions == "rope":
        label(note_x, 9.3, "RoPE turns q and k by position", colour="0.3", ha="left")
    label(note_x, 8.2, "weights: " + _shape_text(("B", "H", "T", "T"), shapes["weights"]), ha="left")
    label(side_x + 0.2, 6.95, _shape_text(("B", "T", "d_model"), shapes["heads"]), ha="left")
    arrow((stream_x, 10.95), (stream_x, 7.5))
    label(stream_x - 0.25, 9.3, stream)
    bottom = 7.2
    if "mlp_hidden" in shapes:
        branch(6.7, 4.6, 3.6, "MLP", "#e4f2e0",
               hidden="hidden: " + _shape_text(("B", "T", "4 d_model"), shapes["mlp_hidden"]))
        arrow((stream_x, 6.9), (stream_x, 3.9))
        label(stream_x - 0.25, 5.4, stream)
        bottom = 3.6
    else:
        label(side_x, 5.2, "(attention-only: no MLP)", colour="0.4", ha="center")
    box(stream_x, 2.1, "LayerNorm")
    arrow((stream_x, bottom - 0.3), (stream_x, 2.45))
    label(stream_x - 0.25, 2.8, stream)
    box(stream_x, 0.9, "unembedding")
    arrow((stream_x, 1.75), (stream_x, 1.25))
    box(stream_x, -0.3, "next-token loss")
    arrow((stream_x, 0.55), (stream_x, 0.05))
    label(stream_x - 0.25, 0.3, "logits " + _shape_text(("B", "T", "N_vocab"), shapes["logits"]))
    label(-5.7, 4.3 if bottom < 7 else 5.5, "residual\nstream", colour="0.3", ha="left")
    return fig


def draw_multi_head(n_heads=4, *, figsize=(11, 4.4)):
    """Draw multi-head attention's five steps: project, split, attend, concatenate, ``W_O``.

    Each head has its own colour, from its slice of $Q$, $K$ and $V$ through its own
    attention to its strip of the concatenation. Returns the figure.
    """
    if not isinstance(n_heads, int) or not 1 <= n_heads <= 8:
        raise ValueError(f"n_heads must be an int from 1 to 8 to be drawn, got {n_heads!r}")
    plt = _pyplot()
    from matplotlib.patches import FancyBboxPatch, Rectangle

    colours = plt.cm.tab10.colors
    fig, ax = plt.subplots(figsize=figsize, constrained_layout=True)
    ax.set(xlim=(-0.9, 16.2), ylim=(-0.9, 6.4))
    ax.axis("off")
    line = dict(color="0.2", lw=1.4)
    mid = 2.6  # the height of the flow's centre line

    def box(x, y, text, width, height=1.1, colour="white"):
        ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                    boxstyle="round,pad=0.06", facecolor=colour,
                                    edgecolor="0.2"))
        ax.text(x, y, text, ha="center", va="center", fontsize=12)

    def arrow(start, end):
        ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", **line))

    steps = ((0.1, "input"), (2.6, "1. project"), (5.4, "2. split"), (8.75, "3. attend"),
             (12.0, "4. concatenate"), (14.95, "5. project"))
    for x, name in steps:
        ax.text(x, 6.0, name, ha="center", va="center", fontsize=12, fontweight="bold")
    box(0.1, mid, "$X$\n$(T, d_{model})$", 1.7, 1.4)
    box(2.6, mid, "$Q = X W_Q$\n$K = X W_K$\n$V = X W_V$\n$Q, K$: $(T, h\\,d_k)$\n$V$: $(T, h\\,d_v)$",
        2.3, 2.9)
    arrow((1.0, mid), (1.4, mid))
    spacing = min(1.2, 5.0 / n_heads)
    rows = [mid + spacing * ((n_heads - 1) / 2 - j) for j in range(n_heads)]
    for j, y in enumerate(rows):
        colour = colours[j % len(colours)]
        arrow((3.8, mid), (4.45, y))
        ax.add_patch(Rectangle((4.5, y - 0.3 * spacing), 1.8, 0.6 * spacing,
                               facecolor=colour, alpha=0.35, edgecolor=colour))
        ax.text(5.4, y, f"$Q_{j}, K_{j}, V_{j}$", ha="center", va="center", fontsize=11)
        arrow((6.35, y), (6.85, y))
        ax.add_patch(Rectangle((6.9, y - 0.3 * spacing), 3.7, 0.6 * spacing,
                               facecolor=colour, alpha=0.6, edgecolor=colour))
        ax.text(8.75, y, f"softmax$(Q_{j} K_{j}^\\top / \\sqrt{{d_k}})\\,V_{j}$",
                ha="center", va="center", fontsize=11)
        arrow((10.65, y), (10.95, mid))
    strip = 2.0 / n_heads  # the concatenation: the heads' outputs side by side
    for j in range(n_heads):
        colour = colours[j % len(colours)]
        ax.add_patch(Rectangle((11.0 + j * strip, mid - 0.7), strip, 1.4,
                               facecolor=colour, alpha=0.6, edgecolor="0.2"))
        ax.text(11.0 + (j + 0.5) * strip, mid, str(j), ha="center", va="center", fontsize=11)
    ax.text(12.0, mid - 1.05, "$(T, h\\,d_v)$", ha="center", va="top", fontsize=12)
    arrow((13.05, mid), (13.85, mid))
    box(14.95, mid, "$\\times\\, W_O$\n$(T, d_{model})$", 1.9, 1.4)
    ax.text(5.4, -0.55, f"head $j$: each $(T, d_k)$, $d_k = d_{{model}} / h$; here $h = {n_heads}$",
            ha="center", va="center", fontsize=11)
    ax.text(14.95, mid - 1.05, "every output\nentry mixes\nevery head", ha="center",
            va="top", fontsize=11)
    return fig
