"""Lookahead across arrivals: a window timed as it is planned.

A replica plans count-based, so without times it must end a window at the first plan that an
arrival could change (conservative advance): at light load one or two round trips an arrival.
Where the next arrivals at a replica are known in advance (routed up front: `until` below) and
nothing a span does draws random numbers, the engine can instead time each span as it plans it,
with the sockets' own cost tables (`Predictor`: the same `CostTables` the local backend uses,
pure functions of the program and the step shape, degradation aside), so a window runs through
any number of arrivals: an unsaturated span is cut at the first step boundary at or after the
next arrival, the arrivals by then join the queue, and planning goes on (`Clock`). The sockets
still cost every span and their times are what the tables record; the engine checks that they
equal the times it planned with (WindowExecutor.execute, engine/windows.py), so a window is
exactly what a step-by-step loop would have done.

Where arrivals are known only so far ahead (Dispatcher.known_until: a closed loop routed up
front, whose own completions send its next requests; a pair's pools, engine/disagg/handover.py,
up to their frontiers), the clock plans no span from the time up to which they are (`until`) on, nor
from the least time after one of the replica's own completions that a request it causes can
reach it (`back`). A 2,000-request pair's decode windows (dgx-h100:tp2:9 + sn40l-16:tp8:2)
went from 2,537 to 688 that way, cut before at every hand-over and completion.

Saturated spans (the plan stopped at a limit, so an arrival could not change it) are timed only
when a later plan needs the time, all at once: a saturated run costs nothing more. A replica
left with nothing to run waits for its next arrival within the window (`Clock.idle`: the steps
after it start at the arrival, `resumes`). Windows still end at Replica's MAX_SPANS, MAX_STEPS
and MAX_COMPLETED, and where a span moves KV between tiers (its seconds are the sockets').
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from chip.cost_tables import CostTables, Spans

if TYPE_CHECKING:
    from rdu_cluster.engine.replica import Span

SHORT = 64  # steps up to which Clock.steps times a span in Python rather than numpy
# Steps of a span cut at a time `h` timed or costed first where the replica has no last step
# time (then as many as it takes to h), four times more each round (in_rounds)
FIRST_STEPS = 4


def ends(t0: float, durations: np.ndarray, resumes: Sequence[tuple[int, float]] = ()
         ) -> np.ndarray:
    """Step end times, accumulated one step after another from t0 (a sequential sum, so the
    same steps give the same times however they were grouped into windows or timed).
    `resumes`: (step, time) where the replica, idle, resumed at an arrival: the sum starts
    again from that time at that step, as a new window would."""
    if not resumes:  # most calls: one span timed as it is planned
        out = np.empty(len(durations) + 1)
        out[0], out[1:] = t0, durations
        return np.cumsum(out, out=out)[1:]
    bounds = [(0, t0), *resumes, (len(durations), 0.0)]
    out = np.empty(len(durations))
    for (i, start), (j, _) in itertools.pairwise(bounds):
        seg = np.empty(j - i + 1)
        seg[0], seg[1:] = start, durations[i:j]
        out[i:j] = np.cumsum(seg, out=seg)[1:]
    return out


def in_rounds(span, t0: float, h: float, dt: float | None, run: Callable[[], Any],
              end_of: Callable[[Any], float]) -> Any:
    """run() with the span's steps cut to a first guess (FIRST_STEPS, or as many as a step
    of `dt` seconds takes from t0 to h, and one), then four times more each round, up to
    its planned steps, until the last end (`end_of` the result) is at or after h: the first
    steps of a span cost what they cost as part of it, so only the rounds' sizes change
    (engine/windows.py WindowExecutor._costed, Clock.steps). The span keeps its steps."""
    planned = span.steps
    guess = FIRST_STEPS if not dt else (h - t0) / dt + 1  # (h may lie past any time)
    k = planned if guess >= planned else max(math.ceil(guess), 1)
    try:
        while True:
            span.steps = k
            out = run()
            if k == planned or end_of(out) >= h:
                return out
            k = min(planned, 4 * k)
    finally:
        span.steps = planned


def starts(t0: float, ends: np.ndarray, resumes: Sequence[tuple[int, float]] = ()
           ) -> np.ndarray:
    """Step start times: the previous step's end, or the time the replica resumed."""
    out = np.empty(len(ends))
    if len(ends):
        out[0], out[1:] = t0, ends[:-1]
    for i, t in resumes:
        if i < len(out):
            out[i] = t
    return out


class Predictor:
    """The rows the sockets of a replica will reply for a window of spans, before they run it:
    one `CostTables` per distinct program (shared with the local backend's sockets when given
    its memo, so the tables fill once). Only for sockets that are not degraded: a run with
    faults does not plan ahead (Simulation._can_look_ahead)."""

    def __init__(self, setups: dict, memo: dict | None = None):
        memo = {} if memo is None else memo
        self.of: dict[int, CostTables] = {}
        for s, setup in setups.items():
            key = (setup.chip.name, setup.program.key())
            if key not in memo:
                memo[key] = CostTables(setup.chip, setup.program, setup.comm_time)
            self.of[s] = memo[key]

    def shared(self, sockets: Sequence[int]) -> CostTables | None:
        """The one cost table of sockets that all run the same program, if they do."""
        first = self.of[sockets[0]]
        return first if all(self.of[s] is first for s in sockets) else None

    def replies(self, sockets: Sequence[int], spans: Spans) -> dict[int, tuple]:
        """{socket: (rows, moves, occupancy)} as a backend's `run` returns them, without region
        moves (a window the engine times has none: Replica.plan_window) or occupancies."""
        done: dict[int, np.ndarray]  # id(cost table) -> its rows: each table's window() once
        out, done = {}, {}
        moves = np.zeros(len(spans.kind))
        for s in sockets:
            t = self.of[s]
            rows = done.get(id(t))
            if rows is None:
                rows = done[id(t)] = t.window(spans)
            out[s] = (rows, moves, None)
        return out


class Clock:
    """A window's time while it is planned. `time_of(spans)`: the per-step times of spans (the
    engine combines the predicted replies as it combines the sockets'); `step_times(span)`:
    those of one span as a list (the same floats); `next_arrival()`: when the next request
    reaches the replica (math.inf: none will); `deliver(t)`: queue the requests that reached
    it by t."""

    def __init__(self, t0: float, time_of: Callable[[list], np.ndarray],
                 next_arrival: Callable[[], float], deliver: Callable[[float], None],
                 step_times: Callable[[Span], list[float]] | None = None,
                 until: float = math.inf, back: float = math.inf, dt: float | None = None):
        self.t = t0
        self.dt = dt  # the mean step of the span timed last (steps' guess)
        self.time_of, self._next_arrival, self._deliver = time_of, next_arrival, deliver
        # Where arrivals are known only so far ahead (Dispatcher.known_until): `until`, the
        # time up to which they are (no span is planned from it on but a window's first: the
        # window ends at the first step boundary at or after it), and `back`, the least time
        # from one of the replica's own completions to an arrival it causes there (a closed
        # loop's next request), which brings `until` in.
        self.until, self.back = until, back
        self.step_times = step_times or (lambda span: time_of([span]).tolist())
        self._next: float | None = None  # the next arrival, until requests are delivered
        self.untimed: list = []  # spans run, in order, not timed yet (saturated ones)
        # the predicted step ends of the spans timed so far: arrays, and the ends of the
        # short spans timed since the last array as one list (a window has hundreds of them)
        self.timed: list[np.ndarray] = []
        self.short: list[float] = []
        self.steps_run = 0  # steps planned so far in the window
        self.resumes: list[tuple[int, float]] = []  # (step, time) the replica resumed idle

    def next_arrival(self) -> float:
        """When the next request reaches the replica, or `until`, whichever is first."""
        return min(self._known(), self.until)

    def _known(self) -> float:
        """The next arrival known: it changes only when requests are delivered (nothing else
        adds one while a window is planned: routed up front, and before `until`), so it is
        asked once per delivery, not once per plan."""
        if self._next is None:
            self._next = self._next_arrival()
        return self._next

    def passed(self) -> bool:
        """Whether the clock is at or past `until` (what may arrive next is not known)."""
        return self.until < math.inf and self.now() >= self.until

    def completed(self) -> None:
        """The span planned last completed a request of the replica at its end."""
        if self.back < math.inf:
            self.until = min(self.until, self.now() + self.back)

    def deliver(self, t: float) -> None:
        self._deliver(t)
        self._next = None

    def now(self) -> float:
        """The end of the last span planned (timing those not timed yet, together)."""
        if self.untimed:
            self._passed(ends(self.t, self.time_of(self.untimed)))
            self.untimed = []
        return self.t

    def plan(self, step: Callable[[], Any], later: bool) -> Any:
        """`step()`'s plan, made with the requests that arrived by the clock's time; None
        where a `later` span of the window would start at or past `until`, unless the plan
        is saturated (an arrival could not change it) and the time not needed yet."""
        caught = not self.untimed
        if caught:
            if later and self.passed():
                return None
            self.catch_up()  # the time is known: no plan is made without the arrivals
        plan = step()
        if not caught and not plan.saturated:
            if later and self.passed():
                return None
            if self.catch_up():
                plan = step()  # with the requests just arrived
        return plan

    def catch_up(self) -> bool:
        """Queue the requests that arrived by now; whether there were any."""
        if self._known() > self.now():
            return False
        self.deliver(self.t)
        return True

    def steps(self, span, saturated: bool) -> int:
        """How many of its steps a span runs: all, for a saturated plan (timed later, if
        needed); else up to the first step boundary at or after the next arrival, timed in
        rounds from the mean step of the span timed last (`dt`: in_rounds; timed to its
        planned end, a decode span planned hundreds of steps to its next completion and cut a
        few steps on filled the tables of every context chunk those steps reach: a pair's
        decode pool, 40% more evaluations)."""
        h = self.next_arrival()
        if saturated or h == math.inf:
            self.untimed.append(span)
            n = span.steps
        else:
            t0 = self.now()
            e = in_rounds(span, t0, h, self.dt, lambda: self._ends_to(span, h),
                          lambda out: out[-1])
            n = len(e)
            self.dt = (e[-1] - t0) / n
            self._passed(e)
        self.steps_run += n
        return n

    def _ends_to(self, span, h: float) -> np.ndarray | list[float]:
        """The ends of the span's steps from now, to the first at or after h (or all)."""
        if span.steps <= SHORT:
            # A light-load span runs a few steps to the next arrival: a running sum in Python
            # (the same additions, in the same order, as ends()) without numpy's per-call cost
            t, out = self.now(), []
            for d in self.step_times(span):
                t += d
                out.append(t)
                if t >= h:  # the first step boundary at or after the arrival
                    break
            return out
        e = ends(self.now(), self.time_of([span]))
        return e[: min(span.steps, int(e.searchsorted(h, side="left")) + 1)]

    def idle(self) -> bool:
        """The replica has nothing to run: it waits, within the window, for the next arrival,
        which joins the queue; the steps after it start then. False when none will come
        before `until`."""
        h = self._known()
        if h == math.inf or h >= self.until:
            return False
        self.now()
        self.resumes.append((self.steps_run, h))
        self.t = h
        self.deliver(h)
        return True

    def _passed(self, e: np.ndarray | list[float]) -> None:
        if isinstance(e, list):
            self.short += e
        else:
            if self.short:
                self.timed.append(np.array(self.short))
                self.short = []
            self.timed.append(e)
        self.t = float(e[-1])

    def predicted(self) -> np.ndarray:
        """The predicted ends of the window's first steps (those timed)."""
        parts = self.timed + ([np.array(self.short)] if self.short else [])
        return np.concatenate(parts) if parts else np.zeros(0)
