"""The dataset: partitioned Parquet with metadata, atomic parts, manifest, resume, refusal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest

from rdu_cluster.output import atomic
from rdu_cluster.sweep import (
    LocalExecutor,
    count_rows,
    dataset,
    expand,
    load_spec,
    read_manifest,
    run_sweep,
)
from tests.sweep import helpers
from tests.sweep.helpers import write
from workloads.errors import ConfigError

SPEC = """
[sweep]
kind = "fake"
seed = 7
[[axes]]
type = "grid"
cluster = ["c1", "c2"]
model = ["m1", "m2"]
x = [{xs}]
y = [1, 2]
"""


def spec_file(tmp_path, n=25, name="spec.toml"):
    return write(tmp_path, SPEC.format(xs=", ".join(str(i) for i in range(1, n + 1))), name)


@pytest.fixture(autouse=True)
def _reset():
    helpers.CALLS.clear()
    helpers.FAIL_AFTER.clear()
    yield
    helpers.FAIL_AFTER.clear()


def run(path, out, **kw):
    spec = load_spec(path)
    return spec, run_sweep(spec, expand(spec).points, out, LocalExecutor(), progress=False, **kw)


def test_layout_metadata_and_readers(tmp_path):
    out = tmp_path / "out"
    spec, s = run(spec_file(tmp_path), out, points_per_task=30)
    assert s.points == 200 and s.infeasible == 8 and s.rows == 192 == count_rows(out)
    folders = sorted(p.relative_to(out).as_posix() for p in out.glob("cluster=*/model=*"))
    assert folders == [f"cluster=c{i}/model=m{j}" for i in (1, 2) for j in (1, 2)]
    part = dataset.part_files(out)[0]
    meta = pq.read_schema(part).metadata
    assert meta[b"rdu_cluster.spec_hash"] == spec.hash.encode()
    assert meta[b"rdu_cluster.seed"] == b"7"
    assert meta[b"rdu_cluster.dataset_schema_version"] == b"6"
    assert b"rdu_cluster.code_version" in meta
    tbl = pq.read_table(out)  # pyarrow, as it is
    assert tbl.num_rows == 192 and {"cluster", "model", "x", "y", "cluster_ref"} <= set(
        tbl.column_names
    )
    df = pd.read_parquet(out)  # pandas, as it is
    assert len(df) == 192 and df.point_id.is_unique
    row = df[(df.x == 3) & (df.y == 2)].iloc[0]
    assert row.value == 3 * 2 + 7 and str(row.cluster) == row.cluster_ref
    assert not [p for p in out.rglob(".*")]  # no temporary file left
    info = json.loads((dataset.meta_dir(out) / dataset.SWEEP_FILE).read_text())
    assert info["spec_hash"] == spec.hash and info["points"] == 200


def test_interrupted_sweep_resumes_to_one_row_per_point(tmp_path):
    path, out = spec_file(tmp_path), tmp_path / "out"
    helpers.FAIL_AFTER.append(3)
    with pytest.raises(KeyboardInterrupt):
        run(path, out, points_per_task=20)
    done = read_manifest(out).finished
    assert len(done) == 60
    # a crash between a part file and its manifest entry leaves an orphan: resume deletes it
    orphan = out / "cluster=c1" / "model=m1" / "part-deadbeef.parquet"
    orphan.write_bytes(dataset.part_files(out)[0].read_bytes())
    # a killed write's temporary file goes; a hidden file of the user's stays
    half = out / "cluster=c1" / f".part-x.parquet.rdu-{atomic._HOST}-999999999-abcd1234.tmp"
    half.write_bytes(b"half")
    (out / "cluster=c1" / ".notes").write_text("mine")
    helpers.FAIL_AFTER.clear()
    helpers.CALLS.clear()
    _, s = run(path, out, points_per_task=20)
    assert s.skipped == 60 and s.ran == 140 and sum(helpers.CALLS) == 140
    assert not orphan.exists() and not half.exists()
    assert (out / "cluster=c1" / ".notes").read_text() == "mine"
    tbl = pq.read_table(out)
    assert tbl.num_rows == 192 == len(set(tbl.column("point_id").to_pylist()))
    helpers.CALLS.clear()
    _, s = run(path, out)  # finished: nothing to run
    assert s.ran == 0 and helpers.CALLS == [] and count_rows(out) == 192


def test_changed_spec_refused_force_starts_anew(tmp_path):
    out = tmp_path / "out"
    run(spec_file(tmp_path, 5), out)
    changed = spec_file(tmp_path, 6, "changed.toml")
    with pytest.raises(ConfigError, match="holds a different sweep.*--force"):
        run(changed, out)
    _, s = run(changed, out, force=True)
    assert s.skipped == 0 and count_rows(out) == 48


@pytest.mark.parametrize("field", ["model", "cluster"])
def test_resume_refused_once_a_named_file_changed(tmp_path, field):
    """The spec hash covers a file's name, not its content: a model config edited between two
    runs would give a dataset of two models under one spec. A cluster TOML reads its chip's
    (each one its `extends` chain), so an edited chip file counts too; the package's own
    files are the code version's."""
    edited = tmp_path / ("model.json" if field == "model" else "chip.toml")
    before, after = (('{"layers": 16}', '{"layers": 64}') if field == "model" else
                     ('extends = "sn40l"\nname = "mine"\n', 'extends = "sn40l"\nname = "b"\n'))
    edited.write_text(before)
    named = edited
    if field == "cluster":
        named = tmp_path / "cluster.toml"
        named.write_text('extends = "sn40l-16"\nchip = "chip.toml"\n')
    path = write(tmp_path, f'[sweep]\nkind = "fake"\n[base]\n{field} = "{named}"\n'
                 "[[axes]]\ntype = 'grid'\nx = [1, 2, 3]\n")
    out = tmp_path / "out"
    run(path, out, points_per_task=1)
    edited.write_text(after)
    with pytest.raises(ConfigError, match=f"--out {out}: {edited} has changed since the sweep "
                       "started; restore it, or rerun the sweep with --force"):
        run(path, out)
    edited.write_text(before)  # restored: resumes
    assert run(path, out)[1].ran == 0
    edited.write_text(after)
    _, s = run(path, out, force=True)
    assert s.skipped == 0 and count_rows(out) == 3


def test_non_sweep_folder_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not a sweep dataset"):
        run(spec_file(tmp_path, 2), out)
    assert (out / "notes.txt").exists()


def test_rows_do_not_depend_on_task_size(tmp_path):
    path = spec_file(tmp_path, 10)
    run(path, tmp_path / "a", points_per_task=7)
    run(path, tmp_path / "b", points_per_task=1000)
    a = pq.read_table(tmp_path / "a").sort_by("point_id")
    b = pq.read_table(tmp_path / "b").sort_by("point_id")
    assert a.equals(b)


def test_second_writer_refused_while_one_runs(tmp_path):
    out = tmp_path / "out"
    run(spec_file(tmp_path, 2), out)
    # as if another sweep were writing
    with dataset.locked(out), pytest.raises(ConfigError, match="another sweep is writing"):
        run(spec_file(tmp_path, 2), out)


def _death_signal() -> int:
    import ctypes

    value = ctypes.c_int()
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(value))  # 2: PR_GET_PDEATHSIG
    return value.value


@pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux's")
def test_a_pool_worker_is_killed_with_a_killed_sweep():
    """A sweep killed with SIGKILL runs no clean-up: its pool workers must end by themselves
    (the kernel kills them with their parent: execute._end_with)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from rdu_cluster.sweep import execute

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=execute._end_with, initargs=(os.getpid(),)) as pool:
        assert pool.submit(_death_signal).result(timeout=120) == signal.SIGKILL


def test_a_sweep_killed_before_its_sweep_file_is_renamed_in_starts_again(tmp_path):
    """SIGKILL between the sweep file's temporary and its rename leaves OUT.sweep with the lock
    and that temporary: the rerun starts the sweep, not refuses a foreign folder."""
    out = tmp_path / "out"
    out.mkdir()
    meta = dataset.meta_dir(out)
    meta.mkdir()
    (meta / dataset.LOCK_FILE).touch()
    stale = meta / f".sweep.json.rdu-{atomic._HOST}-999999999-abcd1234.tmp"
    stale.write_text('{"form')
    _, s = run(spec_file(tmp_path, 2), out)
    assert s.ran == 16 and count_rows(out) == 16 and not stale.exists()


def test_pool_workers_never_take_ctrl_c(tmp_path):
    """Ctrl-C at a terminal reaches every process of the group: a pool worker that took it
    printed a traceback beside the sweep's "aborted". Workers start with SIGINT and SIGTERM
    blocked (execute.parent_only_signals), and the parent's mask is restored after. In a fresh
    process: the first spawn also starts multiprocessing's resource tracker, which unblocked
    them."""
    code = ("import multiprocessing, signal\n"
            "from concurrent.futures import ProcessPoolExecutor\n"
            "from rdu_cluster.sweep import execute\n"
            "def blocked():\n    return sorted(map(int, signal.pthread_sigmask(signal.SIG_BLOCK, [])))\n"
            "if __name__ == '__main__':\n"
            "    with execute.parent_only_signals():\n"
            "        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn'))\n"
            "        future = pool.submit(blocked)\n"
            "    with pool:\n        print(future.result(timeout=120), blocked())\n")
    script = tmp_path / "pool.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()}, check=False)
    assert out.stdout == f"[{signal.SIGINT:d}, {signal.SIGTERM:d}] []\n", out.stderr


def test_code_version_follows_the_package_files(tmp_path, monkeypatch):
    """The code version is the release number and a digest of the packages' files: a changed
    source file or bundled TOML is another version (the release number alone, '0.1.0' through
    every change, let a sweep resumed after editing cluster_configs/chips/sn40l.toml mix rows
    of both HBM bandwidths)."""
    import sys

    pkg = tmp_path / "lib" / "fakecodepkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "chip.toml").write_text("bandwidth_bytes_per_s = 1.8e12\n")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.setattr(dataset, "CODE_PACKAGES", ("fakecodepkg",))
    sys.modules.pop("fakecodepkg", None)
    dataset.code_version.cache_clear()
    before = dataset.code_version()
    (pkg / "sub" / "chip.toml").write_text("bandwidth_bytes_per_s = 0.9e12\n")
    dataset.code_version.cache_clear()
    after = dataset.code_version()
    dataset.code_version.cache_clear()
    assert before != after and before.startswith("0.1.0+") and after.startswith("0.1.0+")


def test_resume_under_another_code_version_is_refused(tmp_path, monkeypatch):
    out = tmp_path / "out"
    helpers.FAIL_AFTER.append(2)
    with pytest.raises(KeyboardInterrupt):
        run(spec_file(tmp_path), out, points_per_task=30)
    info = json.loads((dataset.meta_dir(out) / dataset.SWEEP_FILE).read_text())
    assert info["code_version"] == dataset.code_version()
    helpers.FAIL_AFTER.clear()
    monkeypatch.setattr(dataset, "code_version", lambda: info["code_version"] + "x")
    with pytest.raises(ConfigError, match="rows of two versions would mix"):
        run(spec_file(tmp_path), out, points_per_task=30)
