"""The GPT that writes, live: chapter 10's model continues the reader's text in the page.

The reader types a prompt, picks a temperature, a sampling seed (for the random draw, not the
model's training seed) and a head; the page runs the trained
character-level GPT (:mod:`attnlib.learn.gpt`) in JavaScript (``attnlib/live_writer.js``), one
token at a time with a KV cache whose last ``WINDOW`` positions each layer keeps, exactly as
:func:`attnlib.sampling.generate` with ``window=WINDOW``, and draws each next character with the
same seeded generator and rule as :func:`attnlib.sampling.sample_next`. It shows the text
written and where the chosen head looked from the last position.

The weights travel inside the page as base64 of their float32 bytes (about 0.57 MB); both the
page and :func:`writer_state`, its Python twin, compute in float64 from those float32 values.
``tests/test_live_figures.py`` types prompts into the page in Chromium and compares its logits
with :func:`writer_state` to 1e-6 and its text exactly.
"""

import base64
import hashlib
import html
import json
import math
import string
import unicodedata
from importlib import resources

import numpy as np

from .interactive import CSS
from .live import LiveFigure
from .sampling import Uniform, sample_next

SCRIPT = resources.files(__package__).joinpath("live_writer.js").read_text(encoding="utf-8").rstrip("\n")
WINDOW = 64  # positions each layer's cache keeps: the context the model was trained on
TEMPERATURES = (0.0, 0.5, 0.8, 1.0, 1.5)
MAX_NEW = 1000  # characters the page writes at most at each keystroke


def _arrays(model):
    """The model's weights as float32 arrays, in the order the page reads them: [(name, array)]."""
    out = [("embedding", model.embedding)]
    for i, block in enumerate(model.blocks):
        if block.mlp is None:
            raise ValueError("the writer needs blocks with an MLP (chapter 10's model)")
        p = f"blocks.{i}."
        out += [(p + "norm_1.gain", block.norm_1.gain), (p + "norm_1.bias", block.norm_1.bias)]
        out += [(p + name, getattr(block.attention, name)) for name in ("w_q", "w_k", "w_v", "w_o")]
        out += [(p + "norm_2.gain", block.norm_2.gain), (p + "norm_2.bias", block.norm_2.bias)]
        out += [(p + "mlp." + name, getattr(block.mlp, name)) for name in ("w_1", "b_1", "w_2", "b_2")]
    out += [("norm.gain", model.norm.gain), ("norm.bias", model.norm.bias), ("unembedding", model.unembedding)]
    return [(name, tensor.detach().cpu().numpy().astype("<f4")) for name, tensor in out]


def export_writer(model, vocab):
    """What the page needs: the config, the vocabulary, and the weights as base64 float32."""
    from .learn.transformer import Decoder

    if not isinstance(model, Decoder) or model.position_scheme != "rope":
        raise TypeError(f"model must be an attnlib.learn.transformer.Decoder with RoPE, got {type(model).__name__}")
    arrays = _arrays(model)
    if len(vocab) != model.vocab_size:
        raise ValueError(f"vocab has {len(vocab)} tokens, the model {model.vocab_size}")
    blob = b"".join(a.tobytes() for _, a in arrays)
    config = {"d_model": int(model.embedding.shape[1]), "n_heads": model.blocks[0].attention.n_heads,
              "n_layers": len(model.blocks), "eps": model.norm.eps, "rope_base": 10000.0, "window": WINDOW}
    return {"config": config, "vocab": list(vocab), "knows": describe_alphabet(vocab),
            "manifest": [[n, list(a.shape)] for n, a in arrays],
            "weights": base64.b64encode(blob).decode("ascii")}


def exported_weights(data):
    """The page's weights back as float64 arrays by name (the float32 values, exactly)."""
    blob, out, offset = np.frombuffer(base64.b64decode(data["weights"]), dtype="<f4"), {}, 0
    for name, shape in data["manifest"]:
        n = int(np.prod(shape))
        out[name] = blob[offset:offset + n].astype(np.float64).reshape(shape)
        offset += n
    return out


def _layer_norm(x, gain, bias, eps):
    mean = x.mean()
    variance = ((x - mean) ** 2).mean()
    return (x - mean) / math.sqrt(variance + eps) * gain + bias


def _rope(x, position, base):
    d = len(x)
    half = d // 2
    angles = position * base ** (-np.arange(0, d, 2) / d)  # (d/2,)
    c, s = np.cos(angles), np.sin(angles)
    return np.concatenate([x[:half] * c - x[half:] * s, x[:half] * s + x[half:] * c])


_erf = np.vectorize(math.erf)


def step(config, w, caches, token, position):
    """One token at ``position`` through every block; each block's cache (a list) gains its keys and
    values and keeps the last ``window``. Returns the logits (V,) and each layer's (H, n_keys) weights."""
    d, H = config["d_model"], config["n_heads"]
    dh = d // H
    x = w["embedding"][token].copy()  # (d,)
    maps = []
    for layer, cache in enumerate(caches):
        p = f"blocks.{layer}."
        h = _layer_norm(x, w[p + "norm_1.gain"], w[p + "norm_1.bias"], config["eps"])
        q, k, v = (h @ w[p + name] for name in ("w_q", "w_k", "w_v"))  # (d,) each
        cache.append(([_rope(k[j * dh:(j + 1) * dh], position, config["rope_base"]) for j in range(H)],
                      [v[j * dh:(j + 1) * dh] for j in range(H)]))
        del cache[:-config["window"]]
        heads, layer_maps = [], []
        for j in range(H):
            qj = _rope(q[j * dh:(j + 1) * dh], position, config["rope_base"])
            keys = np.stack([entry[0][j] for entry in cache])  # (n, dh)
            values = np.stack([entry[1][j] for entry in cache])
            scores = keys @ qj / math.sqrt(dh)
            weights = np.exp(scores - scores.max())
            weights /= weights.sum()
            heads.append(weights @ values)
            layer_maps.append(weights)
        maps.append(layer_maps)
        x = x + np.concatenate(heads) @ w[p + "w_o"]
        h2 = _layer_norm(x, w[p + "norm_2.gain"], w[p + "norm_2.bias"], config["eps"])
        pre = h2 @ w[p + "mlp.w_1"] + w[p + "mlp.b_1"]
        hidden = 0.5 * pre * (1 + _erf(pre / math.sqrt(2)))  # GELU, exact
        x = x + hidden @ w[p + "mlp.w_2"] + w[p + "mlp.b_2"]
    logits = _layer_norm(x, w["norm.gain"], w["norm.bias"], config["eps"]) @ w["unembedding"]
    return logits, maps


def describe_alphabet(vocab):
    """The model's alphabet in words, for the message a bad prompt gets: "it knows the letters a-z and
    A-Z but “X”, space, newline and ! ' ( ) , - . : ; ?" (the letters it lacks named)."""
    letters = string.ascii_lowercase + string.ascii_uppercase
    missing = [c for c in letters if c not in vocab]
    few = len(missing) <= 5  # the letters but a few: name the few; else list the letters it has
    but = " but " + ", ".join(map(name_char, missing)) if missing else ""
    words = ["the letters a-z and A-Z" + but] * few
    words += [word for c, word in ((" ", "space"), ("\n", "newline")) if c in vocab]
    others = [c for c in vocab if (c not in letters or not few) and c not in " \n"]
    if others:
        words.append(" ".join(others))
    return "it knows " + (", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0])


def name_char(c):
    """One character as a message names it: in quotes, or by its code point when it cannot be seen
    (a tab, a no-break space, a control character): live_writer.js's nameChar."""
    if unicodedata.category(c)[0] in "CZ":
        return f"the invisible U+{ord(c):04X}"
    return f"\u201c{c}\u201d"


def parse_prompt(text, vocab, window=WINDOW):
    """The reader's prompt -> token ids, or ValueError with the message the page shows."""
    unknown = sorted(set(text) - set(vocab), key=text.index)
    if unknown:
        raise ValueError("not in the model's alphabet: " + ", ".join(map(name_char, unknown))
                         + f" ({describe_alphabet(vocab)})")
    if not text:
        raise ValueError("type at least one character")
    if len(text) > window:
        raise ValueError(f"at most {window} characters (got {len(text)})")
    return [vocab.index(c) for c in text]


def writer_state(data, prompt, temperature, seed, n_new):
    """What the page shows: ``{"text", "tokens", "logits", "maps"}`` for one prompt.

    ``logits`` (V,) are the scores the last character was drawn from, ``maps`` that step's
    weights, one (H, n_keys) list per layer.
    """
    config, vocab = data["config"], data["vocab"]
    w = exported_weights(data)
    ids = parse_prompt(prompt, vocab, config["window"])
    caches = [[] for _ in range(config["n_layers"])]
    generator = None if temperature == 0 else Uniform(seed)
    for position, token in enumerate(ids):
        logits, maps = step(config, w, caches, token, position)
    tokens = list(ids)
    for s in range(n_new):
        last_logits, last_maps = logits, maps
        token = sample_next(logits, temperature=temperature, generator=generator)
        tokens.append(token)
        if s < n_new - 1:
            logits, maps = step(config, w, caches, token, len(tokens) - 1)
    return {"text": "".join(vocab[t] for t in tokens[len(ids):]), "tokens": tokens,
            "logits": last_logits, "maps": last_maps}


def writer_live(model, vocab, prompt="And God said", *, temperature=0.8, seed=1, n_new=200, head=(1, 0)):
    """Type a prompt, pick a temperature, a seed and a head: the trained GPT writes on, in the page."""
    if isinstance(n_new, bool) or not isinstance(n_new, (int, np.integer)) or not 1 <= n_new <= MAX_NEW:
        raise ValueError(f"n_new must be an int in 1 ... {MAX_NEW}, got {n_new!r}")
    Uniform(seed)  # the seed's checks, at every temperature: the page refuses a bad seed even when greedy
    data = dict(export_writer(model, vocab), n_new=int(n_new))
    config = data["config"]
    if float(temperature) not in TEMPERATURES:
        raise ValueError(f"temperature must be one of {TEMPERATURES}, got {temperature!r}")
    if tuple(head) not in {(l, h) for l in range(config["n_layers"]) for h in range(config["n_heads"])}:
        raise ValueError(f"head must be (layer, head) with layer < {config['n_layers']} and head < "
                         f"{config['n_heads']}, got {head}")
    state = writer_state(data, prompt, float(temperature), seed, n_new)
    options = "".join(f'<option value="{t:g}"{" selected" if t == float(temperature) else ""}>{t:g}'
                      f'{" (greedy)" if t == 0 else ""}</option>' for t in TEMPERATURES)
    heads = "".join(f'<option value="{l},{h}"{" selected" if (l, h) == tuple(head) else ""}>layer {l}, '
                    f'head {h}</option>' for l in range(config["n_layers"]) for h in range(config["n_heads"]))
    controls = (f'<label>prompt<textarea class="attn-live-prompt" rows="2" cols="32" '
                f'maxlength="{config["window"]}" autocomplete="off" spellcheck="false">'
                f'{html.escape(prompt)}</textarea></label>'
                f'<label>temperature<select class="attn-live-temperature">{options}</select></label>'
                f'<label>sampling seed<input type="text" inputmode="numeric" class="attn-live-seed" value="{int(seed)}" '
                f'size="10"></label><label>head<select class="attn-live-head">{heads}</select></label>')
    body = (f'<p>the model writes on, at <span class="attn-live-settings">temperature '
            f'{float(temperature):g}, sampling seed {int(seed)}</span>: '
            f'<span class="attn-live-written" data-role="text" '
            f'data-value="{html.escape(state["text"])}" style="white-space:pre-wrap">'
            f'{html.escape(state["text"])}</span></p>'
            '<span data-role="logits" data-value="" hidden></span>'
            '<p>where the chosen head looks from the last position (darker: more weight):</p>'
            '<div class="attn-live-grid" style="font-family:monospace;white-space:pre-wrap;'
            'word-break:break-all">(the page shades the characters here)</div>')

    def draw():
        import textwrap

        import matplotlib.pyplot as plt

        layer, h = head
        weights = np.asarray(state["maps"][layer][h])
        seen = state["tokens"][:-1][-len(weights):]  # the characters the last position looked at
        shown = lambda text: text.replace("\n", "\u21b5")  # noqa: E731
        lines = textwrap.wrap(shown(prompt) + " \u2192 " + shown(state["text"]), 96, drop_whitespace=False)
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 1.1 + 0.2 * len(lines)), constrained_layout=True,
                                          gridspec_kw={"height_ratios": [0.2 * len(lines) + 0.2, 0.5]})
        top.axis("off")
        top.text(0, 1, "\n".join(lines), family="monospace", fontsize=8, va="top")
        top.set_title(f"the model writes on \u201c{shown(prompt)}\u201d (temperature {float(temperature):g}, "
                      f"sampling seed {int(seed)})", fontsize=10, loc="left")
        bottom.imshow(weights[None, :] / weights.max(), cmap="Blues", vmin=0, vmax=1.6, aspect="auto")
        for j, t in enumerate(seen):
            bottom.text(j, 0, shown(vocab[t]), ha="center", va="center", family="monospace", fontsize=7)
        bottom.set_xticks([])
        bottom.set_yticks([])
        bottom.set_title(f"layer {layer}, head {h}: where the last position looks (darker: more weight)",
                         fontsize=9, loc="left")
        return fig

    summary = f"{prompt}|{state['text']}".replace("\n", "\u21b5")  # one line: a newline shows as \u21b5
    figure = LiveFigure("writer", "Type a prompt: the trained GPT writes on, live", controls, body,
                        data, draw, summary)
    # this figure runs its own script (live_writer.js), not live.js's starters
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    digest = hashlib.sha1(f"writer|{controls}|{payload}".encode()).hexdigest()[:12]
    figure.id = f"attn-live-writer-{digest}"
    figure.html = (
        f'<div class="attn-interactive attn-live" id="{figure.id}" data-live="writer" data-frames="1">'
        f"<style>{CSS.strip()}</style>"
        f'<p class="attn-title">{html.escape(figure.title)}</p>'
        f'<div class="attn-live-inputs">{controls}</div>'
        f'<p class="attn-live-message" role="alert"></p>'
        f'<div class="attn-live-out">{body}</div>'
        f'<script type="application/json" class="attn-live-data">{payload}</script>'
        f'<script>{SCRIPT}\nwindow.attnWriter.start("{figure.id}");</script></div>'
    )
    return figure
