"""Independent CPU-bound tasks over forked worker processes, results in the tasks' order (so a
run over N processes gives what it gives in one). Forked: the workers start with what this
process has loaded and computed (the catalog, parsed configs, a fit and its row cache), which
a spawned worker would have to rebuild. For the commands' --jobs (validate, calibrate)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

# The work a forked pool's tasks run: set before the fork, so it goes along without being
# pickled (a closure over this process's objects); a pool's entry stays while it runs.
_WORK: dict[int, Callable[[int], Any]] = {}


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container or taskset sets
    it), the default of --jobs."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


class Pending:
    """Tasks under way; `get()` waits for them: their results in the tasks' order."""

    def __init__(self, get: Callable[[], list]):
        self.get = get


@contextlib.contextmanager
def started(fn: Callable[[Any], Any], tasks: Sequence[Any], jobs: int,
            first: Sequence[int] = (),
            done: Callable[[int, Any], None] | None = None) -> Iterator[Pending]:
    """[fn(t) for t in tasks] under way over `jobs` forked processes while the caller goes on
    with other work in this one (sharing the cores with them). `first`: indices of tasks to
    hand out before the rest (the longest: none should start last and keep one process busy
    alone at the end). `done(i, result)`: called here as each task ends (in `get()`, in the
    order they end: a progress bar, or what a task computed taken in here). With jobs <= 1 or
    one task they run here, now, and so they do in a process that has joined Ray (below). The
    workers end with the block, done or not: fork the next pool after it (a fork while a
    pool's threads run copies their locks)."""
    if jobs <= 1 or len(tasks) <= 1 or "fork" not in multiprocessing.get_all_start_methods() \
            or _joined_ray():
        out = []
        for i, t in enumerate(tasks):
            out.append(fn(t))
            if done is not None:
                done(i, out[-1])
        yield Pending(lambda: out)
        return
    head = list(dict.fromkeys(first))
    order = head + sorted(set(range(len(tasks))) - set(head))
    key = max(_WORK, default=0) + 1
    _WORK[key] = lambda i: fn(tasks[i])
    pool = multiprocessing.get_context("fork").Pool(min(jobs, len(tasks)),
                                                    initializer=_worker_signals)
    results: dict[int, Any] = {}
    try:
        ended = pool.imap_unordered(_run, [(key, i) for i in order], chunksize=1)

        def get() -> list:
            for i, result in ended:
                results[i] = result
                if done is not None:
                    done(i, result)
            return [results[i] for i in range(len(tasks))]

        yield Pending(get)
    finally:
        del _WORK[key]
        # Every result taken: the workers are let go as the pool ends them when it is done
        # (each takes an end-of-work message and exits). Pool.terminate instead holds the
        # task queue's lock for good and relies on SIGTERM reaching every worker: once, in a
        # test process, a worker that it did not end waited on that lock, and the join on it
        # hung the suite. Terminated only when the block ends with tasks under way.
        if len(results) == len(tasks):
            pool.close()
        else:
            pool.terminate()
        pool.join()


def map_forked(fn: Callable[[Any], Any], tasks: Sequence[Any], jobs: int,
               first: Sequence[int] = (),
               done: Callable[[int, Any], None] | None = None) -> list:
    """[fn(t) for t in tasks] over `jobs` forked processes (`started`, waited for)."""
    with started(fn, tasks, jobs, first, done) as pending:
        return pending.get()


def _joined_ray() -> bool:
    """Whether this process has joined Ray: its threads (gRPC's among them, which does not
    support fork by default) hold locks a forked child would copy held."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(getattr(ray, "is_initialized", lambda: False)())


def _worker_signals() -> None:
    """The pool ends its workers with SIGTERM once the block is done: the default action
    there, not the CLI's handler (an "aborted" KeyboardInterrupt traceback per worker). A
    Ctrl-C reaches the whole process group: the command ends its workers itself."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(task: tuple[int, int]) -> tuple[int, Any]:
    key, i = task
    return i, _WORK[key](i)
