"""A pytest plugin for nbval: chosen notebooks run on another machine's arithmetic.

What a training chapter prints must not depend on the CPU's rounding, so `make test` runs those
chapters with their kernels' environment changed (every model's initial weights moved by a
relative 1e-9, torch's and MKL's kernels on their plain code paths; see the Makefile's
TRAINING_CHAPTERS) and nbval requires every stored output to come out the same. This plugin does
that inside the one pytest session that checks everything else, instead of in a second session
after it: the listed notebooks' kernels start with the extra variables, every other notebook's
kernel with the worker's own environment. The pytest worker itself is never changed (its torch and
MKL have read their variables already).

Options (loaded with ``-p tools.nbval_arithmetic``):

    --other-arithmetic="book/07_x.ipynb book/08_y.ipynb"   the notebooks, relative to the rootdir
    --other-arithmetic-env="NAME=VALUE NAME=VALUE"         what their kernels' environment adds

A failure in a listed notebook says, under its report, which variables the kernel had.
"""

import os
from pathlib import Path

import nbval.kernel
import pytest

_KEY = pytest.StashKey[tuple]()
_start_new_kernel = nbval.kernel.start_new_kernel
_kernel_env = None  # the environment of the kernel being started now; None: the worker's own


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


def parse_env(text):
    """``"A=1 B=x"`` as ``{"A": "1", "B": "x"}``; anything else is a usage error naming it."""
    env = {}
    for pair in text.split():
        name, equals, value = pair.partition("=")
        if not equals or not name or not value:
            raise pytest.UsageError(f"--other-arithmetic-env: {pair!r} is not NAME=VALUE")
        env[name] = value
    return env


def pytest_configure(config):
    names = config.getoption("other_arithmetic", default="").split()
    env = parse_env(config.getoption("other_arithmetic_env", default=""))
    if names and not env:
        raise pytest.UsageError("--other-arithmetic names notebooks but --other-arithmetic-env "
                                "gives no NAME=VALUE for their kernels")
    files = {(config.rootpath / name).resolve() for name in names}
    missing = sorted(str(path) for path in files if not path.is_file())
    if missing:
        raise pytest.UsageError(f"--other-arithmetic: no such notebook: {', '.join(missing)}")
    config.stash[_KEY] = (files, env)


def _listed(item):
    files, env = item.config.stash.get(_KEY, (set(), {}))
    path = getattr(item.parent, "path", None)
    return env if path is not None and Path(path).resolve() in files else None


def pytest_report_header(config):
    files, env = config.stash.get(_KEY, (set(), {}))
    if files:
        pairs = " ".join(f"{name}={value}" for name, value in env.items())
        return f"nbval: {len(files)} notebooks run on other arithmetic: {pairs}"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Around an item's setup, which starts its notebook's kernel when it is the notebook's first."""
    global _kernel_env
    env = _listed(item)
    _kernel_env = {**os.environ, **env} if env else None
    try:
        yield
    finally:
        _kernel_env = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    env = _listed(item)
    if env and report.failed:
        pairs = " ".join(f"{name}={value}" for name, value in env.items())
        report.sections.append(("other arithmetic", f"this notebook's kernel ran with {pairs}"))
