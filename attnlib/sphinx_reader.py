"""A Sphinx extension: a chapter's Colab and download buttons open its reader's edition.

The chapters' Markdown is MyST, which Colab, GitHub and a plain Jupyter show as text.
``tools/reader_edition.py`` writes each chapter again as plain Markdown with HTML, in
``book/reader/`` next to it. This extension points the page's Colab button at that file
in the repository and makes the ``.ipynb`` download button give it: the built book
copies it to ``_sources/<folder>/reader/<chapter>.ipynb``. A page without a reader's
edition keeps the theme's buttons.

Use it in ``_config.yml``::

    sphinx:
      extra_extensions:
        - attnlib.sphinx_reader
"""

import shutil
from pathlib import Path, PurePosixPath

FOLDER = "reader"


def edition_path(srcdir, pagename):
    """The reader's edition of ``pagename`` (``book/reader/04_x.ipynb``), or None."""
    page = PurePosixPath(pagename)
    path = Path(srcdir, *page.parent.parts, FOLDER, page.name + ".ipynb")
    return path if path.exists() else None


def edition_name(pagename):
    page = PurePosixPath(pagename)
    return str(page.parent / FOLDER / (page.name + ".ipynb"))


def _buttons(items):
    for item in items or []:
        if isinstance(item, dict):
            yield item
            yield from _buttons(item.get("buttons"))


def _on_page(app, pagename, templatename, context, doctree):
    if edition_path(app.srcdir, pagename) is None:
        return
    source = pagename + ".ipynb"
    reader = edition_name(pagename)
    for button in _buttons(context.get("header_buttons")):
        url = button.get("url", "")
        if button.get("text") == "Colab" and url.endswith("/" + source):
            button["url"] = url[: -len(source)] + reader
            button["tooltip"] = "Open this chapter in Colab"
        elif button.get("label") in ("download-notebook-button", "download-source-button") and url.endswith(
            "/" + source
        ):
            button["url"] = url[: -len(source)] + reader
            button["tooltip"] = "Download this chapter as a notebook"


def _on_finished(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    for pagename in sorted(app.env.found_docs):
        path = edition_path(app.srcdir, pagename)
        if path is not None:
            target = Path(app.outdir, "_sources", edition_name(pagename))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def setup(app):
    app.connect("html-page-context", _on_page, priority=600)
    app.connect("build-finished", _on_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
