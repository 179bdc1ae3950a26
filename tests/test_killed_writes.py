"""A run killed (SIGKILL: no cleanup code runs) at any step of a result write: the destination
shows the earlier result set or the new one, whole, never a mix; the next write to it (and a
resumed sweep, tests/sweep/test_dataset.py) removes the killed run's temporary files and
folders, finishes a swap it broke off, and touches nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rdu_cluster.cli import main
from rdu_cluster.output import atomic

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("a.txt", "b.txt")

# The child writes a two-file set with folder_swap and kills itself at step KILL: 0 while
# filling the temporary folder, 1-3 right before folder_swap's 1st-3rd step (tmp -> .new; then
# .new and out exchanged in one step, or out -> .old and .new -> out where the system cannot
# exchange: SWAP "renames"), 4 halfway through deleting the earlier set, 5 never.
CHILD = """
import os, shutil, signal, sys
from pathlib import Path
from rdu_cluster.output import atomic

out, tag, kill, swap = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
real_rename, real_exchange, real_rmtree, steps = os.rename, atomic._exchange, shutil.rmtree, [0]
if swap == "renames":
    atomic._RENAMEAT2 = None

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def step(real):
    def wrapped(*args):
        steps[0] += 1
        if steps[0] == kill:
            die()
        return real(*args)
    return wrapped

def rmtree(path, *args, **kwargs):
    if kill == 4 and os.path.isdir(path) and any(Path(path).iterdir()):
        next(Path(path).iterdir()).unlink()
        die()
    return real_rmtree(path, *args, **kwargs)

os.rename, shutil.rmtree = step(real_rename), rmtree
if swap == "exchange":
    atomic._exchange = step(real_exchange)
with atomic.folder_swap(out, ["a.txt", "b.txt"]) as tmp:
    (tmp / "a.txt").write_text(tag)
    if kill == 0:
        die()
    (tmp / "b.txt").write_text(tag)
"""
SWAPS = ["exchange", "renames"] if atomic._RENAMEAT2 is not None else ["renames"]


def _child(code: str, *args: str) -> int:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, check=False,
                          timeout=60).returncode


def _visible(out: Path) -> str | None:
    """The tag of the whole set at `out`; None if `out` is missing; fails on a mixed set."""
    if not out.exists():
        return None
    found = {p.name: p.read_text() for p in out.iterdir()}
    assert set(found) == set(NAMES) and len(set(found.values())) == 1, found
    return found["a.txt"]


def _user_files(parent: Path) -> dict[str, str]:
    """Files of the user's beside the destination, two of them named much like temporaries."""
    files = {".out.notes": "mine", ".out.rdu-zz-1-abcdefgh.tmp": "mine too",
             "out.bak": "mine as well"}
    for name, text in files.items():
        (parent / name).write_text(text)
    return files


@pytest.mark.parametrize("swap", SWAPS)
@pytest.mark.parametrize("earlier", [True, False], ids=["over-a-set", "first-write"])
@pytest.mark.parametrize("kill", range(6))
def test_a_kill_at_any_step_leaves_a_whole_set_and_the_next_write_cleans_up(tmp_path, kill,
                                                                             earlier, swap):
    out = tmp_path / "out"
    mine = _user_files(tmp_path)
    if earlier:
        with atomic.folder_swap(out, NAMES) as tmp:
            for name in NAMES:
                (tmp / name).write_text("old")
    rc = _child(CHILD, out, "new", kill, swap)
    # a first write has two steps (tmp -> .new -> out) and no earlier set to delete; with an
    # earlier set the exchange makes two steps, the renames three
    fired = kill in (0, 1, 2) or (kill == 3 and earlier and swap == "renames") or \
        (kill == 4 and earlier)
    assert rc == (-signal.SIGKILL if fired else 0)
    seen = _visible(out)
    if kill == 3 and earlier and swap == "renames":  # killed between the two renames
        assert seen is None  # the one moment out is missing: both sets lie beside it
        atomic.recover(out)  # what the next write does first: the new set goes in
        seen = _visible(out)
    assert seen == ("new" if kill >= 3 else "old" if earlier else None)
    atomic.recover(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*mine, *(["out"] if seen else [])])  # no temporary left, the user's files kept
    with atomic.folder_swap(out, NAMES) as tmp:  # and the next write goes through
        for name in NAMES:
            (tmp / name).write_text("next")
    assert _visible(out) == "next"
    assert {n: (tmp_path / n).read_text() for n in mine} == mine


def test_a_killed_file_write_is_cleaned_up_by_the_next_one(tmp_path):
    path = tmp_path / "r.parquet"
    path.write_bytes(b"earlier")
    code = ("import os, signal, sys\nfrom rdu_cluster.output import atomic\n"
            "def half(tmp):\n    open(tmp, 'wb').write(b'half')\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "atomic.atomic_write(sys.argv[1], half)\n")
    assert _child(code, path) == -signal.SIGKILL
    assert path.read_bytes() == b"earlier"
    [stale] = [p for p in tmp_path.iterdir() if p != path]
    assert atomic.is_temporary(stale)
    atomic.atomic_write(path, b"new")
    assert sorted(tmp_path.iterdir()) == [path] and path.read_bytes() == b"new"


def test_temporaries_of_a_live_process_are_left_alone(tmp_path):
    live = os.getppid()  # the test runner's parent: alive, not this process
    busy = tmp_path / f".out.rdu-{atomic._HOST}-{live}-abcd1234.tmp"
    busy.mkdir()
    other_host = tmp_path / ".out.rdu-00000000-999999999-abcd1234.new"
    other_host.mkdir()
    atomic.recover(tmp_path / "out")
    assert busy.exists() and other_host.exists()


def test_serve_killed_between_the_renames_is_finished_by_the_next_run(tmp_path):
    out = tmp_path / "out"
    serve = ["serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--requests", "8",
             "--rate", "20", "--output-len", "8", "--out", str(out)]
    assert CliRunner().invoke(main, [*serve, "--seed", "0"]).exit_code == 0
    code = ("import os, signal, sys\nfrom rdu_cluster.cli import main\n"
            "from rdu_cluster.output import atomic\natomic._RENAMEAT2 = None\n"
            "real, n = os.rename, [0]\n"
            "def rename(src, dst):\n    n[0] += 1\n"
            "    if n[0] == 3:\n        os.kill(os.getpid(), signal.SIGKILL)\n"
            "    return real(src, dst)\n"
            "os.rename = rename\nmain(sys.argv[1:])\n")
    assert _child(code, *serve, "--seed", "1") == -signal.SIGKILL
    assert not out.exists() and len(list(tmp_path.iterdir())) == 2  # .new and .old
    r = CliRunner().invoke(main, [*serve, "--seed", "2"])
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    import pyarrow.parquet as pq

    seeds = {pq.read_schema(p).metadata[b"rdu_cluster.seed"] for p in out.glob("*.parquet")}
    assert seeds == {b"2"}


def test_a_writability_probe_left_by_a_killed_run_is_removed(tmp_path):
    probe = tmp_path / f".{atomic._PROBE}.rdu-{atomic._HOST}-999999999-abcd1234.tmp"
    probe.mkdir()
    atomic.check_destination(tmp_path / "r.parquet")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_as_the_temporary_is_created_leaves_nothing(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM right after the temporary file was created, before the writer held
    its name (inside mkstemp), left it behind: seen as a manifest entry's .tmp after a sweep
    was aborted."""
    real = os.open

    def interrupted(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "open", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic.atomic_write(tmp_path / "r.json", b"{}")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_as_the_hidden_folder_is_made_leaves_nothing(tmp_path, monkeypatch):
    """As for atomic_write's file: folder_swap's hidden folder, made by mkdtemp before its
    name was held, stayed behind an interruption right after it was created."""
    real = os.mkdir

    def interrupted(path, *args, **kwargs):
        real(path, *args, **kwargs)
        if Path(path).name.startswith(".out.rdu-"):  # not check_folder's probe
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "mkdir", interrupted)
    with pytest.raises(KeyboardInterrupt), atomic.folder_swap(tmp_path / "out", NAMES):
        pass
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
