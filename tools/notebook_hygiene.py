"""Tidy what a reader sees of the chapters' code cells, without changing what they compute.

Usage: python tools/notebook_hygiene.py [book/NN_name.ipynb ...]   (default: every chapter)

1. nbval markers become cell tags: a ``# NBVAL_IGNORE_OUTPUT`` (``_SKIP``,
   ``_RAISES_EXCEPTION``) comment line is removed from the code and the cell gets
   the tag ``nbval-ignore-output`` (``nbval-skip``, ``raises-exception``). nbval
   reads either; only the tag stays out of the reader's way.
2. Long source listings are collapsed: a cell that prints a listing
   (``inspect.getsource`` or a ``__doc__``) of more than LONG_LISTING_LINES lines gets
   the tag ``hide-output`` and a one-line summary on its toggle ("Show the source of
   attnlib.softmax (35 lines)").

Both are idempotent; ``make notebooks`` runs this after executing the chapters, and
``tests/test_notebook_hygiene.py`` checks the result.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.nbedit import editing  # noqa: E402

NBVAL_TAGS = {
    "NBVAL_IGNORE_OUTPUT": "nbval-ignore-output",
    "NBVAL_SKIP": "nbval-skip",
    "NBVAL_RAISES_EXCEPTION": "raises-exception",
    "NBVAL_CHECK_OUTPUT": "nbval-check-output",
}
NBVAL_COMMENT = re.compile(r"^[ \t]*#[ \t]*(NBVAL_[A-Z_]+)[ \t]*$\n?", re.MULTILINE)
LONG_LISTING_LINES = 20
LISTING = re.compile(r"inspect\.getsource\(([\w.]+?)(?:\.fn)?\)|([\w.]+)\.__doc__")


def nbval_comments(source):
    """The NBVAL markers written as comment lines in ``source``."""
    return NBVAL_COMMENT.findall(source)


def move_nbval_markers_to_tags(cell):
    """Replace NBVAL comment lines by the equivalent cell tags; True if the cell changed."""
    markers = nbval_comments(cell.source)
    if not markers:
        return False
    unknown = [m for m in markers if m not in NBVAL_TAGS]
    if unknown:
        raise ValueError(f"cell {cell.get('id')}: unknown nbval marker(s) {unknown}")
    cell.source = NBVAL_COMMENT.sub("", cell.source).lstrip("\n")
    tags = cell.metadata.setdefault("tags", [])
    tags += [NBVAL_TAGS[m] for m in markers if NBVAL_TAGS[m] not in tags]
    return True


def listing_lines(cell):
    """How many lines a listing cell prints (0 if the cell prints no listing)."""
    if cell.cell_type != "code" or not LISTING.search(cell.source):
        return 0
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    return len(text.splitlines())


def listing_summary(cell):
    """The one-line summary on a collapsed listing's toggle."""
    match = LISTING.search(cell.source)
    name = match.group(1) or match.group(2)
    what = "the source of" if match.group(1) else "the docstring of"
    return f"Show {what} {name} ({listing_lines(cell)} lines)"


def collapse_long_listing(cell):
    """Collapse a listing longer than LONG_LISTING_LINES behind its summary; True if changed."""
    if listing_lines(cell) <= LONG_LISTING_LINES:
        return False
    tags = cell.metadata.setdefault("tags", [])
    summary = listing_summary(cell)
    if "hide-output" in tags and cell.metadata.get("mystnb", {}).get("code_prompt_show") == summary:
        return False
    if "hide-output" not in tags:
        tags.append("hide-output")
    cell.metadata.setdefault("mystnb", {})["code_prompt_show"] = summary
    cell.metadata["mystnb"]["code_prompt_hide"] = "Hide the listing"
    return True


def tidy(path):
    with editing(path) as nb:
        code = [cell for cell in nb.cells if cell.cell_type == "code"]
        moved = sum(move_nbval_markers_to_tags(cell) for cell in code)
        collapsed = sum(collapse_long_listing(cell) for cell in code)
    print(f"{Path(path).name}: {moved} nbval markers moved to tags, {collapsed} listings collapsed")


if __name__ == "__main__":
    for name in sys.argv[1:] or sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb")):
        tidy(name)
