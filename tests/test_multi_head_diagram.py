"""Chapter 6's picture of multi-head attention: one strip per head, and a clear error."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from attnlib.block_diagram import draw_multi_head  # noqa: E402


@pytest.mark.parametrize("n_heads", [1, 4, 8])
def test_one_labelled_head_per_head(n_heads):
    fig = draw_multi_head(n_heads)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert sum(t.startswith("$Q_") for t in texts) == n_heads  # one slice per head
    assert [t for t in texts if t.isdigit()] == [str(j) for j in range(n_heads)]  # the strips
    assert any(f"h = {n_heads}" in t for t in texts)
    for text in fig.axes[0].texts:
        assert text.get_fontsize() >= 11  # the book's smallest text
    matplotlib.pyplot.close(fig)


@pytest.mark.parametrize("bad", [0, 9, 2.0, "4"])
def test_bad_head_count_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="n_heads"):
        draw_multi_head(bad)
