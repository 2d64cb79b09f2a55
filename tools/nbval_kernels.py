"""A pytest plugin for nbval: chosen notebooks' kernels start with a changed environment.

Two uses, both in `make test`'s one pytest session (loaded with ``-p tools.nbval_kernels``):

**Another machine's arithmetic.** What a training chapter prints must not depend on the CPU's
rounding, so those chapters' kernels start with extra variables (every model's initial weights
moved by a relative 1e-9, torch's and MKL's kernels on their plain code paths; see the Makefile's
TRAINING_CHAPTERS) and nbval requires every stored output to come out the same::

    --other-arithmetic="book/07_x.ipynb book/08_y.ipynb"   the notebooks, relative to the rootdir
    --other-arithmetic-env="NAME=VALUE NAME=VALUE"         what their kernels' environment adds

**No drawing.** nbval does not compare pictures (it skips image/png), but a kernel still draws every
figure to make one: about half a second each here. The reader's edition runs the book's own
figure code, which the book's notebooks draw in the same session, so its kernels skip it::

    --no-drawing="book/reader"   notebooks in these folders (or these files) draw no figures

Their kernels start with an IPython profile whose inline backend has no picture format; a figure
then shows as its text line (``<Figure size 700x360 with 1 Axes>``), which nbval still compares.

The pytest worker itself is never changed (its torch and MKL have read their variables already).
A failure in a listed notebook says, under its report, what its kernel had.
"""

import os
import shutil
import tempfile
from pathlib import Path

import nbval.kernel
import pytest

_KEY = pytest.StashKey[dict]()
_start_new_kernel = nbval.kernel.start_new_kernel
_kernel_env = None  # the environment of the kernel being started now; None: the worker's own
NO_DRAWING_CONFIG = "c.InlineBackend.figure_formats = set()\n"


def start_new_kernel(*args, **kwargs):
    """nbval's ``start_new_kernel``, with the listed notebook's environment when one is starting."""
    if _kernel_env is not None:
        kwargs.setdefault("env", _kernel_env)
    return _start_new_kernel(*args, **kwargs)


nbval.kernel.start_new_kernel = start_new_kernel  # RunningKernel looks the name up when it starts


def pytest_addoption(parser):
    group = parser.getgroup("nbval")
    group.addoption("--other-arithmetic", default="", metavar="NOTEBOOKS",
                    help="notebooks (separated by spaces) whose kernels start with --other-arithmetic-env")
    group.addoption("--other-arithmetic-env", default="", metavar="NAME=VALUE ...",
                    help="variables (separated by spaces) added to those kernels' environment")
    group.addoption("--no-drawing", default="", metavar="PATHS",
                    help="folders or notebooks (separated by spaces) whose kernels draw no figures")


def parse_env(text):
    """``"A=1 B=x"`` as ``{"A": "1", "B": "x"}``; anything else is a usage error naming it."""
    env = {}
    for pair in text.split():
        name, equals, value = pair.partition("=")
        if not equals or not name or not value:
            raise pytest.UsageError(f"--other-arithmetic-env: {pair!r} is not NAME=VALUE")
        env[name] = value
    return env


def _paths(config, option, kind):
    paths = {(config.rootpath / name).resolve() for name in config.getoption(option, default="").split()}
    missing = sorted(str(path) for path in paths if not path.exists())
    if missing:
        raise pytest.UsageError(f"--{option.replace('_', '-')}: no such {kind}: {', '.join(missing)}")
    return paths


def pytest_configure(config):
    files = _paths(config, "other_arithmetic", "notebook")
    env = parse_env(config.getoption("other_arithmetic_env", default=""))
    if files and not env:
        raise pytest.UsageError("--other-arithmetic names notebooks but --other-arithmetic-env "
                                "gives no NAME=VALUE for their kernels")
    quiet = _paths(config, "no_drawing", "folder or notebook")
    profile = None
    if quiet:  # an IPython directory of this process's own, removed at the end
        profile = tempfile.mkdtemp(prefix="nbval-no-drawing-")
        (Path(profile) / "profile_default").mkdir()
        (Path(profile) / "profile_default" / "ipython_kernel_config.py").write_text(NO_DRAWING_CONFIG)
    config.stash[_KEY] = {"files": files, "env": env, "quiet": quiet, "profile": profile}


def pytest_unconfigure(config):
    settings = config.stash.get(_KEY, None)
    if settings and settings["profile"]:
        shutil.rmtree(settings["profile"], ignore_errors=True)


def _extra_env(item):
    """What ``item``'s notebook kernel adds to the environment ({} for none)."""
    settings = item.config.stash.get(_KEY, None)
    path = getattr(item.parent, "path", None)
    if not settings or path is None:
        return {}
    path = Path(path).resolve()
    extra = dict(settings["env"]) if path in settings["files"] else {}
    if any(path == quiet or quiet in path.parents for quiet in settings["quiet"]):
        extra["IPYTHONDIR"] = settings["profile"]
    return extra


def pytest_report_header(config):
    settings = config.stash.get(_KEY, None)
    lines = []
    if settings and settings["files"]:
        pairs = " ".join(f"{name}={value}" for name, value in settings["env"].items())
        lines.append(f"nbval: {len(settings['files'])} notebooks run on other arithmetic: {pairs}")
    if settings and settings["quiet"]:
        lines.append(f"nbval: no figures drawn in {' '.join(str(p) for p in sorted(settings['quiet']))}")
    return lines or None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Around an item's setup, which starts its notebook's kernel when it is the notebook's first."""
    global _kernel_env
    extra = _extra_env(item)
    _kernel_env = {**os.environ, **extra} if extra else None
    try:
        yield
    finally:
        _kernel_env = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    extra = _extra_env(item)
    if extra and report.failed:
        pairs = " ".join(f"{name}={value}" for name, value in extra.items())
        report.sections.append(("kernel environment", f"this notebook's kernel ran with {pairs}"))
