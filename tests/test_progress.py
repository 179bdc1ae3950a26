"""Progress through tqdm (rdu_cluster/output/progress.py): a bar on a terminal, plain periodic
lines in a log, nothing when disabled; serve and sweep use it; the local backend's --workers."""

from __future__ import annotations

import io
import re

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rdu_cluster.cli import main
from rdu_cluster.output.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_plain_lines_with_rate_and_eta():
    out = io.StringIO()
    with Progress(200, "points", "sweep", out) as bar:
        for _ in range(200):
            bar.update(1)  # far faster than LOG_EVERY_S: no line in between
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0].startswith("sweep: 0/200 points (0%)")
    assert len(lines) == 2
    assert re.fullmatch(r"sweep: 200/200 points \(100%\) +[\d.]+points/s +elapsed 00:00 +"
                        r"ETA 00:00", lines[-1])


def test_a_terminal_gets_a_bar_redrawn_in_place():
    out = Terminal()
    with Progress(10, "requests", "serve", out) as bar:
        bar.set_done(4, 10)
        bar.set_done(10, 10)
    text = out.getvalue()
    assert "\r" in text and "|" in text
    assert re.search(r"serve: 100%\|.*\| 10/10 requests \[elapsed .*, ETA .*requests/s\]", text)


def test_disabled_writes_nothing_and_absolute_counts_never_go_back():
    out = io.StringIO()
    bar = Progress(5, "requests", "serve", out, enabled=False)
    bar.set_done(3)
    bar.set_done(2)  # a late, smaller count is ignored
    assert bar.done == 3
    bar.close()
    assert out.getvalue() == ""


def test_serve_reports_progress_in_a_log_and_no_progress_silences_it(tmp_path):
    args = ["serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--requests", "8",
            "--rate", "20", "--output-len", "8", "--prompt-len", "64"]
    r = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a")])
    assert r.exit_code == 0
    # tqdm writes a rate under 1/s inverted (s/requests)
    assert re.search(r"^serve: 8/8 requests \(100%\) .*(requests/s|s/requests) .*ETA", r.stderr,
                     re.MULTILINE)
    r = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b"), "--no-progress"])
    assert r.exit_code == 0 and "serve:" not in r.stderr


def test_local_workers_run_a_process_pool_with_the_same_rows(tmp_path):
    spec = "examples/sweeps/decode-small.toml"
    runs = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        r = CliRunner().invoke(main, ["sweep", spec, "--out", str(out), "--workers",
                                      str(workers), "--points-per-task", "32", "--no-progress"])
        assert r.exit_code == 0, r.output + r.stderr
        assert f"local backend, {workers} worker(s)" in r.output
        runs[workers] = pq.read_table(out).sort_by("point_id").to_pylist()
    assert runs[1] == runs[2] and len(runs[1]) == 126


def test_nothing_is_drawn_before_the_first_update():
    """A command that fails while setting up prints its error line alone."""
    out = io.StringIO()
    with Progress(10, "requests", "serve", out):
        pass
    assert out.getvalue() == ""


@pytest.mark.slow  # shares a calibrate run: tens of seconds of CPU
def test_calibrate_reports_its_groups(sn40l_calibration):
    r, out = sn40l_calibration
    assert re.search(r"^calibrate: 1/1 groups \(100%\) .*(groups/s|s/groups) .*ETA", r.stderr,
                     re.MULTILINE)
    assert out.is_file()
