"""The event loop: pop the earliest event, let it handle itself, push what it returns."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

from rdu_cluster.engine.events import Event


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
    while heap:
        now, _, _, event = heapq.heappop(heap)
        sim.now = now
        for e in event.handle(sim):
            push(e)
    return now
