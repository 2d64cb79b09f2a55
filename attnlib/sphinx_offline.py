"""A Sphinx extension that keeps the built book from loading anything from another host.

Jupyter Book 1.x always loads ``sphinx_thebe``, which puts a Thebe configuration
script (pointing at a CDN) and its stylesheet on every page, even when no page
offers a live kernel, and declares ``THEBE_JS_URL`` twice, an error in the
browser console. The book has no Thebe button, so this extension disconnects
sphinx-thebe and removes its assets. MathJax comes from ``sphinx-mathjax-offline``
(listed next to this extension in ``_config.yml``), which copies MathJax 3 into
``_static/mathjax``.

Use it in ``_config.yml``::

    sphinx:
      extra_extensions:
        - sphinx-mathjax-offline
        - attnlib.sphinx_offline
"""

THEBE_MODULE = "sphinx_thebe"


def drop_thebe(app, config):
    """Disconnect every sphinx-thebe event handler and drop its stylesheet."""
    for listeners in app.events.listeners.values():
        for listener in list(listeners):
            if getattr(listener.handler, "__module__", "") == THEBE_MODULE:
                app.disconnect(listener.id)
    app.registry.css_files[:] = [(name, attrs) for name, attrs in app.registry.css_files
                                 if name != "sphinx-thebe.css"]


def setup(app):
    app.connect("config-inited", drop_thebe, priority=900)  # after every extension's setup
    return {"parallel_read_safe": True, "parallel_write_safe": True}
