"""tools/nbval_kernels.py: the listed notebooks' kernels, and only theirs, get the extra variables or
draw no figures."""

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tools import nbval_kernels

ROOT = Path(__file__).resolve().parent.parent
PROBE = "NBVAL_ARITHMETIC_PROBE"


def _notebook(path, stored, source=f"import os\nprint(os.environ.get({PROBE!r}))", more=()):
    """A notebook whose cell prints the probe variable, stored as having printed ``stored``."""
    cell = nbformat.v4.new_code_cell(source, execution_count=1)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"{stored}\n")]
    nb = nbformat.v4.new_notebook(cells=[cell, *more])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def _pytest(tmp_path, *options):
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", ".", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-p", "tools.nbval_kernels", "--rootdir", str(tmp_path), "-c", "/dev/null", *options],
        cwd=tmp_path, capture_output=True, text=True, env={**_env(), "PYTHONPATH": str(ROOT)})


def _env():
    return {name: value for name, value in os.environ.items()
            if name not in (PROBE, "PYTEST_ADDOPTS", "IPYTHONDIR")}


def test_only_the_listed_notebooks_kernels_get_the_variables(tmp_path):
    _notebook(tmp_path / "listed.ipynb", "on")  # listed: its kernel must see PROBE=on
    _notebook(tmp_path / "other.ipynb", "None")  # not listed: the worker's own environment
    _notebook(tmp_path / "wrong.ipynb", "None")  # listed, but stored as if it had not been
    run = _pytest(tmp_path, "--other-arithmetic=listed.ipynb wrong.ipynb",
                  f"--other-arithmetic-env={PROBE}=on OTHER_NAME=1")
    summary = run.stdout.strip().splitlines()[-1]
    assert re.search(r"\b1 failed, 2 passed\b", summary), run.stdout + run.stderr
    assert "FAILED wrong.ipynb" in run.stdout
    assert f"this notebook's kernel ran with {PROBE}=on OTHER_NAME=1" in run.stdout
    assert f"nbval: 2 notebooks run on other arithmetic: {PROBE}=on OTHER_NAME=1" in run.stdout


FORMATS = ("%matplotlib inline\nfrom matplotlib_inline.backend_inline import InlineBackend\n"
           "print(sorted(InlineBackend.instance().figure_formats))")


def _figure_cell():
    """A cell that draws a figure, stored as the book stores one: a PNG and its text line."""
    cell = nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\nplt.plot([0, 1])\nplt.show()",
                                     execution_count=2)
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "image/png": "iVBORw0KGgo=", "text/plain": "<Figure size 640x480 with 1 Axes>"})]
    return cell


def test_kernels_in_a_no_drawing_folder_make_no_pictures_and_still_pass(tmp_path):
    (tmp_path / "quiet").mkdir()
    _notebook(tmp_path / "quiet" / "edition.ipynb", "[]", FORMATS, [_figure_cell()])
    _notebook(tmp_path / "book.ipynb", "['png']", FORMATS, [_figure_cell()])  # draws as usual
    run = _pytest(tmp_path, "--no-drawing=quiet")
    summary = run.stdout.strip().splitlines()[-1]
    assert re.search(r"\b4 passed\b", summary) and "failed" not in summary, run.stdout + run.stderr
    assert "nbval: no figures drawn in " in run.stdout


@pytest.mark.parametrize("options, message", [
    (["--other-arithmetic=missing.ipynb", f"--other-arithmetic-env={PROBE}=on"], "no such notebook"),
    (["--other-arithmetic=listed.ipynb"], "gives no NAME=VALUE"),
    (["--other-arithmetic=listed.ipynb", "--other-arithmetic-env=JUSTANAME"], "'JUSTANAME' is not NAME=VALUE"),
    (["--no-drawing=nowhere"], "--no-drawing: no such folder or notebook"),
])
def test_bad_options_are_usage_errors_naming_them(tmp_path, options, message):
    _notebook(tmp_path / "listed.ipynb", "on")
    run = _pytest(tmp_path, *options)
    assert run.returncode == 4, run.stdout + run.stderr  # pytest's usage error
    assert message in run.stderr


def test_the_kernel_start_adds_the_environment_only_while_one_is_set(monkeypatch):
    calls = []
    monkeypatch.setattr(nbval_kernels, "_start_new_kernel", lambda **kwargs: calls.append(kwargs))
    nbval_kernels.start_new_kernel(kernel_name="python3")
    monkeypatch.setattr(nbval_kernels, "_kernel_env", {PROBE: "on"})
    nbval_kernels.start_new_kernel(kernel_name="python3")
    assert calls == [{"kernel_name": "python3"}, {"kernel_name": "python3", "env": {PROBE: "on"}}]
