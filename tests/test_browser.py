"""The built book in a real browser: headless Chromium, every page, offline, phone and desktop.

Runs on the HTML in ``$BOOK_HTML`` (``make browser-test`` sets it to the strict build,
``_build/html``) and is skipped without it or without a Chromium. Each page is opened
from disk with the network off, 390 px wide as on a phone, then widened to 1280 px, and
checked at both widths for what a reader would trip over. The page checks themselves are
in ``tools/browser.py``.
"""

import html
import os
import re
from pathlib import Path

import pytest

from tools.browser import HEIGHT, WIDTHS, Chromium, find_chromium, page_report, typeset

BOOK = Path(os.environ["BOOK_HTML"]) if os.environ.get("BOOK_HTML") else None
pytestmark = [
    pytest.mark.skipif(BOOK is None, reason="set BOOK_HTML to a built book (make browser-test does)"),
    pytest.mark.skipif(find_chromium() is None, reason="no Chromium (apt-get install chromium)"),
]
# The root index.html only redirects to book/index.html (a meta refresh): a browser leaves it at
# once, and a check running in it then fails at random ("target navigated"). So the browser opens
# the book's pages, and the root page gets the static checks and a check of its redirect.
BOOK_PAGES = sorted((BOOK / "book").glob("*.html")) if BOOK else []
PAGES = BOOK_PAGES + [BOOK / "index.html"] if BOOK else []
VIEWS = [(page, width) for page in BOOK_PAGES for width in WIDTHS.values()]
MIN_FIGURE_SCALE = 0.65  # with 11 pt text at 100 dpi (attnlib.plotting), at least 9.9 px on screen

FIGURE_SCALES_JS = """[...document.querySelectorAll("div.cell_output img")].map(img => {
    const shown = img.getBoundingClientRect().width;
    return [img.src.split("/").pop(), img.naturalWidth, Math.round(shown)];
})"""

CODE_FITS_JS = """[...document.querySelectorAll("div.cell_input pre")].filter(pre => {
    if (pre.closest(".admonition")) return false;  // exercise boxes are narrower: their code scrolls
    const longest = Math.max(...pre.innerText.split("\\n").map(line => line.length));
    return longest <= 88 && pre.scrollWidth > pre.clientWidth + 1;
}).map(pre => `${pre.scrollWidth} > ${pre.clientWidth} px: ` + pre.innerText.slice(0, 60))"""

FIGURES_CUT_JS = """[...document.querySelectorAll("div.cell_output img")].filter(img => {
    const box = img.closest("div.cell_output");
    return box.scrollWidth > box.clientWidth + 1;
}).map(img => `${img.naturalWidth} px figure in a ${img.closest("div.cell_output").clientWidth} px column`)"""

REACT_JS = """(() => {
    const results = [];
    for (const root of document.querySelectorAll(".attn-interactive")) {
        const frames = Number(root.dataset.frames);
        if (frames > 1) {
            const next = root.querySelector("button.attn-next");
            const visible = () => [...root.querySelectorAll(".attn-frame")].findIndex(f => !f.hidden);
            const before = [root.dataset.frame, visible()];
            if (next) next.click();
            const after = [root.dataset.frame, visible()];
            const slider = root.querySelector("input.attn-slider");
            // a figure may open on any frame (data-frame counts from 1): "next" shows the one after it
            const opened = Number(before[0]);
            const prev = root.querySelector("button.attn-prev");
            if (prev) prev.click();  // and back: the figure is left as it opened, for the next width
            const back = [root.dataset.frame, visible()];
            results.push({id: root.id, kind: "frames", ok: !!next && !!slider && !!prev && opened >= 1
                && opened < frames && before[1] === opened - 1 && Number(after[0]) === opened + 1
                && after[1] === opened && back[0] === before[0] && back[1] === before[1]});
        }
        const readout = root.querySelector(".attn-readout");
        if (readout) {
            const cells = root.querySelectorAll("[data-readout]");
            const cell = cells[cells.length - 1];
            const before = readout.textContent;
            cell.dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));
            results.push({id: root.id, kind: "readout", ok: readout.textContent !== before
                && readout.textContent === cell.dataset.readout});
            readout.textContent = before;  // left as it opened, for the next width
            cell.classList.remove("attn-hover");
        }
    }
    return results;
})()"""


@pytest.fixture(scope="module")
def browser():
    with Chromium() as chromium:
        yield chromium


def _report(tab):
    report = page_report(tab)
    report["figures"] = tab.evaluate(FIGURE_SCALES_JS, await_promise=False)
    report["code_scrolls"] = tab.evaluate(CODE_FITS_JS, await_promise=False)
    report["figures_cut"] = tab.evaluate(FIGURES_CUT_JS, await_promise=False)
    report["reactions"] = tab.evaluate(REACT_JS, await_promise=False)
    report["errors"] = tab.console_errors()
    report["external"] = [u for u in tab.requests() if not u.startswith(("file:", "data:"))]
    report["failed"] = tab.failed_loads()
    report["viewport"] = tab.evaluate("document.documentElement.clientWidth", await_promise=False)
    return report


@pytest.fixture(scope="module")
def visits(browser):
    """Open each page once, lazily, as a phone does (390 px), then widen the same window to 1280 px:
    a report at each width. The widening lays the page out again (media queries, resize handlers)
    without loading or typesetting it a second time, which is most of the browser's work."""
    seen = {}

    def visit(page, width):
        if (page, width) not in seen:
            for either in WIDTHS.values():  # fail once
                seen[page, either] = RuntimeError(f"{page.name} did not open (at {WIDTHS['phone']} px)")
            tab = browser.open_page(page.as_uri(), WIDTHS["phone"], HEIGHT["phone"])
            typeset(tab)
            seen[page, WIDTHS["phone"]] = _report(tab)
            tab.resize(WIDTHS["desktop"], HEIGHT["desktop"])
            seen[page, WIDTHS["desktop"]] = _report(tab)
            tab.close()
        if isinstance(seen[page, width], Exception):
            raise seen[page, width]
        return seen[page, width]

    return visit


def _id(view):
    page, width = view
    return f"{page.stem}-{width}px"


@pytest.mark.parametrize("view", VIEWS, ids=_id)
def test_each_report_is_of_the_page_laid_out_at_its_width(visits, view):
    page, width = view
    assert visits(page, width)["viewport"] == width  # the window, without a scrollbar (hidden)


@pytest.mark.parametrize("view", VIEWS, ids=_id)
def test_nothing_is_loaded_from_another_host_and_every_load_succeeds(visits, view):
    report = visits(*view)
    assert report["external"] == []
    assert report["failed"] == []


@pytest.mark.parametrize("view", VIEWS, ids=_id)
def test_the_math_is_typeset(visits, view):
    report = visits(*view)
    assert report["untypeset"] == [], "formulas MathJax left alone"
    assert report["rawMath"] == [], "raw \\( or \\[ in the text"


@pytest.mark.parametrize("view", VIEWS, ids=_id)
def test_every_image_has_loaded(visits, view):
    assert visits(*view)["brokenImages"] == []


@pytest.mark.parametrize("view", VIEWS, ids=_id)
def test_nothing_in_the_main_column_is_wider_than_the_column(visits, view):
    report = visits(*view)
    assert report["tooWide"] == [], f"{report['tooWideCount']} elements stick out of the column"
    assert report["cutOff"] == [], "boxes that cut their content off without scrolling"


@pytest.mark.parametrize("view", VIEWS, ids=_id)
def test_no_inline_formula_has_a_scrollbar_of_its_own(visits, view):
    """Only display math wider than the column may scroll; a scrollbar under a short inline formula
    (as on phones, where 96 of chapter 4's 103 had one) is noise in the middle of a sentence."""
    report = visits(*view)
    assert report["inlineMathScrollbars"] == [], f"{report['inlineMathScrollbarCount']} inline formulas scroll"


@pytest.mark.parametrize("page", BOOK_PAGES, ids=lambda p: p.stem)
def test_code_lines_of_88_characters_fit_the_column_at_1280_px(visits, page):
    assert visits(page, WIDTHS["desktop"])["code_scrolls"] == []


@pytest.mark.parametrize("view", VIEWS, ids=_id)
def test_figures_are_shown_large_enough_to_read(visits, view):
    small = [f"{name}: {shown} of {natural} px" for name, natural, shown in visits(*view)["figures"]
             if natural and shown < MIN_FIGURE_SCALE * natural - 1]
    assert small == []


@pytest.mark.parametrize("page", BOOK_PAGES, ids=lambda p: p.stem)
def test_no_figure_is_cut_by_the_column_at_1280_px(visits, page):
    """On a desktop screen every figure fits the column at a legible scale; only on a phone may a wide
    figure scroll sideways in its box (pages.js keeps it at 0.65 of its size or more)."""
    report = visits(page, WIDTHS["desktop"])
    assert not report["figures_cut"], report["figures_cut"]


@pytest.mark.parametrize("view", VIEWS, ids=_id)
def test_there_are_no_console_errors(visits, view):
    assert visits(*view)["errors"] == []


@pytest.mark.parametrize("view", VIEWS, ids=_id)
def test_solutions_start_collapsed(visits, view):
    assert visits(*view)["openSolutions"] == []


@pytest.mark.parametrize("view", VIEWS, ids=_id)
def test_the_interactive_figures_react(visits, view):
    failed = [r for r in visits(*view)["reactions"] if not r["ok"]]
    assert failed == []


def test_the_book_has_at_least_four_interactive_figures_that_step_or_read_out(visits):
    reactions = [r for page in BOOK_PAGES for r in visits(page, WIDTHS["desktop"])["reactions"]]
    assert len({r["id"] for r in reactions}) >= 4
    assert {"frames", "readout"} <= {r["kind"] for r in reactions}


LOADING_TAG = re.compile(
    r"<(?:script|img|iframe|source|video|audio|embed)\b[^>]*\bsrc\s*=\s*[\"']?(https?:)?//"
    r"|<link\b(?=[^>]*\brel\s*=\s*[\"']?(?:stylesheet|icon|preload|modulepreload|manifest))"
    r"[^>]*\bhref\s*=\s*[\"']?(https?:)?//"
    r"|url\(\s*[\"']?(https?:)?//", re.IGNORECASE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_no_page_names_a_script_stylesheet_font_or_image_on_another_host(page):
    """Also what no click of ours triggers: every src, loading href and CSS url() is local."""
    found = [m.group(0)[:120] for m in LOADING_TAG.finditer(page.read_text())]
    assert found == []


def test_no_stylesheet_loads_from_another_host():
    found = [f"{css.name}: {m.group(0)[:80]}" for css in (BOOK / "_static").rglob("*.css")
             for m in re.finditer(r"url\(\s*[\"']?(https?:)?//[^)]*\)|@import\s+[\"']?(https?:)?//",
                                  css.read_text(errors="replace"))]
    assert found == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_figure_has_alt_text_that_describes_it(page):
    """Figures computed by the chapters carry a description (a screen reader reads it, and it shows
    where the image cannot load), not the file name myst-nb writes when a cell sets none."""
    figures = [tag for tag in re.findall(r"<img\b[^>]*>", page.read_text(encoding="utf-8"))
               if "_images/" in tag]
    bad = []
    for tag in figures:
        alt = re.search(r'\balt="([^"]*)"', tag)
        text = alt.group(1) if alt else ""
        if len(text.split()) < 4 or text.endswith((".png", ".svg", ".jpg")):
            bad.append(text or tag)
    assert not bad, f"{page.name}: figures without a description: {bad}"


def test_the_root_page_redirects_to_the_book():
    text = (BOOK / "index.html").read_text(encoding="utf-8")
    target = re.search(r'http-equiv="refresh"\s+content="0;\s*url=([^"]+)"', text, re.IGNORECASE)
    assert target, "the root index.html should redirect to the book's first page"
    assert (BOOK / target.group(1)).is_file(), target.group(1)


def test_the_live_figures_of_the_book_agree_with_python(browser):
    """Each live figure of the built book, driven as a reader would, against Python on the data it carries
    (the chapters' own trained models): random scores, every query, held-out sentences and sequences."""
    from types import SimpleNamespace

    import numpy as np

    import live_driver

    kinds, problems = set(), []
    for page in BOOK_PAGES:
        if "attn-live" not in page.read_text(encoding="utf-8"):
            continue
        tab = browser.open_page(page.as_uri(), WIDTHS["phone"], 844)
        for figure in tab.evaluate(live_driver.FIGURES_JS, await_promise=False):
            kind, data, fid = figure["kind"], figure["data"], figure["id"]
            kinds.add(kind)
            if kind == "typed-scores":
                found = live_driver.check_typed_scores(tab, fid, data, np.random.default_rng(1))
            elif kind == "pick-query":
                example = SimpleNamespace(**{name: np.array(data[name]) for name in ("q", "k", "v")})
                found = live_driver.check_pick_query(tab, fid, data, example)
            elif kind == "pointer":
                found = live_driver.check_pointer(tab, fid, data, [
                    (0, "animal", "street", "tired"), (1, "animal", "street", "wide"), (0, "fox", "canal", "icy"),
                    (1, "wolf", "hill", "sleepy"), (0, "duck", "yard", "muddy")])
            elif kind == "writer":
                found = live_driver.check_writer(tab, fid, data, [
                    ("And God said", 0.8, 1, (1, 0)), ("Jesus wept.\n", 0.0, 0, (0, 2)),
                    ("Blessed are the poor in spirit", 1.5, 123, (1, 3)), ("Amen", 0.5, 4294967295, (0, 0))])
            else:
                letters = data["letters"]
                rng = np.random.default_rng(3)
                pattern = "".join(rng.choice(list(letters), 9))
                found = live_driver.check_induction(tab, fid, data, [pattern * 2, "abcabc", letters[:16] * 2])
            problems += [f"{page.name} {kind}: {p}" for p in found]
        wide = tab.evaluate("""[...document.querySelectorAll(".attn-live input, .attn-live select, .attn-live textarea")]
            .filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
            .map(e => e.className)""", await_promise=False)
        problems += [f"{page.name}: a control wider than the phone: {w}" for w in wide]
        problems += [f"{page.name}: console: {e}" for e in tab.console_errors()]
        tab.close()
    assert kinds == {"typed-scores", "pick-query", "pointer", "induction", "writer"}
    assert problems == []


CHAPTER_PAGES = [p for p in BOOK_PAGES if re.match(r"\d\d_", p.name)]


@pytest.mark.parametrize("page", CHAPTER_PAGES, ids=lambda p: p.stem)
def test_colab_and_download_buttons_give_the_reader_edition(page):
    """The Colab button opens book/reader/<chapter>.ipynb in the repository, and the download button gives
    that file, copied into the build: the plain-Markdown edition, not the MyST source."""
    import nbformat
    import yaml

    from tools.reader_edition import READER, ROOT

    text = page.read_text(encoding="utf-8")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    repo = config["repository"]["url"].removeprefix("https://github.com/").rstrip("/")
    branch = config["repository"].get("branch", "main")
    colab = re.findall(r'href="(https://colab\.research\.google\.com/[^"]+)"', text)
    assert colab == [f"https://colab.research.google.com/github/{repo}/blob/{branch}/book/reader/"
                     f"{page.stem}.ipynb"]
    downloads = set(re.findall(r'href="([^"]*_sources/[^"]+\.ipynb)"', text))
    assert downloads == {f"../_sources/book/reader/{page.stem}.ipynb"}
    built = nbformat.read(page.parent / downloads.pop(), as_version=4)
    assert built == nbformat.read(READER / f"{page.stem}.ipynb", as_version=4)


def test_exercise_and_equation_numbers_of_the_reader_edition_are_the_books():
    """The reader's edition numbers exercises and equations itself; they must be the built book's."""
    import nbformat

    from tools.reader_edition import READER

    for page in CHAPTER_PAGES:
        text = page.read_text(encoding="utf-8")
        built_exercises = re.findall(r'caption-number">Exercise ([\d.]+) </span> \(([^<]+)\)</p>', text)
        built_equations = re.findall(r'<span class="eqno">\((\d+)\)', text)
        cells = nbformat.read(READER / f"{page.stem}.ipynb", as_version=4).cells
        markdown = "\n".join(c.source for c in cells if c.cell_type == "markdown")
        mine = re.findall(r"^#### Exercise ([\d.]+) \((.+)\)$", markdown, re.M)
        smart = str.maketrans({"\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "--"})
        assert [(n, html.unescape(t).translate(smart)) for n, t in built_exercises] == mine, page.name
        assert built_equations == re.findall(r"\\tag\{(\d+)\}", markdown), page.name


def test_the_page_of_the_gpt_that_writes_stays_under_one_and_a_half_megabytes():
    """Its live figure carries the model's weights (base64 float32): the page must stay light to load."""
    page = next(p for p in BOOK_PAGES if p.name.startswith("10_"))
    assert page.stat().st_size < 1_500_000, f"{page.name}: {page.stat().st_size:,} bytes"
