"""Events of the serving simulation. Each handler changes the engine and returns the events that
follow (the event loop owns time and order; handlers never push events themselves).

At equal times, arrivals come first (a request arriving at a step boundary is seen by the
scheduler at that boundary), then faults, then window ends and scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rdu_cluster.engine.faults import Fault
from rdu_cluster.engine.requests import Request

if TYPE_CHECKING:
    from rdu_cluster.engine.simulation import Simulation


@dataclass(frozen=True)
class Event:
    time: float
    priority = 9

    def handle(self, sim: Simulation) -> list[Event]:
        raise NotImplementedError


@dataclass(frozen=True)
class Arrival(Event):
    request: Request
    replica: int | None  # None: routed on arrival (engine/dispatch.py)
    priority = 0

    def handle(self, sim: Simulation) -> list[Event]:
        if sim.dispatch.skip(self.request):  # a window took it as its time passed
            return sim.dispatch.feed()
        rep = sim.dispatch.arrive(self.request, self.replica, self.time)
        sim.finished.arrived(self.request, rep.index)
        out = [*sim.admit_to_queue(rep, self.request), *sim.dispatch.feed()]
        return out if rep.busy else [*out, Schedule(self.time, rep.index)]


@dataclass(frozen=True)
class FaultAt(Event):
    fault: Fault
    priority = 1

    def handle(self, sim: Simulation) -> list[Event]:
        return sim.apply_fault(self.fault)


@dataclass(frozen=True)
class WindowEnd(Event):
    replica: int
    priority = 2

    def handle(self, sim: Simulation) -> list[Event]:
        sim.replicas[self.replica].busy = False
        sim.report_progress()
        return [Schedule(self.time, self.replica)]


@dataclass(frozen=True)
class Schedule(Event):
    replica: int
    priority = 3

    def handle(self, sim: Simulation) -> list[Event]:
        rep = sim.replicas[self.replica]
        if rep.busy:
            return []
        if rep.down_until > self.time:
            return [Schedule(rep.down_until, self.replica)]
        end = sim.execute_window(rep, self.time)
        if end is None:
            return []
        rep.busy = True
        return [WindowEnd(end, self.replica), *sim.take_spawned()]
