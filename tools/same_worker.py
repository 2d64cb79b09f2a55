"""A pytest-xdist plugin: chosen test files run one after another on one worker.

`make test`'s checks hand out whole files to two workers (``--dist loadscope``). Notebooks that
use the same trained model (chapter 9 decodes with chapter 8's) share one training through
attnlib.learn.memo's store: the first trains and stores, the others load. If two of them run
at once on the two workers, the second waits for the first's training on the store's lock,
and its core idles meanwhile (17 s of chapter 9 once here). Listed together, they run in turn
on one worker, in the order pytest collects them::

    -p tools.same_worker --same-worker="book/08_x.ipynb book/09_y.ipynb" --same-worker="..."

Each ``--same-worker`` names one group (paths relative to the rootdir, separated by spaces).
Without ``--dist loadscope`` the option changes nothing.
"""

from pathlib import Path

import pytest


def pytest_addoption(parser):
    parser.getgroup("xdist").addoption(
        "--same-worker", action="append", default=[], metavar="FILES",
        help="test files (separated by spaces) that run one after another on one worker, with "
             "--dist loadscope; repeat for more groups")


def groups(config):
    """``{file: group name}`` from the ``--same-worker`` options; a usage error names a missing file."""
    scopes = {}
    for text in config.getoption("same_worker"):
        names = text.split()
        for name in names:
            if not (config.rootpath / name).is_file():
                raise pytest.UsageError(f"--same-worker: no such file: {name}")
            if Path(name).as_posix() in scopes:
                raise pytest.UsageError(f"--same-worker: {name} is in two groups")
            scopes[Path(name).as_posix()] = "same-worker:" + " ".join(names)
    return scopes


def pytest_configure(config):
    groups(config)  # usage errors at once, on the controller and without xdist alike


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    scopes = groups(config)
    if not scopes or config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SameWorker(LoadScopeScheduling):
        """loadscope, with each group of files one scope (xdist hands out the largest scopes first)."""

        def _split_scope(self, nodeid):
            return scopes.get(nodeid.split("::", 1)[0], super()._split_scope(nodeid))

    return SameWorker(config, log)
