"""Independent CPU-bound tasks over forked worker processes, results in the tasks' order (so a
run over N processes gives what it gives in one). Forked: the workers start with what this
process has loaded and computed (the catalog, parsed configs, a fit and its row cache), which
a spawned worker would have to rebuild. For the commands' --jobs (validate)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# The work a forked pool's tasks read (map_forked): set before the fork, so it goes along
# without being pickled; cleared afterwards.
_WORK: list[Callable[[Any], Any]] = []


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container or taskset sets
    it), the default of --jobs."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def map_forked(fn: Callable[[T], R], tasks: Sequence[T], jobs: int,
               first: Sequence[int] = ()) -> list[R]:
    """[fn(t) for t in tasks], over `jobs` forked processes (in this one for jobs <= 1 or a
    single task). `first`: indices of tasks to hand out before the rest (the longest, so
    that no long task starts last and keeps one process busy alone at the end)."""
    if jobs <= 1 or len(tasks) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [fn(t) for t in tasks]
    head = list(dict.fromkeys(first))
    rest = set(range(len(tasks))) - set(head)
    order = head + sorted(rest)
    ctx = multiprocessing.get_context("fork")
    _WORK.append(lambda i: fn(tasks[i]))
    try:
        # the pool ends its workers with SIGTERM once the map is done: the default action
        # there, not the CLI's handler (an "aborted" KeyboardInterrupt traceback per worker)
        with ctx.Pool(min(jobs, len(tasks)), initializer=signal.signal,
                      initargs=(signal.SIGTERM, signal.SIG_DFL)) as pool:
            done = dict(zip(order, pool.imap(_run, order, chunksize=1)))
    finally:
        _WORK.pop()
    return [done[i] for i in range(len(tasks))]


def _run(i: int) -> Any:
    return _WORK[-1](i)
