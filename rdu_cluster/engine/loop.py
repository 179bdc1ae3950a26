"""The event loop: pop the earliest event, let it handle itself, push what it returns."""

from __future__ import annotations

import contextlib
import gc
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence

from rdu_cluster.engine import allocator
from rdu_cluster.engine.checkpoint import Checkpoint
from rdu_cluster.engine.events import Event

# The loop makes and drops many small objects (spans, plans, lists) and next to no reference
# cycles, which reference counting alone cannot free. CPython collects its youngest generation
# every 700 net allocations of such objects by default, and its full collections walk every
# object alive: at light load that was a fifth of a run's time (bench_serve.py --light). While
# the loop runs, the youngest generation is collected every GC_THRESHOLD allocations instead,
# and the objects that existed before it (model, trace, cost tables) are left out of the walks
# (gc.freeze); both are restored when it returns. Results do not depend on either. Before the
# freeze, one full collection: the garbage cycles of an earlier run (a finished simulation)
# would otherwise be frozen with the live objects and outlive every later run of a sweep (a
# 54-point serve sweep grew ~20 MB a point; flat with it).
GC_THRESHOLD = 100_000  # youngest-generation allocations between collections (vs 700)
_scopes = 0  # frozen() scopes open in this process (and the process it was forked from)


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """The objects alive on entry left out of the collector's walks for the scope (gc.freeze),
    after one full collection; where a caller froze already, its frozen objects stay as they
    are and nothing is done. A caller that runs many simulations (capacity's candidates,
    validate's rows) freezes once around them: each run otherwise collects the whole process
    at its start, 36 ms a run with capacity's caches about (about 380 of the Llama 3.1 70B
    question's systems' runs)."""
    global _scopes
    # gc.get_freeze_count walks the frozen objects: 16 ms a run inside a capacity candidate's
    # scope (4.2 of the sessions question's ~120 s of profiled CPU), where the count kept
    # here says as much
    if _scopes or gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    _scopes += 1
    try:
        yield
    finally:
        _scopes -= 1
        gc.unfreeze()


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    old = gc.get_threshold()
    with frozen():
        gc.set_threshold(max(old[0], GC_THRESHOLD), *old[1:])
        try:
            yield
        finally:
            gc.set_threshold(*old)


def run(sim, events: Iterable[Event]) -> float:
    """Run to the last event; returns the time of the last one. Ties break by event priority,
    then by insertion order, so a run is deterministic."""
    heap: list = []
    order = itertools.count()

    def push(e: Event) -> None:
        heapq.heappush(heap, (e.time, e.priority, next(order), e))

    for e in events:
        push(e)
    now = 0.0
    allocator.keep_freed_memory()
    with _fewer_collections():
        while heap:
            now, _, _, event = heapq.heappop(heap)
            sim.now = now
            for e in event.handle(sim):
                push(e)
    return now


def run_coupled(sims: Sequence, events: Iterable[tuple[int, Event]],
                handed: Callable[[], list[tuple[int, Event]]],
                checkpoint: Checkpoint | None = None, owner: object = None,
                shared: Callable[[], list] = list, resume: tuple[list, int] | None = None,
                pending: Callable[[], Exception | None] | None = None) -> float:
    """Simulations that feed each other (engine/disagg/: a prefill pool and a decode pool)
    run in one time order: an event is (index of its simulation, event); after each one,
    `handed()` gives the events its handler made for another simulation. Ties break as in
    `run`, then by insertion order across the simulations. With a `checkpoint`, the state
    (`owner`, the event queue and its count: what `resume` takes to go on) is copied at the
    end of the event that makes it due (engine/checkpoint.py; `shared()`: what is not).
    `pending()`: a decision the run made in the event (engine/decided.py, Watch.defer), raised
    at its end; before the state is the longer run's no more, a checkpoint not yet taken is
    taken there (a run stopped before it is due: the longer run's state too)."""
    heap, order = resume if resume is not None else ([], 0)

    def push(i: int, e: Event) -> None:
        nonlocal order
        heapq.heappush(heap, (e.time, e.priority, order, i, e))
        order += 1

    for i, e in events:
        push(i, e)
    now = 0.0
    allocator.keep_freed_memory()
    with _fewer_collections():
        while heap:
            now, _, _, i, event = heapq.heappop(heap)
            for sim in sims:
                sim.now = now
            for e in event.handle(sims[i]):
                push(i, e)
            for j, e in handed():
                push(j, e)
            if checkpoint is not None and checkpoint.due:
                checkpoint.take((owner, heap, order), shared())
            stop = None if pending is None else pending()
            if stop is not None:
                if checkpoint is not None and not checkpoint.taken:
                    checkpoint.take((owner, heap, order), shared())
                raise stop
    return now
