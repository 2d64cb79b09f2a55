"""The reader's edition (book/reader/): the chapters as Colab, GitHub and Jupyter render them.

Those front ends render a markdown cell as CommonMark with raw HTML, with math taken out
first and typeset by MathJax. ``render`` does the same with markdown-it-py, and the
detectors below count the MyST that would show as text: directive fences, roles,
equation labels, directive options and targets. The chapters in book/ are full of it
(the detectors must find it there); their reader's edition must show none, with every
solution collapsed and every exercise still answerable.
"""

import ast
import json
import re

import nbformat
import pytest
from markdown_it import MarkdownIt

from tools import reader_edition
from tools.reader_edition import READER, chapters

MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$", re.S)
LEAKS = {
    "directive fence": re.compile(r'class="language-\{|:{3,}\{[\w-]+\}'),
    "role": re.compile(r"\{[\w:-]+\}<code>"),
    "equation label": re.compile(r"MATHBLOCK\s*\([\w:-]+\)"),
    "directive option": re.compile(r"(?:^|>|\n):(?:label|class|open|name|nowrap|all):"),
    "target": re.compile(r"\([\w-]+\)="),
}
_renderer = MarkdownIt("commonmark", {"html": True}).enable("table")


def render(markdown):
    """HTML as Colab/GitHub/Jupyter show a markdown cell (math masked, as they mask it)."""
    masked = MATH.sub(lambda m: "MATHBLOCK" if m.group(0).startswith("$$") else "MATH", markdown)
    return _renderer.render(masked)


def leaks(nb):
    counts = dict.fromkeys(LEAKS, 0)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            html = render(cell.source)
            for name, pattern in LEAKS.items():
                counts[name] += len(pattern.findall(html))
    return counts


def read(path):
    return nbformat.read(path, as_version=4)


def edition(path):
    return READER / path.name


CHAPTERS = chapters()


def test_every_chapter_has_a_reader_edition_and_nothing_else_is_there():
    assert len(CHAPTERS) >= 13
    assert sorted(p.name for p in READER.glob("*.ipynb")) == sorted(p.name for p in CHAPTERS)


def test_the_reader_edition_is_up_to_date():
    stale = [
        path.name
        for path, nb in reader_edition.convert_all().items()
        if not path.exists() or path.read_text() != reader_edition.text_of(nb)
    ]
    assert not stale, f"stale reader's edition {stale}: run make reader"


def test_the_detectors_find_the_myst_of_the_book_chapters():
    total = dict.fromkeys(LEAKS, 0)
    for path in CHAPTERS:
        for name, count in leaks(read(path)).items():
            total[name] += count
    assert total["directive fence"] >= 190, total
    assert total["role"] >= 70, total
    assert total["equation label"] >= 30, total
    assert total["directive option"] >= 76, total


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_myst_shows_as_text_in_the_reader_edition(path):
    counts = leaks(read(edition(path)))
    assert not any(counts.values()), counts
    for cell in read(edition(path)).cells:
        if cell.cell_type == "markdown":
            assert "prose_template" not in cell.metadata
            assert not re.search(r"\{(cite|eq|glue|ref|numref|doc)[\w:-]*\}`", cell.source)


def _solution_cells(nb):
    return [c for c in nb.cells if c.cell_type == "markdown" and "Solution to Exercise" in c.source]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_solution_is_collapsed_and_no_solution_code_runs(path):
    source = read(path)
    starts = sum(c.source.count("{solution-start}") for c in source.cells if c.cell_type == "markdown")
    solutions = _solution_cells(read(edition(path)))
    assert len(solutions) == starts
    for cell in solutions:
        html = render(cell.source)
        assert html.startswith("<details>\n<summary>"), html[:80]
        assert html.rstrip().endswith("</details>")
        assert "<details open" not in html
    # the solutions' code is shown inside the collapsed cell, never as a code cell
    code = {c.source.strip() for c in read(edition(path)).cells if c.cell_type == "code"}
    inside, depth = [], 0
    for cell in source.cells:
        text = cell.source if cell.cell_type == "markdown" else ""
        depth += text.count("{solution-start}")
        if depth and cell.cell_type == "code":
            inside.append(cell.source.strip())
        depth -= text.count("{solution-end}")
    assert len(inside) >= starts
    for solution_code in inside:
        assert solution_code not in code
        assert any(solution_code in c.source for c in solutions)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_exercise_keeps_its_heading_and_its_cell_to_answer(path):
    source_checks = [
        c.source for c in read(path).cells if c.cell_type == "code" and "exercises.check(" in c.source
    ]
    cells = read(edition(path)).cells
    headings = [c.source for c in cells if c.cell_type == "markdown" and c.source.startswith("#### Exercise")]
    if not path.name[:2].isdigit():
        pytest.skip(f"{path.name} is not a numbered chapter and has no exercises")
    chapter = int(path.name[:2])
    assert headings == [
        h for h in headings if re.match(rf"#### Exercise {chapter}\.\d+ \(.+\)$", h.split("\n")[0])
    ]
    assert [int(h.split()[2].split(".")[1]) for h in headings] == list(range(1, len(headings) + 1))
    answer_cells = [c for c in cells if c.cell_type == "code" and "exercises.check(" in c.source]
    assert len(answer_cells) == len(headings) == len(source_checks) // 2
    # in order: the heading, the cell to answer in, then the collapsed solution
    kinds = [
        "h" if c.cell_type == "markdown" and c.source.startswith("#### Exercise")
        else "a" if c.cell_type == "code" and "exercises.check(" in c.source
        else "s" if c.cell_type == "markdown" and "Solution to Exercise" in c.source
        else "" for c in cells
    ]
    assert "".join(kinds) == "has" * len(headings)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_code_cells_and_outputs_are_the_chapters_own(path):
    source = [c for c in read(path).cells if c.cell_type == "code"]
    reader = [c for c in read(edition(path)).cells if c.cell_type == "code"]
    by_id = {c.id: c for c in source}
    assert len(reader) > 0
    for cell in reader:
        original = by_id[cell.id]
        removed = "remove-cell" in original.metadata.get("tags", []) and cell.id != reader_edition.SETUP_CELL_ID
        if removed:  # kept for a name a later cell reads: no glue, assert or print, nor their records
            stripped = reader_edition._without_bookkeeping(original.source)
            printed = reader_edition._prints(original.source) > reader_edition._prints(stripped)
            outputs = [o for o in original.outputs if not reader_edition.is_glue_output(o)
                       and not (printed and o.output_type == "stream")]
            original = nbformat.v4.new_code_cell(stripped, metadata=original.metadata,
                                                 execution_count=original.execution_count)
            original.outputs = outputs
        assert cell.outputs == original.outputs
        assert cell.execution_count == original.execution_count
        hidden = set(original.metadata.get("tags", [])) & reader_edition.HIDDEN_TAGS
        assert bool(cell.metadata.get("jupyter", {}).get("source_hidden")) == bool(hidden)
        if hidden:  # folded in JupyterLab and in Colab (a form title, then the code unchanged)
            title, _, code = cell.source.partition("\n")
            assert re.fullmatch(r"#@title [A-Z].* \(double-click to show\)", title), title
            assert code == original.source and cell.metadata["cellView"] == "form"
        else:
            assert cell.source == original.source and "cellView" not in cell.metadata
    assert read(edition(path)).metadata[reader_edition.SOURCE_KEY] == f"book/{path.name}"


def test_equations_are_numbered_as_in_the_book_and_references_match():
    numbers = reader_edition.Numbers(CHAPTERS)
    assert len(numbers.equations) >= 30
    assert sorted(numbers.equations.values()) == list(range(1, len(numbers.equations) + 1))
    backward = next(path for path in CHAPTERS if path.name.startswith("13_"))  # the backward pass
    ch13 = "\n".join(c.source for c in read(edition(backward)).cells if c.cell_type == "markdown")
    number = numbers.equations["eq-ch13-forward"]
    assert f"\\tag{{{number}}}" in ch13
    assert f"({number}) from the end back to the start" in ch13


def test_citations_name_the_work_and_each_chapter_lists_its_references():
    cells = read(edition(CHAPTERS[4])).cells
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    assert "[Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)" in text
    assert cells[-1].source.startswith("## References")
    assert "Łukasz Kaiser" in cells[-1].source and "{\\L}" not in cells[-1].source


# -- the converter on made-up input --------------------------------------------------------

def _converter():
    return reader_edition.Converter(reader_edition.Numbers(CHAPTERS), reader_edition.Bibliography())


def test_a_dropdown_with_code_inside_becomes_a_collapsed_block():
    out = _converter().markdown(
        ":::{dropdown} Deep dive: `x < y`\n:open:\nSome $a_i$ text.\n\n```python\nprint(1)\n```\n:::\n"
    )
    html = render(out)
    assert html.startswith("<details>\n<summary><b>Deep dive: <code>x &lt; y</code></b></summary>")
    assert '<code class="language-python">print(1)' in html
    assert not any(p.findall(html) for p in LEAKS.values())


def test_two_keys_in_one_citation_and_a_textual_citation():
    converter = _converter()
    out = converter.markdown("See {cite:p}`vaswani2017attention, dao2023flashattention2` and {cite:t}`dao2023flashattention2`.")
    assert out.count("](https://arxiv.org/abs/") == 3
    assert "(2024)](" in out and "; [Dao, 2024]" in out
    assert converter.cited == ["vaswani2017attention", "dao2023flashattention2"]


@pytest.mark.parametrize(
    "text, words",
    [
        ("```{figure} x.png\nbody\n```", "unknown MyST directive {figure}"),
        ("see {numref}`fig-x`", "unknown MyST role {numref}"),
        ("{eq}`eq-nowhere`", "eq-nowhere"),
        ("{cite:p}`nobody2099`", "nobody2099"),
    ],
)
def test_markup_it_cannot_convert_stops_it_with_the_name(text, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        _converter().markdown(text)


def test_a_later_cell_that_needs_a_solution_stops_it(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("```{exercise-start} Make it\n:label: ch4-softmax-weight\n```\nDo it."),
        nbformat.v4.new_code_cell("answer = ...\nresult = attnlib.exercises.check('x', answer)"),
        nbformat.v4.new_markdown_cell("```{exercise-end}\n```"),
        nbformat.v4.new_markdown_cell("```{solution-start} ch4-softmax-weight\n:class: dropdown\n```"),
        nbformat.v4.new_code_cell("helper = 3\nanswer = helper"),
        nbformat.v4.new_markdown_cell("```{solution-end}\n```"),
        nbformat.v4.new_code_cell("print(helper + 1)"),
    ]
    path = tmp_path / "04_made_up.ipynb"
    nbformat.write(nb, path)
    converted = _converter().notebook(path)
    assert json.dumps(converted).count("Solution to Exercise 4.1 (One softmax weight)") == 1
    with pytest.raises(ValueError, match=r"\['helper'\].*only a solution defines"):
        reader_edition.check_edition(converted, path)


def test_the_sphinx_extension_points_colab_and_download_at_the_edition(tmp_path):
    """A two-page Sphinx book: the page with a reader's edition gets Colab and download links to it (and
    the file in the build); the page without one keeps the theme's links to its own source."""
    import subprocess
    import sys

    src = tmp_path / "src"
    (src / "book" / "reader").mkdir(parents=True)
    (src / "conf.py").write_text(
        'extensions = ["myst_nb", "attnlib.sphinx_reader"]\n'
        'html_theme = "sphinx_book_theme"\n'
        'nb_execution_mode = "off"\n'
        'exclude_patterns = ["book/reader"]\n'
        "html_theme_options = {\n"
        '    "repository_url": "https://github.com/someone/somebook", "repository_branch": "main",\n'
        '    "path_to_docs": "", "use_download_button": True,\n'
        '    "launch_buttons": {"colab_url": "https://colab.research.google.com"},\n'
        "}\n"
    )
    (src / "index.md").write_text("# Book\n\n```{toctree}\nbook/01_with\nbook/02_without\n```\n")
    for name, text in [("book/01_with", "# With"), ("book/02_without", "# Without"),
                       ("book/reader/01_with", "# With, plain")]:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, src / f"{name}.ipynb")
    out = tmp_path / "html"
    # in a process of its own: myst-nb registers its parser once per process, and another test's
    # Sphinx app in this one (myst-parser alone) leaves markdown without a parser for the next
    run = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-E", str(src), str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    blob = "https://colab.research.google.com/github/someone/somebook/blob/main/"
    page = (out / "book" / "01_with.html").read_text()
    assert f'href="{blob}book/reader/01_with.ipynb"' in page
    assert 'href="../_sources/book/reader/01_with.ipynb"' in page
    copied = nbformat.read(out / "_sources" / "book" / "reader" / "01_with.ipynb", as_version=4)
    assert copied.cells[0].source == "# With, plain"
    other = (out / "book" / "02_without.html").read_text()
    assert f'href="{blob}book/02_without.ipynb"' in other
    assert "reader/" not in other


def test_admonitions_become_quotes_under_their_title_and_may_collapse():
    converter = _converter()
    html = render(converter.markdown("```{tip}\nA tip with $$x$$ (eq. {eq}`eq-ch13-forward`).\n\nTwo.\n```"))
    number = reader_edition.Numbers(CHAPTERS).equations["eq-ch13-forward"]
    assert html.startswith("<blockquote>\n<p><strong>Tip</strong></p>")
    assert f"(eq. ({number}))" in html and "<p>Two.</p>" in html
    out = converter.markdown(":::{admonition} The rule\n:class: dropdown\nBody.\n:::")
    assert out.startswith("<details>\n<summary><b>The rule</b></summary>") and "Body." in out
    for html in (render(out), render(converter.markdown("```{note}\nN.\n```"))):
        assert not any(p.findall(html) for p in LEAKS.values())


# -- what the edition gives a reader: only what the book shows ----------------------------------

def _edition_cells():
    for path in sorted(READER.glob("*.ipynb")):
        yield from ((path, cell) for cell in read(path).cells)


def test_every_relative_link_in_the_edition_resolves():
    broken = []
    for path, cell in _edition_cells():
        if cell.cell_type != "markdown":
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", cell.source):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (READER / target.split("#")[0]).exists():
                broken.append(f"{path.name}: {target}")
    assert broken == []


def test_cells_the_book_removes_are_gone_unless_a_later_cell_needs_them():
    """A removed cell stays only for a name a later cell reads, without its glue calls and asserts."""
    for path in sorted(READER.glob("*.ipynb")):
        cells = [c for c in read(path).cells if c.cell_type == "code"]
        for i, cell in enumerate(cells):
            if "remove-cell" not in cell.metadata.get("tags", []) or cell.get("id") == reader_edition.SETUP_CELL_ID:
                continue
            source = "\n".join(line for line in cell.source.split("\n") if not line.startswith("#@title"))
            tree = ast.parse(source)
            assert not any(reader_edition._is_bookkeeping(node) for node in ast.walk(tree)
                           if isinstance(node, ast.stmt)), f"{path.name}: {source[:80]}"
            needed = set()
            for later in reversed(cells[i + 1:]):
                reads, binds = reader_edition._free_reads(later.source)
                needed = (needed - binds) | reads
            assert reader_edition._assigned(source) & needed, f"{path.name}: kept for nothing: {source[:80]}"


def _glue_record(name, value):
    return nbformat.v4.new_output("display_data", data={"application/papermill.record/text/plain": value},
                                  metadata={"scrapbook": {"name": name,
                                                          "mime_prefix": "application/papermill.record/"}})


def test_dropping_removed_cells_keeps_what_a_later_cell_reads():
    removed = {"tags": ["remove-cell"]}
    cells = [nbformat.v4.new_code_cell("from myst_nb import glue\nx = 3\nglue('x', x)\nassert x > 0",
                                       metadata=removed),
             nbformat.v4.new_code_cell("glue('y', 4)\nassert True", metadata=removed),
             # the loop did nothing but glue: it goes, with its comment
             nbformat.v4.new_code_cell("# the numbers\nfor i in range(2):\n    glue(f'z{i}', i)\nw = 1",
                                       metadata=removed),
             # the cell reads the loop's variable after it: the loop stays, with pass
             nbformat.v4.new_code_cell("for j in range(2):\n    glue(f'z{j}', j)\nlast = j",
                                       metadata=removed),
             # kept for nothing: later cells bind t and u before they read them
             nbformat.v4.new_code_cell("t = 1\nu = 2", metadata=removed),
             nbformat.v4.new_code_cell("print(x + w + last)\nfor t in range(2):\n    print(t)"),
             nbformat.v4.new_code_cell("print([u for u in range(2)])")]
    kept = reader_edition.drop_removed_cells(cells)
    assert [c.source for c in kept] == ["from myst_nb import glue\nx = 3", "w = 1",
                                        "for j in range(2):\n    pass\nlast = j", cells[-2].source,
                                        cells[-1].source]


def test_a_removed_cell_kept_is_stored_executed_with_the_outputs_it_draws():
    """Not as never run (nbval would not compare it), nor with its figure missing (nbval compares a
    fresh run with the stored outputs): only its glue records go, and the text of its prints."""
    figure = nbformat.v4.new_output("display_data", data={"image/png": "iVBOR", "text/plain": "<Figure>"})
    printed = nbformat.v4.new_output("stream", name="stdout", text="the table\n")
    static = nbformat.v4.new_code_cell("fig = draw()\nprint('the table')\nglue('n', 3)\nfig",
                                       metadata={"tags": ["remove-cell"]}, execution_count=7)
    static.outputs = [printed, _glue_record("n", "3"), figure]
    quiet = nbformat.v4.new_code_cell("n = 3\nglue('n', n)", metadata={"tags": ["remove-cell"]},
                                      execution_count=8)
    quiet.outputs = [_glue_record("n", "3")]
    kept = reader_edition.drop_removed_cells([static, quiet, nbformat.v4.new_code_cell("fig, n")])
    assert [c.source for c in kept[:2]] == ["fig = draw()\nfig", "n = 3"]
    assert [c.execution_count for c in kept[:2]] == [7, 8]
    assert kept[0].outputs == [figure] and kept[1].outputs == []


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_code_cell_of_the_edition_is_stored_executed_with_its_outputs(path):
    """nbval skips a cell stored without an execution count and compares the others' outputs with a
    fresh run: every code cell is stored as the book ran it, with the book's figures and results
    (glue records aside)."""
    book = {c.id: c for c in read(path).cells if c.cell_type == "code"}
    for cell in read(edition(path)).cells:
        if cell.cell_type != "code":
            continue
        assert cell.execution_count is not None, f"{path.name}: cell {cell.id} stored as never run"
        assert cell.execution_count == book[cell.id].execution_count
        def shown(outputs):  # figures and results (prints of a removed cell go with them)
            return [o.output_type for o in outputs
                    if o.output_type != "stream" and not reader_edition.is_glue_output(o)]

        assert shown(cell.outputs) == shown(book[cell.id].outputs), \
            f"{path.name}: cell {cell.id} is stored without the outputs the book's cell has"


def test_the_names_a_cell_needs_from_earlier_cells():
    def reads(source):
        return reader_edition._free_reads(source)[0] - {"print", "range", "len"}

    assert reads("for r in rows:\n    print(r)") == {"rows"}
    assert reads("[t for t in ts if t]\n{k: v for k, v in d}") == {"ts", "d"}
    assert reads("def f(a, b=c):\n    x = a + y\n    return x\nf(1)") == {"c", "y"}
    assert reads("g = lambda q: q + z") == {"z"}
    assert reads("if a:\n    b = 1\nelse:\n    b = 2\nprint(b)") == {"a"}
    assert reads("if a:\n    b = 1\nprint(b)") == {"a", "b"}  # b may come from an earlier cell
    assert reads("x += 1\ny = x") == {"x"}
    assert reads("with open(p) as f:\n    s = f.read()\nn = len(s)") == {"open", "p"}
    assert reads("a[i] = 1") == {"a", "i"}
    assert reader_edition._free_reads("x = 1\nfor t in ts:\n    pass")[1] == {"x", "t"}
