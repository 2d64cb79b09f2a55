"""Put the interactive figures (attnlib.interactive) into their chapters.

Usage: python tools/insert_interactive.py [notebook stems...]   (default: all)

Each figure is a group of cells whose ids start with ``interactive-``: a short lead-in
(markdown), a static matplotlib twin for readers of the notebook (tag ``remove-cell``:
JupyterLab runs no script in an untrusted notebook, so there the static figure is what
a reader sees) and the interactive figure itself (tag ``remove-input``: the HTML book
shows the figure, not the line that makes it). A group goes right after its anchor
cell the first time; later runs update the cells where they are, so the script can
be run again after the prose around them changes. Run tools/execute_notebooks.py on
the chapter afterwards.
"""

import sys
from pathlib import Path

import nbformat.v4 as v4

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.nbedit import editing  # noqa: E402

STAGES = [
    ("markdown", "interactive-stages-intro", [],
     "Here are the same five steps for every token at once, as four stages (scaling and "
     "softmax share one), with *cat*'s row outlined. Step through them with the buttons or "
     "the slider:"),
    ("code", "interactive-stages-static", ["remove-cell"],
     'from attnlib import interactive\n\n'
     'stages = interactive.stages(ex, token="cat")  # the four stages, one frame each\n'
     "stages.static_figure()  # the static version, for readers of the notebook\n"
     "plt.show()"),
    ("code", "interactive-stages", ["remove-input"], "stages"),
]

TEMPERATURE = [
    ("markdown", "interactive-temperature-intro", [],
     "Dividing by $\\sqrt{d_k}$ multiplies every score by one factor $c$. Slide $c$: a small "
     "$c$ flattens the weights towards uniform, a large one piles them on the largest score. "
     "The slider opens where scaling puts it, $c = 1/\\sqrt{d_k} =$ "
     "{glue:text}`example_factor:.1f`:"),
    ("code", "interactive-temperature-static", ["remove-cell"],
     "from attnlib import interactive\n\n"
     "factor_slider = interactive.softmax_temperature(\n"
     "    example_scores, tokens, start_factor=1 / np.sqrt(example_d_k)\n)\n"
     "factor_slider.static_figure()  # the static version, for readers of the notebook\n"
     "plt.show()"),
    ("code", "interactive-temperature", ["remove-input"], "factor_slider"),
]

HEATMAP = [
    ("markdown", "interactive-heatmap-intro", [],
     "The same weights again, interactive: point at a cell (or tap it) to read which "
     "query attends to which key, and with what weight."),
    ("code", "interactive-heatmap", ["remove-input"],
     "from attnlib import interactive\n\n"
     "interactive.heatmap(\n"
     '    animal_weights, sentence, title="One untrained layer: who attends to whom"\n'
     ")"),
]

ONLINE_SOFTMAX = [
    ("markdown", "interactive-online-softmax-intro", [],
     "In the running example every key raised the maximum. On a longer row it does not "
     "always: step through the twelve keys of a longer sentence in blocks of three, for the "
     "query *it*, and watch $m$, $\\alpha$, $\\ell$ and $a$. Where a block brings no new "
     "maximum, $\\alpha = 1$ and nothing is rescaled."),
    ("code", "interactive-online-softmax-static", ["remove-cell"],
     "from attnlib import interactive\n"
     "from attnlib.examples import ANIMAL_SENTENCE, animal_sentence_embeddings\n\n"
     "sentence_layer = attnlib.SelfAttention(\n"
     "    d_model=16, d_k=16, d_v=4, max_seq_len=64, seed=0\n"
     ")\n"
     "q_s, k_s, v_s = sentence_layer.project(animal_sentence_embeddings(d_model=16, seed=0))\n"
     'it_scores = q_s[ANIMAL_SENTENCE.index("it")] @ k_s.T / np.sqrt(16)  # (12,)\n'
     "trace = interactive.online_softmax_trace(\n"
     '    it_scores, v_s, block_size=3, key_tokens=ANIMAL_SENTENCE, query_token="it"\n'
     ")\n"
     "trace.static_figure()  # the static version, for readers of the notebook\n"
     "plt.show()"),
    ("code", "interactive-online-softmax", ["remove-input"], "trace"),
]

# notebook stem -> [(id of the cell the group follows, group)]
PLACES = {
    "02_token_by_token": [("ae76cf88", STAGES)],
    "04_scale_and_softmax": [("fcc4df3d", TEMPERATURE)],
    "05_weighted_sum": [("29d76284", HEATMAP)],
    "12_without_the_matrix": [("66bc5e5e", ONLINE_SOFTMAX)],
}


def _new_cell(kind, cell_id, tags, source):
    make = v4.new_markdown_cell if kind == "markdown" else v4.new_code_cell
    cell = make(source, id=cell_id)
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def place(stem):
    with editing(ROOT / "book" / f"{stem}.ipynb") as nb:
        for anchor, group in PLACES[stem]:
            ids = [cell.get("id") for cell in nb.cells]
            previous = anchor
            for kind, cell_id, tags, source in group:
                cell = _new_cell(kind, cell_id, tags, source)
                if cell_id in ids:
                    old = nb.cells[ids.index(cell_id)]
                    old.source = source
                    old.metadata["tags"] = sorted(set(old.metadata.get("tags", [])) | set(tags))
                    if not old.metadata["tags"]:
                        del old.metadata["tags"]
                elif previous in ids:
                    nb.cells.insert(ids.index(previous) + 1, cell)
                else:
                    raise SystemExit(f"{stem}: no cell {previous!r} to put {cell_id!r} after")
                ids = [c.get("id") for c in nb.cells]
                previous = cell_id
    print(f"{stem}: {sum(len(group) for _, group in PLACES[stem])} interactive cells in place")


if __name__ == "__main__":
    for name in sys.argv[1:] or PLACES:
        place(name)
