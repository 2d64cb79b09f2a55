"""tools/nbval_retry.py: a kernel that dies while starting is started again; nothing else is retried."""

import inspect
import re

import nbval.kernel
import pytest

from conftest import make_nbval_commands
from tools import nbval_retry


def _fake(outcomes, calls):
    def start(*args, **kwargs):
        calls.append(kwargs)
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome
    return start


def test_nbval_starts_its_kernels_through_the_retry():
    start = nbval.kernel.start_new_kernel  # the retry, or another plugin's wrapper around it
    while start is not nbval_retry.start_new_kernel and hasattr(inspect.getmodule(start), "_start_new_kernel"):
        start = inspect.getmodule(start)._start_new_kernel
    assert start is nbval_retry.start_new_kernel


def test_a_kernel_that_died_starting_is_started_again(monkeypatch):
    calls = []
    died = RuntimeError(nbval_retry.DIED)
    monkeypatch.setattr(nbval_retry, "_start_new_kernel", _fake([died, died, "kernel"], calls))
    assert nbval_retry.start_new_kernel(kernel_name="python3", cwd="book") == "kernel"
    assert calls == [{"kernel_name": "python3", "cwd": "book"}] * 3


def test_a_third_death_and_any_other_error_are_raised(monkeypatch):
    calls = []
    monkeypatch.setattr(nbval_retry, "_start_new_kernel",
                        _fake([RuntimeError(nbval_retry.DIED)] * 3, calls))
    with pytest.raises(RuntimeError, match="died before replying"):
        nbval_retry.start_new_kernel()
    assert len(calls) == nbval_retry.ATTEMPTS
    calls.clear()
    monkeypatch.setattr(nbval_retry, "_start_new_kernel",
                        _fake([RuntimeError("Kernel didn't respond in 60 seconds"), "kernel"], calls))
    with pytest.raises(RuntimeError, match="didn't respond"):
        nbval_retry.start_new_kernel()
    assert len(calls) == 1


@pytest.mark.parametrize("target", ["test", "nbval", "nbval-training", "nbval-perturbed", "nbval-default-isa"])
def test_every_nbval_run_of_the_makefile_loads_the_retry(target):
    runs = make_nbval_commands(target)
    assert runs and all(re.search(r"-p tools\.nbval_retry\b", run) for run in runs), runs
