"""What the stored GPU files can and cannot be trusted for: the tile lists each ran with
(attnlib/data/gpu/tile_lists.json, read by attnlib.bench.gpu_results), the check errors the bench's
tolerance rule rests on, and the clock arithmetic behind the datasheet peak (attnlib.bench.devices)."""

import collections
import json
import os
import re
import subprocess
import sys

import pytest

from attnlib.bench import devices, gpu_figures, gpu_results, kernels, report

DATA = json.loads(gpu_results.TILE_LISTS.read_text())
REPORT_FILES = [("", name) for name in ("fwd_d64", "fwd_d128", "fwdbwd_d64", "fwdbwd_d128", "bf16", "fp32",
                                        "dobench_t4096")] + [("h200", "fwdbwd_d128")]


def load(folder, name):
    path = gpu_results.GPU_DIR / folder
    return path, *gpu_results.load(name, folder=path)


def test_every_stored_gpu_file_names_the_tile_lists_it_ran_with():
    stored = {p.relative_to(gpu_results.GPU_DIR).as_posix() for p in gpu_results.GPU_DIR.rglob("*")
              if p.is_file() and p.name not in ("tile_lists.json", "README.md")}
    assert stored == set(DATA["files"])
    assert {key for key in DATA["files"].values() if key} <= set(DATA["lists"])
    assert set(DATA["fixed_tiles"]) == {name for name, key in DATA["files"].items()
                                        if key is None and not name.endswith("versions.txt")}
    with pytest.raises(KeyError, match="says nothing of 'fwd_d96.csv'"):
        gpu_results.tile_lists("fwd_d96.csv")


@pytest.mark.parametrize("folder, name", REPORT_FILES)
def test_every_triton_row_ran_a_tile_its_lists_offered(folder, name):
    path, _, rows = load(folder, name)
    lists = gpu_results.tile_lists(f"{name}.csv", path)
    assert gpu_results.retired_tiles(rows, lists) == []
    autotuned = [r for r in rows if r["kernel"] == "triton" and r["status"] == "ok" and r["T"] ** 2 >= 2**20]
    small = [r for r in rows if r["kernel"] == "triton" and r["status"] == "ok" and r["T"] ** 2 < 2**20]
    assert autotuned
    for r in small:  # below 2**20 scores the kernels ran their fixed tiles
        for part in r["tile"].split("; "):
            kernel, tile = part.split(" ", 1)
            assert lists["small_problem"][kernel] == tile


def _lists_at(commit):
    config = re.compile(r'triton\.Config\(\{"BLOCK_M": (\d+), "BLOCK_N": (\d+)\}, num_warps=(\d+), '
                        r'num_stages=(\d+)\), (\d+), "(\w+)"\)')
    lists = {}
    for kernel, path, name in (("fwd", "attnlib/backends/triton_flash.py", "FWD_TILES"),
                               ("dkdv", "attnlib/backends/triton_backward.py", "DKDV_TILES"),
                               ("dq", "attnlib/backends/triton_backward.py", "DQ_TILES")):
        source = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True,
                                cwd=gpu_results.GPU_DIR, check=True).stdout
        block = source[source.index(f"{name} = ["):]
        block = block[:block.index("\n]")]
        lists[kernel] = [[f"{m}x{n} w{w} s{s}", int(d), kind]
                         for m, n, w, s, d, kind in config.findall(block)]
    return lists


@pytest.mark.parametrize("key", sorted(DATA["lists"]))
def test_the_tile_lists_are_the_librarys_at_the_commit_they_name(key):
    entry = DATA["lists"][key]
    try:
        at_commit = _lists_at(entry["commit"])
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs the repository's git history")
    if key.endswith("dkdv-32x64-at-d128"):  # the experiment: one limit raised
        at_commit["dkdv"] = [[t, 128 if t == "32x64 w4 s3" else d, k] for t, d, k in at_commit["dkdv"]]
    assert {kernel: entry[kernel] for kernel in gpu_results.TRITON_KERNELS} == at_commit


@pytest.mark.parametrize("name", ["sm90_triton36_run1.txt", "sm90_triton36_run3_dkdv32x64_d128.txt"])
def test_each_sm90_check_compiled_the_tiles_its_lists_offer_at_d_64_and_128(name):
    listed = set()
    for line in (gpu_results.GPU_DIR / "h200" / name).read_text().splitlines():
        found = re.match(r"(fwd|dkdv|dq)\s+\S+\s+\d+\s+\S+\s+\S+\s+(\d+x\d+ w\d+ s\d+) "
                         r"\((\w+), d<=(\d+)\)", line)
        if found:
            kernel, tile, kind, max_d = found.groups()
            listed.add((kernel, tile, int(max_d), kind))
    lists = gpu_results.tile_lists(name, gpu_results.GPU_DIR / "h200")
    expected = {(kernel, tile, max_d, kind) for kernel in gpu_results.TRITON_KERNELS
                for tile, max_d, kind in lists[kernel] if max_d >= 64}  # the check compiles d = 64 and 128
    assert listed == expected


def row(tile, d=128, dtype="float16", T=4096, kernel="triton", tf32=False):
    return {"kernel": kernel, "status": "ok", "T": T, "d": d, "dtype": dtype, "tile": tile, "tf32": tf32}


def test_retired_tiles_follow_the_head_dim_the_dtype_and_the_fixed_tiles():
    lists = {"fwd": [["64x64 w4 s3", 128, "tc"], ["128x128 w8 s3", 64, "tc"], ["32x32 w4 s2", 64, "fp32"],
                     ["16x16 w4 s1", 128, "any"]],
             "dkdv": [["32x128 w8 s3", 128, "tc"]], "dq": [["64x32 w4 s3", 128, "tc"]]}
    assert gpu_results.offered_tiles(lists, "fwd", 64, "float16") == ["64x64 w4 s3", "128x128 w8 s3",
                                                                      "32x32 w4 s2", "16x16 w4 s1"]
    # d = 65 pads to 128
    assert gpu_results.offered_tiles(lists, "fwd", 65, "bfloat16") == ["64x64 w4 s3", "16x16 w4 s1"]
    assert gpu_results.offered_tiles(lists, "fwd", 64, "float32") == ["32x32 w4 s2", "16x16 w4 s1"]
    assert gpu_results.offered_tiles(lists, "fwd", 64, "float32", tf32=True)[0] == "64x64 w4 s3"
    assert gpu_results.offered_tiles(lists, "fwd", 64, "float64") == ["16x16 w4 s1"]
    rows = [row("fwd 64x64 w4 s3; dkdv 32x64 w4 s3; dq 64x32 w4 s3"),  # dK/dV tile not offered
            row("fwd 128x128 w8 s3"),  # over its head dim
            row("fwd 128x128 w8 s3", d=64),
            row("fwd 64x64 w4 s2", T=512),  # a small problem's fixed tile
            row("fwd 128x64 w4", kernel="triton-simple")]  # the teaching kernel's own tile
    assert [(r["tile"][:8], kernel, tile) for r, kernel, tile in gpu_results.retired_tiles(rows, lists)] == [
        ("fwd 64x6", "dkdv", "32x64 w4 s3"), ("fwd 128x", "fwd", "128x128 w8 s3")]


def test_current_tile_lists_offer_what_the_kernels_autotune_among():
    """Imported in a subprocess under the interpreter, as tests/test_triton.py needs the kernels."""
    script = (
        "import json\n"
        "from attnlib.backends import triton_backward as b, triton_flash as f\n"
        "from attnlib.bench import gpu_results as g\n"
        "now = g.current_tile_lists()\n"
        "lists = {'fwd': f.FWD_TILES, 'dkdv': b.DKDV_TILES, 'dq': b.DQ_TILES}\n"
        "out = []\n"
        "for d, dtype, cores, fp64 in ((64, 'float16', True, False), (128, 'bfloat16', True, False),\n"
        "                              (64, 'float32', False, False), (128, 'float64', False, True)):\n"
        "    for k, t in lists.items():\n"
        "        want = ['%dx%d w%d s%d' % (c.kwargs['BLOCK_M'], c.kwargs['BLOCK_N'],\n"
        "                                   c.num_warps, c.num_stages)\n"
        "                for c in f.usable_configs(t, d, tensor_cores=cores, fp64=fp64)]\n"
        "        out.append([want, g.offered_tiles(now, k, d, dtype)])\n"
        "print(json.dumps(out))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TRITON_INTERPRET": "1"}, check=True).stdout
    pairs = json.loads(result.strip().splitlines()[-1])
    assert pairs and all(want == got and want for want, got in pairs)


@pytest.mark.parametrize("folder, name", REPORT_FILES)
def test_on_the_gpu_every_kernels_check_error_was_near_the_naive_paths_at_the_same_shape(folder, name):
    """The bench's tolerance is CHECK_MARGIN times the error of a model of the naive path's roundings
    (attnlib.bench.kernels.check_tolerance). On the stored runs, in fp16 and bf16 every kernel's error
    was within 5% of the naive path's (or of SDPA's unfused math kernel where the naive path has no
    row); in fp32, where float32 sums dominate, within two thirds of CHECK_MARGIN times it."""
    _, _, rows = load(folder, name)
    shapes = collections.defaultdict(dict)
    for r in rows:
        if r["check_error"] is not None:
            shapes[(r["dtype"], r["direction"], r["d"], r["T"], r["causal"])][r["kernel"]] = r["check_error"]
    compared = 0
    for (dtype, *_), errors in shapes.items():
        naive = errors.get("torch", errors.get("sdpa-math"))
        if naive is not None:
            compared += 1
            bound = 1.05 if dtype in ("float16", "bfloat16") else kernels.CHECK_MARGIN / 1.5
            assert max(errors.values()) <= bound * naive, errors
    assert compared or name in ("bf16", "dobench_t4096")  # these files timed fused kernels only


def test_the_datasheet_peak_assumes_a_clock_below_the_maximum_the_gpu_reports():
    stamp, _ = gpu_results.load("fwd_d64")
    spec = devices.lookup(stamp["device_name"])
    assert gpu_figures.multiprocessors() == spec.sm_count == 132  # what torch reported on that GPU
    clock = devices.datasheet_clock_mhz(spec)
    end = gpu_figures.clocks(stamp, "end")
    assert round(clock) == 1830 < end["max_sm_mhz"] == 1980
    assert devices.peak_at_clock(spec, clock) == pytest.approx(spec.dense_fp16_tflops)
    assert devices.peak_at_clock(spec, end["sm_mhz"]) < spec.dense_fp16_tflops
    with pytest.raises(ValueError, match="no SM count"):
        devices.datasheet_clock_mhz(devices.lookup("NVIDIA H100 PCIe"))


def test_the_measured_peak_is_no_upper_bound_for_attention():
    """cuDNN's attention came within a few percent of the stored 8192^3 matrix product's rate."""
    best = max((r for name in ("fwd_d64", "fwd_d128") for r in gpu_results.load(name)[1]
                if r["status"] == "ok" and r["fraction_of_measured_peak"]),
               key=lambda r: r["fraction_of_measured_peak"])
    assert best["kernel"] == "sdpa-cudnn" and best["fraction_of_measured_peak"] > 0.95
    assert report.ROW_COLUMNS["measured_peak_tflop_per_s"] is float


def test_the_clock_arithmetic_examples_in_the_docstrings_hold():
    import doctest

    assert doctest.testmod(devices).attempted >= 2 and doctest.testmod(devices).failed == 0


def test_a_table_without_the_measured_column_keeps_every_other_column():
    stamp, rows = gpu_results.load("fwdbwd_d64")
    full = gpu_figures.format_table(stamp, rows, T=4096, d=64, kernels=["sdpa-flash", "triton"])
    short = gpu_figures.format_table(stamp, rows, T=4096, d=64, kernels=["sdpa-flash", "triton"],
                                     measured=False)
    assert "of measured" in full and "of measured" not in short
    assert "of datasheet" in short and "memory" in short
    for line_full, line_short in zip(full.splitlines()[3:5], short.splitlines()[3:5]):
        assert len(line_short) == len(line_full) - 13  # one 13-character column fewer
        assert line_short.split()[:5] == line_full.split()[:5]
