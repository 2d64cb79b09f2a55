"""The main path speaks to a learner, not to the book's maintainers.

The main path is what tools/main_path_words.py counts: the markdown before a chapter's
"## Exercises" heading, less its collapsed blocks (deep dives, dropdowns), code fences and
display math; and the code cells a reader sees there (those without a ``remove-cell``,
``remove-input``, ``hide-cell`` or ``hide-input`` tag). In it, none of: the library's own
tests, the names of stored data files, commands that regenerate data, GPU state tables,
the library's error classes, and (in visible code) ``glue(`` calls or ``# prose`` notes.
Every chapter notebook in book/ is checked (a glob, so a new chapter is checked too), and
every appendix page (``appendix_*.ipynb``) too. The appendix on measuring a GPU teaches how
to read a GPU's state (clocks, power, throttle reasons), so there, and only there, naming a
GPU state table is not maintainer talk; every other check holds in the appendix as well.

    python tests/test_main_path_talk.py      # lists every offending place
"""

import json
import re
from pathlib import Path

import pytest

from tools.main_path_words import strip_collapsed

BOOK = Path(__file__).resolve().parent.parent / "book"
HIDDEN_TAGS = {"remove-cell", "remove-input", "hide-cell", "hide-input"}
HIDDEN_OUTPUT_TAGS = {"remove-cell", "remove-output", "hide-cell", "hide-output"}
ERROR_CLASSES = ("ShapeError", "MaskError", "NonFiniteError", "DTypeError",
                 "MixedArrayTypesError", "DeviceError", "SequenceTooLongError")

# (name, pattern) checked in main-path markdown and in visible code.
TALK = [
    ("the library's tests", re.compile(r"\blibrary'?s tests?\b|\b(unit )?tests (check|verify|assert)",
                                        re.I)),
    ("a stored file's name", re.compile(r"[\w/.-]+\.(csv|json|npz|npy|pt|parquet)\b")),
    ("a command that regenerates data",
     re.compile(r"python3? -m \w|\bmake (test|book|notebooks|gpu|data|bench)\b|\bpip install\b"
                r"|\btools/[\w/]+\.(py|sh)\b|--dry-run\b")),
    ("a GPU state table", re.compile(r"\bnvidia-smi\b|\bGPU state\b|\bthrottle reasons?\b", re.I)),
]
ERROR_NAME = r"\b(" + "|".join(ERROR_CLASSES) + r")\b"
# A library error class caught by name or printed as the head of a message (code, output),
# or named in the prose (markdown). Printing a function's source that raises one is fine.
ERROR_CLASS = {
    "markdown": re.compile(ERROR_NAME),
    "code": re.compile(r"except\s+\(?[\w.]*" + ERROR_NAME + r"|" + ERROR_NAME + r":"),
    "output": re.compile(r"^\s*[\w.]*" + ERROR_NAME + r":"),
}
# Checked in visible code only.
CODE_ONLY = [
    ("a glue( call", re.compile(r"\bglue\(")),
    ("a # prose note", re.compile(r"#\s*prose\b", re.I)),
]


def chapters():
    return sorted(BOOK.glob("[0-9][0-9]_*.ipynb"))


def appendices():
    return sorted(BOOK.glob("appendix_*.ipynb"))


# What an appendix page may name on its main path (its subject), by check name.
ALLOWED_IN_APPENDIX = {"a GPU state table"}


def main_path(notebook_path):
    """(kind, cell index, text) for the main-path markdown, visible code and its output."""
    cells = json.loads(Path(notebook_path).read_text(encoding="utf-8"))["cells"]
    for index, cell in enumerate(cells):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            if re.match(r"\s*#{1,2} Exercises\b", source):
                return
            yield "markdown", index, strip_collapsed(source)
        elif cell["cell_type"] == "code":
            tags = set(cell.get("metadata", {}).get("tags", []))
            if not HIDDEN_TAGS & tags:
                yield "code", index, source
            if not HIDDEN_OUTPUT_TAGS & tags:
                yield "output", index, "\n".join(output_texts(cell))


def output_texts(cell):
    """The text a reader sees in a code cell's outputs (streams and plain-text results)."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            yield "".join(output["text"])
        elif "text/plain" in output.get("data", {}) and "image/png" not in output["data"]:
            yield "".join(output["data"]["text/plain"])


def offences(notebook_path):
    """One line for each place in the main path that speaks to maintainers."""
    found = []
    allowed = ALLOWED_IN_APPENDIX if Path(notebook_path).name.startswith("appendix_") else set()
    for kind, index, text in main_path(notebook_path):
        checks = [(name, pattern) for name, pattern in TALK if name not in allowed]
        checks += [("a library error class", ERROR_CLASS[kind])]
        checks += CODE_ONLY if kind == "code" else []
        for line in text.splitlines():
            for name, pattern in checks:
                match = pattern.search(line)
                if match:
                    found.append(f"{Path(notebook_path).name} cell {index} ({kind}): "
                                 f"{name}: {match.group(0)!r} in {line.strip()[:100]!r}")
    return found


def test_chapters_are_found():
    assert len(chapters()) >= 13


def test_appendices_are_found():
    assert BOOK / "appendix_measuring.ipynb" in appendices()


@pytest.mark.parametrize("notebook", chapters() + appendices(), ids=lambda p: p.stem)
def test_main_path_speaks_to_the_reader(notebook):
    found = offences(notebook)
    assert not found, "\n".join(found)


def _write_notebook(path, cells):
    """A minimal notebook file holding ``cells``, for the checks below."""
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


def test_the_check_can_fail(tmp_path):
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": [
            "The library's tests check this. See `attnlib/data/x.csv`.\n",
            ":::{dropdown} Deep dive\npython -m attnlib.bench is fine here\n:::\n"]},
        {"cell_type": "code", "metadata": {}, "source": ["glue('x', 1)  # prose\n"],
         "outputs": []},
        {"cell_type": "code", "metadata": {"tags": ["remove-input"]},
         "source": ["glue('y', 2)\n"], "outputs": []},
        {"cell_type": "markdown", "metadata": {}, "source": ["## Exercises\n"]},
        {"cell_type": "markdown", "metadata": {}, "source": ["python -m after exercises\n"]},
    ]
    found = offences(_write_notebook(tmp_path / "99_bad.ipynb", cells))
    kinds = sorted(line.split(": ")[1] for line in found)
    assert kinds == ["a # prose note", "a glue( call", "a stored file's name",
                     "the library's tests"], found


def test_the_check_can_fail_in_an_appendix(tmp_path):
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": [
            "Run `tools/gpu_run.sh check out/`.\n",
            "It wrote `fwd_d64.csv`; the GPU state table shows throttle reasons.\n"]},
        {"cell_type": "code", "metadata": {}, "source": ["print(nvidia_smi)  # prose\n"],
         "outputs": [{"output_type": "stream", "name": "stdout",
                      "text": ["GPU state: 0x4\n"]}]},
    ]
    as_chapter = _write_notebook(tmp_path / "99_bad.ipynb", cells)
    as_appendix = _write_notebook(tmp_path / "appendix_bad.ipynb", cells)
    kinds = sorted(line.split(": ")[1] for line in offences(as_appendix))
    assert kinds == ["a # prose note", "a command that regenerates data",
                     "a stored file's name"], kinds  # its GPU state table is allowed
    # a numbered chapter may not name the GPU state either
    assert "a GPU state table" in {line.split(": ")[1] for line in offences(as_chapter)}


if __name__ == "__main__":
    for chapter in chapters() + appendices():
        for line in offences(chapter):
            print(line)
