"""The sweep dataset: a hive-partitioned Parquet folder, its manifest, and resume.

    OUT/_sweep.json                                     spec hash, code version, seed, the spec
    OUT/_manifest/<chunk>.json                          the points each finished chunk covered
    OUT/cluster=<c>/model=<m>/part-<chunk>.parquet      the rows, one file per chunk and partition

The partition columns live in the folder names only (a reader adds them back: pyarrow, pandas,
polars, DuckDB and Ray Data all do, and all skip names starting with "_" or "."). A chunk is
committed by writing its part files (each to a hidden temporary name, then renamed) and then
its manifest entry the same way: a point counts as finished only once its manifest entry
exists, and a part file no manifest entry names is a leftover of an interrupted run, deleted on
resume. So a resumed sweep ends with exactly one row per point (feasible or not).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import rdu_cluster
from rdu_cluster.sweep.registry import Point
from workloads.errors import ConfigError

# 2: serve rows carry the engine's energy and cost columns; 3: a point that does not fit is a
# row (feasible = false, infeasible_reason) in every kind
DATASET_SCHEMA_VERSION = "3"
SWEEP_FILE = "_sweep.json"
LOCK_FILE = "_sweep.lock"
MANIFEST_DIR = "_manifest"
FORMAT = "rdu-cluster-sweep"
_SAFE = re.compile(r"[^A-Za-z0-9._+-]")
_UMASK = os.umask(0)
os.umask(_UMASK)


@dataclass(frozen=True)
class Part:
    path: str  # relative to the dataset root
    data: bytes
    rows: int


@dataclass
class Manifest:
    finished: set[str] = field(default_factory=set)  # every point of a committed chunk
    infeasible: dict[str, str] = field(default_factory=dict)
    files: set[str] = field(default_factory=set)
    rows: int = 0


def partition_value(value: Any) -> str:
    """A folder-safe partition value: what readers will show in the column."""
    return _SAFE.sub("_", str(value)) or "_"


def encode_parts(
    table: pa.Table,
    chunk_id: str,
    partition_by: Sequence[str],
    metadata: Mapping[str, str],
) -> list[Part]:
    """Split a chunk's rows by partition and encode each as Parquet bytes (done on the worker,
    so the driver only writes files)."""
    meta = dict(table.schema.metadata or {})
    meta.update({f"rdu_cluster.{k}".encode(): str(v).encode() for k, v in metadata.items()})
    table = table.replace_schema_metadata(meta)
    keys = [table.column(c).to_pylist() for c in partition_by]
    parts = []
    for combo in sorted(set(zip(*keys))):
        mask = None
        for col, value in zip(partition_by, combo):
            m = pc.equal(table.column(col), value)
            mask = m if mask is None else pc.and_(mask, m)
        sub = table.filter(mask).drop_columns(list(partition_by))
        folder = "/".join(f"{c}={partition_value(v)}" for c, v in zip(partition_by, combo))
        buf = io.BytesIO()
        pq.write_table(sub, buf)
        parts.append(Part(f"{folder}/part-{chunk_id}.parquet", buf.getvalue(), sub.num_rows))
    return parts


def scenario_columns(table: pa.Table, points: Iterable[Point], columns) -> pa.Table:
    """Append every scenario field as a column, by each row's point_id (types from the spec)."""
    by_id = {p.id: p.fields for p in points}
    ids = table.column("point_id").to_pylist()
    for col in columns:
        values = [by_id[i].get(col.field) for i in ids]
        if pa.types.is_string(col.type):
            values = [None if v is None else str(v) for v in values]
        table = table.append_column(col.name, pa.array(values, type=col.type))
    return table


def atomic_write(path: Path, data: bytes) -> None:
    """A hidden temporary file in the same folder, flushed to disk, then renamed over `path`:
    a reader or a resumed run sees the whole file or none of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; a dataset is for others to read
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def commit_chunk(
    root: Path,
    chunk_id: str,
    point_ids: Sequence[str],
    parts: Sequence[Part],
    infeasible: Mapping[str, str],
) -> None:
    for part in parts:
        atomic_write(root / part.path, part.data)
    reasons = sorted(set(infeasible.values()))
    entry = {
        "chunk": chunk_id,
        "points": sorted(point_ids),
        "files": sorted(p.path for p in parts),
        "rows": sum(p.rows for p in parts),
        "reasons": reasons,
        "infeasible": {k: reasons.index(v) for k, v in sorted(infeasible.items())},
    }
    atomic_write(root / MANIFEST_DIR / f"{chunk_id}.json", json.dumps(entry).encode())


def read_manifest(root: str | Path) -> Manifest:
    out = Manifest()
    folder = Path(root) / MANIFEST_DIR
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        entry = json.loads(path.read_text())
        out.finished.update(entry["points"])
        out.files.update(entry["files"])
        out.rows += entry["rows"]
        out.infeasible.update({k: entry["reasons"][i] for k, i in entry["infeasible"].items()})
    return out


def sweep_info(root: str | Path) -> dict[str, Any] | None:
    path = Path(root) / SWEEP_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: unreadable sweep file: {e}") from None


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold an exclusive lock on OUT while a sweep writes it: two runs on one folder would
    both run the unfinished points and commit them twice. flock dies with its process, so a
    killed run leaves no stale lock."""
    _refuse_foreign(root)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK_FILE, "a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"--out {root}: another sweep is writing this folder; wait for it or stop it"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _refuse_foreign(root: Path) -> None:
    foreign = root.exists() and sweep_info(root) is None
    if foreign and any(p.name != LOCK_FILE for p in root.iterdir()):
        raise ConfigError(
            f"--out {root}: exists and is not a sweep dataset (no {SWEEP_FILE}); "
            "choose an empty or new folder"
        )


def prepare(root: Path, spec, n_points: int, force: bool) -> Manifest:
    """Open OUT for this spec: new, resumed (same spec hash and code version), or refused.
    Returns what is already finished. Called only once the spec is known to be good, under
    `locked(root)`."""
    _refuse_foreign(root)
    info = sweep_info(root) if root.exists() else None
    if info is not None and force:
        wipe(root)
        info = None
    if info is not None:
        _check_same(root, info, spec)
        manifest = read_manifest(root)
        remove_leftovers(root, manifest)
        return manifest
    root.mkdir(parents=True, exist_ok=True)
    atomic_write(root / SWEEP_FILE, json.dumps(header(spec, n_points), indent=2).encode())
    return Manifest()


def header(spec, n_points: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "dataset_schema_version": DATASET_SCHEMA_VERSION,
        "spec_hash": spec.hash,
        "code_version": rdu_cluster.__version__,
        "seed": spec.seed,
        "kind": spec.kind,
        "name": spec.name,
        "points": n_points,
        "spec": spec.normalized,
    }


def file_metadata(spec) -> dict[str, str]:
    """Key-value metadata of every part file (results.table adds the schema and code versions)."""
    return {
        "dataset_schema_version": DATASET_SCHEMA_VERSION,
        "spec_hash": spec.hash,
        "seed": str(spec.seed),
        "kind": spec.kind,
        "sweep": spec.name,
        "code_version": rdu_cluster.__version__,
    }


def _check_same(root: Path, info: Mapping[str, Any], spec) -> None:
    if info.get("format") != FORMAT:
        raise ConfigError(f"--out {root}: {SWEEP_FILE} is not an rdu-cluster sweep file")
    if info.get("spec_hash") != spec.hash:
        raise ConfigError(
            f"--out {root}: holds a different sweep (spec hash {info.get('spec_hash')}, this spec "
            f"{spec.hash}); rerun with --force to start it anew, or choose another --out"
        )
    if info.get("code_version") != rdu_cluster.__version__:
        raise ConfigError(
            f"--out {root}: was written by rdu-cluster {info.get('code_version')}, this is "
            f"{rdu_cluster.__version__}; rows of two versions would mix: use --force or another --out"
        )


def remove_leftovers(root: Path, manifest: Manifest) -> int:
    """Delete part files no manifest entry names and temporary files of interrupted writes."""
    removed = 0
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or rel in (SWEEP_FILE, LOCK_FILE):
            continue
        leftover_tmp = path.name.startswith(".")
        orphan = path.suffix == ".parquet" and rel not in manifest.files
        if leftover_tmp or orphan:
            path.unlink()
            removed += 1
    return removed


def wipe(root: Path) -> None:
    """Remove what a sweep wrote (and nothing else)."""
    for path in root.iterdir():
        if path.name in (SWEEP_FILE, MANIFEST_DIR) or "=" in path.name:  # not the lock: held
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def count_rows(root: str | Path) -> int:
    """Rows in the dataset's part files, from their footers (no data read)."""
    return sum(pq.ParquetFile(p).metadata.num_rows for p in part_files(root))


def part_files(root: str | Path) -> list[Path]:
    root = Path(root)
    return sorted(p for p in root.rglob("part-*.parquet") if not p.name.startswith("."))


def read_dataset(root: str | Path) -> pa.Table:
    """The whole dataset as one table, partition columns included (as plain strings)."""
    root = Path(root)
    if sweep_info(root) is None:
        raise ConfigError(f"{root}: not a sweep dataset (no {SWEEP_FILE})")
    if not part_files(root):
        raise ConfigError(f"{root}: the sweep has no rows yet")
    import pyarrow.dataset as ds

    part = ds.partitioning(flavor="hive")
    tbl = ds.dataset(str(root), format="parquet", partitioning=part).to_table()
    return tbl
