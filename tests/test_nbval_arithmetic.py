"""tools/nbval_arithmetic.py: the listed notebooks' kernels, and only theirs, get the extra variables."""

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tools import nbval_arithmetic

ROOT = Path(__file__).resolve().parent.parent
PROBE = "NBVAL_ARITHMETIC_PROBE"


def _notebook(path, stored):
    """A notebook whose one cell prints the probe variable, stored as having printed ``stored``."""
    cell = nbformat.v4.new_code_cell(f"import os\nprint(os.environ.get({PROBE!r}))", execution_count=1)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"{stored}\n")]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def _pytest(tmp_path, *options):
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", ".", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-p", "tools.nbval_arithmetic", "--rootdir", str(tmp_path), "-c", "/dev/null", *options],
        cwd=tmp_path, capture_output=True, text=True, env={**_env(), "PYTHONPATH": str(ROOT)})


def _env():
    import os
    return {name: value for name, value in os.environ.items() if name != PROBE}


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


@pytest.mark.parametrize("options, message", [
    (["--other-arithmetic=missing.ipynb", f"--other-arithmetic-env={PROBE}=on"], "no such notebook"),
    (["--other-arithmetic=listed.ipynb"], "gives no NAME=VALUE"),
    (["--other-arithmetic=listed.ipynb", "--other-arithmetic-env=JUSTANAME"], "'JUSTANAME' is not NAME=VALUE"),
])
def test_bad_options_are_usage_errors_naming_them(tmp_path, options, message):
    _notebook(tmp_path / "listed.ipynb", "on")
    run = _pytest(tmp_path, *options)
    assert run.returncode == 4, run.stdout + run.stderr  # pytest's usage error
    assert message in run.stderr


def test_the_kernel_start_adds_the_environment_only_while_one_is_set(monkeypatch):
    calls = []
    monkeypatch.setattr(nbval_arithmetic, "_start_new_kernel", lambda **kwargs: calls.append(kwargs))
    nbval_arithmetic.start_new_kernel(kernel_name="python3")
    monkeypatch.setattr(nbval_arithmetic, "_kernel_env", {PROBE: "on"})
    nbval_arithmetic.start_new_kernel(kernel_name="python3")
    assert calls == [{"kernel_name": "python3"}, {"kernel_name": "python3", "env": {PROBE: "on"}}]
