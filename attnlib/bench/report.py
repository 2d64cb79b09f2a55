"""Result files: the schema of a row, the stamp, CSV and JSON, and tables to read.

A JSON file is ``{"stamp": {...}, "rows": [{...}, ...]}``. A CSV file has one
line per row, with the stamp's fields repeated on every line, so that a single
line copied out of it still says where and when it was measured.

The stamp records what a reader needs to trust or reproduce a number: the
device, the library versions, the git commit of the code that ran (files written
before it was recorded have none), the TF32 setting, the dtypes, the date (UTC)
and the command line.
"""

import csv
import datetime
import json
import os
import platform
import sys
from pathlib import Path

from ..provenance import git_commit
from . import devices

# Every row has exactly these fields; a value is None (empty in a CSV) when it
# does not apply: no timing for a row that did not run, no fraction of peak
# for a device without a known peak.
ROW_COLUMNS = {
    "kernel": str,  # e.g. "torch", "sdpa-flash"
    "backend": str,  # the attnlib backend behind it, e.g. "sdpa"
    "device": str,  # "cpu" or "cuda"
    "device_name": str,
    "dtype": str,
    "tf32": bool,  # torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32, both set to this
    "B": int,
    "H": int,
    "T": int,
    "d": int,
    "causal": bool,
    "direction": str,  # "fwd", "bwd" or "fwd+bwd"
    "status": str,  # "ok", "unsupported", "out of memory" or "error"
    "message": str,  # why, when status is not "ok"; None otherwise
    "time_ms": float,  # median of the timed calls
    "time_q25_ms": float,
    "time_q75_ms": float,
    "time_min_ms": float,
    "time_first_ms": float,  # the very first call, one-off costs included
    "repeats": int,
    "warmup": int,
    "timer": str,  # "perf_counter", "cuda-events" or "do_bench"
    "flops": int,  # counted as 4 * B * H * T**2 * d, halved when causal; 2.5x that for bwd, 3.5x for fwd+bwd
    "products": int,  # (T, T, d) products the kernel really does (flops.products_done); None if unknown
    "tflop_per_s": float,  # flops / median time, in 10**12 per second
    "peak_tflop_per_s": float,  # the device's dense fp16/bf16 peak, when known
    "fraction_of_peak": float,  # tflop_per_s / peak_tflop_per_s
    "peak_extra_bytes": int,  # peak memory of one call above the start (see attnlib.bench.memory)
    "memory_method": str,  # which instrument measured peak_extra_bytes
    "times_ms": str,  # every timed call, in order, space-separated (empty for do_bench)
    "flag": str,  # why this row's time is not to be trusted (see flag_rows); None when it looks sound
    "check_error": float,  # largest |kernel - reference| / max(1, max |reference|) on a slice, before timing
    "check_tolerance": float,  # the largest check_error allowed on that slice (kernels.check_tolerance)
    "tile": str,  # for Triton rows: the tile each kernel ran with (the autotuner's choice on a GPU)
    "measured_peak_tflop_per_s": float,  # a large matmul in this dtype, measured in the same run
    "fraction_of_measured_peak": float,  # tflop_per_s / measured_peak_tflop_per_s
}

# Columns added after files were first committed: a file without them reads as None.
OPTIONAL_COLUMNS = ("times_ms", "flag", "load_average", "direction", "check_error", "tile", "products",
                    "measured_peak_tflop_per_s", "fraction_of_measured_peak", "driver_version",
                    "cudnn_version", "gpu_state_start", "gpu_state_end", "check_tolerance", "git_commit")

NOISY_IQR_OVER_MEDIAN = 0.2  # a row whose IQR is more than this fraction of its median is flagged

STAMP_COLUMNS = {
    "date_utc": str,  # ISO 8601, e.g. 2026-01-31T12:00:00+00:00
    "git_commit": str,  # the library's commit, "<sha>-dirty" with uncommitted changes (attnlib.provenance)
    "python_version": str,
    "numpy_version": str,
    "torch_version": str,
    "triton_version": str,  # None (empty in a CSV) when triton is not installed
    "attnlib_version": str,
    "cuda_version": str,  # torch.version.cuda; None for a CPU build
    "torch_num_threads": int,  # CPU threads torch used
    "platform": str,
    "command": str,
    "load_average": str,  # the 1, 5 and 15 minute load averages when the run started (os.getloadavg)
    "driver_version": str,  # the NVIDIA driver (nvidia-smi); None on a CPU
    "cudnn_version": str,  # torch.backends.cudnn.version(); None without cuDNN
    "gpu_state_start": str,  # SM and memory clocks, power, temperature, throttle reasons, at the start
    "gpu_state_end": str,  # the same at the end of the run (the last row written so far, while it runs)
}

# The stamp of a JSON file also holds these, which a CSV keeps per row.
JSON_STAMP_ONLY = ("device", "device_name", "tf32", "dtypes")


def _version(module_name):
    try:
        module = __import__(module_name)
    except ImportError:
        return None
    return getattr(module, "__version__", None)


def make_stamp(*, device, device_name, tf32, dtypes, command, threads=None):
    """The fields that say where, when and with what a file was measured.

    ``threads`` is the CPU thread limit of the run, if it set one.
    """
    import numpy
    import torch

    from .. import __version__ as attnlib_version

    return {
        "device": device,
        "device_name": device_name,
        "tf32": bool(tf32),
        "dtypes": list(dtypes),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "git_commit": git_commit(),
        "python_version": platform.python_version(),
        "numpy_version": numpy.__version__,
        "torch_version": torch.__version__,
        "triton_version": _version("triton"),
        "attnlib_version": attnlib_version,
        "cuda_version": torch.version.cuda,
        "torch_num_threads": torch.get_num_threads() if threads is None else int(threads),
        "platform": platform.platform(),
        "command": command,
        "load_average": load_average(),
        "driver_version": devices.driver_version() if device == "cuda" else None,
        "cudnn_version": _cudnn_version() if device == "cuda" else None,
        "gpu_state_start": devices.gpu_state() if device == "cuda" else None,
        "gpu_state_end": None,
    }


def _cudnn_version():
    import torch

    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return None if version is None else str(version)


def load_average():
    """``"0.52 0.71 0.40"``: the machine's 1, 5 and 15 minute load averages, or None where unknown.

    On a machine with few cores, a load near or above the core count means other
    processes were competing for them, and the times of that run will be noisy.
    """
    import os

    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


def write_json(path, stamp, rows):
    Path(path).write_text(json.dumps({"stamp": stamp, "rows": rows}, indent=1) + "\n")


def write_csv(path, stamp, rows):
    columns = [*ROW_COLUMNS, *STAMP_COLUMNS]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({**{name: stamp[name] for name in STAMP_COLUMNS}, **row})


def write_stamped_csv(path, columns, stamp, stamp_columns, rows):
    """Write ``rows`` as CSV over ``columns``, then ``stamp_columns`` with the stamp's values repeated
    on every line (empty where the stamp lacks one); atomically, like :func:`write_results`. The
    sparsity, decode and chapter 7 seed files are written this way."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*columns, *stamp_columns])
        writer.writeheader()
        for row in rows:
            writer.writerow({**{name: stamp.get(name, "") for name in stamp_columns}, **row})
    os.replace(partial, path)


def write_results(path, stamp, rows, fmt=None):
    """Write ``rows`` to ``path`` as "csv" or "json" (default: from the file's suffix).

    The file is written beside ``path`` and then renamed over it, so a run killed
    while writing leaves the previous complete file, never half of one.
    """
    fmt = fmt or ("json" if str(path).endswith(".json") else "csv")
    if fmt not in ("csv", "json"):
        raise ValueError(f"format must be 'csv' or 'json', got {fmt!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    (write_json if fmt == "json" else write_csv)(partial, stamp, rows)
    os.replace(partial, path)


class ResultWriter:
    """Writes a run's file again after every row, so that a run stopped halfway keeps what it measured.

    ``add(row)`` appends a row and rewrites the file (atomically, see
    :func:`write_results`); ``finish()`` records the GPU's state at the end in the
    stamp and writes the file a last time. With ``path`` None nothing is written.
    """

    def __init__(self, path, stamp, fmt=None):
        self.path, self.stamp, self.fmt, self.rows = path, stamp, fmt, []

    def add(self, row):
        self.rows.append(row)
        self._write()

    def finish(self, rows=None):
        if rows is not None:
            self.rows = list(rows)
        if self.stamp.get("device") == "cuda":
            self.stamp["gpu_state_end"] = devices.gpu_state()
        self._write()

    def _write(self):
        if self.path is not None and self.rows:
            write_results(self.path, self.stamp, self.rows, self.fmt)


def _parse(text, kind):
    if text == "":
        return None
    if kind is bool:
        if text not in ("True", "False"):
            raise ValueError(f"expected True or False, got {text!r}")
        return text == "True"
    return kind(text)


def read_results(path):
    """``(stamp, rows)`` from a file :func:`write_results` wrote, with typed values."""
    if str(path).endswith(".json"):
        data = json.loads(Path(path).read_text())
        return data["stamp"], data["rows"]
    with open(path, newline="") as f:
        records = list(csv.DictReader(f))
    if not records:
        raise ValueError(f"{path} holds no rows")
    columns = {**ROW_COLUMNS, **STAMP_COLUMNS}
    missing = sorted(set(columns) - set(records[0]) - set(OPTIONAL_COLUMNS))
    if missing:
        raise ValueError(f"{path} is missing the columns {missing}")
    typed = [{name: _parse(record.get(name, ""), kind) for name, kind in columns.items()} for record in records]
    first = typed[0]
    stamp = {name: first[name] for name in STAMP_COLUMNS}
    stamp.update(device=first["device"], device_name=first["device_name"], tf32=first["tf32"],
                 dtypes=list(dict.fromkeys(row["dtype"] for row in typed)))
    rows = [{name: row[name] for name in ROW_COLUMNS} for row in typed]
    return stamp, rows


def _group_key(row):
    return (row["B"], row["H"], row["d"], row["dtype"], row.get("direction"), row["causal"])


def split_groups(rows):
    """``{(B, H, d, dtype, direction, causal): rows}``: rows that differ only in kernel and T.

    ``direction`` is None in files written before the bench timed backward passes.
    """
    groups = {}
    for row in rows:
        groups.setdefault(_group_key(row), []).append(row)
    return groups


def ratio_table(rows, reference="sdpa-flash"):
    """``{kernel: {T: time / reference time}}`` for rows of one group (see :func:`split_groups`).

    A ratio of 3 means three times as long as ``reference`` at the same T.
    Rows that did not run, and T with no ``reference`` row, are left out.
    """
    if len(split_groups(rows)) > 1:
        raise ValueError("ratio_table needs rows that differ only in kernel and T; use split_groups first")
    reference_ms = {r["T"]: r["time_ms"] for r in rows if r["kernel"] == reference and r["status"] == "ok"}
    table = {}
    for row in rows:
        if row["status"] == "ok" and row["T"] in reference_ms:
            table.setdefault(row["kernel"], {})[row["T"]] = row["time_ms"] / reference_ms[row["T"]]
    return table


def loglog_slope(rows, kernel, column="time_ms", min_t=1):
    """The slope of ``log(column)`` against ``log(T)`` for one kernel's rows, fitted
    by least squares (``np.polyfit``) over the rows with ``T >= min_t`` that ran.

    A quantity that grows as ``T**p`` has slope ``p``: 2 for the time of any
    attention kernel at large T, 2 for the memory of one that stores the
    T x T matrix, 1 for one that does not.
    """
    import numpy as np

    points = [(r["T"], r[column]) for r in rows
              if r["kernel"] == kernel and r["status"] == "ok" and r["T"] >= min_t and r[column]]
    if len({T for T, _ in points}) < 2:
        raise ValueError(f"need {column} at two or more T >= {min_t} for {kernel!r}, got {points}")
    seq_lens, values = np.array(points, dtype=float).T
    return float(np.polyfit(np.log(seq_lens), np.log(values), 1)[0])


def repeat_times_ms(row):
    """The raw per-call times of a row, in ms, as a list (empty when the file has none)."""
    return [float(t) for t in (row.get("times_ms") or "").split()]


def flag_rows(rows, max_spread=NOISY_IQR_OVER_MEDIAN):
    """Set each row's ``flag`` to why its time is not to be trusted, or None.

    Two symptoms of a run disturbed by other work on the machine (on a CPU,
    scheduler time slices taken by other processes or by a library's spinning
    threads):

    - "noisy": the interquartile range of the repeats is more than
      ``max_spread`` of the median;
    - "not growing with T": a kernel took no longer at a larger T than at a
      smaller one, within the same sizes, dtype and causal setting, although its
      work grows as T**2.

    Returns the flagged rows.
    """
    for row in rows:
        reasons = []
        if row["status"] == "ok" and row["time_q25_ms"] is not None and row["time_ms"]:
            spread = (row["time_q75_ms"] - row["time_q25_ms"]) / row["time_ms"]
            if spread > max_spread:
                reasons.append(f"noisy: IQR is {spread:.0%} of the median")
        row["flag"] = "; ".join(reasons) or None
    for group in split_groups(rows).values():
        for kernel in dict.fromkeys(r["kernel"] for r in group):
            timed = sorted((r for r in group if r["kernel"] == kernel and r["status"] == "ok"),
                           key=lambda r: r["T"])
            for shorter, longer in zip(timed, timed[1:]):
                if longer["time_ms"] <= shorter["time_ms"]:
                    for r in (shorter, longer):
                        note = f"not growing with T: T={longer['T']} took no longer than T={shorter['T']}"
                        r["flag"] = note if r["flag"] is None else f"{r['flag']}; {note}"
    return [r for r in rows if r["flag"]]


def format_flags(rows):
    """A warning listing the flagged rows, or "" when none is flagged."""
    flagged = [r for r in rows if r.get("flag")]
    if not flagged:
        return ""
    lines = [f"WARNING: {len(flagged)} of {len(rows)} rows look disturbed by other work on this machine; "
             "re-run them on a quiet machine (fewer --threads, a longer --warmup-s, more repeats) "
             "before trusting their times:"]
    for r in flagged:
        lines.append(f"  {r['kernel']:<15} T={r['T']:<6} d={r['d']} {r['dtype']} causal={r['causal']}: {r['flag']}")
    return "\n".join(lines)


def _cell(value, fmt):
    return "" if value is None else format(value, fmt)


def format_rows(rows):
    """A plain-text table of the rows, for the terminal."""
    header = (f"{'kernel':<15} {'dtype':<9} {'causal':<6} {'B':>3} {'H':>3} {'T':>6} {'d':>4} "
              f"{'median ms':>10} {'IQR ms':>15} {'TFLOP/s':>8} {'% peak':>7} {'peak MiB':>9}  status")
    # a flagged row's status ends in " (flagged)"; format_flags says why
    lines = [header, "-" * len(header)]
    for r in rows:
        iqr = "" if r["time_q25_ms"] is None else f"{r['time_q25_ms']:.3g}-{r['time_q75_ms']:.3g}"
        mib = None if r["peak_extra_bytes"] is None else r["peak_extra_bytes"] / 2**20
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r['message'][:60]}"
        if r.get("flag"):
            status += " (flagged)"
        lines.append(
            f"{r['kernel']:<15} {r['dtype']:<9} {str(r['causal']):<6} {r['B']:>3} {r['H']:>3} {r['T']:>6} "
            f"{r['d']:>4} {_cell(r['time_ms'], '.4g'):>10} {iqr:>15} {_cell(r['tflop_per_s'], '.3g'):>8} "
            f"{_cell(r['fraction_of_peak'], '.1%'):>7} {_cell(mib, '.1f'):>9}  {status}"
        )
    return "\n".join(lines)


def format_ratio_table(rows, reference="sdpa-flash"):
    """The ratio table as text: one line per kernel, one column per T."""
    table = ratio_table(rows, reference)
    seq_lens = sorted({T for ratios in table.values() for T in ratios})
    lines = [f"time / {reference} time"]
    lines.append(f"{'kernel':<15}" + "".join(f"{'T=' + str(T):>10}" for T in seq_lens))
    for kernel, ratios in table.items():
        lines.append(f"{kernel:<15}" + "".join(f"{_cell(ratios.get(T), '.2f'):>10}" for T in seq_lens))
    return "\n".join(lines)


def command_line(argv):
    """The command as a reader would type it: ``python -m attnlib.bench ...``."""
    import shlex

    return shlex.join(["python", "-m", "attnlib.bench", *(sys.argv[1:] if argv is None else argv)])
