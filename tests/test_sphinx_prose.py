"""The built book renders each templated cell from its template, with this build's glue."""

import json

from attnlib.sphinx_prose import templates_back


def _notebook(cells):
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def test_a_templated_cell_is_read_as_its_template_and_others_are_untouched():
    template = "took {glue:text}`ratio:.2f` times as long"
    cells = [
        {"cell_type": "markdown", "id": "a", "metadata": {"prose_template": template},
         "source": "took 1.30 times as long"},
        {"cell_type": "markdown", "id": "b", "metadata": {}, "source": "plain prose"},
        {"cell_type": "code", "id": "c", "metadata": {"prose_template": "not markdown"},
         "source": "x = 1", "outputs": [], "execution_count": 1},
    ]
    read = json.loads(templates_back(_notebook(cells)))["cells"]
    assert read[0]["source"] == template
    assert read[1]["source"] == "plain prose"
    assert read[2]["source"] == "x = 1"


def test_a_notebook_without_templates_comes_back_byte_for_byte():
    text = _notebook([{"cell_type": "markdown", "id": "a", "metadata": {}, "source": "text"}])
    assert templates_back(text) is text


def test_every_stored_chapter_template_holds_glue_roles():
    from pathlib import Path

    book = Path(__file__).resolve().parent.parent / "book"
    templates = [
        cell["metadata"]["prose_template"]
        for path in sorted(book.glob("*.ipynb"))
        for cell in json.loads(path.read_text())["cells"]
        if "prose_template" in cell.get("metadata", {})
    ]
    assert templates, "no chapter stores a prose template"
    assert all("{glue" in t for t in templates)
