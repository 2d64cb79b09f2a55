"""The GPU measurements stored with attnlib (``attnlib/data/gpu/``), read for the book.

The files were written by the benchmark (``tools/gpu_run.sh``, one step per file) on
an NVIDIA H100 and are never edited by hand. Chapters 12 and 13 read them here, so that
a page built on a machine without a GPU still plots and quotes real GPU numbers:

- ``fwd_d64``, ``fwd_d128``: fp16 forward passes, B=4, H=32, T=512 ... 16384, with and
  without a causal mask, for every kernel of the bench;
- ``fwdbwd_d64``, ``fwdbwd_d128``: forward and backward together, from T=1024;
- ``bf16``, ``fp32``, ``dobench_t4096``: other dtypes, and a cross-check of the timer.

The H100 ``fwdbwd_d128`` rows mostly ran the dK/dV tile 32x64 (4 warps), which the
library has since stopped offering at d=128 (it spills there). ``h200/`` holds a later
re-check on an H200 (``load(name, folder=GPU_DIR / "h200")``; its README lists the
files): the GPU tests, the sm_90 check under Triton 3.6, the same fwd+bwd sweep with
the tiles offered now, and a dK/dV tile A/B.

The stamps of these files record no git commit. ``tile_lists.json`` says, for every
stored file, which Triton tile lists it ran with (the library's at the commit named):
:func:`tile_lists` reads them, :func:`current_tile_lists` gives the library's lists now,
and :func:`retired_tiles` finds the rows that ran a tile no longer offered.

Every row is a row of :mod:`attnlib.bench.report` (``time_ms`` is the median of the
timed calls). The helpers below pick rows, turn two rows into a speed ratio, count
the tiles a causal pass skips, and read the stamp and the Nsight Compute report.
"""

import json
import math
import re
from importlib.resources import files
from pathlib import Path

from . import report

GPU_DIR = Path(files("attnlib") / "data" / "gpu")
TILE_LISTS = GPU_DIR / "tile_lists.json"
TRITON_KERNELS = ("fwd", "dkdv", "dq")  # the library's Triton kernels, as the tile column names them


def load(name, folder=GPU_DIR):
    """``(stamp, rows)`` of the stored GPU file ``name``, e.g. ``"fwd_d64"`` (``.csv`` added)."""
    path = Path(folder) / (name if name.endswith(".csv") else f"{name}.csv")
    if not path.exists():
        known = sorted(p.stem for p in Path(folder).glob("*.csv"))
        raise FileNotFoundError(f"no GPU result file {path.name!r} in {folder}; the stored ones are {known}")
    return report.read_results(path)


def find(rows, kernel, T, *, causal=False, **fields):
    """The one row of ``kernel`` at sequence length ``T`` (and ``causal``, and any other
    column given as a keyword, e.g. ``d=64``). Raises ``KeyError`` naming what was asked
    when no row, or more than one, matches."""
    wanted = {"kernel": kernel, "T": T, "causal": causal, **fields}
    found = [r for r in rows if all(r[name] == value for name, value in wanted.items())]
    if len(found) != 1:
        raise KeyError(f"{len(found)} rows match {wanted}; pass more columns (d=, dtype=, direction=)")
    return found[0]


def speed_ratio(rows, kernel, reference, T, *, causal=False, **fields):
    """How many times as fast ``kernel`` ran as ``reference``: the reference's median time
    over the kernel's, at the same T (above 1: ``kernel`` is faster)."""
    ours = find(rows, kernel, T, causal=causal, **fields)
    theirs = find(rows, reference, T, causal=causal, **fields)
    for row in (ours, theirs):
        if row["status"] != "ok":
            raise ValueError(f"{row['kernel']} at T={T} did not run ({row['status']}: {row['message']})")
    return theirs["time_ms"] / ours["time_ms"]


def tile_shape(row, kernel="fwd"):
    """``(BLOCK_M, BLOCK_N)`` that the Triton kernel ``kernel`` ("fwd", "dkdv" or "dq")
    ran with in ``row``, read from its ``tile`` column ("fwd 64x64 w4 s3; dkdv 32x64 w4 s3")."""
    match = re.search(rf"\b{kernel} (\d+)x(\d+)", row.get("tile") or "")
    if match is None:
        raise ValueError(f"row of {row['kernel']} at T={row['T']} records no {kernel!r} tile "
                         f"(tile={row.get('tile')!r})")
    return int(match.group(1)), int(match.group(2))


def causal_tiles(T, block_m, block_n):
    """``(visited, total)``: the (query tile, key tile) pairs a causal pass over ``T``
    tokens loads, and the pairs a pass without a mask loads.

    Query tile ``i`` holds queries ``i * block_m`` to ``(i + 1) * block_m - 1``; its last
    query sees keys up to its own index, so it loads the key tiles up to that one and
    skips the rest. ``total / visited`` is the speed-up the tile count predicts.
    """
    n_query_tiles, n_key_tiles = math.ceil(T / block_m), math.ceil(T / block_n)
    visited = sum(math.ceil(min(T, (i + 1) * block_m) / block_n) for i in range(n_query_tiles))
    return visited, n_query_tiles * n_key_tiles


def causal_speedups(rows, kernel, **fields):
    """For each T where ``kernel`` ran with and without a causal mask: the time without
    over the time with (measured), next to what the causal run's tile count predicts.

    Returns a list of dicts with ``T``, ``tile`` (BLOCK_M, BLOCK_N of the causal run),
    ``full_tile`` (those of the run without a mask: the autotuner may pick another, and then
    the measured ratio compares two tile shapes as well as the masking), ``visited``,
    ``total``, ``predicted`` and ``measured``, by increasing T.
    """
    table = []
    for T in sorted({r["T"] for r in rows if r["kernel"] == kernel}):
        full = find(rows, kernel, T, causal=False, **fields)
        causal = find(rows, kernel, T, causal=True, **fields)
        if full["status"] != "ok" or causal["status"] != "ok":
            continue
        tile = tile_shape(causal)
        visited, total = causal_tiles(T, *tile)
        table.append({"T": T, "tile": tile, "full_tile": tile_shape(full), "visited": visited, "total": total,
                      "predicted": total / visited, "measured": full["time_ms"] / causal["time_ms"]})
    return table


def cudnn_version_text(version):
    """cuDNN's version number as torch reports it, written out: ``"91900"`` is ``"9.19.0"``
    (cuDNN 9 counts major * 10000 + minor * 100 + patch), ``"8902"`` is ``"8.9.2"``
    (cuDNN 8 and before: major * 1000 + minor * 100 + patch)."""
    number = int(version)
    major_unit = 10_000 if number >= 10_000 else 1_000
    return f"{number // major_unit}.{number % major_unit // 100}.{number % 100}"


def stamp_line(stamp):
    """Where and with what a file was measured, from its stamp: the device, the library
    versions and the date, e.g. ``"NVIDIA H100 80GB HBM3; torch 2.11.0+cu130, Triton 3.6.0,
    cuDNN 9.19.0, CUDA 13.0, driver 580.159.04; 2026-11-25"``."""
    parts = [f"torch {stamp['torch_version']}"]
    if stamp.get("triton_version"):
        parts.append(f"Triton {stamp['triton_version']}")
    if stamp.get("cudnn_version"):
        parts.append(f"cuDNN {cudnn_version_text(stamp['cudnn_version'])}")
    if stamp.get("cuda_version"):
        parts.append(f"CUDA {stamp['cuda_version']}")
    if stamp.get("driver_version"):
        parts.append(f"driver {stamp['driver_version']}")
    return f"{stamp['device_name']}; {', '.join(parts)}; {stamp['date_utc'][:10]}"


def gpu_state(stamp, when="end"):
    """The GPU's state recorded in the stamp at the ``"start"`` or ``"end"`` of the run, as
    ``{name: text}``, e.g. ``{"clocks.sm": "1650 MHz", "power.draw": "540.91 W", ...}``."""
    text = stamp.get(f"gpu_state_{when}") or ""
    return dict(part.strip().split("=", 1) for part in text.split(";") if "=" in part)


def ncu_metrics(path=GPU_DIR / "ncu_fwd_d64.txt"):
    """``{metric name: (unit, value)}`` from the sections of an Nsight Compute text report.

    A value with digits only (commas and a decimal point allowed) becomes a float;
    anything else stays text. Lines that are not ``name  [unit]  value`` rows are skipped.
    """
    row = re.compile(r"^\s{4}(\S.*?)\s{2,}(?:(\S+)\s{2,})?([\d,]+(?:\.\d+)?|\S+)\s*$")
    metrics = {}
    for line in Path(path).read_text().splitlines():
        match = row.match(line)
        if match is None or line.strip().startswith(("Section:", "Metric Name", "-", "OPT", "WRN")):
            continue
        name, unit, value = match.groups()
        if re.fullmatch(r"[\d,]+(\.\d+)?", value):
            value = float(value.replace(",", ""))
        metrics[name.strip()] = (unit or "", value)
    return metrics


def tile_lists(name, folder=GPU_DIR):
    """The Triton tile lists the stored file ``name`` (e.g. ``"fwdbwd_d128.csv"``) ran with.

    A dict with ``"commit"`` (the library's commit whose lists they are), ``"note"``,
    ``"small_problem"`` (the fixed tile of each kernel below 2**20 scores) and, for each of
    "fwd", "dkdv" and "dq", a list of ``[tile, largest padded head dim, kind]``
    (see ``tile_lists.json``). None for a file in which no Triton kernel autotuned.
    Raises ``KeyError`` for a file ``tile_lists.json`` does not list.
    """
    data = json.loads(TILE_LISTS.read_text())
    relative = (Path(folder) / name).relative_to(GPU_DIR).as_posix()
    if relative not in data["files"]:
        raise KeyError(f"tile_lists.json says nothing of {relative!r}; it lists {sorted(data['files'])}")
    key = data["files"][relative]
    return None if key is None else data["lists"][key]


def current_tile_lists():
    """The library's tile lists now, in the form of :func:`tile_lists` (imports the Triton kernels)."""
    from ..backends import triton_backward, triton_flash

    def listed(tiles):
        return [[f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']} w{c.num_warps} s{c.num_stages}", max_d, kind]
                for c, max_d, kind in tiles]

    def fixed(tile):
        return f"{tile['BLOCK_M']}x{tile['BLOCK_N']} w{tile['num_warps']} s{tile['num_stages']}"

    return {"commit": None, "note": "the library as installed",
            "small_problem": {"fwd": fixed(triton_flash.SMALL_PROBLEM_TILE),
                              **{name: fixed(tile)
                                 for name, tile in triton_backward.SMALL_PROBLEM_TILES.items()}},
            "fwd": listed(triton_flash.FWD_TILES), "dkdv": listed(triton_backward.DKDV_TILES),
            "dq": listed(triton_backward.DQ_TILES)}


def offered_tiles(lists, kernel, d, dtype, tf32=False):
    """The tiles (``"64x64 w4 s3"``) that ``lists`` let the autotuner pick for ``kernel`` ("fwd",
    "dkdv" or "dq") at head dim ``d`` in ``dtype``, as ``triton_flash.usable_configs`` picks them:
    a padded head dim (the next power of two, at least 16) within the tile's limit, and a kind
    offered to the dtype ("tc": tensor-core products, fp16, bf16 and fp32 under TF32; "fp32":
    those and exact fp32; "any": every dtype)."""
    padded = max(16, 1 << (d - 1).bit_length())
    tensor_cores = dtype in ("float16", "bfloat16") or (dtype == "float32" and tf32)
    kinds = {"any"} | ({"tc", "fp32"} if tensor_cores else {"fp32"} if dtype == "float32" else set())
    return [tile for tile, max_d, kind in lists[kernel] if padded <= max_d and kind in kinds]


def _autotuned(row):
    """Whether the library's Triton kernels autotuned in ``row``: neither the teaching kernel nor a
    small problem, which run fixed tiles."""
    return row["kernel"] == "triton" and row["status"] == "ok" and row["T"] * row["T"] >= 2**20


def retired_tiles(rows, lists):
    """The library's Triton rows that ran a tile ``lists`` do not offer at their head dim and dtype.

    ``lists``: e.g. :func:`current_tile_lists`. Returns ``[(row, kernel, tile)]``, one entry per
    kernel ("fwd", "dkdv", "dq") of a row whose tile is not offered. Rows of the teaching kernel
    and of small problems (fixed tiles) are left out.
    """
    retired = []
    for row in filter(_autotuned, rows):
        for part in (row.get("tile") or "").split("; "):
            kernel, _, tile = part.partition(" ")
            if kernel in TRITON_KERNELS and tile not in offered_tiles(lists, kernel, row["d"], row["dtype"],
                                                                         row.get("tf32") or False):
                retired.append((row, kernel, tile))
    return retired
