"""Where, when and with what a stored result was made: the stamp every data file carries.

The benchmarks (:mod:`attnlib.bench.report`) and the seed sweeps
(:mod:`attnlib.learn.sweep`) stamp their files with these fields, so a number in
the book can be traced to the commit and the machine that produced it.
"""

import datetime
import os
import platform
import subprocess
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


def _git(*args):
    """The output of ``git ARGS`` run in the repository, stripped."""
    done = subprocess.run(["git", *args], cwd=REPOSITORY, capture_output=True, text=True, timeout=10, check=True)
    return done.stdout.strip()


def git_commit():
    """The repository's commit, ``"<sha>"``, or ``"<sha>-dirty"`` with uncommitted changes to tracked files.

    None where the code does not run from a git checkout (an installed wheel) or git is missing.
    """
    try:
        sha = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty else sha


def load_average():
    """``"0.52 0.71 0.40"``: the 1, 5 and 15 minute load averages, or None where unknown."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


def cpu_name():
    """The CPU's model name from /proc/cpuinfo, with the number of CPUs; ``platform.processor()`` elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    except OSError:  # pragma: no cover - not Linux
        pass
    return platform.processor() or None


def stamp(command):
    """The provenance fields of a CPU run: date, commit, versions, machine, load, and the ``command``."""
    import numpy

    from . import __version__

    try:
        import torch

        torch_version, threads = torch.__version__, torch.get_num_threads()
    except ImportError:  # pragma: no cover - torch is a requirement
        torch_version, threads = None, None
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "git_commit": git_commit(),
        "python_version": platform.python_version(),
        "numpy_version": numpy.__version__,
        "torch_version": torch_version,
        "attnlib_version": __version__,
        "torch_num_threads": threads,
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "load_average": load_average(),
        "command": command,
    }
