"""Running a sweep: points grouped into tasks, tasks run in-process or as Ray tasks, each
finished task committed to the dataset by the driver, with a progress line.

A task ("chunk") holds points that share their non-vector fields where it can, so the runner
costs them with few array calls; it returns Parquet bytes per partition, so that encoding runs
on the workers in parallel and the driver only writes files and the manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgpack

from rdu_cluster.output.progress import Progress
from rdu_cluster.sweep import dataset, registry
from rdu_cluster.sweep.registry import Point
from rdu_cluster.sweep.spec import Column, Spec
from workloads.errors import ConfigError

MIN_TASK = 64  # below this, Ray's ~1 ms per task starts to show against the work


@dataclass(frozen=True)
class Chunk:
    id: str
    points: tuple[Point, ...]

    def __reduce__(self):
        # Sent to a Ray worker as one msgpack blob: pickling thousands of small objects one by
        # one costs the driver more CPU than the worker spends costing them.
        # Column by column: a few long lists pack far faster than one small dict per point.
        names = sorted({k for p in self.points for k in p.fields})
        cols = [[p.fields.get(n) for p in self.points] for n in names]
        packed = msgpack.packb([[p.id for p in self.points], names, cols])
        return _unpack_chunk, (self.id, packed)


def _unpack_chunk(chunk_id: str, packed: bytes) -> Chunk:
    ids, names, cols = msgpack.unpackb(packed)
    rows = zip(*cols) if cols else ([] for _ in ids)
    points = tuple(  # None marks a field the point does not set (fields never hold None)
        Point(i, {n: v for n, v in zip(names, row) if v is not None}) for i, row in zip(ids, rows)
    )
    return Chunk(chunk_id, points)


@dataclass(frozen=True)
class Context:
    """Everything a worker needs besides the points: small, sent with every task."""

    kind: str
    seed: int
    columns: tuple[Column, ...]
    metadata: dict[str, str]


@dataclass
class ChunkResult:
    chunk_id: str
    point_ids: list[str]
    parts: list[dataset.Part]
    infeasible: dict[str, str]
    seconds: float
    started_at: float = 0.0  # wall clock (time.time) on the worker, for timelines
    worker: int = 0  # process id

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)


def run_chunk(chunk: Chunk, ctx: Context) -> ChunkResult:
    """One task: run the points, add the scenario columns, encode per partition. Pure: the
    result depends only on the chunk and the context."""
    start, started_at = time.perf_counter(), time.time()
    runner = registry.get(ctx.kind)
    out = runner.run(chunk.points, ctx.seed)
    parts: list[dataset.Part] = []
    if out.table is not None and out.table.num_rows:
        tbl = dataset.scenario_columns(out.table, chunk.points, ctx.columns)
        parts = dataset.encode_parts(tbl, chunk.id, runner.partition_by, ctx.metadata)
    ids = [p.id for p in chunk.points]
    seconds = time.perf_counter() - start
    return ChunkResult(chunk.id, ids, parts, out.infeasible, seconds, started_at, os.getpid())


def make_chunks(points: Sequence[Point], runner: registry.Runner, size: int) -> list[Chunk]:
    """Put points that a runner costs together (same non-vector fields) next to each other,
    groups in order of first appearance (deterministic, no sort), then cut into tasks of
    `size`."""
    vec = set(runner.vector_fields)
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        key = tuple((k, v) for k, v in p.fields.items() if k not in vec)
        groups.setdefault(key, []).append(p)
    keyed = [p for group in groups.values() for p in group]
    chunks = []
    for i in range(0, len(keyed), size):
        pts = tuple(keyed[i : i + size])
        digest = hashlib.sha256("".join(sorted(p.id for p in pts)).encode()).hexdigest()[:16]
        chunks.append(Chunk(digest, pts))
    return chunks


def task_size(n: int, runner: registry.Runner, workers: int, override: int | None) -> int:
    """Large enough to amortize the per-task cost, small enough that every worker gets about
    four tasks (load balance, and a progress bar that moves)."""
    if override:
        return override
    balanced = math.ceil(n / max(1, 4 * workers)) if n else 1
    return max(1, min(runner.points_per_task, max(MIN_TASK, balanced)))


class LocalExecutor:
    """Tasks in this process, or with `workers` > 1 in a pool of that many processes (spawned:
    fresh interpreters, safe beside threads and an in-process Ray). Results come back as tasks
    end; the dataset is the same either way (a task's rows depend only on its points)."""

    name = "local"

    def __init__(self, workers: int | None = None):
        self.workers = workers or 1
        self._pool: Any = None

    def map(self, chunks: Sequence[Chunk], ctx: Context) -> Iterator[ChunkResult]:
        if self.workers == 1:
            for chunk in chunks:
                yield run_chunk(chunk, ctx)
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with parent_only_signals():  # the workers are spawned by the first submits
            self._pool = ProcessPoolExecutor(self.workers,
                                             mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_end_with, initargs=(os.getpid(),))
            futures = [self._pool.submit(run_chunk, chunk, ctx) for chunk in chunks]
        try:
            for done in as_completed(futures):
                yield done.result()
        finally:
            for f in futures:  # interrupted or failed: start nothing more
                f.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


@contextlib.contextmanager
def parent_only_signals() -> Iterator[None]:
    """Processes started inside never take Ctrl-C or SIGTERM: they start with both blocked (a
    signal mask survives fork and exec, and nothing in a worker unblocks it). A Ctrl-C at a
    terminal reaches the whole process group, and a worker taking it, in its imports or a
    task, printed its own traceback beside the sweep's "aborted"; the sweep alone handles it
    and ends its workers (pool shutdown, or _end_with when it is killed). Here, in the parent,
    a signal that arrives meanwhile is delivered when the mask is restored."""
    from multiprocessing import resource_tracker

    # started at the first spawn, the tracker unblocks both signals once it is up: before
    resource_tracker.ensure_running()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _end_with(parent: int) -> None:
    """A pool worker ends with the sweep that started it, even one killed with SIGKILL (which
    runs no clean-up of its own): Linux sends the worker SIGKILL when its parent dies
    (prctl PR_SET_PDEATHSIG). Elsewhere a killed sweep's workers finish their task and stay."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no prctl: not Linux
        return
    if os.getppid() != parent:  # the parent died before the call above
        os._exit(1)


class _Worker:
    """One Ray actor: a long-lived process, so imports and the per-process caches of clusters
    and models are paid once per sweep, not once per task."""

    def ready(self, kind: str) -> int:
        registry.get(kind)  # imports the runner and what it needs
        return os.getpid()

    def run(self, chunk: Chunk, ctx: Context) -> ChunkResult:
        return run_chunk(chunk, ctx)


class RayExecutor:
    """A pool of `workers` Ray actors (one CPU each). Joins `address` (or $RAY_ADDRESS, which
    `ray job submit` sets), else starts an embedded instance and stops it at the end; an
    instance already running in this process (tests) is used as is."""

    name = "ray"
    QUEUE = 2  # tasks queued per actor: it starts its next one while the driver commits

    def __init__(self, address: str | None = None, workers: int | None = None):
        import ray

        self._ray = ray
        self._owned = False
        if not ray.is_initialized():
            from rdu_cluster.backends import join_ray

            addr = address or os.environ.get("RAY_ADDRESS")
            kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
            if addr:
                join_ray(addr, from_env=not address, **kwargs)
            else:
                # "local": always an instance of our own, never a cluster that happens to
                # run on this machine (/tmp/ray/ray_current_cluster).
                join_ray("local", num_cpus=workers, include_dashboard=False, **kwargs)
            self._owned = True
        self.cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = workers or max(1, self.cpus)
        self._actor_cls = ray.remote(num_cpus=1, max_restarts=1, max_task_retries=2)(_Worker)
        self._actors: list[Any] = []

    def warm(self, kind: str) -> None:
        """Start the actors (in parallel) and have each import the runner of `kind`."""
        ray = self._ray
        while len(self._actors) < self.workers:
            self._actors.append(self._actor_cls.remote())
        ray.get([a.ready.remote(kind) for a in self._actors[: self.workers]])

    def map(self, chunks: Sequence[Chunk], ctx: Context) -> Iterator[ChunkResult]:
        ray = self._ray
        self.warm(ctx.kind)
        actors = self._actors[: self.workers]
        ctx_ref = ray.put(ctx)
        todo = list(reversed(chunks))
        owner: dict[Any, Any] = {}  # task -> actor
        load = {id(a): 0 for a in actors}
        try:
            while todo or owner:
                for actor in actors:  # top up every actor's queue
                    while todo and load[id(actor)] < self.QUEUE:
                        owner[actor.run.remote(todo.pop(), ctx_ref)] = actor
                        load[id(actor)] += 1
                done, _ = ray.wait(list(owner), num_returns=1)
                load[id(owner.pop(done[0]))] -= 1
                yield ray.get(done[0])
        finally:
            for ref in owner:  # interrupted: do not leave work running on the cluster
                ray.cancel(ref)

    def close(self) -> None:
        for actor in self._actors:
            self._ray.kill(actor)
        self._actors = []
        if self._owned:
            self._ray.shutdown()


@dataclass
class Summary:
    points: int  # in the spec, after filters
    skipped: int  # finished by an earlier run
    ran: int
    infeasible: int  # in the whole dataset
    rows: int  # in the whole dataset
    seconds: float
    backend: str
    workers: int
    tasks: int
    task_seconds: list[float] = field(default_factory=list)
    timeline: list[tuple[int, float, float, float]] = field(default_factory=list)  # worker,
    # start and end on the worker, commit end on the driver: seconds from the sweep's start

    @property
    def points_per_s(self) -> float:
        return self.ran / self.seconds if self.seconds > 0 else 0.0


def run_sweep(
    spec: Spec,
    points: Sequence[Point],
    out: str | Path,
    backend: LocalExecutor | RayExecutor,
    force: bool = False,
    points_per_task: int | None = None,
    progress: bool = True,
    stream: TextIO | None = None,
) -> Summary:
    """Run the points not yet finished in `out` and commit each task as it ends."""
    root = Path(out)
    runner = spec.runner
    runner.check(points, {n: spec.origin(n) for n in spec.field_names()})
    with dataset.locked(root):
        return _run_locked(spec, points, root, backend, force, points_per_task, progress, stream)


def _run_locked(spec, points, root, backend, force, points_per_task, progress, stream) -> Summary:
    runner = spec.runner
    manifest = dataset.prepare(root, spec, len(points), force)
    todo = [p for p in points if p.id not in manifest.finished]
    size = task_size(len(todo), runner, backend.workers, points_per_task or spec.points_per_task)
    chunks = make_chunks(todo, runner, size)
    ctx = Context(spec.kind, spec.seed, tuple(spec.columns()), dataset.file_metadata(spec))
    start, wall0, times, timeline = time.perf_counter(), time.time(), [], []
    with Progress(len(todo), "points", "sweep", stream, progress) as bar:
        bar.start()  # the spec and the folder are checked: show the bar from 0
        for result in backend.map(chunks, ctx):
            if result.infeasible and spec.on_infeasible == "error":
                pid, why = next(iter(sorted(result.infeasible.items())))
                raise ConfigError(f"point {pid} is infeasible (sweep.on_infeasible = 'error'): {why}")
            dataset.commit_chunk(
                root, result.chunk_id, result.point_ids, result.parts, result.infeasible
            )
            times.append(result.seconds)
            t0 = result.started_at - wall0
            timeline.append((result.worker, t0, t0 + result.seconds, time.time() - wall0))
            bar.update(len(result.point_ids))
    seconds = time.perf_counter() - start
    final = dataset.read_manifest(root)
    return Summary(
        points=len(points),
        skipped=len(points) - len(todo),
        ran=len(todo),
        infeasible=len(final.infeasible),
        rows=final.rows,
        seconds=seconds,
        backend=backend.name,
        workers=backend.workers,
        tasks=len(chunks),
        task_seconds=times,
        timeline=timeline,
    )
