"""Part III's opening pages, their pictures, the appendix on measuring, and ch10's symbols."""

import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from attnlib.bench import diagrams, gpu_results  # noqa: E402

BOOK = Path(__file__).resolve().parent.parent / "book"
PART_III = ["11_timing_on_gpu", "12_without_the_matrix", "13_backward_pass", "15_decoding_at_scale"]
HIDDEN = {"remove-cell", "remove-input", "hide-cell", "hide-input"}


def cells(name):
    return json.loads((BOOK / f"{name}.ipynb").read_text(encoding="utf-8"))["cells"]


def source(cell):
    return "".join(cell["source"])


@pytest.mark.parametrize("draw", [diagrams.plot_naive_vs_fused, diagrams.plot_tile_stream,
                                  diagrams.plot_backward_flow, diagrams.plot_paged_cache])
def test_each_diagram_draws_labelled_boxes(draw):
    fig = draw()
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert len(texts) >= 5 and all(ax.patches for ax in fig.axes)
    plt.close(fig)


def test_the_tile_stream_sends_v_to_the_running_sum():
    """An arrow in the values' colour ends at the running-state box, above the K arrow's
    end at the scores."""
    from matplotlib.colors import to_rgba
    from matplotlib.patches import FancyArrowPatch

    fig = diagrams.plot_tile_stream()
    ax = fig.axes[0]
    ends = {colour: [a._posA_posB[1][0] for a in ax.patches
                     if isinstance(a, FancyArrowPatch)
                     and a.get_edgecolor() == to_rgba(colour)]
            for colour in (diagrams.KEY, diagrams.VALUE)}
    assert len(ends[diagrams.VALUE]) == 1 and len(ends[diagrams.KEY]) == 1
    assert ends[diagrams.VALUE][0] > 8.2 > ends[diagrams.KEY][0]  # the running box's left
    plt.close(fig)


def test_the_tile_stream_needs_two_key_tiles():
    with pytest.raises(ValueError, match="n_key_tiles"):
        diagrams.plot_tile_stream(n_key_tiles=1)


@pytest.mark.parametrize("name", PART_III)
def test_each_chapter_opens_with_its_picture_and_its_result(name):
    """Before the first '## ' heading: a figure with alt text drawn by attnlib, and
    'The result in three sentences' with glued numbers."""
    opening = []
    for cell in cells(name):
        if cell["cell_type"] == "markdown" and re.search(r"^## ", source(cell), re.M):
            break
        opening.append(cell)
    figures = [c for c in opening if c["cell_type"] == "code" and "diagrams.plot_" in source(c)]
    assert len(figures) == 1, name
    alt = figures[0]["metadata"]["mystnb"]["image"]["alt"]
    assert len(alt.split()) >= 20
    assert any(o.get("data", {}).get("image/png") for o in figures[0]["outputs"])
    result = [source(c) for c in opening if c["cell_type"] == "markdown"
              and "The result in three sentences" in source(c)]
    assert len(result) == 1 and re.search(r"\d", result[0]), name


def test_part_three_says_whom_it_is_for():
    first = source(cells(PART_III[0])[0])
    assert "Part III" in first and "assumes" in first and "PyTorch" in first


def test_ch10_keeps_capital_s_for_the_raw_scores():
    """Chapter 0's S is Q K^T, unscaled: chapter 13 writes the scaled scores as S-tilde."""
    text = ""
    for cell in cells("13_backward_pass"):
        if cell["cell_type"] == "markdown":
            if source(cell).lstrip().startswith("## Exercises"):
                break
            text += source(cell)
    assert r"S = QK^\top" in text and r"\tilde S = \text{scale}\cdot S" in text
    assert not re.search(r"(?<![A-Za-z_\\])dS(?![A-Za-z_])", text)  # every dS is d\tilde S
    assert r"\text{scale}\cdot QK^\top" not in text


def test_ch13_exercises_write_the_scores_gradient_as_the_text_does():
    """The exercises' tasks and answers say d\\tilde S, as the chapter does, never a bare dS."""
    text = "".join(source(c) for c in cells("13_backward_pass") if c["cell_type"] == "markdown")
    exercises = text[text.index("## Exercises"):]
    assert r"d\tilde S" in exercises
    assert not re.search(r"(?<![A-Za-z_\\])dS(?![A-Za-z_~])", exercises)


def test_tile_lists_say_how_their_commits_were_inferred():
    data = json.loads(gpu_results.TILE_LISTS.read_text())
    how = data["how_inferred"]
    assert "inferred" in how and "date_utc" in how and "git log" in how


def test_the_appendix_shows_no_glue_and_runs_clean():
    appendix = cells("appendix_measuring")
    assert source(appendix[0]).startswith("# Measuring a GPU honestly")
    for cell in appendix:
        if cell["cell_type"] != "code":
            continue
        tags = set(cell.get("metadata", {}).get("tags", []))
        if "glue(" in source(cell):
            assert HIDDEN & tags, source(cell)[:80]
        assert not any(o.get("output_type") == "error" for o in cell.get("outputs", []))
    text = "".join(source(c) for c in appendix if c["cell_type"] == "markdown")
    for topic in ("throttle", "flag", "git commit", "tools/gpu_run.sh", "do_bench"):
        assert topic in text, topic


def test_the_backward_flow_sends_k_to_dq_and_q_to_dk():
    """dQ = scale · dS̃ K reads K, and dK = scale · dS̃ᵀ Q reads Q: an arrow in the keys'
    colour ends at dQ's box, one in the queries' colour at dK's, lower down."""
    from matplotlib.colors import to_rgba
    from matplotlib.patches import FancyArrowPatch

    fig = diagrams.plot_backward_flow()
    ax = fig.axes[0]
    ends = {colour: [a._posA_posB[1] for a in ax.patches
                     if isinstance(a, FancyArrowPatch)
                     and a.get_edgecolor() == to_rgba(colour)]
            for colour in (diagrams.KEY, diagrams.QUERY)}
    assert len(ends[diagrams.KEY]) == 1 and len(ends[diagrams.QUERY]) == 1
    (kx, ky), (qx, qy) = ends[diagrams.KEY][0], ends[diagrams.QUERY][0]
    assert kx >= 10.4 and qx >= 10.4  # the gradients' boxes start at x = 10.5
    assert 3.2 < ky < 4.0 and 1.7 < qy < 2.5  # dQ's box, then dK's
    plt.close(fig)


def test_the_backward_flow_draws_every_t_by_t_block_red_and_nothing_else():
    """S → P, dP and dS̃ are T × T blocks: their boxes share the scores' red, as the
    title says; the inputs, D (one number per query) and the gradients do not."""
    from matplotlib.colors import to_rgba
    from matplotlib.patches import FancyBboxPatch

    fig = diagrams.plot_backward_flow()
    ax = fig.axes[0]
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    labels = {}
    for box in boxes:  # each box's label is the text at its centre
        x, y = box.get_x() + box.get_width() / 2, box.get_y() + box.get_height() / 2
        label = next(t.get_text() for t in ax.texts
                     if abs(t.get_position()[0] - x) < 1e-6
                     and abs(t.get_position()[1] - y) < 1e-6)
        labels[label] = box.get_facecolor() == to_rgba(diagrams.SCORE)
    red = {label for label, is_red in labels.items() if is_red}
    assert red == {"S → P", "dP = dO Vᵀ", "dS̃ = P∘(dP − D)"}, red
    assert "P, dP, dS̃" in ax.get_title()
    plt.close(fig)
