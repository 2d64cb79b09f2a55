"""tools/same_worker.py: the files of a --same-worker group run one after another on one xdist worker."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = """
import os, time
from pathlib import Path

def test_{name}_{i}():
    time.sleep(0.2)
    with open(Path(__file__).parent / "runs.txt", "a") as f:
        f.write("{name} " + os.environ.get("PYTEST_XDIST_WORKER", "none") + "\\n")
"""


def _pytest(tmp_path, *options):
    for name in "abcd":
        (tmp_path / f"test_{name}.py").write_text("".join(RECORD.format(name=name, i=i) for i in range(3)))
    env = {name: value for name, value in os.environ.items() if name not in ("PYTEST_ADDOPTS",)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tools.same_worker",
         "--rootdir", str(tmp_path), "-c", "/dev/null", *options],
        cwd=tmp_path, capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)}, timeout=300)


def test_a_group_runs_in_turn_on_one_worker(tmp_path):
    run = _pytest(tmp_path, "-n", "2", "--dist", "loadscope", "--same-worker=test_a.py test_b.py")
    assert run.returncode == 0, run.stdout + run.stderr
    runs = [line.split() for line in (tmp_path / "runs.txt").read_text().splitlines()]
    assert len(runs) == 12
    workers = {name: {worker for n, worker in runs if n == name} for name in "abcd"}
    assert len(workers["a"]) == 1 and workers["a"] == workers["b"]  # the group: one worker
    assert workers["a"] <= {"gw0", "gw1"}
    group = [name for name, worker in runs if worker in workers["a"] and name in "ab"]
    assert group == ["a"] * 3 + ["b"] * 3  # in turn, in the order pytest collects them


def test_a_missing_file_is_a_usage_error(tmp_path):
    run = _pytest(tmp_path, "--same-worker=test_a.py nothing_here.py", "--collect-only")
    assert run.returncode == 4 and "--same-worker: no such file: nothing_here.py" in run.stderr
