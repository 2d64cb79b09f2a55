"""tools/nbval_retry.py: a kernel that dies while starting is started again; nothing else is retried."""

import re
import shutil
import subprocess
from pathlib import Path

import nbval.kernel
import pytest

from tools import nbval_retry

ROOT = Path(__file__).resolve().parent.parent


def _fake(outcomes, calls):
    def start(*args, **kwargs):
        calls.append(kwargs)
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome
    return start


def test_nbval_starts_its_kernels_through_the_retry():
    assert nbval.kernel.start_new_kernel is nbval_retry.start_new_kernel


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


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("target", ["test", "nbval", "nbval-perturbed", "nbval-default-isa"])
def test_every_nbval_run_of_the_makefile_loads_the_retry(target):
    printed = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    runs = [line for line in printed.splitlines() if "--nbval" in line]
    assert runs and all(re.search(r"-p tools\.nbval_retry\b", run) for run in runs), runs
