"""tools/sync_prose.py: the prose of every notebook shows the glued numbers, not glue markup.

The chain that keeps every number computed: nbval checks that a fresh run reproduces
the stored glue outputs, and the test at the bottom checks that every templated cell's
text is its template rendered from those stored outputs.
"""

from pathlib import Path

import nbformat
import nbformat.v4 as v4
import pytest

from tools import sync_prose

BOOK = Path(__file__).resolve().parent.parent / "book"
CHAPTERS = sorted(BOOK.glob("*.ipynb"))


def _glue_output(name, text, mime="text/plain"):
    return nbformat.from_dict({
        "output_type": "display_data",
        "data": {f"application/papermill.record/{mime}": text},
        "metadata": {"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}},
    })


def _notebook(glued, *markdown):
    code = v4.new_code_cell("glue(...)", id="glue-cell", execution_count=1)
    code.outputs = [_glue_output(name, text) for name, text in glued.items()]
    cells = [code] + [v4.new_markdown_cell(text, id=f"prose-{i}") for i, text in enumerate(markdown)]
    return v4.new_notebook(cells=cells)


@pytest.mark.parametrize(("stored", "role", "shown"), [
    ("0.123456", "{glue:text}`x:.3f`", "0.123"),
    ("0.4567", "{glue:text}`x:.1%`", "45.7%"),
    ("1234567.0", "{glue:text}`x:,.0f`", "1,234,567"),
    ("1234567", "{glue:text}`x:,`", "1,234,567"),
    ("'0.41, 0.59'", "{glue:text}`x`", "0.41, 0.59"),
    ("12.5", "{glue:text}`x`", "12.5"),
    ("'cat'", "{glue}`x`", "cat"),
    ("3", "{glue:}`x`", "3"),
])
def test_a_role_is_rendered_as_myst_nb_renders_it(stored, role, shown):
    nb = _notebook({"x": stored}, f"The value is {role}.")
    sync_prose.sync(nb)
    assert nb.cells[1].source == f"The value is {shown}."
    assert nb.cells[1].metadata[sync_prose.TEMPLATE_KEY] == f"The value is {role}."


def test_markdown_glue_is_pasted_as_markdown():
    nb = _notebook({}, "Top token: {glue:md}`who`.")
    nb.cells[0].outputs.append(_glue_output("who", "**animal**", mime="text/markdown"))
    sync_prose.sync(nb)
    assert nb.cells[1].source == "Top token: **animal**."


def test_running_it_again_renders_new_values_from_the_stored_template():
    nb = _notebook({"x": "0.5"}, "Weight {glue:text}`x:.2f` and {glue:text}`x:.0%`.")
    assert sync_prose.sync(nb) == ["prose-0"]
    assert sync_prose.sync(nb) == []  # idempotent
    assert nb.cells[1].source == "Weight 0.50 and 50%."
    nb.cells[0].outputs = [_glue_output("x", "0.25")]  # as after re-executing the notebook
    assert sync_prose.sync(nb) == ["prose-0"]
    assert nb.cells[1].source == "Weight 0.25 and 25%."


def test_cells_without_roles_are_left_alone():
    nb = _notebook({"x": "1.0"}, "No numbers here, just $x$ and `code`.")
    assert sync_prose.sync(nb) == []
    assert nb.cells[1].source == "No numbers here, just $x$ and `code`."
    assert sync_prose.TEMPLATE_KEY not in nb.cells[1].metadata


def test_a_missing_value_is_an_error_naming_the_cell_and_the_role():
    nb = _notebook({"x": "1.0"}, "Oops {glue:text}`y:.2f`.")
    with pytest.raises(sync_prose.ProseSyncError, match=r"prose-0.*'y'.*glued: x"):
        sync_prose.sync(nb)


def test_stale_prose_is_reported():
    nb = _notebook({"x": "0.5"}, "Weight {glue:text}`x:.2f`.")
    assert [cell_id for cell_id, _ in sync_prose.stale(nb)] == ["prose-0"]  # raw markup
    sync_prose.sync(nb)
    assert sync_prose.stale(nb) == []
    nb.cells[0].outputs = [_glue_output("x", "0.7")]
    assert [cell_id for cell_id, _ in sync_prose.stale(nb)] == ["prose-0"]  # not re-rendered


def test_restore_puts_the_roles_back_for_editing():
    nb = _notebook({"x": "0.5"}, "Weight {glue:text}`x:.2f`.")
    sync_prose.sync(nb)
    assert sync_prose.restore(nb) == ["prose-0"]
    assert nb.cells[1].source == "Weight {glue:text}`x:.2f`."
    assert sync_prose.TEMPLATE_KEY not in nb.cells[1].metadata


def test_a_real_chapter_renders_every_role_and_comes_back(tmp_path):
    chapter = next(p for p in CHAPTERS if "{glue:text}" in p.read_text())
    copy = tmp_path / chapter.name
    copy.write_text(chapter.read_text())
    assert sync_prose.main([str(copy)]) == 0
    nb = nbformat.read(copy, as_version=4)
    assert not any(sync_prose.ROLE.search(c.source) for c in nb.cells if c.cell_type == "markdown")
    assert sync_prose.main(["--check", str(copy)]) == 0
    sync_prose.restore(nb)
    original = nbformat.read(chapter, as_version=4)
    sync_prose.restore(original)  # stored rendered or not, both now hold the templates
    assert [c.source for c in nb.cells] == [c.source for c in original.cells]
    assert any(sync_prose.ROLE.search(c.source) for c in nb.cells if c.cell_type == "markdown")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_the_prose_shows_the_stored_glue_values(chapter):
    """Every templated cell reads as its template rendered from the stored glue outputs."""
    nb = nbformat.read(chapter, as_version=4)
    problems = sync_prose.stale(nb, chapter.name)
    assert not problems, "run tools/sync_prose.py on it:\n" + "\n".join(f"{i}: {why}" for i, why in problems)
