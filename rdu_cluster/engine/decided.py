"""A run that stops once its verdict is certain: capacity's verification asks whether the pP
TTFT and TPOT of a run (as engine/bench.py measures them) are within their bounds, and a run
that misses is most of a search's runs (the sessions question: 71% of its engine CPU). Where
enough requests that the statistics will certainly count exceed a bound, the pP exceeds it
whatever the rest of the run does, and the run stops there (`Decided`).

Which requests the statistics count: those completed, after the first `warmup` sent (send
order, ties in request order), and with MSER (--warmup-mser) after a cut the whole run
decides, at most half of the rest (bench.mser_cut: a multiple of 5 within the first half of
the series; TPOT's cut counted in all requests, which is that bound only where every request
has more than one output token: otherwise nothing is certain before the end). A request sent
at s is counted whatever the cut where at least `warmup + cut` requests were sent before s:
at loop time t every send before t is known (a send is made no later than its time), and a
completed request was sent before the window that completes it began, so the sends known
before s, counted as they come, never overstate its rank.

When it is certain: numpy's linear percentile of n values exceeds a bound once the value at
position floor(q (n - 1)) does, that is once n - floor(q (n - 1)) of them exceed it; n is the
count of requests measured, between `requests - warmup - cut` and `requests - warmup`, so the
largest such count over that range decides. The pP is then at least the exceeding value at
that rank (`at_least_ms`). A disaggregated run's requests are sent to the prefill pool and
complete in the decode pool: its TTFT is the decode pool's plus the time from the send to the
hand-over (`completions`' shift).

A TTFT is certain before its request completes: one still waiting for its first token at loop
time t has a TTFT over t - s (Watch.waits). A disaggregated run tells the watch of each first
token (Watch.through: the decode window that admits the hand-over, as it starts) and checks it
as time passes (Watch.check): a pair whose prefill pool, or decode pool, is too small queues
its requests, which were known to miss only as they completed, after every request queued ahead
of them had been served."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from rdu_cluster.engine.bench import MSER_BATCH
from rdu_cluster.engine.metrics import REQUEST_FIELDS
from rdu_cluster.engine.requests import Request

METRICS = ("ttft", "tpot")
EPS = 1e-9  # a value over its bound by less than this is not counted (ms from s, rounding)


_TTFT, _TPOT = REQUEST_FIELDS.index("ttft_s"), REQUEST_FIELDS.index("tpot_s")


class Decided(Exception):
    """The run's pP of `metric` exceeds its bound whatever the rest of the run does; it is at
    least `at_least_ms`."""

    def __init__(self, metric: str, at_least_ms: float, completed: int) -> None:
        super().__init__(f"p {metric} at least {at_least_ms:.1f} ms after {completed} requests")
        self.metric, self.at_least_ms, self.completed = metric, at_least_ms, completed

    def __reduce__(self) -> tuple:  # copied (a kept run's pending decision) and pickled whole
        return Decided, (self.metric, self.at_least_ms, self.completed)


@dataclass
class Watch:
    """Raises Decided at the first completion (with `waits`, or check) after which a bound is
    certainly missed. `bounds`: ms per metric ('ttft', 'tpot'; None: not watched); `percentile`
    the pP; `requests` the run's count, `warmup` the first sent left out, `mser` whether the
    MSER cut follows, `several` whether every request has more than one output token, `waits`
    whether the run tells each first token (`through`) and checks the waits (`check`)."""

    bounds: dict[str, float | None]
    percentile: float
    requests: int
    warmup: int
    mser: bool = False
    several: bool = True
    sends: list[float] = field(default_factory=list)  # every send so far, in time order
    completed: int = 0
    # with `waits`: the sends of the requests without their first token yet, in time order,
    # and each one's send by request id
    waits: bool = False
    waiting: list[float] = field(default_factory=list)
    since: dict[int, float] = field(default_factory=dict)
    # `defer`: the first decision is kept (`pending`) and the run raises it at the end of its
    # event (loop.run_coupled), a state a kept run can go on from (engine/checkpoint.py)
    defer: bool = False
    pending: Decided | None = None

    def __post_init__(self) -> None:
        rest = max(self.requests - self.warmup, 0)
        cut = 0
        if self.mser:  # bench.mser_cut: a multiple of MSER_BATCH within the first half
            cut = (rest // MSER_BATCH) // 2 * MSER_BATCH if self.several else rest
        self.first = self.warmup + cut  # sends before a request that make it counted
        # n - floor(q (n - 1)) never falls as n grows: the largest count measured decides
        q = self.percentile / 100.0
        self.need = max(rest - math.floor(q * (rest - 1)), 1)
        self.limit = {m: b for m in METRICS if (b := self.bounds.get(m)) is not None}
        self.over: dict[str, list[float]] = {m: [] for m in self.limit}  # counted, over

    def sent(self, t: float, rid: int = -1) -> None:
        """Request `rid` is sent at t (closed loop: as the one it follows completes)."""
        if not self.sends or t >= self.sends[-1]:
            self.sends.append(t)
        else:
            bisect.insort(self.sends, t)
        if self.waits:
            self.since[rid] = t
            bisect.insort(self.waiting, t)

    def sent_all(self, times) -> None:
        """Open loop: every send at once (the trace's arrivals, request i's at times[i])."""
        self.sends = sorted(float(t) for t in times)
        if self.waits:
            self.since = dict(enumerate(float(t) for t in times))
            self.waiting = list(self.sends)

    def through(self, rid: int) -> None:
        """Request `rid` has its first token (or was refused, or completed): its TTFT is
        counted as it completes (`done`)."""
        t = self.since.pop(rid, None)
        if t is not None:
            del self.waiting[bisect.bisect_left(self.waiting, t)]

    def check(self, now: float) -> None:
        """At loop time `now`, with every first token before it told (`through`: a window
        tells its first tokens as it starts, and a step takes time): a counted request sent at
        s and still waiting has a TTFT over now - s."""
        over = self.over.get("ttft")
        if over is None or len(self.sends) < max(self.first, 1):
            return
        bound = self.limit["ttft"] * (1.0 + EPS) / 1e3
        # counted: sent after the first `first` sends (ties: bisect_left, as `done` ranks)
        lo = bisect.bisect_right(self.waiting, self.sends[self.first - 1]) if self.first else 0
        hi = bisect.bisect_left(self.waiting, now - bound)
        if hi <= lo or len(over) + hi - lo < self.need:
            return
        values = sorted(over + [(now - s) * 1e3 for s in self.waiting[lo:hi]])
        self._decide(Decided("ttft", values[-self.need], self.completed))

    def done(self, send_s: float, ttft_s: float | None, tpot_s: float | None) -> None:
        """A request sent at send_s completed with these TTFT and TPOT (s; None: none)."""
        self.completed += 1
        if bisect.bisect_left(self.sends, send_s) < self.first:
            return  # it may be left out (warm-up, or the MSER cut)
        for metric, value in (("ttft", ttft_s), ("tpot", tpot_s)):
            over = self.over.get(metric)
            if over is None or value is None:
                continue
            ms = value * 1e3
            if ms > self.limit[metric] * (1.0 + EPS):
                bisect.insort(over, ms)
                if len(over) >= self.need:
                    self._decide(Decided(metric, over[-self.need], self.completed))

    def _decide(self, d: Decided) -> None:
        if not self.defer:
            raise d
        if self.pending is None:
            self.pending = d

    def goes_on(self, old: Watch) -> bool:
        """Whether this watch, of a longer run, takes up `old`'s sends, completions and
        waits where that run's state is this one's (a kept run going on, engine/checkpoint.py)
        and decides as it would have from the start: none of those sends is one it counts
        (so it could not have decided before), with the same bounds and warm-up."""
        return (len(old.sends) < self.first and old.waits and old.bounds == self.bounds
                and (old.percentile, old.warmup, old.mser, old.several)
                == (self.percentile, self.warmup, self.mser, self.several))

    def take_up(self, old: Watch) -> None:
        """`old`'s sends, completions and waits (goes_on), as its own."""
        self.sends, self.completed = list(old.sends), old.completed
        self.waits, self.waiting, self.since = True, list(old.waiting), dict(old.since)


def completions(watch: Watch, shift: dict[int, float] | None = None
                ) -> Callable[[Request, tuple], None]:
    """What a run's Finished calls with each completed request and its row: the request as
    `watch` counts it, sent at its arrival; with `shift` (a disaggregated run's decode pool:
    request id -> seconds from its send to its hand-over), that much earlier."""
    def done(r: Request, row: tuple) -> None:
        watch.through(r.id)  # (a first token not told: its TTFT counted once, here)
        s = shift.pop(r.id) if shift is not None else 0.0
        watch.done(r.arrival_s - s, row[_TTFT] + s, row[_TPOT])
    return done
