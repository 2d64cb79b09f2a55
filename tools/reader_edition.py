"""Write the reader's edition: every chapter with its MyST markup turned into plain Markdown.

Usage: python tools/reader_edition.py [--check]   (``make reader``; ``make notebooks`` runs it)

The chapters in ``book/`` are written for Jupyter Book: drop-downs, exercises and
solutions are MyST directives, citations and equation references are roles, and
equations carry labels. Colab, GitHub and a plain JupyterLab render Markdown as
CommonMark with HTML, where all of that shows as text and every solution sits open.
This script writes ``book/reader/NN_name.ipynb`` for every chapter, the same cells and
outputs with the Markdown converted:

- a drop-down becomes ``<details><summary>title</summary> ... </details>``; a note,
  tip or other admonition a block quote under its bold title;
- an exercise's fences become a heading "Exercise 4.1 (title)", numbered as in the book,
  and its answer cell stays a code cell to fill in;
- a solution (its fences and every cell between them, code with its printed output)
  becomes one collapsed ``<details>`` cell "Solution to Exercise 4.1 (title)";
- ``{cite:p}`` / ``{cite:t}`` / ``{cite}`` become author-year citations linked to the
  work, listed under "References" at the end of the chapter;
- a labelled equation gets its book number as ``\\tag{N}`` and ``{eq}`` becomes "(N)";
- ``(target)=`` lines go; cells the book hides keep their code, folded: JupyterLab
  collapses them and Colab shows a ``#@title`` bar that opens on a double click;
- a cell the book removes goes, unless a later cell reads a name it defines before defining
  it; then it stays without its glue calls, asserts and prints, stored as the book ran it
  (execution count, and the figures it draws, such as a live figure's static twin), so that
  nbval checks it like any other cell.

An unknown directive or role stops the script with its name, so new markup cannot leak
silently. A name that only a solution defines and a later cell uses would break the
edition (its solutions do not run), so that stops the script too.
The Colab and download buttons of the built book open these files
(``attnlib/sphinx_reader.py``); ``tests/test_reader_edition.py`` checks they are up to
date and renders them with a CommonMark renderer to count leaked markup.
"""

import argparse
import ast
import codecs
import copy
import html
import re
import sys
from pathlib import Path

import nbformat
import yaml
from markdown_it import MarkdownIt
from mdit_py_plugins.colon_fence import colon_fence_plugin
from mdit_py_plugins.dollarmath import dollarmath_plugin

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
READER = BOOK / "reader"
SOURCE_KEY = "reader_edition_of"

DIRECTIVE = re.compile(r"^\{([\w:-]+)\}\s*(.*)$")
ROLE = re.compile(r"\{([\w:-]+)\}`([^`]*)`")
TARGET = re.compile(r"^\([\w-]+\)=[ \t]*\n?", re.M)
OPTION = re.compile(r"^:([\w-]+):[ \t]*(.*)$")
HIDDEN_TAGS = {"remove-cell", "remove-input", "hide-input", "hide-cell"}
# Admonitions become a block quote under their bold title (a collapsed block with :class: dropdown).
ADMONITIONS = {"admonition": "", "note": "Note", "tip": "Tip", "hint": "Hint", "important": "Important",
               "warning": "Warning", "caution": "Caution", "attention": "Attention",
               "seealso": "See also"}

_markdown = MarkdownIt("commonmark").use(colon_fence_plugin).use(dollarmath_plugin, allow_labels=True)


def chapters():
    """The chapters in the book's order (``_toc.yml``)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    entries = [entry for part in toc["parts"] for entry in part["chapters"]] if "parts" in toc \
        else toc["chapters"]
    files = [ROOT / (entry["file"] + ".ipynb") for entry in entries]
    return [path for path in files if path.exists()]


def _plain(text):
    """A BibTeX field as plain text: LaTeX accents decoded, braces dropped."""
    import latexcodec  # noqa: F401  (registers the "ulatex" codec; a pybtex dependency)

    return codecs.decode(text, "ulatex").replace("{", "").replace("}", "")


class Bibliography:
    """Author-year citations and reference lines from ``references.bib``."""

    def __init__(self, path=ROOT / "references.bib"):
        from pybtex.database import parse_file

        self.entries = parse_file(str(path)).entries

    def _entry(self, key):
        if key not in self.entries:
            raise ValueError(f"citation key {key!r} is not in references.bib")
        return self.entries[key]

    def short(self, key):
        """``("Vaswani et al.", "2017")`` for one key."""
        entry = self._entry(key)
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        last = [_plain(" ".join(p.last_names)) for p in people]
        if not last:
            names = _plain(entry.fields.get("organization", entry.fields.get("title", key)))
        elif len(last) == 1:
            names = last[0]
        elif len(last) == 2:
            names = f"{last[0]} and {last[1]}"
        else:
            names = f"{last[0]} et al."
        return names, entry.fields.get("year", "n.d.")

    def link(self, key):
        fields = self._entry(key).fields
        if "url" in fields:
            return fields["url"]
        if "doi" in fields:
            return f"https://doi.org/{fields['doi']}"
        return None

    def cite(self, keys, textual):
        parts = []
        for key in keys:
            names, year = self.short(key)
            text = f"{names} ({year})" if textual else f"{names}, {year}"
            url = self.link(key)
            parts.append(f"[{text}]({url})" if url else text)
        return "; ".join(parts) if textual else "(" + "; ".join(parts) + ")"

    def reference(self, key):
        """One line for the chapter's reference list."""
        entry = self._entry(key)
        people = entry.persons.get("author") or []
        authors = ", ".join(
            _plain(" ".join(p.first_names + p.middle_names + p.prelast_names + p.last_names))
            for p in people
        )
        fields = {k: _plain(v) for k, v in entry.fields.items()}
        venue = fields.get("booktitle") or fields.get("journal") or fields.get("publisher") or ""
        venue = venue or fields.get("institution", "") or fields.get("howpublished", "")
        pieces = [authors, f"*{fields.get('title', key)}*", venue, fields.get("year", "")]
        line = ". ".join(piece.strip().rstrip(".") for piece in pieces if piece.strip()) + "."
        url = self.link(key)
        return f"{line} <{url}>" if url else line


class Numbers:
    """The book's numbers: equations across all chapters in order, exercises per chapter."""

    def __init__(self, paths):
        self.equations = {}
        self.exercises = {}
        for path in paths:
            chapter = int(path.name[:2]) if path.name[:2].isdigit() else None  # the appendix: none
            count = 0
            for cell in nbformat.read(path, as_version=4).cells:
                if cell.cell_type != "markdown":
                    continue
                for token in _tokens(cell.source):
                    if token.type == "math_block_label":
                        self.equations[token.info] = len(self.equations) + 1
                    if token.type in ("fence", "colon_fence") and token.info.startswith("{exercise"):
                        name, title = DIRECTIVE.match(token.info).groups()
                        if name in ("exercise", "exercise-start"):
                            count += 1
                            label = _options(token.content)[0].get("label", f"{path.stem}-{count}")
                            self.exercises[label] = (f"{chapter}.{count}", title.strip())

    def equation(self, label):
        if label not in self.equations:
            raise ValueError(f"{{eq}} refers to {label!r}, which no equation is labelled")
        return self.equations[label]

    def exercise(self, label):
        if label not in self.exercises:
            raise ValueError(f"a solution refers to exercise {label!r}, which is not in the book")
        return self.exercises[label]


def _tokens(text):
    """Block tokens of MyST ``text`` in order, with the contents of directives parsed too."""
    for token in _markdown.parse(text):
        yield token
        if token.type in ("fence", "colon_fence") and DIRECTIVE.match(token.info) and (
            DIRECTIVE.match(token.info).group(1) in ("dropdown", *ADMONITIONS)
        ):
            yield from _tokens(_options(token.content)[1])


def _options(content):
    """Split a directive's leading ``:key: value`` lines from its body."""
    options, lines = {}, content.split("\n")
    while lines and OPTION.match(lines[0]):
        key, value = OPTION.match(lines[0]).groups()
        options[key] = value.strip()
        lines.pop(0)
    return options, "\n".join(lines).strip("\n")


def _inline_html(text):
    """A title for ``<summary>``: HTML-escaped, with inline code as ``<code>``."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(
        f"<code>{html.escape(p[1:-1])}</code>" if p.startswith("`") else html.escape(p, quote=False)
        for p in parts
    )


def details(title, body):
    """A collapsed block: renders in GitHub, Colab and Jupyter, closed until clicked."""
    return f"<details>\n<summary><b>{_inline_html(title)}</b></summary>\n\n{body.strip()}\n\n</details>"


class Converter:
    def __init__(self, numbers, bibliography):
        self.numbers = numbers
        self.bibliography = bibliography
        self.cited = []

    # -- text -----------------------------------------------------------------------------
    def roles(self, text):
        def replace(match):
            name, target = match.groups()
            if name in ("cite:p", "cite", "cite:t"):
                keys = [key.strip() for key in target.split(",") if key.strip()]
                self.cited += [key for key in keys if key not in self.cited]
                return self.bibliography.cite(keys, textual=name == "cite:t")
            if name == "eq":
                return f"({self.numbers.equation(target)})"
            raise ValueError(f"unknown MyST role {{{name}}} (in {match.group(0)!r})")

        return ROLE.sub(replace, text)

    def markdown(self, text, gates=None):
        """Plain Markdown for MyST ``text``. Gate fences (exercise/solution) are returned
        in ``gates`` as ``(name, argument, options)`` with a placeholder line left in the text."""
        lines = text.split("\n")
        tokens = [t for t in _markdown.parse(text) if t.map is not None]
        replacements = []
        for token in tokens:
            if token.type == "math_block_label":
                body = token.content.strip("\n")
                number = self.numbers.equation(token.info)
                replacements.append((token.map, f"$$\n{body}\n\\tag{{{number}}}\n$$"))
            elif token.type in ("fence", "colon_fence") and token.info.startswith("{"):
                match = DIRECTIVE.match(token.info)
                if not match:
                    raise ValueError(f"cannot read the directive line {token.info!r}")
                replacements.append((token.map, self.directive(*match.groups(), token.content, gates)))
        for (start, end), new in sorted(replacements, reverse=True):
            lines[start:end] = new.split("\n") if new is not None else []
        out = TARGET.sub("", "\n".join(lines))
        out = self.roles(out)
        out = PAGE_LINK.sub(lambda m: f"]({published_book()}book/{m[1]}.html{m[2] or ''})", out)
        return re.sub(r"\n{3,}", "\n\n", out).strip("\n")

    def directive(self, name, argument, content, gates):
        options, body = _options(content)
        if name == "dropdown":
            return details(argument, self.markdown(body))
        if name in ADMONITIONS:
            title = argument.strip() or ADMONITIONS[name]
            if not title:
                raise ValueError("an {admonition} needs a title")
            if "dropdown" in options.get("class", "").split():
                return details(title, self.markdown(body))
            quoted = "\n".join(f"> {line}".rstrip() for line in self.markdown(body).split("\n"))
            return f"> **{title}**\n>\n{quoted}"
        if name in ("exercise-start", "exercise-end", "solution-start", "solution-end"):
            if gates is None:
                raise ValueError(f"{{{name}}} inside another directive cannot be converted")
            gates.append((name, argument.strip(), options))
            return f"\x00GATE{len(gates) - 1}\x00"
        raise ValueError(f"unknown MyST directive {{{name}}} (argument {argument!r})")

    # -- cells ----------------------------------------------------------------------------
    def code_as_markdown(self, cell):
        parts = [f"```python\n{cell.source.strip()}\n```"]
        for output in cell.get("outputs", []):
            text = None
            if output.output_type == "stream":
                text = output.text
            elif output.output_type in ("execute_result", "display_data"):
                text = output.get("data", {}).get("text/plain")
            if text and text.strip():
                parts.append(f"```text\n{text.strip()}\n```")
        return "\n\n".join(parts)

    def notebook(self, source_path):
        nb = nbformat.read(source_path, as_version=4)
        self.cited = []
        cells, solution = [], None
        for cell in nb.cells:
            if cell.cell_type != "markdown":
                if solution is not None:
                    solution["parts"].append(self.code_as_markdown(cell))
                    solution["names"] |= _assigned(cell.source) if cell.cell_type == "code" else set()
                    continue
                cell = copy.deepcopy(cell)
                cells.append(cell)
                continue
            gates = []
            text = self.markdown(cell.source, gates)
            pieces = re.split(r"\x00GATE(\d+)\x00", text)
            for i, piece in enumerate(pieces):
                if i % 2 == 0:
                    if not piece.strip():
                        continue
                    if solution is not None:
                        solution["parts"].append(piece.strip())
                    else:
                        cells.append(_markdown_cell(piece.strip(), cell))
                    continue
                name, argument, options = gates[int(piece)]
                if name == "exercise-start":
                    number, title = self.numbers.exercise(options.get("label", ""))
                    cells.append(_markdown_cell(f"#### Exercise {number} ({title})", cell))
                elif name == "solution-start":
                    number, title = self.numbers.exercise(argument)
                    solution = {"title": f"Solution to Exercise {number} ({title})", "parts": [],
                                "names": set(), "cell": cell}
                elif name == "solution-end":
                    if solution is None:
                        raise ValueError(f"{source_path.name}: solution-end without solution-start")
                    body = "\n\n".join(solution["parts"])
                    cells.append(_markdown_cell(details(solution["title"], body), solution["cell"]))
                    _check_uses(cells, solution["names"], source_path)
                    solution = None
        if solution is not None:
            raise ValueError(f"{source_path.name}: a solution is never closed")
        cells = drop_removed_cells(cells)
        for cell in cells:
            if cell.cell_type == "code" and set(cell.metadata.get("tags", [])) & HIDDEN_TAGS:
                fold(cell)
        _unique_ids(cells)
        if self.cited:
            lines = "\n".join(f"- {self.bibliography.reference(key)}" for key in self.cited)
            cells.append(nbformat.v4.new_markdown_cell(f"## References\n\n{lines}", id="references"))
        out = copy.deepcopy(nb)
        out.cells = cells
        path = Path(source_path).resolve()
        out.metadata[SOURCE_KEY] = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        return out


# A link to a page of the book that is not a notebook (further_reading.md): the edition holds
# notebooks only, so the link goes to that page of the published book.
PAGE_LINK = re.compile(r"\]\(([\w-]+)\.md(#[\w-]+)?\)")


def published_book():
    """The published book's address, from _config.yml's repository (GitHub Pages of it)."""
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    owner, name = url.split("/")[-2:]
    return f"https://{owner}.github.io/{name}/"


SETUP_CELL_ID = "colab-setup"  # the first code cell, which installs attnlib in Colab


def _is_bookkeeping(node, loops=True):
    """A statement the book runs only for itself: ``glue(...)``, an ``assert``, a ``print(...)`` (in a
    cell the book removes, text no page shows), or with ``loops`` a ``for`` or ``if`` that does
    nothing else."""
    if isinstance(node, ast.Assert):
        return True
    if loops and isinstance(node, (ast.For, ast.If)):
        return all(_is_bookkeeping(child) for child in node.body + node.orelse)
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id in ("glue", "print"))


def _without_bookkeeping(source):
    """``source`` without its glue calls, asserts and prints, and without the loops and ``if``s that
    did nothing else (unless the cell reads a loop's variable after it; then the loop stays, with
    ``pass`` in it); the comment lines right above a statement that goes, go with it.
    Unparseable source comes back unchanged."""
    tree = _code(source)
    if tree is None:
        return source
    stripped = _strip(source, tree, loops=True)
    if _free_reads(stripped)[0] <= _free_reads(source)[0]:
        return stripped
    return _strip(source, tree, loops=False)


def _strip(source, tree, loops):
    lines = source.split("\n")
    drop, replace = set(), {}

    def visit(block, top):
        gone = [node for node in block if _is_bookkeeping(node, loops)]
        for node in gone:
            drop.update(range(node.lineno - 1, node.end_lineno))
            above = node.lineno - 2
            while above >= 0 and lines[above].strip().startswith("#") and above not in drop:
                drop.add(above)
                above -= 1
        if gone and len(gone) == len(block) and not top:  # a block left empty
            replace[gone[0].lineno - 1] = " " * gone[0].col_offset + "pass"
        for node in block:
            # a function's or class's body runs when a later cell calls it: its prints are that
            # cell's output, so it stays as it is
            if node in gone or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            parts = [node, *getattr(node, "handlers", []), *getattr(node, "cases", [])]
            for part in parts:
                for field in ("body", "orelse", "finalbody"):
                    if isinstance(getattr(part, field, None), list) and getattr(part, field):
                        visit(getattr(part, field), False)

    visit(tree.body, True)
    kept = [replace.get(i, line) for i, line in enumerate(lines) if i not in drop or i in replace]
    return "\n".join(kept).strip("\n")


def is_glue_output(output):
    """A glue record (``glue(name, value)``): myst-nb moves it into the prose, no page shows it."""
    return "scrapbook" in output.get("metadata", {}) or any(
        key.startswith("application/papermill.record/") for key in output.get("data", {}))


def drop_removed_cells(cells):
    """Give the reader only what the book shows: a cell the book removes (``remove-cell``) loses
    its glue calls, asserts and prints, and goes altogether unless a later cell kept here reads a
    name it defines (or it is the Colab set-up cell). A cell that stays keeps its execution count
    and the outputs the rest of its code drew (a static figure for notebook readers): it ran in the
    book, and nbval compares those outputs with a fresh run. Its glue records go, and its printed
    text when its prints went."""
    needed, out = set(), []
    for cell in reversed(cells):
        removed = cell.cell_type == "code" and "remove-cell" in cell.metadata.get("tags", []) \
            and cell.get("id") != SETUP_CELL_ID
        if removed:
            source = _without_bookkeeping(cell.source)
            meaningful = [line for line in source.split("\n") if line.strip() and not line.strip().startswith("#")]
            if not meaningful or not (_assigned(source) & needed):
                continue
            printed = _prints(cell.source) > _prints(source)  # some of its prints went
            cell.source = source
            cell.outputs = [output for output in cell.get("outputs", []) if not is_glue_output(output)
                            and not (printed and output.output_type == "stream" and output.name == "stdout")]
        if cell.cell_type == "code":
            reads, binds = _free_reads(cell.source)
            needed = (needed - binds) | reads
        out.append(cell)
    return out[::-1]


def _prints(source):
    """How many ``print(...)`` calls ``source`` makes."""
    tree = _code(source)
    return sum(isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
               for node in ast.walk(tree)) if tree else 0


def fold(cell):
    """Fold a code cell the book hides: JupyterLab collapses its source, Colab shows a titled bar
    (a ``#@title`` line and the form view) that opens on a double click."""
    prompt = cell.metadata.get("mystnb", {}).get("code_prompt_show", "")
    title = re.sub(r"^Show (the )?", "", prompt).strip() or "code the book hides"
    title = title[0].upper() + title[1:]
    cell.source = f"#@title {title} (double-click to show)\n{cell.source}"
    cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
    cell.metadata["cellView"] = "form"


def _markdown_cell(text, like):
    cell = nbformat.v4.new_markdown_cell(text)
    cell.id = like.get("id", cell.id)
    return cell


def _unique_ids(cells):
    """Give split pieces of one source cell distinct ids (the first keeps the source's)."""
    seen = {}
    for cell in cells:
        base = cell.get("id")
        if base in seen:
            seen[base] += 1
            cell.id = f"{base}-{seen[base]}"[:64]
        else:
            seen[base] = 0


def _code(source):
    lines = [line for line in source.split("\n") if not line.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _assigned(source):
    tree = _code(source)
    names = set()
    for node in ast.walk(tree) if tree else []:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _loaded(source):
    tree = _code(source)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} if tree else set()


def _stores(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _expr_reads(node, bound):
    """Names ``node`` reads that ``bound`` does not hold (a comprehension's or a lambda's own
    names are theirs)."""
    if isinstance(node, ast.Name):
        return {node.id} - bound if isinstance(node.ctx, ast.Load) else set()
    if isinstance(node, _COMPREHENSIONS):
        local, reads = set(bound), set()
        for generator in node.generators:
            reads |= _expr_reads(generator.iter, local)
            local |= _stores(generator.target)
            for condition in generator.ifs:
                reads |= _expr_reads(condition, local)
        parts = (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)
        return reads.union(*(_expr_reads(part, local) for part in parts))
    if isinstance(node, ast.Lambda):
        reads = set().union(*(_expr_reads(d, bound) for d in node.args.defaults + node.args.kw_defaults if d))
        return reads | _expr_reads(node.body, bound | _arguments(node.args))
    return set().union(*(_expr_reads(child, bound) for child in ast.iter_child_nodes(node)))


def _arguments(args):
    every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
    return {a.arg for a in every}


def _block_reads(statements, bound):
    """Names ``statements`` read before binding them, in order; ``bound`` grows with what they
    bind for sure (a name bound in only one branch of an ``if`` is not)."""
    reads = set()
    for node in statements:
        if isinstance(node, _FUNCTIONS + (ast.ClassDef,)):
            reads |= set().union(*(_expr_reads(d, bound) for d in node.decorator_list))
            if isinstance(node, ast.ClassDef):
                reads |= set().union(*(_expr_reads(b, bound) for b in node.bases + node.keywords))
                reads |= _block_reads(node.body, set(bound))
            else:
                reads |= set().union(*(_expr_reads(d, bound) for d in
                                       node.args.defaults + node.args.kw_defaults if d))
                declared = {name for n in ast.walk(node) if isinstance(n, (ast.Global, ast.Nonlocal))
                            for name in n.names}
                local = (_arguments(node.args) | _stores(node) | {
                    n.name for n in ast.walk(node) if isinstance(n, _FUNCTIONS + (ast.ClassDef,))
                } | {(a.asname or a.name).split(".")[0] for n in ast.walk(node)
                     if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}) - declared
                reads |= _block_reads(node.body, bound | local)
            bound.add(node.name)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            reads |= _expr_reads(node.iter, bound)
            bound |= _stores(node.target)
            reads |= _block_reads(node.body, bound) | _block_reads(node.orelse, set(bound))
        elif isinstance(node, (ast.If, ast.While)):
            reads |= _expr_reads(node.test, bound)
            body, orelse = set(bound), set(bound)
            reads |= _block_reads(node.body, body) | _block_reads(node.orelse, orelse)
            bound |= body & orelse if isinstance(node, ast.If) else set()
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                reads |= _expr_reads(item.context_expr, bound)
                if item.optional_vars is not None:
                    reads |= _expr_reads(item.optional_vars, bound)
                    bound |= _stores(item.optional_vars)
            reads |= _block_reads(node.body, bound)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            reads |= _block_reads(node.body, bound)
            for handler in node.handlers:
                inner = set(bound) | ({handler.name} if handler.name else set())
                reads |= _expr_reads(handler.type, bound) if handler.type else set()
                reads |= _block_reads(handler.body, inner)
            reads |= _block_reads(node.orelse, bound) | _block_reads(node.finalbody, bound)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            value = [node.value] if node.value is not None else []
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            reads |= set().union(*(_expr_reads(v, bound) for v in value + targets))
            if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                reads |= {node.target.id} - bound
            bound |= set().union(*(_stores(t) for t in targets))
        else:  # an expression, return, assert, del, raise, match ...: read all, then bind
            reads |= _expr_reads(node, bound)
            bound |= _stores(node)
    return reads


def _free_reads(source):
    """``(reads, binds)``: the names a cell reads before it binds them (what it needs from an earlier
    cell), and those it binds for sure. Unparseable source reads every name it mentions."""
    tree = _code(source)
    if tree is None:
        return _loaded(source), set()
    bound = set()
    return _block_reads(tree.body, bound), bound


def _check_uses(cells, names, path):
    """Record names only a solution defines; ``check_edition`` fails if a later cell reads one."""
    defined = set()
    for cell in cells:
        if cell.cell_type == "code":
            defined |= _assigned(cell.source)
    cells[-1].metadata["solution_only_names"] = sorted(names - defined)


def check_edition(nb, path):
    """Raise if a code cell reads a name that only an earlier solution (not run here) defined."""
    pending = set()
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            pending |= set(cell.metadata.pop("solution_only_names", []))
            continue
        if cell.cell_type != "code":
            continue
        used = (_loaded(cell.source) - _assigned(cell.source)) & pending
        if used:
            raise ValueError(
                f"{path.name}: a cell uses {sorted(used)}, which only a solution defines; "
                "in the reader's edition solutions do not run"
            )
        pending -= _assigned(cell.source)


def convert_all(paths=None):
    """``{output path: notebook}`` for every chapter."""
    paths = paths or chapters()
    converter = Converter(Numbers(chapters()), Bibliography())
    editions = {}
    for path in paths:
        nb = converter.notebook(path)
        check_edition(nb, path)
        editions[READER / path.name] = nb
    return editions


def text_of(nb):
    return nbformat.writes(nb) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if an edition is stale")
    args = parser.parse_args(argv)
    READER.mkdir(exist_ok=True)
    stale = []
    for path, nb in convert_all().items():
        text = text_of(nb)
        if not path.exists() or path.read_text() != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print("stale reader's edition: " + ", ".join(map(str, stale)) + " (run make reader)")
        return 1
    print(f"{'checked' if args.check else 'wrote'} {len(chapters())} notebooks in {READER.relative_to(ROOT)}"
          + (f"; {len(stale)} changed" if stale and not args.check else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
