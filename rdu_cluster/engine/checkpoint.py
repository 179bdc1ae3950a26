"""A closed-loop run kept where it can go on as a run of more requests.

Capacity's verification serves a row again with twice the requests until its figures settle
(scenarios/capacity/steady.py: settle). A closed loop of N requests and one of 2N over the
same clients are the same run until the first request past the N-th is sent: request i
follows i - C (C clients), so the two part ways at the first completion of a request numbered
N - C or more.
Every request up to then is one of the first N, sent at the same time in both, and a replica
plans the same windows in both while each of its clients has a request still to send (what it
may assume: engine/dispatch.py, which this checks as it keeps the state). So the state at the
end of the event that sends request N - C (or the first above it) is the longer run's too, an
event before the two differ: `Checkpoint` keeps a copy of it there. The longer run goes on from
the copy once its trace is continued (Disaggregated.continued: the new requests' rows and the
per-request arrays), and gives the tables a run of 2N from the start gives (tests compare them
bit for bit), without the first N - C requests' windows.

The copy shares what no run changes (the cost tables: a pure function of the chip and program,
backends/local.py) and copies the rest (copy.deepcopy, with the classes that hold an identity
or a file copying themselves: LocalBackend, engine/spill.py, and a Request field by field, the
most numerous object: question 1 of benchmarks/bench_capacity.py, 16 copies 1.04 -> 0.72 s;
a Finished shares its rows handed on, tuples no run changes: question 2's 66 copies 13.4 ->
1.7 s).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chip.cost_tables import CostTables


@dataclass
class Checkpoint:
    """Made due (`due`) by the dispatcher as it sends request `at` or a later one; taken at the
    end of that event (loop.run_coupled), where the replicas' plans then hold for the longer
    run (`holds()`: Dispatcher.plans_hold)."""

    at: int
    holds: Callable[[], bool]
    due: bool = False
    taken: bool = False
    state: tuple[Any, list, int] | None = field(default=None, repr=False)  # owner, queue, count

    def take(self, state: tuple[Any, list, int], shared: list[object]) -> None:
        """Keep a copy of `state` (the objects in `shared` not copied: each is the same object
        in the copy), once."""
        self.due, self.taken = False, True
        if self.holds():
            self.state = copied(state, shared)


def copied(state: Any, shared: list[object]) -> Any:
    """A deep copy of `state` sharing `shared` and every CostTables it reaches."""
    memo: dict[int, object] = {id(x): x for x in shared}
    return copy.deepcopy(state, memo)


def shared_tables(backends: list[object]) -> list[CostTables]:
    """The cost tables the backends' sockets hold (a process-wide memo: backends/local.py)."""
    out: list[CostTables] = []
    for b in backends:
        out += list(getattr(b, "memo", {}).values())
        out += [s.tables for s in getattr(b, "sockets", {}).values()]
    return out
