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

The test also checks what no tool can tidy, with the helpers below: no stored text
output holds a number printed with LONG_NUMBER_DIGITS or more significant digits
(:func:`long_numbers`), and no glued number carries more decimals than the prose
shows (:func:`glue_finer_than_prose`). A full float repr such as 0.9588865637779236
differs between CPUs in its last digits, so nbval fails on another machine; printed
and glued at the precision the prose needs, the number survives. A cell that prints
many digits on purpose (to show that two results agree to 12 decimals, say) carries
the tag ``many-digits-intentional``; a source listing (``inspect.getsource``) is code,
not a result, and is exempt.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.nbedit import editing  # noqa: E402
from tools.sync_prose import GLUE_MIME_PREFIX  # noqa: E402
from tools.sync_prose import ROLE as GLUE_ROLE  # noqa: E402

NBVAL_TAGS = {
    "NBVAL_IGNORE_OUTPUT": "nbval-ignore-output",
    "NBVAL_SKIP": "nbval-skip",
    "NBVAL_RAISES_EXCEPTION": "raises-exception",
    "NBVAL_CHECK_OUTPUT": "nbval-check-output",
}
NBVAL_COMMENT = re.compile(r"^[ \t]*#[ \t]*(NBVAL_[A-Z_]+)[ \t]*$\n?", re.MULTILINE)
LONG_LISTING_LINES = 20
LISTING = re.compile(r"inspect\.getsource\(([\w.]+?)(?:\.fn)?\)|([\w.]+)\.__doc__")


LONG_NUMBER_DIGITS = 8
MANY_DIGITS_TAG = "many-digits-intentional"
# A number with a decimal point, and an exponent if it has one; not part of a name or of a
# dotted version such as 2.13.0. Integers are exact and not matched.
DECIMAL_NUMBER = re.compile(r"(?<![\w.])(\d*\.\d+|\d+\.)([eE][-+]?\d+)?(?![\w.])")
FIXED_POINT_SPEC = re.compile(r"\.(\d+)([fF%])$")


def significant_digits(number):
    """Significant digits of a decimal number as written: 3 in ``0.00123``, 2 in ``1.6e-14``."""
    mantissa = re.split("[eE]", number)[0].replace(".", "").lstrip("0")
    return len(mantissa)


def text_outputs(cell):
    """Every text a code cell stores as output: ``(kind, text)`` for streams, data and errors."""
    texts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            texts.append(("stream", output.get("text", "")))
        elif output.get("output_type") == "error":
            texts.append(("error", f"{output.get('ename', '')}: {output.get('evalue', '')}"))
        for mime, data in output.get("data", {}).items():
            if not mime.startswith("image/") and isinstance(data, str):
                texts.append((mime, data))
    return texts


def long_numbers(nb):
    """Numbers of LONG_NUMBER_DIGITS or more significant digits in the stored text outputs.

    Returns ``(cell id, output kind, number)`` for each, skipping source listings and
    cells tagged MANY_DIGITS_TAG.
    """
    found = []
    for cell in nb.cells:
        if cell.cell_type != "code" or MANY_DIGITS_TAG in cell.metadata.get("tags", []):
            continue
        if LISTING.search(cell.source):
            continue
        for kind, text in text_outputs(cell):
            for match in DECIMAL_NUMBER.finditer(text):
                if significant_digits(match.group(0)) >= LONG_NUMBER_DIGITS:
                    found.append((cell.get("id"), kind, match.group(0)))
    return found


def prose_decimals(nb):
    """For each glued name the prose formats as fixed point: the most decimals it is shown with.

    ``{glue:text}`x:.3f``` shows x with 3 decimals; ``:.1%`` shows 100 x with 1, so x with 3.
    """
    decimals = {}
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        template = cell.get("metadata", {}).get("prose_template") or cell.source
        for match in GLUE_ROLE.finditer(template):
            name, _, spec = match.group(2).rpartition(":")
            fixed = FIXED_POINT_SPEC.search(spec) if name else None
            if fixed:
                places = int(fixed.group(1)) + (2 if fixed.group(2) == "%" else 0)
                decimals[name] = max(places, decimals.get(name, 0))
    return decimals


def glued_numbers(nb):
    """Every glued value whose stored text is a number: name -> float."""
    numbers = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            text = output.get("data", {}).get(GLUE_MIME_PREFIX + "text/plain")
            if name is None or text is None:
                continue
            try:
                numbers[name] = float(text)
            except ValueError:
                continue  # a string, a phrase, a repr such as np.float64(...)
    return numbers


def glue_finer_than_prose(nb):
    """Glued numbers that carry more decimals than the prose shows: ``(name, value, decimals)``.

    Glue a number rounded to what the prose prints (``round(x, 3)`` for ``:.3f``): the
    stored value then holds no digits that could differ from one CPU to another.
    """
    numbers = glued_numbers(nb)
    return [(name, numbers[name], places) for name, places in prose_decimals(nb).items()
            if name in numbers and round(numbers[name], places) != numbers[name]]


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
