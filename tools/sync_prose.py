"""Write the glued numbers into the prose, so a notebook read outside the book shows them.

Usage:
    python tools/sync_prose.py book/04_scale_and_softmax.ipynb [...]   render the prose
    python tools/sync_prose.py --check book/*.ipynb                    only report stale cells
    python tools/sync_prose.py --restore book/04_scale_and_softmax.ipynb   templates back

In the HTML book, myst-nb replaces ``{glue:text}`name:.3f``` with the value a cell
glued under ``name``. JupyterLab and Colab know nothing of glue and show the markup.
So a markdown cell whose source holds glue roles is treated as a *template*: this
tool keeps the template in the cell's metadata (``prose_template``) and replaces the
source by the rendered text, each role formatted from that notebook's stored glue
outputs exactly as myst-nb would (it calls myst-nb's own formatter). Running it again
re-renders from the stored template, so after re-executing a notebook it brings the
prose up to date. ``tests/test_prose_sync.py`` re-renders every template from the
stored glue and checks it equals the source; with nbval checking that a fresh run
reproduces the stored glue, every number in the prose stays computed.

To change the wording of such a cell, run ``--restore`` (the roles come back into the
source), edit, then ``make notebooks`` (execute, then render).

Roles handled: ``{glue:text}`` (with an optional format spec), ``{glue}``, ``{glue:}``,
``{glue:any}`` and ``{glue:md}`` for values that have text/plain or text/markdown.
"""

import argparse
import re
import sys
from pathlib import Path

import nbformat
from myst_nb.core.variables import format_plain_text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.nbedit import editing  # noqa: E402

TEMPLATE_KEY = "prose_template"
GLUE_MIME_PREFIX = "application/papermill.record/"
ROLE = re.compile(r"\{glue(?::(text|md|any)?)?\}`([^`]+)`")


class ProseSyncError(ValueError):
    """A role names no stored glue value, or asks for something this tool cannot render."""


def glued_values(nb):
    """Every value the notebook glued: name -> {mime type: data}, from the stored outputs."""
    values = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if name is None:
                continue
            prefix = output["metadata"]["scrapbook"].get("mime_prefix", GLUE_MIME_PREFIX)
            values[name] = {mime[len(prefix):]: data for mime, data in output.get("data", {}).items()
                            if mime.startswith(prefix)}
    return values


def render(template, values, where="markdown cell"):
    """``template`` with each glue role replaced by its value, formatted as myst-nb does."""

    def paste(match):
        kind, content = match.group(1), match.group(2)
        if "::" in content:
            raise ProseSyncError(f"{where}: {match.group(0)} pastes from another notebook; "
                                 "glue the value in this one")
        # As myst-nb reads them: {glue:text}`name:spec` and {glue:md}`name:format` split at
        # the last colon; {glue}`name` and {glue:any}`name` take the whole text as the name.
        name, _, spec = content.rpartition(":") if kind in ("text", "md") and ":" in content else (
            content, "", "")
        if name not in values:
            raise ProseSyncError(f"{where}: {match.group(0)} names {name!r}, which no cell glued "
                                 f"(glued: {', '.join(sorted(values)) or 'nothing'})")
        data = values[name]
        if kind == "md" or (kind in (None, "any") and "text/markdown" in data):
            if "text/markdown" not in data:
                raise ProseSyncError(f"{where}: {match.group(0)}: {name!r} has no text/markdown")
            return data["text/markdown"].strip()
        if "text/plain" not in data:
            raise ProseSyncError(f"{where}: {match.group(0)}: {name!r} has no text/plain "
                                 f"(it has {', '.join(sorted(data))})")
        return format_plain_text(data["text/plain"], spec)

    return ROLE.sub(paste, template)


def template_of(cell):
    """The cell's template: the stored one, or its own source if that holds glue roles."""
    if ROLE.search(cell.source):
        return cell.source
    return cell.get("metadata", {}).get(TEMPLATE_KEY)


def sync(nb, name="notebook"):
    """Render every template cell of ``nb`` in place; return the ids of the cells changed."""
    values = glued_values(nb)
    changed = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        template = template_of(cell)
        if template is None:
            continue
        rendered = render(template, values, where=f"{name}, cell {cell.get('id')}")
        if cell.metadata.get(TEMPLATE_KEY) != template or cell.source != rendered:
            changed.append(cell.get("id"))
        cell.metadata[TEMPLATE_KEY] = template
        cell.source = rendered
    return changed


def stale(nb, name="notebook"):
    """Cells whose source is not their template rendered from the stored glue: (id, why)."""
    values = glued_values(nb)
    problems = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        if ROLE.search(cell.source):
            problems.append((cell.get("id"), "glue roles in the source: readers outside the book see markup"))
        elif TEMPLATE_KEY in cell.metadata:
            rendered = render(cell.metadata[TEMPLATE_KEY], values, where=f"{name}, cell {cell.get('id')}")
            if rendered != cell.source:
                problems.append((cell.get("id"), "the source is not its template rendered from the stored glue"))
    return problems


def restore(nb):
    """Put every stored template back into its cell's source (for editing the wording)."""
    restored = []
    for cell in nb.cells:
        if cell.cell_type == "markdown" and TEMPLATE_KEY in cell.metadata:
            cell.source = cell.metadata.pop(TEMPLATE_KEY)
            restored.append(cell.get("id"))
    return restored


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="report stale cells, change nothing")
    mode.add_argument("--restore", action="store_true", help="put the templates back into the sources")
    args = parser.parse_args(argv)
    failed = False
    for path in args.notebooks:
        if args.check:
            problems = stale(nbformat.read(path, as_version=4), path.name)
            for cell_id, why in problems:
                print(f"{path}: cell {cell_id}: {why}")
            failed |= bool(problems)
            continue
        with editing(path) as nb:
            if args.restore:
                print(f"{path}: {len(restore(nb))} templates restored")
            else:
                print(f"{path}: {len(sync(nb, path.name))} cells rendered")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
