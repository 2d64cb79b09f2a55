"""Edit a chapter notebook safely while other people (or scripts) edit the book too.

Several contributors may change the same notebook at once. Every write to a notebook goes
through :func:`editing`, which holds an exclusive lock on that notebook for the whole
read-modify-write, so no edit overwrites another. ``tools/execute_notebooks.py`` and
``tools/insert_exercises.py`` take the same lock.

    from tools.nbedit import editing
    with editing("book/04_scale_and_softmax.ipynb") as nb:
        nb.cells[3].source = "..."
"""

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path

import nbformat

LOCK_DIR = Path(tempfile.gettempdir()) / "attnlib-notebook-locks"


@contextlib.contextmanager
def locked(path):
    """Hold the exclusive lock of notebook ``path`` (blocks while someone else holds it)."""
    LOCK_DIR.mkdir(exist_ok=True)
    with open(LOCK_DIR / f"{Path(path).name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def editing(path):
    """Yield the notebook at ``path`` read fresh under its lock; write it back on a clean exit."""
    path = Path(path)
    with locked(path):
        nb = nbformat.read(path, as_version=4)
        yield nb
        tmp = path.with_suffix(".ipynb.tmp")
        nbformat.write(nb, tmp)
        os.replace(tmp, path)
