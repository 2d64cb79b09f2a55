"""A Sphinx extension: the built book shows the numbers of the run that built it.

A chapter's markdown cells are stored with the glued numbers written in
(``tools/sync_prose.py``), so that JupyterLab, Colab and GitHub show numbers rather
than ``{glue:text}`` markup; each such cell keeps its template, with the roles, in
``metadata["prose_template"]``. A build executes every chapter afresh, so for the
HTML the template is what should be rendered: myst-nb then fills each role from the
glue of this very run, and a measured value (a timing) in the prose always agrees
with the table or figure beside it on the same page.

This hook swaps each templated cell's source for its template as Sphinx reads the
notebook, before myst-nb parses and executes it. The notebook file is not changed.

Use it in ``_config.yml``::

    sphinx:
      extra_extensions:
        - attnlib.sphinx_prose
"""

import json

TEMPLATE_KEY = "prose_template"


def templates_back(text):
    """The notebook JSON ``text`` with every templated markdown cell's source set to its template."""
    notebook = json.loads(text)
    changed = False
    for cell in notebook.get("cells", []):
        template = cell.get("metadata", {}).get(TEMPLATE_KEY)
        if cell.get("cell_type") == "markdown" and template is not None:
            cell["source"] = template
            changed = True
    return json.dumps(notebook) if changed else text


def _on_source_read(app, docname, source):
    if str(app.env.doc2path(docname)).endswith(".ipynb"):
        source[0] = templates_back(source[0])


def setup(app):
    app.connect("source-read", _on_source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
