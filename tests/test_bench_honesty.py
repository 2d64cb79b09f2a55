"""Timing on a small shared machine: flagged rows, raw repeats, load average, one thread by default.

No test here times anything for its own sake: rows are built by hand, or a
tiny sweep is run only to check what the file records.
"""

import csv

import matplotlib
import numpy as np
import pytest

from attnlib.bench import cli, plots, report

matplotlib.use("Agg")


def _row(kernel, T, median, q25=None, q75=None, **extra):
    row = dict.fromkeys(report.ROW_COLUMNS)
    row.update(kernel=kernel, backend=kernel, device="cpu", device_name="cpu", dtype="float32", tf32=False,
               B=1, H=2, T=T, d=64, causal=False, status="ok", time_ms=median,
               time_q25_ms=median if q25 is None else q25, time_q75_ms=median if q75 is None else q75)
    row.update(extra)
    return row


def test_a_row_whose_iqr_exceeds_a_fifth_of_its_median_is_flagged_noisy():
    quiet = _row("numpy", 128, 1.0, 0.95, 1.05)
    noisy = _row("numpy", 256, 4.0, 3.0, 5.0)  # IQR 2.0 = 50 % of 4.0
    flagged = report.flag_rows([quiet, noisy])
    assert flagged == [noisy]
    assert quiet["flag"] is None
    assert noisy["flag"] == "noisy: IQR is 50% of the median"


def test_a_time_that_does_not_grow_with_t_flags_both_rows():
    rows = [_row("sdpa-flash", 256, 8.0), _row("sdpa-flash", 512, 0.96), _row("sdpa-flash", 1024, 3.9),
            _row("numpy", 256, 1.0), _row("numpy", 512, 4.0)]
    report.flag_rows(rows)
    assert [r["flag"] is not None for r in rows] == [True, True, False, False, False]
    assert "not growing with T: T=512 took no longer than T=256" in rows[0]["flag"]


def test_rows_that_differ_in_causal_or_dtype_are_not_compared_with_each_other():
    rows = [_row("numpy", 256, 2.0), _row("numpy", 512, 1.0, causal=True)]
    assert report.flag_rows(rows) == []


def test_failed_rows_are_never_flagged():
    rows = [_row("numpy", 256, None, status="unsupported", time_q25_ms=None, time_q75_ms=None)]
    assert report.flag_rows(rows) == []


def test_the_warning_lists_each_flagged_row_and_is_empty_when_none_is():
    rows = [_row("numpy", 128, 1.0), _row("numpy", 256, 4.0, 3.0, 5.0)]
    assert report.format_flags(rows) == ""
    report.flag_rows(rows)
    text = report.format_flags(rows)
    assert text.startswith("WARNING: 1 of 2 rows")
    assert "numpy" in text and "T=256" in text and "IQR is 50%" in text
    assert "(flagged)" in report.format_rows(rows)


def test_the_stamp_records_the_load_average():
    stamp = report.make_stamp(device="cpu", device_name="cpu", tf32=False, dtypes=["float32"], command="x")
    numbers = [float(x) for x in stamp["load_average"].split()]
    assert len(numbers) == 3 and all(x >= 0 for x in numbers)


def test_a_file_without_the_newer_columns_still_reads(tmp_path):
    rows = [_row("numpy", 128, 1.0)]
    stamp = report.make_stamp(device="cpu", device_name="cpu", tf32=False, dtypes=["float32"], command="x")
    path = tmp_path / "old.csv"
    report.write_results(path, stamp, rows)
    with open(path, newline="") as f:
        records = list(csv.DictReader(f))
    old_columns = [c for c in records[0] if c not in report.OPTIONAL_COLUMNS]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=old_columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)
    read_stamp, read_rows = report.read_results(path)
    assert read_rows[0]["times_ms"] is None and read_rows[0]["flag"] is None
    assert read_stamp["load_average"] is None
    assert read_rows[0]["time_ms"] == 1.0


def test_a_cpu_run_uses_one_thread_by_default_and_saves_every_repeat(tmp_path, capsys):
    path = tmp_path / "run.csv"
    code = cli.main(["--device", "cpu", "--kernels", "numpy,tiled", "--seq-lens", "32", "64", "--heads", "1",
                     "--min-repeats", "4", "--max-repeats", "4", "--budget", "0.01", "--warmup-s", "0",
                     "--no-progress", "--no-memory", "--output", str(path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "threads 1" in out and "load average" in out
    stamp, rows = report.read_results(path)
    assert stamp["torch_num_threads"] == 1
    assert stamp["load_average"]
    for row in rows:
        times = report.repeat_times_ms(row)
        assert len(times) == row["repeats"] == 4
        assert np.median(times) == pytest.approx(row["time_ms"], rel=1e-4)
        assert min(times) == pytest.approx(row["time_min_ms"], rel=1e-4)


def test_time_plots_draw_interquartile_bars_and_mark_flagged_rows():
    import matplotlib.pyplot as plt

    rows = [_row("numpy", 128, 1.0, 0.9, 1.2), _row("numpy", 256, 4.0, 3.0, 5.0)]
    report.flag_rows(rows)
    fig, ax = plt.subplots()
    plots.plot_against_t(ax, rows, "time_ms")
    bars = [c for c in ax.containers if hasattr(c, "has_yerr") and c.has_yerr]
    assert len(bars) == 1
    segments = bars[0].lines[2][0].get_segments()
    assert [tuple(np.round(seg[:, 1], 6)) for seg in segments] == [(0.9, 1.2), (3.0, 5.0)]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "flagged (noisy, or no\nslower than a shorter T)" in legend
    plt.close(fig)


def test_the_bench_plot_crosses_flagged_rows_in_both_panels_titles_both_and_keeps_legends_off_the_lines():
    import matplotlib.pyplot as plt

    rows = [dict(_row("numpy", 128, 1.0, 0.99, 1.01), peak_extra_bytes=1000),
            dict(_row("numpy", 256, 4.0, 3.0, 5.0), peak_extra_bytes=4000)]
    report.flag_rows(rows)
    assert rows[1]["flag"]  # the noisy one
    fig = plots.plot_time_and_memory(rows, "test")
    fig.canvas.draw()
    for ax in fig.axes:
        assert ax.get_title(), "every panel has a title"
        crosses = [line for line in ax.lines if line.get_marker() == "x" and len(line.get_xdata())]
        assert [list(line.get_xdata()) for line in crosses] == [[256]], ax.get_title()
        legend, panel = ax.get_legend().get_window_extent(), ax.get_window_extent()
        assert legend.y1 <= panel.y0, "the legend sits below the panel, over no line"
    plt.close(fig)
