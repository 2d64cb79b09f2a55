"""attnlib.interactive: self-contained, deterministic HTML whose numbers are the library's."""

import re

import numpy as np
import pytest

import attnlib
from attnlib import interactive
from attnlib.examples import ANIMAL_SENTENCE, THE_CAT_SAT, animal_sentence_embeddings


def _scaled_row(token="sat"):
    t = THE_CAT_SAT.index(token)
    return THE_CAT_SAT.q[t] @ THE_CAT_SAT.k.T / np.sqrt(THE_CAT_SAT.d_k)


def _all_figures():
    weights = attnlib.attention_weights(THE_CAT_SAT.q, THE_CAT_SAT.k)
    return [
        interactive.stages(THE_CAT_SAT, token="cat"),
        interactive.heatmap(weights, THE_CAT_SAT.tokens),
        interactive.online_softmax_trace(_scaled_row(), THE_CAT_SAT.v, block_size=2,
                                         key_tokens=THE_CAT_SAT.tokens, query_token="sat"),
        interactive.softmax_temperature([2.0, 4.0, 6.0], THE_CAT_SAT.tokens),
    ]


@pytest.mark.parametrize("figure", _all_figures(), ids=lambda f: f.kind)
def test_the_html_loads_nothing_from_anywhere(figure):
    html = figure.html
    assert not re.search(r"\b(src|href)\s*=", html), "an interactive figure must not load anything"
    assert "<link" not in html and "@import" not in html and "url(" not in html
    assert not re.search(r"https?://", html)


@pytest.mark.parametrize("figure", _all_figures(), ids=lambda f: f.kind)
def test_the_same_figure_twice_gives_the_same_html(figure):
    again = next(f for f in _all_figures() if f.kind == figure.kind)
    assert again.html == figure.html
    assert figure.id in figure.html and figure.id.startswith(f"attn-{figure.kind}-")


def test_different_content_gets_a_different_id():
    assert interactive.stages(THE_CAT_SAT, token="cat").id != interactive.stages(THE_CAT_SAT, token="sat").id


@pytest.mark.parametrize("figure", _all_figures(), ids=lambda f: f.kind)
def test_only_the_first_frame_is_shown_before_the_script_runs(figure):
    frames = re.findall(r'<div class="attn-frame"[^>]*>', figure.html)
    assert len(frames) == figure.frames
    assert "hidden" not in frames[0]
    assert all(" hidden" in f for f in frames[1:])


def test_the_stages_show_the_library_s_weights_and_outputs():
    figure = interactive.stages(THE_CAT_SAT, token="cat")
    assert figure.frames == 4
    cat = THE_CAT_SAT.index("cat")
    weights = attnlib.attention_weights(THE_CAT_SAT.q, THE_CAT_SAT.k)[cat]
    output = attnlib.attention(THE_CAT_SAT.q, THE_CAT_SAT.k, THE_CAT_SAT.v)[cat]
    for w in weights:
        assert f"{w:.3f}" in figure.html
    for o in output:
        assert f"{o:.2f}" in figure.html


def test_the_heatmap_reads_out_every_weight():
    x = animal_sentence_embeddings(d_model=16, seed=0)
    layer = attnlib.SelfAttention(d_model=16, d_k=16, d_v=16, max_seq_len=64, seed=0)
    weights = layer.weights(x)
    figure = interactive.heatmap(weights, ANIMAL_SENTENCE)
    readouts = re.findall(r'data-readout="([^"]*)"', figure.html)
    assert len(readouts) == weights.size
    it, animal = ANIMAL_SENTENCE.index("it"), ANIMAL_SENTENCE.index("animal")
    expected = f"weight {weights[it, animal]:.3f}"
    assert any(f"query {it} " in r and f"key {animal} " in r and r.endswith(expected) for r in readouts)


def test_the_heatmap_refuses_labels_that_do_not_match():
    with pytest.raises(ValueError, match=r"shape \(3, 3\).*2 query tokens"):
        interactive.heatmap(np.eye(3), ["a", "b"])


@pytest.mark.parametrize("block_size", [1, 2, 3, 5])
def test_the_online_trace_ends_at_the_one_pass_softmax(block_size):
    scores = _scaled_row()
    figure = interactive.online_softmax_trace(scores, THE_CAT_SAT.v, block_size=block_size,
                                              key_tokens=THE_CAT_SAT.tokens, query_token="sat")
    n_blocks = -(-len(scores) // block_size)
    assert figure.frames == n_blocks + 1
    exact = attnlib.attention(THE_CAT_SAT.q, THE_CAT_SAT.k, THE_CAT_SAT.v)[THE_CAT_SAT.index("sat")]
    final = figure.html.split('data-title="a / ')[1]
    for value in exact:
        assert f"{value:.4f}" in final
    assert f"{np.exp(scores - scores.max()).sum():.4f}" in figure.html  # the final running sum


def test_the_online_trace_rescales_only_when_the_maximum_rises():
    scores = np.array([3.0, 1.0, 2.0, 5.0])
    figure = interactive.online_softmax_trace(scores, np.eye(4), block_size=1, key_tokens="abcd",
                                              query_token="q")
    assert figure.html.count("does not raise the maximum") == 2
    assert figure.html.count("raises the maximum from") == 1


def test_the_online_trace_refuses_bad_input():
    with pytest.raises(ValueError, match="block_size"):
        interactive.online_softmax_trace(np.zeros(3), np.zeros((3, 2)), block_size=0, key_tokens="abc",
                                         query_token="q")
    with pytest.raises(ValueError, match=r"scores must have shape.*\(4,\)"):
        interactive.online_softmax_trace(np.zeros(4), np.zeros((3, 2)), block_size=1, key_tokens="abcd",
                                         query_token="q")


def test_a_larger_factor_puts_more_weight_on_the_largest_score():
    figure = interactive.softmax_temperature([2.0, 4.0, 6.0], ["a", "b", "c"], factors=(0.5, 1.0, 4.0))
    largest = [float(x) for x in re.findall(r"the largest weight is ([0-9]+\.[0-9]+)", figure.html)]
    assert largest == sorted(largest) and largest[0] < largest[-1]


@pytest.mark.parametrize("figure", _all_figures(), ids=lambda f: f.kind)
def test_every_figure_has_a_static_twin_for_notebook_readers(figure):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = figure.static_figure()
    assert fig.axes
    plt.close(fig)


def test_the_temperature_figure_opens_on_the_factor_asked_for():
    default = interactive.softmax_temperature([2.0, 4.0, 6.0], ["a", "b", "c"])
    figure = interactive.softmax_temperature([2.0, 4.0, 6.0], ["a", "b", "c"], start_factor=0.5)
    frames = re.findall(r'<div class="attn-frame" data-title="([^"]*)"([^>]*)>', figure.html)
    shown = [title for title, rest in frames if "hidden" not in rest]
    assert shown == ["c = 0.5"]
    assert "show(2);" in figure.html and "show(0);" in default.html
    assert figure.id != default.id
    with pytest.raises(ValueError, match="start_factor must be one of factors"):
        interactive.softmax_temperature([2.0, 4.0, 6.0], ["a", "b", "c"], start_factor=0.3)
    with pytest.raises(ValueError, match="start must be a frame index"):
        interactive.InteractiveFigure("x", "t", [("a", "")], start=1)
