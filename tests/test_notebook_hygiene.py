"""What a reader of the chapters sees of their code: short lines, no test markers, long
listings collapsed, a first cell that installs attnlib, and interactive figures in place."""

import fnmatch
import re
import tomllib
from pathlib import Path

import nbformat
import pytest

from tools import colab_setup, notebook_hygiene

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
MAX_LINE = 88


def _code_cells(path):
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_code_line_is_longer_than_88_characters(chapter):
    long_lines = [f"cell {cell.get('id')}, line {n}: {len(line)} characters"
                  for cell in _code_cells(chapter)
                  for n, line in enumerate(cell.source.splitlines(), 1) if len(line) > MAX_LINE]
    assert not long_lines, f"{chapter.name}: code lines over {MAX_LINE} characters:\n" + "\n".join(long_lines)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_nbval_markers_are_cell_tags_not_comments(chapter):
    visible = [(cell.get("id"), notebook_hygiene.nbval_comments(cell.source)) for cell in _code_cells(chapter)
               if notebook_hygiene.nbval_comments(cell.source)]
    assert not visible, f"run tools/notebook_hygiene.py: {visible}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_long_listings_are_collapsed_behind_a_summary(chapter):
    for cell in _code_cells(chapter):
        if notebook_hygiene.listing_lines(cell) > notebook_hygiene.LONG_LISTING_LINES:
            assert "hide-output" in cell.metadata.get("tags", []), cell.get("id")
            assert cell.metadata["mystnb"]["code_prompt_show"].startswith("Show the "), cell.get("id")


HIDDEN_TAGS = {"remove-cell", "remove-input", "hide-input", "hide-cell"}
BOOKKEEPING = re.compile(r"\bglue\(|from myst_nb import glue|# the numbers? (in|of) the prose")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_the_code_a_reader_sees_does_no_bookkeeping_for_the_prose(chapter):
    """glue() calls and the asserts that pin the prose's numbers live in hidden cells: the
    visible code teaches, and a learner never meets a function the book does not explain."""
    shown = [(cell.get("id"), line.strip()) for cell in _code_cells(chapter)
             if not HIDDEN_TAGS & set(cell.metadata.get("tags", []))
             for line in cell.source.splitlines() if BOOKKEEPING.search(line)]
    assert not shown, f"{chapter.name}: move these into a remove-cell cell:\n" + "\n".join(map(str, shown))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_figure_a_reader_sees_has_alt_text(chapter):
    """A figure's alt text says what it shows (cell metadata mystnb.image.alt): screen readers
    read it, and it shows where an image cannot load. myst-nb otherwise writes the file path."""
    missing = []
    for cell in _code_cells(chapter):
        tags = set(cell.metadata.get("tags", []))
        if tags & {"remove-cell", "remove-output"}:
            continue
        if any("image/png" in output.get("data", {}) for output in cell.get("outputs", [])):
            alt = cell.metadata.get("mystnb", {}).get("image", {}).get("alt", "")
            if len(alt.split()) < 4:
                missing.append(cell.get("id"))
    assert not missing, (f"{chapter.name}: figures without alt text (set "
                         f"cell.metadata['mystnb']['image']['alt']): {missing}")


def test_hygiene_moves_a_marker_comment_into_a_tag():
    cell = nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(time.time())", id="timing")
    assert notebook_hygiene.move_nbval_markers_to_tags(cell)
    assert cell.source == "print(time.time())"
    assert cell.metadata["tags"] == ["nbval-ignore-output"]
    assert not notebook_hygiene.move_nbval_markers_to_tags(cell)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_the_first_code_cell_installs_attnlib_from_the_configured_repository(chapter):
    first = _code_cells(chapter)[0]
    assert first.get("id") == colab_setup.CELL_ID, "run tools/colab_setup.py"
    assert first.source == colab_setup.setup_source(*colab_setup.repository())
    assert "remove-cell" in first.metadata.get("tags", [])


def test_the_set_up_cell_does_nothing_where_attnlib_is_installed(monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("it tried to install"))
    exec(compile(colab_setup.setup_source("https://example.invalid/repo", "main"), "setup", "exec"), {})


def test_the_data_the_chapters_read_ships_with_the_package():
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = ROOT / "attnlib" / "data"
    files = [p.relative_to(ROOT / "attnlib").as_posix() for p in data.rglob("*") if p.is_file()]
    assert "data/cpu_ratios.csv" in files
    for name in files:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in package_data["attnlib"]), name
    assert (ROOT / "book" / "data").resolve() == data.resolve(), "book/data should link to attnlib/data"


def test_at_least_four_interactive_figures_each_with_a_static_image_for_notebook_readers():
    figures = 0
    for chapter in CHAPTERS:
        cells = nbformat.read(chapter, as_version=4).cells
        for i, cell in enumerate(cells):
            if cell.cell_type != "code" or not cell.get("id", "").startswith("interactive-"):
                continue
            html = "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)
            if "attn-interactive" not in html:
                continue
            figures += 1
            assert "remove-input" in cell.metadata.get("tags", []), cell.get("id")
            assert not re.search(r"\b(src|href)=", html), f"{cell.get('id')} loads something"
            nearby = cells[max(0, i - 3): i + 3]
            assert any("image/png" in o.get("data", {}) for c in nearby if c.cell_type == "code"
                       for o in c.outputs), f"{chapter.name} {cell.get('id')}: no static image beside it"
    assert figures >= 4


# --- Numbers at the precision the prose needs (issue 18) -----------------------------------------
# A full float repr (0.9588865637779236) differs between CPUs in its last digits, and nbval
# compares stored outputs, glued values included, as text: such a number fails on another machine.

@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_stored_output_prints_a_number_with_8_or_more_significant_digits(chapter):
    found = notebook_hygiene.long_numbers(nbformat.read(chapter, as_version=4))
    assert not found, (f"{chapter.name}: print and glue numbers at the precision the prose needs "
                       f"(or tag the cell {notebook_hygiene.MANY_DIGITS_TAG!r} if the digits are the "
                       f"point):\n" + "\n".join(map(str, found)))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_glued_numbers_carry_no_more_decimals_than_the_prose_shows(chapter):
    finer = notebook_hygiene.glue_finer_than_prose(nbformat.read(chapter, as_version=4))
    assert not finer, (f"{chapter.name}: glue round(x, decimals) for these (name, value, decimals "
                       "the prose shows):\n" + "\n".join(map(str, finer)))


def test_significant_digits_are_counted_as_written():
    assert notebook_hygiene.significant_digits("0.9588865637779236") == 16
    assert notebook_hygiene.significant_digits("1.6e-14") == 2
    assert notebook_hygiene.significant_digits("0.000123") == 3
    assert notebook_hygiene.significant_digits("100.50") == 5


def _cell_printing(text, source="print(x)", tags=()):
    cell = nbformat.v4.new_code_cell(source, id="c")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    cell.metadata["tags"] = list(tags)
    return nbformat.v4.new_notebook(cells=[cell])


def test_a_full_float_repr_is_found_and_short_or_exact_numbers_are_not():
    assert notebook_hygiene.long_numbers(_cell_printing("weight 0.9588865637779236\n")) == [
        ("c", "stream", "0.9588865637779236")]
    assert notebook_hygiene.long_numbers(_cell_printing("error 1.6e-14, torch 2.13.0, 16777216 bytes, "
                                                        "0.959, 12.345678e3\n")) == [
        ("c", "stream", "12.345678e3")]


def test_glued_values_are_stored_text_outputs_too():
    cell = nbformat.v4.new_code_cell('glue("w", w, display=False)', id="g")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        notebook_hygiene.GLUE_MIME_PREFIX + "text/plain": "0.31131637096405"}, metadata={"scrapbook": {
            "name": "w", "mime_prefix": notebook_hygiene.GLUE_MIME_PREFIX}})]
    prose = nbformat.v4.new_markdown_cell("puts {glue:text}`w:.2f` on it")
    nb = nbformat.v4.new_notebook(cells=[cell, prose])
    assert notebook_hygiene.long_numbers(nb) == [("g", notebook_hygiene.GLUE_MIME_PREFIX + "text/plain",
                                                  "0.31131637096405")]
    assert notebook_hygiene.glue_finer_than_prose(nb) == [("w", 0.31131637096405, 2)]
    cell.outputs[0]["data"][notebook_hygiene.GLUE_MIME_PREFIX + "text/plain"] = "0.31"
    assert notebook_hygiene.long_numbers(nb) == [] and notebook_hygiene.glue_finer_than_prose(nb) == []


def test_many_digits_on_purpose_are_marked_and_listings_are_code():
    text = "online l = 2.677491286346\n"
    assert notebook_hygiene.long_numbers(_cell_printing(text, tags=[notebook_hygiene.MANY_DIGITS_TAG])) == []
    assert notebook_hygiene.long_numbers(_cell_printing("LOG2E = 1.4426950408889634\n",
                                                        source="print(inspect.getsource(kernel))")) == []


# --- Citations ------------------------------------------------------------------------------------
# The strict build fails on a {cite} key that references.bib lacks, after executing every chapter;
# this finds it in a second.
CITE_ROLE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")


def test_every_cited_key_is_in_references_bib():
    bib_keys = set(re.findall(r"^@\w+\{([^,\s]+),", (ROOT / "references.bib").read_text(), re.MULTILINE))
    pages = [*CHAPTERS, ROOT / "book" / "index.md", ROOT / "book" / "further_reading.md"]
    missing = {}
    for page in pages:
        if page.suffix == ".ipynb":
            text = "\n".join(c.source for c in nbformat.read(page, as_version=4).cells if c.cell_type == "markdown")
        else:
            text = page.read_text()
        for keys in CITE_ROLE.findall(text):
            for key in (k.strip() for k in keys.split(",")):
                if key not in bib_keys:
                    missing.setdefault(page.name, set()).add(key)
    assert not missing, f"cited but not in references.bib: {missing}"
