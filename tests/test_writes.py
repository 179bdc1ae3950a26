"""Writing results: whole or not at all, never mixed with an earlier run, 0644, interrupted by
Ctrl-C or SIGTERM without leftovers; internal errors as one line; resume checks its files."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rdu_cluster.cli import main
from rdu_cluster.output import atomic
from rdu_cluster.sweep import LocalExecutor, dataset, expand, load_spec, run_sweep
from tests.sweep import helpers
from tests.sweep.helpers import write
from workloads.errors import ConfigError

SERVE = ["serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--requests", "12",
         "--rate", "20", "--prompt-len", "uniform:32:256", "--output-len", "8"]
TABLES = ("requests", "steps", "sockets", "links")


def run(*args, **kw):
    return CliRunner().invoke(main, list(args), **kw)


def _tables(out: Path) -> dict[str, bytes]:
    return {name: (out / f"{name}.parquet").read_bytes() for name in TABLES}


def _interrupt_on_third_table(monkeypatch, how):
    """serve streams its tables into the result folder (atomic.TableFolder.write: the steps
    and sockets rows as the run records them, then the requests and links)."""
    real, calls = atomic.TableFolder.write, []

    def write(self, name, tbl):
        calls.append(name)
        if len(calls) == 3:  # two tables of the new set are written: the worst moment
            how()
        return real(self, name, tbl)

    monkeypatch.setattr(atomic.TableFolder, "write", write)


def _ctrl_c():
    raise KeyboardInterrupt


def _aborted(stderr: str) -> bool:
    """The interrupt's one line ends stderr, with no blank line (click's) before it."""
    return stderr.endswith("aborted\n") and "\n\n" not in stderr and not stderr.startswith("\n")


def _sigterm():
    os.kill(os.getpid(), signal.SIGTERM)  # the CLI turns it into KeyboardInterrupt


@pytest.mark.parametrize("how", [_ctrl_c, _sigterm], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_serve_write_leaves_the_earlier_set_whole(tmp_path, monkeypatch, how):
    out = tmp_path / "out"
    assert run(*SERVE, "--seed", "0", "--out", str(out)).exit_code == 0
    before = _tables(out)
    _interrupt_on_third_table(monkeypatch, how)
    r = run(*SERVE, "--seed", "1", "--out", str(out))
    assert r.exit_code == 130 and _aborted(r.stderr)
    assert _tables(out) == before  # the seed-0 set, all four, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left
    assert sorted(p.name for p in out.iterdir()) == sorted([*(f"{t}.parquet" for t in TABLES), "summary.json"])
    monkeypatch.undo()
    assert run(*SERVE, "--seed", "1", "--out", str(out)).exit_code == 0
    seeds = {pq.read_schema(out / f"{t}.parquet").metadata[b"rdu_cluster.seed"] for t in TABLES}
    assert seeds == {b"1"}  # the new set replaced the old one as a whole


def test_a_symlinked_out_becomes_the_new_set_and_leaves_its_target_and_no_link(tmp_path):
    """The swap exchanges the names: the link ends up where the earlier set would be deleted
    from; it goes (not rmtree's refusal, a stray .new link), the folder it named stays."""
    earlier = tmp_path / "earlier"
    assert run(*SERVE, "--seed", "0", "--out", str(earlier)).exit_code == 0
    before = _tables(earlier)
    (tmp_path / "lnk").symlink_to(earlier)
    assert run(*SERVE, "--seed", "1", "--out", str(tmp_path / "lnk")).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier", "lnk"]
    assert not (tmp_path / "lnk").is_symlink() and _tables(earlier) == before
    seeds = {pq.read_schema(tmp_path / "lnk" / f"{t}.parquet").metadata[b"rdu_cluster.seed"]
             for t in TABLES}
    assert seeds == {b"1"}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # its __del__
def test_a_disk_that_fills_as_the_tables_close_is_one_line_and_leaves_nothing(tmp_path,
                                                                              monkeypatch):
    close, full_for = pq.ParquetWriter.close, []

    def full(self):
        if not full_for or self is full_for[0]:  # the first footer, at every try: a full disk
            full_for[:] = [self]
            raise OSError(errno.ENOSPC, "No space left on device")
        return close(self)

    monkeypatch.setattr(pq.ParquetWriter, "close", full)
    r = run(*SERVE, "--no-progress", "--out", str(tmp_path / "out"))
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        f"error: --out {tmp_path / 'out'}: cannot write: No space left on device"]
    assert list(tmp_path.iterdir()) == []


def test_a_rejected_serve_writes_nothing(tmp_path):
    out = tmp_path / "new" / "out"
    (tmp_path / "new").mkdir()
    r = run(*SERVE, "--fault", "socket:99@1", "--out", str(out))
    assert r.exit_code == 2 and "--fault" in r.stderr
    assert list((tmp_path / "new").iterdir()) == []


def test_result_files_are_readable_by_others(tmp_path):
    want = 0o666 & ~atomic._UMASK
    assert run("simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--out",
               str(tmp_path / "r.parquet")).exit_code == 0
    assert run(*SERVE, "--out", str(tmp_path / "serve")).exit_code == 0
    spec = load_spec(write(tmp_path, "[sweep]\nkind = 'fake'\n[[axes]]\ntype = 'grid'\n"
                           "x = [1, 2]\n"))
    run_sweep(spec, expand(spec).points, tmp_path / "ds", LocalExecutor(), progress=False)
    files = [tmp_path / "r.parquet", *(tmp_path / "serve").iterdir(),
             *dataset.part_files(tmp_path / "ds"),
             *(dataset.manifest_dir(tmp_path / "ds")).iterdir()]
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in files}
    assert set(modes.values()) == {want}, modes
    if atomic._UMASK == 0o022:
        assert want == 0o644


def test_an_unwritable_destination_is_one_line(tmp_path):
    r = run("simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--out",
            "/proc/x.parquet")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "/proc" in r.stderr
    with pytest.raises(Exception) as e:
        atomic.atomic_write(Path("/proc/self/x.bin"), b"data")
    assert "cannot write" in str(e.value)


def test_internal_errors_are_one_line_traceback_only_when_asked(monkeypatch):
    sim_cli = sys.modules["rdu_cluster.cli.simulate"]  # the package exports the command

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(sim_cli, "load_model", boom)
    r = run("simulate")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("internal error: RuntimeError: boom") and "Traceback" not in r.stderr
    r = run("--debug", "simulate")
    assert r.exit_code == 1 and "Traceback" in r.stderr and "internal error" in r.stderr
    monkeypatch.setenv("RDU_CLUSTER_DEBUG", "1")
    assert "Traceback" in run("simulate").stderr


def test_resume_reruns_chunks_whose_parts_are_missing_or_damaged(tmp_path):
    path = write(tmp_path, "[sweep]\nkind = 'fake'\n[[axes]]\ntype = 'grid'\n"
                 "cluster = ['c1', 'c2']\nx = [1, 2, 3, 4]\n")
    spec = load_spec(path)
    points, out = expand(spec).points, tmp_path / "ds"
    run_sweep(spec, points, out, LocalExecutor(), progress=False, points_per_task=2)
    full = dataset.read_dataset(out).sort_by("point_id")
    parts = dataset.part_files(out)
    parts[0].unlink()
    parts[1].write_bytes(parts[1].read_bytes()[:20])  # truncated: no footer
    twice = pq.read_table(parts[2])  # a valid file that holds its rows twice
    pq.write_table(pa.concat_tables([twice, twice]), parts[2])
    rows = pq.read_table(parts[3])  # its rows and points, one column fewer
    pq.write_table(rows.drop_columns([rows.column_names[-1]]), parts[3])
    helpers.CALLS.clear()
    s = run_sweep(spec, points, out, LocalExecutor(), progress=False, points_per_task=2)
    assert s.ran == 8 and sum(helpers.CALLS) == 8  # the four chunks those files held
    assert dataset.read_dataset(out).sort_by("point_id").equals(full)
    (out / "notes.txt").write_text("mine")  # a reader would fail on it: the resume refuses
    with pytest.raises(ConfigError, match="notes.txt is not one of the dataset's part files"):
        run_sweep(spec, points, out, LocalExecutor(), progress=False, points_per_task=2)


def test_report_names_a_damaged_part_and_skips_a_stray_file(tmp_path):
    pytest.importorskip("plotly")
    spec = load_spec(write(tmp_path, "[base]\nmodel = 'llama-3.1-8b'\ncluster = 'sn40l-8'\n"
                           "[[axes]]\ntype = 'grid'\nbatch = [1, 2]\n"))
    out = tmp_path / "ds"
    run_sweep(spec, expand(spec).points, out, LocalExecutor(), progress=False)
    (out / "notes.txt").write_text("a stray file")
    r = run("report", str(out), "--out", str(tmp_path / "r.html"))
    assert r.exit_code == 0, r.stderr
    part = dataset.part_files(out)[0]
    part.write_bytes(b"PAR1 broken")
    r = run("report", str(out), "--out", str(tmp_path / "r2.html"))
    assert r.exit_code == 2 and f"damaged part file {part}" in r.stderr
    assert not (tmp_path / "r2.html").exists()
    assert "delete it and rerun the sweep command" in r.stderr
    part.unlink()
    sweep_file = dataset.meta_dir(out) / dataset.SWEEP_FILE
    sweep_file.write_text("[1, 2]")
    r = run("report", str(out), "--out", str(tmp_path / "r3.html"))
    # report has no --force: what to rerun with it is the sweep
    assert r.exit_code == 2 and f"damaged sweep file {sweep_file}" in r.stderr
    assert "rerun the sweep with --force to start it anew" in r.stderr



def test_report_refuses_a_part_file_of_another_sweep_or_table(tmp_path):
    pytest.importorskip("plotly")
    spec = load_spec(write(tmp_path, "[base]\nmodel = 'llama-3.1-8b'\ncluster = 'sn40l-8'\n"))
    out = tmp_path / "ds"
    run_sweep(spec, expand(spec).points, out, LocalExecutor(), progress=False)
    (own,) = dataset.part_files(out)
    rows = pq.read_table(own)
    other = rows.replace_schema_metadata({**rows.schema.metadata,
                                          b"rdu_cluster.spec_hash": b"0123456789abcdef"})
    for name, table in (("part-serve.parquet", pa.table({"link_id": ["a"], "bytes": [1.0]})),
                        ("part-other.parquet", other)):
        pq.write_table(table, own.parent / name)
        r = run("report", str(out), "--out", str(tmp_path / "r.html"))
        assert r.exit_code == 2 and f"part file {own.parent / name}: not a row of this sweep" \
            in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "r.html").exists()
        (own.parent / name).unlink()

# The console script, SIGTERM arriving while it imports the CLI (made certain: sent from the
# import itself, not after a guessed delay).
_EARLY_SIGTERM = """
import builtins, os, signal, sys
from rdu_cluster import entry
real = builtins.__import__
def imp(name, *args, **kwargs):
    if name == "rdu_cluster.cli":
        os.kill(os.getpid(), signal.SIGTERM)
    return real(name, *args, **kwargs)
builtins.__import__ = imp
sys.argv = ["rdu-cluster", "models"]
entry.run()
"""


def test_sigterm_while_the_cli_loads_exits_like_ctrl_c():
    r = subprocess.run([sys.executable, "-c", _EARLY_SIGTERM], capture_output=True, text=True,
                       check=False,
                       timeout=120)
    assert r.returncode == 130 and r.stderr == "aborted\n" and r.stdout == ""


@pytest.mark.slow
def test_sigterm_during_a_run_exits_like_ctrl_c_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen(
        [sys.executable, "-c", "from rdu_cluster.cli import main; main()", "serve", "--model",
         "llama-3.1-8b", "--cluster", "sn40l-8", "--requests", "50000", "--rate", "inf",
         "--out", str(out)], env=env, stderr=subprocess.PIPE, text=True)
    # the progress line at 0 requests: imports done, the trace built, the run under way (tens
    # of seconds of it left). A fixed 6 s sleep over 2,000,000 requests signalled while the
    # trace was still being built (its first request ran after minutes on a loaded machine).
    assert proc.stderr.readline().startswith("serve: 0/50000 requests")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and _aborted(err)
    assert list(tmp_path.iterdir()) == []  # no folder, no temporary file


@pytest.mark.parametrize("swap", ["exchange", "renames"])
def test_sigterm_during_the_swap_is_held_until_the_new_set_is_in(tmp_path, monkeypatch, swap):
    out = tmp_path / "out"
    assert run(*SERVE, "--seed", "0", "--out", str(out)).exit_code == 0
    real_rename, real_exchange = os.rename, atomic._exchange

    def rename(src, dst):
        if str(dst).endswith(".old"):  # out moved aside: the moment a signal would hurt most
            os.kill(os.getpid(), signal.SIGTERM)
        return real_rename(src, dst)

    def exchange(a, b):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_exchange(a, b)

    if swap == "renames" or atomic._RENAMEAT2 is None:
        monkeypatch.setattr(atomic, "_RENAMEAT2", None)
        monkeypatch.setattr(atomic.os, "rename", rename)
    else:
        monkeypatch.setattr(atomic, "_exchange", exchange)
    r = run(*SERVE, "--seed", "1", "--out", str(out))
    assert r.exit_code == 130  # the signal still ends the run, once the swap is done
    seeds = {pq.read_schema(out / f"{t}.parquet").metadata[b"rdu_cluster.seed"] for t in TABLES}
    assert seeds == {b"1"} and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _sigterm_on_write(monkeypatch, at: int) -> list:
    """SIGTERM this process as the `at`-th result file is being written (the CLI turns it
    into KeyboardInterrupt, as Ctrl-C)."""
    real, calls = atomic.atomic_write, []

    def atomic_write(path, data, *args, **kwargs):
        calls.append(path)
        if len(calls) == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(atomic, "atomic_write", atomic_write)
    return calls


def test_sigterm_while_simulate_writes_is_ctrl_c_and_leaves_nothing(tmp_path, monkeypatch):
    _sigterm_on_write(monkeypatch, 1)
    r = run("simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--out",
            str(tmp_path / "r.parquet"))
    assert r.exit_code == 130 and _aborted(r.stderr)
    assert list(tmp_path.iterdir()) == []


def test_sigterm_during_a_sweep_is_ctrl_c_and_the_rerun_resumes(tmp_path, monkeypatch):
    spec = write(tmp_path, "[base]\nmodel = 'llama-3.1-8b'\ncluster = 'sn40l-8'\n"
                 "[[axes]]\ntype = 'grid'\nbatch = [1, 2, 4, 8]\n")
    sweep = ["sweep", str(spec), "--points-per-task", "1", "--no-progress", "--out"]
    assert run(*sweep, str(tmp_path / "whole")).exit_code == 0
    calls = _sigterm_on_write(monkeypatch, 4)  # sweep.json, then a part and its entry a chunk
    r = run(*sweep, str(tmp_path / "ds"))
    assert r.exit_code == 130 and _aborted(r.stderr)
    assert len(calls) == 4 and len(dataset.read_manifest(tmp_path / "ds").finished) == 1
    assert not [p for p in tmp_path.rglob("*") if atomic.is_temporary(p)]
    monkeypatch.undo()
    assert run(*sweep, str(tmp_path / "ds")).exit_code == 0
    key = lambda root: dataset.read_dataset(root).sort_by("point_id").select(["point_id",
                                                                                "tpot_s"])
    assert key(tmp_path / "ds").equals(key(tmp_path / "whole"))


# A Ctrl-C inside a class body's __set_name__ (numpy's finfo, while the CLI loads) comes out of
# the import as a RuntimeError caused by the KeyboardInterrupt.
_WRAPPED_INTERRUPT = """
import builtins, sys
from rdu_cluster import entry
real = builtins.__import__
def imp(name, *args, **kwargs):
    if name == "rdu_cluster.cli":
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise RuntimeError("Error calling __set_name__ on 'cached_property'") from e
    return real(name, *args, **kwargs)
builtins.__import__ = imp
sys.argv = ["rdu-cluster", "models"]
entry.run()
"""


def test_an_interrupt_an_import_wrapped_is_still_aborted(monkeypatch):
    """Exit 130 and "aborted", not an internal error or a traceback."""
    r = subprocess.run([sys.executable, "-c", _WRAPPED_INTERRUPT], capture_output=True,
                       text=True, check=False, timeout=120)
    assert r.returncode == 130 and r.stderr == "aborted\n" and r.stdout == ""
    def wrapped(*args, **kwargs):  # as a command's lazy import would
        raise RuntimeError("Error calling __set_name__") from KeyboardInterrupt()

    monkeypatch.setattr(main.commands["simulate"], "callback", wrapped)
    r = CliRunner().invoke(main, ["simulate"])
    assert r.exit_code == 130 and r.stderr == "aborted\n"


# A signal while the interpreter tears down after the command (made certain: sent from an
# atexit function, which runs then).
_LATE_SIGNAL = """
import atexit, os, signal, sys, time
from rdu_cluster import entry
def late():
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
atexit.register(late)
sys.argv = ["rdu-cluster", "models"]
entry.run()
"""


def test_a_signal_after_the_command_ended_changes_nothing():
    """The run was killed by the signal (status -2, nothing on stderr) once the teardown had
    restored the default handlers; the command's own exit code stands."""
    r = subprocess.run([sys.executable, "-c", _LATE_SIGNAL], capture_output=True, text=True,
                       check=False, timeout=120)
    assert r.returncode == 0 and r.stderr == "" and "llama-3.1-8b" in r.stdout


def test_report_reads_the_committed_parts_and_names_a_missing_one(tmp_path):
    """A part no manifest entry names (a killed run's, or a copy of a committed one) was drawn
    (rows not finished, or repeated), and a deleted part left its rows out without a word."""
    path = write(tmp_path, "[sweep]\nkind = 'fake'\n[[axes]]\ntype = 'grid'\n"
                 "cluster = ['c1']\nx = [1, 2, 3, 4]\n")
    spec = load_spec(path)
    out = tmp_path / "ds"
    run_sweep(spec, expand(spec).points, out, LocalExecutor(), progress=False, points_per_task=2)
    full = dataset.read_dataset(out)
    first = dataset.part_files(out)[0]
    copy = first.with_name("part-0000000000000000.parquet")
    copy.write_bytes(first.read_bytes())
    assert dataset.read_dataset(out).num_rows == full.num_rows == 4
    copy.unlink()
    first.unlink()
    with pytest.raises(ConfigError, match=f"part file {first} is missing .*rerun the sweep"):
        dataset.read_dataset(out)
