"""Each chapter's main path stays short: about 1,500 words of prose, the rest in deep dives."""

import json
from pathlib import Path

import pytest

from tools.main_path_words import main_path_words, strip_collapsed

BOOK = Path(__file__).resolve().parent.parent / "book"
CHAPTERS = sorted(BOOK.glob("[0-9][0-9]_*.ipynb"))
MAX_WORDS = 1550  # "about 1,500"


def test_collapsed_blocks_code_and_display_math_are_not_counted():
    markdown = "\n".join([
        "One two three.",
        ":::{dropdown} Deep dive: hidden",
        "four five six seven",
        ":::",
        "```{admonition} Also hidden",
        ":class: dropdown",
        "eight nine",
        "```",
        "```{note}",
        "Visible note.",
        "```",
        "```python",
        "x = 1",
        "```",
        "$$ a + b $$",
        "End.",
    ])
    assert strip_collapsed(markdown).split() == ["One", "two", "three.", "Visible", "note.", "End."]


def test_the_exercises_section_is_not_counted(tmp_path):
    cells = [{"cell_type": "markdown", "source": ["# Title\n", "Five words on the path."]},
             {"cell_type": "code", "source": ["print('code is not prose')"]},
             {"cell_type": "markdown", "source": ["## Exercises\n", "Many words here not counted."]},
             {"cell_type": "markdown", "source": ["After the exercises."]}]
    path = tmp_path / "chapter.ipynb"
    path.write_text(json.dumps({"cells": cells}), encoding="utf-8")
    assert main_path_words(path) == 7  # "# Title" and five words


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_main_path_is_about_1500_words(chapter):
    words = main_path_words(chapter)
    assert words <= MAX_WORDS, f"{chapter.name}: {words} words on the main path; move expert material " \
                               f"into a ':::{{dropdown}} Deep dive' block"
