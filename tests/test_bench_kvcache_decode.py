"""The decode preset of attnlib.bench.kvcache_decode: its dry run on the CPU writes every row, checked,
and without a GPU the real preset refuses with a message."""

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
# triton is not imported here: importing it before a test module that sets TRITON_INTERPRET=1 (collected
# later in the same process) would define that module's kernels for a GPU (tests/test_triton.py)
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from attnlib.bench import kvcache_decode  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _run(*args):
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "attnlib.bench.kvcache_decode", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_dry_run_writes_every_variant_of_every_shape_checked_against_sdpa(tmp_path):
    output = tmp_path / "decode.csv"
    run = _run("--dry-run", "--output", str(output))
    assert run.returncode == 0, run.stderr[-3000:]
    with open(output) as f:
        rows = list(csv.DictReader(f))
    preset = kvcache_decode.PRESETS["dry-run"]
    assert len(rows) == len(preset["batches"]) * len(preset["contexts"]) * len(kvcache_decode.VARIANTS)
    assert {row["variant"] for row in rows} == set(kvcache_decode.VARIANTS)
    for row in rows:
        assert row["status"] == "ok" and float(row["max_abs_error"]) < 1e-5, row
        assert int(row["cache_bytes"]) == 2 * int(row["batch"]) * int(row["context"]) * 2 * 16 * 4
        gbps = int(row["cache_bytes"]) / float(row["time_ms"]) / 1e6
        assert float(row["gbps"]) == pytest.approx(gbps, rel=1e-9)
        assert len(row["times_ms"].split()) == int(row["repeats"])
    stamp = json.loads((tmp_path / "decode.csv.stamp.json").read_text())
    assert stamp["copy_gbps"] > 0 and stamp["git_commit"]
    # what chapter 15 reads and plots, from files named as tools/gpu_run.sh's decode step names them
    assert kvcache_decode.stored(tmp_path) is None
    output.rename(tmp_path / "decode_fp16.csv")
    (tmp_path / "decode.csv.stamp.json").rename(tmp_path / "decode_fp16.csv.stamp.json")
    stored = kvcache_decode.stored(tmp_path)
    assert len(stored) == len(rows) and all(r["stamp"]["copy_gbps"] == stamp["copy_gbps"] for r in stored)
    assert all(isinstance(r["fraction_of_copy"], float) for r in stored)
    import matplotlib

    matplotlib.use("Agg")
    fig = kvcache_decode.plot_stored(stored)
    assert len(fig.axes) == len(preset["batches"])
    assert all(len(ax.get_lines()) == len(kvcache_decode.VARIANTS) + 1 for ax in fig.axes)  # + the 1.0 line
    with pytest.raises(ValueError, match="status 'ok'"):
        kvcache_decode.plot_stored([dict(r, status="oom") for r in stored])


def test_the_chapter_reads_no_gpu_rows_until_a_run_is_stored():
    """The stored files are the decode step's names; none exist until a GPU run stores them."""
    data = ROOT / "attnlib" / "data" / "gpu"
    present = [name for name in kvcache_decode.STORED if (data / name).exists()]
    assert (kvcache_decode.stored() is None) == (not present)


def test_the_gpu_preset_covers_the_issues_sweep():
    preset = kvcache_decode.PRESETS["decode"]
    assert preset["batches"] == (1, 8, 64)
    assert min(preset["contexts"]) == 1024 and max(preset["contexts"]) == 131072
    shape = (preset["n_heads"], preset["n_kv_heads"], preset["head_dim"], preset["dtypes"])
    assert shape == (32, 8, 128, ("fp16", "bf16"))
    assert all(context % preset["page_size"] == 0 for context in preset["contexts"])


def test_without_a_gpu_the_preset_refuses_with_a_message(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    run = _run("--output", str(tmp_path / "x.csv"))
    assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr and "--dry-run" in run.stderr
