"""The sweep dataset: a hive-partitioned Parquet folder, its manifest, and resume.

    OUT/cluster=<c>/model=<m>/part-<chunk>.parquet      the rows, one file per chunk and partition
    OUT.sweep/sweep.json                                spec hash, code version, seed, the spec
    OUT.sweep/manifest/<chunk>.json                     the points each finished chunk covered
    OUT.sweep/lock                                      held (flock) while a sweep writes OUT

OUT holds Parquet part files and nothing else, so every reader opens it as it is: polars'
read_parquet(OUT) reads every file under a folder, whatever its name (sidecar files starting
with "_" or ".", which pyarrow, pandas and Ray Data skip, make it fail), hence the sidecar
folder beside OUT (`meta_dir`). The partition columns live in the folder names only (a reader
adds them back as strings: tests/sweep/test_readers.py checks each reader). A chunk is
committed by writing its part files (each to a hidden temporary name, then renamed) and then
its manifest entry the same way: a point counts as finished only once its manifest entry
exists, and a part file no manifest entry names is a leftover of an interrupted run, deleted on
resume. So a resumed sweep ends with exactly one row per point (feasible or not).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import cluster_configs
import rdu_cluster
from rdu_cluster.config import cluster_files
from rdu_cluster.output import atomic
from rdu_cluster.sweep.registry import Point
from workloads.errors import ConfigError
from workloads.files import parse_json, read_text

# 2: serve rows carry the engine's energy and cost columns; 3: a point that does not fit is a
# row (feasible = false, infeasible_reason) in every kind; 4: simulate rows carry each figure's
# interval (<figure>_low, <figure>_high) and interval_note; 5: calibration and
# decode/prefill_prefetch_stall_s columns; 6: a serve row's scheduler, max_batch, token_budget
# and chunked_prefill are the run's (its engine's where the point sets none: a GPU stack's)
DATASET_SCHEMA_VERSION = "6"
SWEEP_FILE = "sweep.json"  # in meta_dir(OUT), as the two below
LOCK_FILE = "lock"
MANIFEST_DIR = "manifest"
META_SUFFIX = ".sweep"
FORMAT = "rdu-cluster-sweep"
_SAFE = re.compile(r"[^A-Za-z0-9._+-]")
_HEX = re.compile(r"[0-9a-f]{64}")
# The packages a row is computed by, and the files of theirs it reads (setup.cfg's packages and
# package_data): their bytes are the code version of a sweep, beside the release number.
CODE_PACKAGES = ("rdu_cluster", "chip", "interconnect", "partitioning", "workloads",
                 "cluster_configs")
CODE_SUFFIXES = (".py", ".toml", ".json", ".parquet")


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """`rdu_cluster.__version__` + a digest of every source and data file of the packages.
    The release number alone stays the same across changes of the code or of a bundled chip
    or cluster TOML, so a sweep resumed across one mixed rows of both; the digest makes it a
    different version (refused on resume, _check_same)."""
    h = hashlib.sha256()
    base: str | Path  # a search location, then the folder it names
    for pkg in CODE_PACKAGES:
        spec = cast(ModuleSpec, importlib.util.find_spec(pkg))  # our own packages: installed
        for base in spec.submodule_search_locations or ():
            base = Path(base)
            for f in sorted(base.rglob("*")):
                if f.suffix in CODE_SUFFIXES and "__pycache__" not in f.parts and f.is_file():
                    h.update(f"{pkg}/{f.relative_to(base).as_posix()}\0".encode())
                    h.update(hashlib.sha256(f.read_bytes()).digest())
    return f"{rdu_cluster.__version__}+{h.hexdigest()[:16]}"


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
    """A folder-safe partition value: what readers will show in the column. One a reader would
    take for a number, a date or a boolean (a cluster named "16") gets a leading "_", so the
    column stays a string in every reader."""
    text = _SAFE.sub("_", str(value)) or "_"
    return "_" + text if _TYPED.match(text) else text


_TYPED = re.compile(r"^([+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|\d{4}-\d\d-\d\d.*|true|false|"
                    r"null|nan|inf|[+-]inf)$", re.IGNORECASE)


def meta_dir(root: str | Path) -> Path:
    """The sidecar folder of the dataset OUT: OUT.sweep beside it."""
    root = Path(os.path.abspath(root)) if Path(root).name in ("", ".", "..") else Path(root)
    return root.parent / f"{root.name}{META_SUFFIX}"


def manifest_dir(root: str | Path) -> Path:
    return meta_dir(root) / MANIFEST_DIR


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


def commit_chunk(
    root: Path,
    chunk_id: str,
    point_ids: Sequence[str],
    parts: Sequence[Part],
    infeasible: Mapping[str, str],
) -> None:
    # A partition folder holds a part per chunk: no look through it per write (quadratic in
    # chunks); prepare() removed a killed run's temporaries once, under the lock.
    for part in parts:
        atomic.atomic_write(root / part.path, part.data, clean=False, parents=True)
    reasons = sorted(set(infeasible.values()))
    entry = {
        "chunk": chunk_id,
        "points": sorted(point_ids),
        "files": sorted(p.path for p in parts),
        # what resume checks a part against: any change to it (a column dropped, rows
        # rewritten, bytes lost) reruns the chunk rather than finishing a dataset with it
        "sha256": {p.path: hashlib.sha256(p.data).hexdigest() for p in parts},
        "rows": sum(p.rows for p in parts),
        "reasons": reasons,
        "infeasible": {k: reasons.index(v) for k, v in sorted(infeasible.items())},
    }
    atomic.atomic_write(manifest_dir(root) / f"{chunk_id}.json", json.dumps(entry).encode(),
                        clean=False, parents=True)


def read_manifest(root: str | Path) -> Manifest:
    out = Manifest()
    folder = manifest_dir(root)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        entry = _manifest_entry(path)
        out.finished.update(entry["points"])
        out.files.update(entry["files"])
        out.rows += entry["rows"]
        out.infeasible.update({k: entry["reasons"][i] for k, i in entry["infeasible"].items()})
    return out


def _manifest_entry(path: Path) -> dict[str, Any]:
    """One chunk's manifest entry, its shape checked: a damaged one is named with what to do
    (a truncated file is what a killed run can leave only if the disk lies about fsync)."""
    # `report` meets this too, and has no --force: what to rerun is the sweep
    fix = ("delete it and rerun the sweep command to redo its chunk, or rerun the sweep with "
           "--force to start it anew")
    try:
        entry = parse_json(read_text(path), str(path))
        ok = (isinstance(entry, dict)
              and all(isinstance(entry.get(k), list) for k in ("points", "files", "reasons"))
              and all(isinstance(x, str) for k in ("points", "files", "reasons")
                      for x in entry[k])
              and isinstance(entry.get("sha256"), dict)
              and sorted(entry["sha256"]) == sorted(entry["files"])
              and all(isinstance(h, str) and _HEX.fullmatch(h) for h in entry["sha256"].values())
              and isinstance(entry.get("rows"), int) and not isinstance(entry["rows"], bool)
              and isinstance(entry.get("infeasible"), dict)
              and all(isinstance(i, int) and 0 <= i < len(entry["reasons"])
                      for i in entry["infeasible"].values()))
    except ConfigError as e:
        raise ConfigError(f"damaged manifest entry {path} ({e}); {fix}") from None
    if not ok:
        raise ConfigError(f"damaged manifest entry {path}: not a chunk record; {fix}")
    return entry


def sweep_info(root: str | Path) -> dict[str, Any] | None:
    path = meta_dir(root) / SWEEP_FILE
    if not path.exists():
        return None
    try:
        info = parse_json(read_text(path), str(path))
    except ConfigError as e:
        info = e
    if not isinstance(info, dict):
        why = str(info) if isinstance(info, ConfigError) else f"holds a {type(info).__name__}"
        raise ConfigError(f"damaged sweep file {path} ({why}); rerun the sweep with --force "
                          "to start it anew, or choose another --out")
    return info


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold an exclusive lock on OUT while a sweep writes it: two runs on one folder would
    both run the unfinished points and commit them twice. flock dies with its process, so a
    killed run leaves no stale lock."""
    atomic.check_name(Path(os.path.abspath(root)), "--out", META_SUFFIX)
    _refuse_foreign(root)
    try:
        meta_dir(root).mkdir(parents=True, exist_ok=True)
        f = open(meta_dir(root) / LOCK_FILE, "a+b")  # noqa: SIM115 - held across the yield below
    except OSError as e:
        raise ConfigError(f"--out {root}: cannot write its lock {meta_dir(root) / LOCK_FILE}: "
                          f"{e.strerror or e}") from None
    with f:
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
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--out {root}: exists and is not a folder")
    meta = meta_dir(root)
    for folder in (meta, manifest_dir(root)):
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"--out {root}: {folder} exists and is not a folder; delete it "
                              "and rerun the sweep with --force to start it anew")
    if sweep_info(root) is not None:
        return
    for folder in (root, meta):
        # a run killed before its sweep file was renamed in leaves the lock and that file's
        # temporary: a sweep's own start, not someone else's folder (prepare's write of the
        # sweep file removes the temporary)
        if folder.exists() and any(p.name != LOCK_FILE and not atomic.is_temporary(p)
                                   for p in folder.iterdir()):
            raise ConfigError(
                f"--out {root}: {folder} exists and is not a sweep dataset (no "
                f"{meta / SWEEP_FILE}); choose an empty or new folder")


def prepare(root: Path, spec, n_points: int, force: bool) -> Manifest:
    """Open OUT for this spec: new, resumed (same spec hash, code version and referenced
    files), or refused. Returns what is already finished. Called only once the spec is known to
    be good, under `locked(root)`."""
    _refuse_foreign(root)
    info = sweep_info(root)
    if info is not None and force:
        wipe(root)
        info = None
    files = referenced_files(spec)
    if info is not None:
        _check_same(root, info, spec)
        _check_files(root, info, files)
        drop_broken_chunks(root)
        manifest = read_manifest(root)
        remove_leftovers(root, manifest)
        _refuse_strays(root)
        return manifest
    root.mkdir(parents=True, exist_ok=True)
    info = header(spec, n_points, files)
    atomic.atomic_write(meta_dir(root) / SWEEP_FILE, json.dumps(info, indent=2).encode(),
                        parents=True)
    return Manifest()


# The fields whose value may name a local file (a model config, a cluster TOML, a calibration
# profile, a trace, a fabric; a pool CLUSTER:PLAN:N names its cluster first): the spec hash
# covers the name, the sweep file the content.
FILE_FIELDS = ("model", "cluster", "calibration", "trace", "fabric", "prefill_pool",
               "decode_pool")


def referenced_files(spec) -> dict[str, str]:
    """The sha256 of each local file the spec names, by the name the spec gives it, and of the
    local files a cluster it names reads beside its own (an `extends` chain, a chip TOML), by
    their paths."""
    out = {}
    for name in FILE_FIELDS:
        for value in spec.values_of(name):
            ref = str(value).split(":")[0] if name.endswith("_pool") else str(value)
            path = Path(ref) / "config.json" if Path(ref).is_dir() else Path(ref)
            if path.is_file():
                out[ref] = _sha256(path)
                if name in ("cluster", "prefill_pool", "decode_pool"):
                    out.update(_cluster_files(path))
    return dict(sorted(out.items()))


def _cluster_files(path: Path) -> dict[str, str]:
    """The files a local cluster TOML reads beside itself, less the package's own (the code
    version covers those)."""
    bundled = {p.resolve() for kind in ("chips", "clusters")
               for p in cluster_configs.bundled(kind).values()}
    return {str(p): _sha256(p) for p in cluster_files(path)[1:] if p.resolve() not in bundled}


def _check_files(root: Path, info: Mapping[str, Any], files: Mapping[str, str]) -> None:
    """Refuse to resume once a file the spec names has changed: the spec hash would still
    match, and the dataset would mix rows of two models (or clusters, or traces)."""
    before = info.get("files", files)  # a sweep file of an earlier version records none
    if not isinstance(before, dict):
        raise ConfigError(f"damaged sweep file {meta_dir(root) / SWEEP_FILE} (files: not a "
                          "table); rerun the sweep with --force to start it anew")
    for ref in sorted(set(before) | set(files)):
        if before.get(ref) != files.get(ref):
            raise ConfigError(f"--out {root}: {ref} has changed since the sweep started; restore "
                              "it, or rerun the sweep with --force to start it anew")


def header(spec, n_points: int, files: Mapping[str, str]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "dataset_schema_version": DATASET_SCHEMA_VERSION,
        "spec_hash": spec.hash,
        "code_version": code_version(),
        "seed": spec.seed,
        "kind": spec.kind,
        "name": spec.name,
        "points": n_points,
        "spec": spec.normalized,
        "files": dict(files),  # sha256 of each local file the spec names (referenced_files)
    }


def file_metadata(spec) -> dict[str, str]:
    """Key-value metadata of every part file (results.table adds the schema and code versions)."""
    return {
        "dataset_schema_version": DATASET_SCHEMA_VERSION,
        "spec_hash": spec.hash,
        "seed": str(spec.seed),
        "kind": spec.kind,
        "sweep": spec.name,
        "code_version": code_version(),
    }


def _check_same(root: Path, info: Mapping[str, Any], spec) -> None:
    if info.get("format") != FORMAT:
        raise ConfigError(f"--out {root}: {SWEEP_FILE} is not an rdu-cluster sweep file")
    if info.get("spec_hash") != spec.hash:
        raise ConfigError(
            f"--out {root}: holds a different sweep (spec hash {info.get('spec_hash')}, this spec "
            f"{spec.hash}); rerun with --force to start it anew, or choose another --out"
        )
    if info.get("code_version") != code_version():
        raise ConfigError(
            f"--out {root}: was written by rdu-cluster {info.get('code_version')}, this is "
            f"{code_version()}; rows of two versions would mix: use --force or another --out"
        )


def drop_broken_chunks(root: Path) -> list[str]:
    """Resume trusts no manifest entry blindly: a chunk whose part files are missing or not
    the bytes it wrote (deleted, truncated, rewritten) loses its entry, so its points run again; the part files it
    still has are removed with the leftovers. Returns the chunks dropped."""
    dropped = []
    folder = manifest_dir(root)
    entries = [(p, _manifest_entry(p)) for p in sorted(folder.glob("*.json"))] \
        if folder.is_dir() else []
    for _, entry in entries:  # checked before any entry is dropped: nothing changes on refusal
        squat = next((root / rel for rel in entry["files"]
                      if (root / rel).exists() and not (root / rel).is_file()), None)
        if squat is not None:  # a folder, a FIFO (opening it would block), a device
            raise ConfigError(f"--out {root}: {squat} is not a regular file where a part file "
                              "belongs; delete it and rerun the sweep, or rerun it with --force to "
                              "start anew")
    for path, entry in entries:
        if not _held(root, entry):
            path.unlink()
            dropped.append(entry.get("chunk", path.stem))
    return dropped


def _held(root: Path, entry: dict[str, Any]) -> bool:
    """Whether the chunk's part files are, byte for byte, those its manifest entry recorded
    (a missing, truncated, rewritten or swapped part reruns the chunk)."""
    for rel in entry["files"]:
        try:
            if _sha256(root / rel) != entry["sha256"][rel]:
                return False
        except OSError:
            return False
    return True


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _part_rows(path: Path) -> int | None:
    """Rows a part file's footer counts; None if it cannot be read (a truncated file has no
    footer)."""
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (OSError, pa.ArrowException):
        return None


def _check_part(path: Path, info: Mapping[str, Any]) -> None:
    """A part file readable and written by this sweep: one of another sweep or a serve table
    copied in (its own columns, the partition columns missing) would mix into the rows."""
    if not path.is_file() or _part_rows(path) is None:  # a FIFO's open would block
        raise ConfigError(f"damaged part file {path}: not a readable Parquet file; delete "
                          "it and rerun the sweep command to redo its chunk")
    meta = pq.read_schema(path).metadata or {}
    written = meta.get(b"rdu_cluster.spec_hash", b"").decode(errors="replace")
    if written != info.get("spec_hash"):
        by = f"spec hash {written}" if written else "no sweep spec hash"
        raise ConfigError(f"part file {path}: not a row of this sweep ({by}, this sweep "
                          f"{info.get('spec_hash')}); move it out of the dataset folder")


def _refuse_strays(root: Path) -> None:
    """A file of someone else's in OUT: every reader opens OUT as the dataset's Parquet parts,
    and a stray file makes pyarrow, polars or DuckDB refuse it (resume would finish a dataset
    nobody can open). Hidden names (. or _) are left alone: the readers skip them too."""
    for path in sorted(root.rglob("*")):
        hidden = any(p.startswith((".", "_")) for p in path.relative_to(root).parts)
        part = path.name.startswith("part-") and path.suffix == ".parquet"
        if path.is_file() and not (hidden or part):
            raise ConfigError(f"--out {root}: {path} is not one of the dataset's part files; "
                              "move it out and rerun (readers open the folder as its parts)")


def remove_leftovers(root: Path, manifest: Manifest) -> int:
    """Delete part files no manifest entry names and the temporary files of interrupted writes
    (named as atomic.atomic_write names them: no other file is touched). Under the lock no
    other run writes here, so every temporary file is a killed run's."""
    removed = 0
    data = [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else []
    for path in data:
        # a part file (named as the sweep names them: a user's other .parquet is refused by
        # _refuse_strays, not deleted) that no manifest entry names
        orphan = path.name.startswith("part-") and path.suffix == ".parquet" and \
            path.relative_to(root).as_posix() not in manifest.files
        if atomic.is_temporary(path) or orphan:
            path.unlink()
            removed += 1
    for folder in (manifest_dir(root), meta_dir(root)):  # a manifest entry's unfinished write
        for path in folder.glob(".*") if folder.is_dir() else []:
            if atomic.is_temporary(path):
                path.unlink()
                removed += 1
    return removed


def wipe(root: Path) -> None:
    """Remove what a sweep wrote (and nothing else; not the lock: it is held)."""
    for path in root.iterdir() if root.is_dir() else []:
        if "=" in path.name:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    meta = meta_dir(root)
    for path in (meta / SWEEP_FILE, meta / MANIFEST_DIR):
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def count_rows(root: str | Path) -> int:
    """Rows in the dataset's part files, from their footers (no data read)."""
    return sum(pq.ParquetFile(p).metadata.num_rows for p in part_files(root))


def _committed_parts(root: Path, info: Mapping[str, Any]) -> list[Path]:
    """The part files the manifest names, each checked: a part no entry names is a killed
    run's uncommitted write (its rows are not finished; a copy of a committed part would
    repeat them), and a named part that is gone would leave its rows out unsaid."""
    committed = read_manifest(root).files
    files = part_files(root)
    for path in files:
        _check_part(path, info)
    missing = sorted(committed - {p.relative_to(root).as_posix() for p in files})
    if missing:
        raise ConfigError(f"part file {root / missing[0]} is missing ({len(missing)} of the "
                          "sweep's); rerun the sweep command to redo its chunk")
    return [p for p in files if p.relative_to(root).as_posix() in committed]


def part_files(root: str | Path) -> list[Path]:
    root = Path(root)
    return sorted(p for p in root.rglob("part-*.parquet") if not p.name.startswith("."))


def read_dataset(root: str | Path) -> pa.Table:
    """The whole dataset as one table, partition columns included (as plain strings)."""
    root = Path(root)
    info = sweep_info(root)
    if info is None:
        raise ConfigError(f"{root}: not a sweep dataset (no {meta_dir(root) / SWEEP_FILE})")
    import pyarrow.dataset as ds

    files = _committed_parts(root, info)
    if not files:
        raise ConfigError(f"{root}: the sweep has no rows yet")
    # The part files by name (not the folder): a stray file beside them is not read. Partition
    # columns come back as plain strings, as every reader shows them (test_readers).
    part = ds.HivePartitioning.discover(infer_dictionary=False)
    data = ds.dataset([str(p) for p in files], format="parquet", partitioning=part,
                      partition_base_dir=str(root))
    return data.to_table()
