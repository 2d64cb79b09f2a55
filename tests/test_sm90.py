"""Every Triton kernel configuration that must be clean compiles for the H100 (sm_90) with no GPU.

``python -m attnlib.bench.sm90 --required`` compiles, ahead of time, each autotune
configuration that autotuning may pick for fp16 and bf16 (and every "any" tile, which exact
fp32 and fp64 get) with the ``ptxas`` that the triton wheel bundles, and fails on a failed
compile, a register spill or more shared memory than the H100 has. It runs in a subprocess
with ``TRITON_INTERPRET`` unset: under the interpreter there is nothing to compile, and
tests/test_triton.py sets that variable in this process. Compiled kernels land in Triton's
cache, so a second run takes seconds.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from attnlib.bench import sm90  # noqa: E402  (imports no kernel until asked)

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(r"^(\d+) configurations compiled for sm_90: (\d+) spill, (\d+) over shared memory, "
                     r"(\d+) failed$", re.MULTILINE)


def _run_sm90(*args):
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "attnlib.bench.sm90", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)


def test_every_required_configuration_compiles_for_sm90_without_spill_or_shared_memory_overflow():
    run = _run_sm90("--required")
    assert "attnlib.bench.sm90:" not in run.stderr, run.stderr  # the environment check passed
    match = SUMMARY.search(run.stdout)
    assert match, f"no summary line in:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    compiled, spill, over, failed = map(int, match.groups())
    rows = [line for line in run.stdout.splitlines() if line.startswith(("fwd ", "dkdv ", "dq "))]
    assert compiled == len(rows) > 0
    assert {line.split()[0] for line in rows} == {"fwd", "dkdv", "dq"}  # all three kernels
    assert {line.split()[1] for line in rows} >= {"fp16", "bf16"}
    bad = [line for line in rows if "FAIL" in line]
    assert (failed, spill, over) == (0, 0, 0), "\n".join(bad)
    assert run.returncode == 0, run.stdout[-3000:]


def _result(**fields):
    case = sm90.Case(fields.pop("kernel", "fwd"), 0, fields.pop("dtype", "fp16"), 64,
                     fields.pop("causal", False), fields.pop("mask_kind", sm90.NO_MASK))
    return sm90.Result(case, "128x64 w4 s3 (tc, d<=64)", fields.pop("pickable", True),
                       fields.pop("kind", "tc"), **fields)


def test_the_summary_counts_spills_overflows_and_failures():
    results = [_result(registers=128), _result(registers=255, spill_bytes=64),
               _result(shared_bytes=sm90.H100_SHARED_MEMORY + 1), _result(error="CompilationError: x"),
               _result(shared_bytes=sm90.H100_SHARED_MEMORY)]  # exactly the limit fits
    assert sm90.summary(results) == ("5 configurations compiled for sm_90: 1 spill, "
                                     "1 over shared memory, 1 failed")


def test_only_pickable_half_precision_or_any_tiles_without_a_mask_must_be_clean():
    spill = dict(spill_bytes=8)
    assert _result(**spill).fails  # fp16, autotuning may pick it
    assert _result(dtype="bf16", **spill).fails
    assert not _result(pickable=False, **spill).fails  # not offered: reported only
    assert not _result(dtype="fp32-tf32", **spill).fails  # a TF32 tensor-core tile: reported
    assert _result(dtype="fp64", kind="any", **spill).fails  # what exact fp32/fp64 get
    assert _result(dtype="fp32-ieee", kind="fp32", **spill).fails
    assert not _result(mask_kind=sm90.BOOL_MASK, **spill).fails
    assert _result(pickable=False, error="CompilationError: x").fails  # a failed compile always fails


def test_a_row_says_why_it_fails():
    assert "FAIL: spills where autotuning may pick it" in sm90.format_row(_result(spill_bytes=8))
    assert sm90.format_row(_result(registers=96)).endswith("ok")
    assert "FAILED CompilationError" in sm90.format_row(_result(error="CompilationError: bad"))

