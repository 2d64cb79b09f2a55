"""Live figures: the reader's own input, computed in the page by a short script.

Where :mod:`attnlib.interactive` steps through frames computed in Python, these
figures take what the reader types or picks and compute in the browser, with the
JavaScript in ``attnlib/live.js`` (package data, inlined into each figure): a
softmax, one query's attention, and the forward pass of chapter 8's trained
decoder, each mirroring the Python it is named after. The data they need (the
example's Q, K and V, or the model's weights) travels inside the figure as JSON.
Nothing is loaded from anywhere, so the figures work in the HTML book offline.

The page's numbers carry their full value in ``data-value`` attributes;
``tests/test_live_figures.py`` types into each figure in Chromium and checks them
against the Python functions here (:func:`typed_scores_state`,
:func:`pick_query_state`, :func:`induction_state`) to 1e-6.

Jupyter does not run the script of an untrusted notebook, so the HTML carries the
numbers of the starting input, and every figure has a matplotlib
:meth:`LiveFigure.static_figure`.
"""

import functools
import hashlib
import html
import json
from importlib import resources

import numpy as np

from .interactive import CSS, _softmax

SCRIPT = resources.files(__package__).joinpath("live.js").read_text(encoding="utf-8").rstrip("\n")
SATURATED = 0.99  # a largest weight from here on: softmax is nearly a hard max
INPUT_LIMIT = 1_000_000  # a typed score or factor beyond this is refused with a message


class LiveFigure:
    """A live figure as one self-contained piece of HTML (``html``), shown by a notebook cell."""

    def __init__(self, kind, title, controls, body, data, draw_static, summary=""):
        self.kind, self.title = kind, title
        self.summary = summary  # the starting input's result in one line, at the precision shown
        payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
        digest = hashlib.sha1(f"{kind}|{title}|{controls}|{body}|{payload}".encode()).hexdigest()[:12]
        self.id = f"attn-live-{kind}-{digest}"
        self.html = (
            f'<div class="attn-interactive attn-live" id="{self.id}" data-live="{kind}" data-frames="1">'
            f"<style>{CSS.strip()}</style>"
            f'<p class="attn-title">{html.escape(title)}</p>'
            f'<div class="attn-live-inputs">{controls}</div>'
            f'<p class="attn-live-message" role="alert"></p>'
            f'<div class="attn-live-out">{body}</div>'
            f'<script type="application/json" class="attn-live-data">{payload}</script>'
            f'<script>{SCRIPT}\nwindow.attnLive.start("{self.id}");</script></div>'
        )
        self._draw_static = draw_static

    def _repr_html_(self):
        return self.html

    def __repr__(self):
        return f"<live figure: {self.title}>"

    def static_figure(self):
        """The starting input's result as a matplotlib figure, for readers of the notebook."""
        return self._draw_static()


def _value(role, x, digits, index=None):
    """A number the script rewrites: shown rounded. The script puts the full value in ``data-value``;
    the stored HTML holds the rounded one there too, so that it is the same on every CPU."""
    where = "" if index is None else f' data-index="{index}"'
    return f'<span data-role="{role}"{where} data-value="{float(x):.{digits}f}">{float(x):.{digits}f}</span>'


# ---------------------------------------------------------------------------------------
# 1. Scores you type (chapter 4)


def typed_scores_state(scores, factor):
    """What the typed-scores figure shows: ``{"scaled", "weights", "sum", "saturated"}``."""
    scaled = float(factor) * np.asarray(scores, dtype=np.float64)
    weights = _softmax(scaled)
    return {"scaled": scaled, "weights": weights, "sum": float(weights.sum()),
            "saturated": bool(weights.max() >= SATURATED)}


def typed_scores(scores, tokens, factor=1.0, *, query_token=None):
    """Type a row of scores and a factor c; see softmax(c * scores), its sum, and saturation.

    ``scores``: one per token of ``tokens``, the starting values of the text fields.
    """
    scores = np.asarray(scores, dtype=np.float64)
    tokens = [str(t) for t in tokens]
    if scores.ndim != 1 or scores.shape != (len(tokens),) or not len(tokens):
        raise ValueError(f"scores must be one row with one score per token: got scores of shape "
                         f"{scores.shape} for {len(tokens)} tokens")
    if not np.isfinite(scores).all() or not np.isfinite(factor):
        raise ValueError(f"scores and factor must be finite, got scores {scores.tolist()} and factor {factor}")
    state = typed_scores_state(scores, factor)
    who = f" of \u201c{html.escape(query_token)}\u201d" if query_token else ""
    controls = "".join(
        f'<label>score{who} for \u201c{html.escape(t)}\u201d<input type="text" inputmode="decimal" '
        f'class="attn-live-score" value="{s:g}"></label>' for t, s in zip(tokens, scores))
    controls += (f'<label>factor c<input type="text" inputmode="decimal" class="attn-live-factor" '
                 f'value="{factor:g}"></label>')
    bars = "".join(
        f'<div class="attn-bar"><span class="attn-bar-label">{html.escape(t)}</span>'
        f'<span class="attn-bar-track"><span class="attn-bar-fill" data-role="bar" data-index="{i}" '
        f'style="display:block;width:{100 * w:.1f}%"></span></span>'
        f'<span>c\u00b7s = {_value("scaled", cs, 2, i)}, weight {_value("weight", w, 3, i)}</span></div>'
        for i, (t, cs, w) in enumerate(zip(tokens, state["scaled"], state["weights"])))
    top = float(state["weights"].max())
    saturation = (f"saturated: the largest weight is {top:.3f}, so softmax is nearly a hard max and its "
                  f"gradient nearly 0" if state["saturated"] else f"not saturated: the largest weight is {top:.3f}")
    body = (bars + f'<p>sum of the weights: {_value("sum", state["sum"], 6)}</p>'
            f'<p data-role="saturation">{saturation}</p>')

    def draw():
        from .plotting import plot_softmax_temperature

        return plot_softmax_temperature(scores, tokens, (float(factor),))

    summary = f"weights {', '.join(f'{w:.3f}' for w in state['weights'])}; {saturation}"
    return LiveFigure("typed-scores", "Type the scores and the factor c: softmax(c \u00b7 s), live", controls,
                      body, {"tokens": tokens, "limit": INPUT_LIMIT, "saturated": SATURATED}, draw, summary)


# ---------------------------------------------------------------------------------------
# 2. Pick the query (chapters 2 and 5)


def pick_query_state(example, index):
    """One query's ``{"scores", "weights", "output"}`` from the example's Q, K and V."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (example.q, example.k, example.v))
    scores = k @ q[index] / np.sqrt(q.shape[-1])  # (T,)
    weights = _softmax(scores)
    return {"scores": scores, "weights": weights, "output": weights @ v}


def pick_query(example, token=None):
    """Choose any token of ``example`` as the query; see its scores, weights and output.

    ``example``: a :class:`attnlib.examples.RunningExample` (tokens, q, k, v).
    """
    tokens = [str(t) for t in example.tokens]
    index = 0 if token is None else tokens.index(token) if token in tokens else None
    if index is None:
        raise ValueError(f"token must be one of the example's tokens {tokens}, got {token!r}")
    state = pick_query_state(example, index)
    options = "".join(f'<option value="{i}"{" selected" if i == index else ""}>{html.escape(t)}</option>'
                      for i, t in enumerate(tokens))
    controls = f'<label>query token<select class="attn-live-query">{options}</select></label>'
    head = "".join(f'<th scope="col">{html.escape(t)}</th>' for t in tokens)
    scores = "".join(f"<td>{_value('score', s, 3, j)}</td>" for j, s in enumerate(state["scores"]))
    weights = "".join(f'<td data-role="weight" data-index="{j}" data-value="{w:.3f}">{w:.3f}</td>'
                      for j, w in enumerate(state["weights"]))
    output = "".join(f"<td>{_value('output', o, 3, c)}</td>" for c, o in enumerate(state["output"]))
    body = (f'<p>query: \u201c<span data-role="query">{html.escape(tokens[index])}</span>\u201d</p>'
            f'<table class="attn-matrix"><tr><th scope="col">key</th>{head}</tr>'
            f'<tr><th scope="row">score q\u00b7k/\u221ad</th>{scores}</tr>'
            f'<tr><th scope="row">weight</th>{weights}</tr></table>'
            f'<table class="attn-matrix"><caption>output: the weights times V</caption><tr>{output}</tr></table>')
    data = {"tokens": tokens, "q": np.asarray(example.q).tolist(), "k": np.asarray(example.k).tolist(),
            "v": np.asarray(example.v).tolist()}

    def draw():
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 2.6), constrained_layout=True)
        ax.bar(tokens, state["weights"], color="#2166ac")
        ax.set(ylim=(0, 1), ylabel="weight", title=f"attention weights of the query \u201c{tokens[index]}\u201d")
        return fig

    summary = (f"query {tokens[index]!r}: weights {', '.join(f'{w:.3f}' for w in state['weights'])}; "
               f"output {', '.join(f'{o:.3f}' for o in state['output'])}")
    return LiveFigure("pick-query", "Pick the query: its scores, weights and output, live", controls, body,
                      data, draw, summary)


# ---------------------------------------------------------------------------------------
# 3. The trained pointer model, live (chapter 7)


def _numbers(tensor, digits=9):
    """A tensor as nested lists of floats rounded to ``digits`` significant digits (compact JSON)."""
    return np.vectorize(lambda x: float(f"{x:.{digits}g}"))(tensor.detach().double().numpy()).tolist()


def export_pointer(model):
    """An :class:`attnlib.learn.model.AttentionPointer`'s weights as JSON-ready lists (9 digits)."""
    from .learn.model import AttentionPointer

    if not isinstance(model, AttentionPointer):
        raise TypeError(f"model must be an attnlib.learn.model.AttentionPointer, got {type(model).__name__}")
    return {"embedding": _numbers(model.embedding), "position": _numbers(model.position),
            "layers": [{name: _numbers(getattr(layer, name)) for name in ("w_q", "w_k", "w_v", "w_o")}
                       for layer in model.layers],
            "pointer_w_q": _numbers(model.pointer.w_q), "pointer_w_k": _numbers(model.pointer.w_k),
            "n_heads": model.layers[0].n_heads}


def exported_pointer(data, read_at):
    """An AttentionPointer holding the exported (rounded) weights: the Python twin of the page's model."""
    import torch

    from .learn.model import AttentionPointer

    vocab_size, d_model = len(data["embedding"]), len(data["embedding"][0])
    model = AttentionPointer(vocab_size, len(data["position"]), d_model, data["n_heads"], len(data["layers"]),
                             read_at=[read_at])
    with torch.no_grad():
        model.embedding.copy_(torch.tensor(data["embedding"]))
        model.position.copy_(torch.tensor(data["position"]))
        for layer, saved in zip(model.layers, data["layers"]):
            for name in ("w_q", "w_k", "w_v", "w_o"):
                getattr(layer, name).copy_(torch.tensor(saved[name]))
        model.pointer.w_q.copy_(torch.tensor(data["pointer_w_q"]))
        model.pointer.w_k.copy_(torch.tensor(data["pointer_w_k"]))
    return model


def pointer_state(model, vocab, words, read_at):
    """``{"maps": [(H, T, T) per layer], "pointer": (T,)}``: the model on one sentence (a list of words)."""
    import torch

    unknown = [w for w in words if w not in vocab]
    if unknown:
        raise ValueError(f"words not in the vocabulary: {unknown}")
    tokens = torch.tensor([[vocab.index(w) for w in words]])
    maps = model.attention_maps(tokens)
    return {"maps": [m[0].numpy() for m in maps[:-1]], "pointer": maps[-1][0, 0, read_at].numpy()}


def pointer_live(model, *, animal="animal", place="street", adjective="tired", template=0):
    """Build a sentence from chapter 7's task with drop-downs; see the trained pointer model answer.

    ``model``: the :class:`~attnlib.learn.model.AttentionPointer` chapter 7 trains
    (:func:`attnlib.learn.recipes.trained_coreference_model`).
    """
    from .learn import coreference as task

    choices = {"animal": (animal, task.ANIMALS), "place": (place, task.PLACES),
               "adjective": (adjective, task.ANIMAL_ADJECTIVES + task.PLACE_ADJECTIVES)}
    for name, (value, allowed) in choices.items():
        if value not in allowed:
            raise ValueError(f"{name} must be one of the task's {name}s {list(allowed)}, got {value!r}")
    if template not in range(len(task.TEMPLATES)):
        raise ValueError(f"template must be 0 ... {len(task.TEMPLATES) - 1}, got {template!r}")
    vocab = list(task.VOCAB)
    data = {"model": export_pointer(model), "vocab": vocab, "read_at": task.IT_POSITION,
            "templates": list(task.TEMPLATES),
            "animal_adjectives": list(task.ANIMAL_ADJECTIVES)}
    words = task.TEMPLATES[template].format(animal=animal, place=place, adjective=adjective).split()
    state = pointer_state(exported_pointer(data["model"], task.IT_POSITION), vocab, words, task.IT_POSITION)
    template_options = "".join(
        f'<option value="{i}"{" selected" if i == template else ""}>'
        f'{html.escape(t.replace("{animal}", "ANIMAL").replace("{place}", "PLACE").replace("{adjective}", "…"))}'
        f"</option>" for i, t in enumerate(task.TEMPLATES))
    controls = f'<label>sentence<select data-slot="template">{template_options}</select></label>'
    for name, (value, allowed) in choices.items():
        options = "".join(f'<option{" selected" if w == value else ""}>{html.escape(w)}</option>' for w in allowed)
        controls += f'<label>{name}<select data-slot="{name}">{options}</select></label>'
    best = int(state["pointer"].argmax())
    body = (f'<p>“<span data-role="sentence">{html.escape(" ".join(words))}</span>”: the pointer picks '
            f'“<span data-role="pick">{html.escape(words[best])}</span>” with weight '
            f'{_value("pick-p", state["pointer"][best], 3)}; <span data-role="verdict"></span></p>'
            '<div class="attn-live-grid"><p>(The weights of “it” in the pointer and in each head '
            'appear here as a table when the page\'s JavaScript runs.)</p></div>')

    def draw():
        from .plotting import plot_attention

        rows = np.stack([state["pointer"]] + [m[h, task.IT_POSITION] for m in state["maps"]
                                               for h in range(m.shape[0])])
        labels = ["pointer"] + [f"layer {i}, head {h}" for i, m in enumerate(state["maps"])
                                for h in range(m.shape[0])]
        ax = plot_attention(rows, labels, words, title="rows of “it”")
        return ax.figure

    summary = f"{' '.join(words)}: the pointer picks {words[best]!r} ({state['pointer'][best]:.2f})"
    return LiveFigure("pointer", "Build a sentence: the trained model points at what “it” means, live",
                      controls, body, data, draw, summary)


# ---------------------------------------------------------------------------------------
# 4. The induction head, live (chapter 8)


def export_decoder(model, digits=9):
    """An attention-only RoPE :class:`attnlib.learn.transformer.Decoder`'s weights as JSON-ready lists.

    Rounded to ``digits`` significant digits (about 140 kB for chapter 8's model),
    which moves its logits by about 1e-7 to 1e-6 (the page is compared with this rounded twin).
    """
    from .learn.transformer import Decoder

    if not isinstance(model, Decoder):
        raise TypeError(f"model must be an attnlib.learn.transformer.Decoder, got {type(model).__name__}")
    if model.position_scheme != "rope" or any(block.mlp is not None for block in model.blocks):
        raise ValueError("export_decoder takes an attention-only decoder with RoPE positions "
                         f"(got positions={model.position_scheme!r}, mlp blocks: "
                         f"{[block.mlp is not None for block in model.blocks]})")

    numbers = functools.partial(_numbers, digits=digits)

    def norm(layer):
        return {"gain": numbers(layer.gain), "bias": numbers(layer.bias)}

    blocks = [{"norm_1": norm(b.norm_1), **{name: numbers(getattr(b.attention, name))
                                           for name in ("w_q", "w_k", "w_v", "w_o")}} for b in model.blocks]
    return {"embedding": numbers(model.embedding), "blocks": blocks, "norm": norm(model.norm),
            "unembedding": numbers(model.unembedding), "n_heads": model.blocks[0].attention.n_heads,
            "eps": model.norm.eps, "rope_base": 10000.0}


def exported_model(data):
    """A Decoder holding the exported (rounded) weights: the Python twin of what the page runs."""
    import torch

    from .learn.transformer import Decoder

    d_model = len(data["embedding"][0])
    model = Decoder(len(data["embedding"]), d_model, data["n_heads"], len(data["blocks"]), positions="rope",
                    mlp=False)
    with torch.no_grad():
        model.embedding.copy_(torch.tensor(data["embedding"]))
        model.unembedding.copy_(torch.tensor(data["unembedding"]))
        model.norm.gain.copy_(torch.tensor(data["norm"]["gain"]))
        model.norm.bias.copy_(torch.tensor(data["norm"]["bias"]))
        for block, saved in zip(model.blocks, data["blocks"]):
            block.norm_1.gain.copy_(torch.tensor(saved["norm_1"]["gain"]))
            block.norm_1.bias.copy_(torch.tensor(saved["norm_1"]["bias"]))
            for name in ("w_q", "w_k", "w_v", "w_o"):
                getattr(block.attention, name).copy_(torch.tensor(saved[name]))
    return model


def parse_letters(text, letters, max_len):
    """The reader's letters -> token ids, or ValueError with the message the page shows."""
    tokens = []
    for ch in "".join(text.replace(",", " ").split()).lower():
        if ch not in letters:
            raise ValueError(f"\u201c{ch}\u201d is not a token: use the letters {letters[0]} to {letters[-1]}")
        tokens.append(letters.index(ch))
    if len(tokens) < 2:
        raise ValueError("type at least 2 letters")
    if len(tokens) > max_len:
        raise ValueError(f"at most {max_len} letters, the length the model trained on (got {len(tokens)})")
    return tokens


def induction_state(model, tokens):
    """``{"maps": [(H, T, T) per layer], "guesses": (T,), "next_p": float}`` of ``model`` on one sequence."""
    import torch

    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = model(ids)[0]  # (T, V)
        maps = [m[0].numpy() for m in model.attention_maps(ids)]
    guesses = logits.argmax(dim=-1).numpy()
    p = torch.softmax(logits[-1], dim=-1)
    return {"maps": maps, "guesses": guesses, "next_p": float(p[guesses[-1]])}


def induction_live(model, letters, sequence, *, head=(1, 0), max_len=32):
    """Type a sequence of letters; see a head of the trained decoder attend, and the model's guesses.

    ``letters``: one character per token id. ``head``: (layer, head) shown first.
    """
    letters = "".join(letters)
    data = {"model": export_decoder(model), "letters": letters, "max_len": int(max_len)}
    if len(letters) != len(data["model"]["embedding"]) or len(set(letters)) != len(letters):
        raise ValueError(f"letters must hold one different character per token id: the model has "
                         f"{len(data['model']['embedding'])} tokens, letters {letters!r} has {len(letters)}")
    twin = exported_model(data["model"])
    tokens = parse_letters(sequence, letters, max_len)
    state = induction_state(twin, tokens)
    n_layers, n_heads = len(data["model"]["blocks"]), data["model"]["n_heads"]
    if tuple(head) not in {(layer, h) for layer in range(n_layers) for h in range(n_heads)}:
        raise ValueError(f"head must be (layer, head) with layer < {n_layers} and head < {n_heads}, got {head}")
    options = "".join(f'<option value="{layer},{h}"{" selected" if (layer, h) == tuple(head) else ""}>'
                      f"layer {layer}, head {h}</option>" for layer in range(n_layers) for h in range(n_heads))
    controls = (f'<label>letters {letters[0]} to {letters[-1]}<input type="text" class="attn-live-sequence" '
                f'value="{html.escape(sequence)}" autocomplete="off" spellcheck="false"></label>'
                f'<label>head<select class="attn-live-head">{options}</select></label>')
    guesses = "".join(letters[g] for g in state["guesses"])
    body = (f'<p>next-token guesses, one per position: <code class="attn-live-guesses" data-role="guesses" '
            f'data-value="{",".join(map(str, state["guesses"]))}">{guesses}</code>; after the last letter: '
            f'\u201c<span data-role="next">{letters[state["guesses"][-1]]}</span>\u201d with probability '
            f'{_value("next-p", state["next_p"], 3)}</p>'
            '<div class="attn-live-grid"><p>(the page draws the chosen head\'s weights here)</p></div>')

    def draw():
        from .plotting import plot_attention

        layer, h = head
        labels = [letters[t] for t in tokens]
        return plot_attention(state["maps"][layer][h], labels, title=f"layer {layer}, head {h}",
                              annotate=len(tokens) <= 12).figure

    summary = (f"{sequence}: guesses {guesses}, after the last letter {letters[state['guesses'][-1]]!r} "
               f"({state['next_p']:.2f})")
    return LiveFigure("induction", "Type letters: the trained model's heads and guesses, live", controls, body,
                      data, draw, summary)
