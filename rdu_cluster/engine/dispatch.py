"""The front end of a serving run: how requests are sent (open loop at the trace's arrival
times, or closed loop: `--concurrency N` clients) and to which replica (a routing policy from
engine/replica_routing/), and what that means for how far a replica may plan ahead.

Open loop with a stateless policy (round-robin, the default) routes the whole trace up front:
each replica knows its own next arrival, replicas never interact, and any interleaving of their
windows gives the same tables (the engine's original mode).

Otherwise replicas are coupled in time, and the engine advances conservatively:
- A stateful policy routes a request at its arrival, on each replica's state at that instant.
  Every replica's unsaturated window is cut at the first step boundary at or after the next
  arrival anywhere, so when an arrival is handled each replica has planned at least up to it.
  The view at time t is exact even when a saturated window ran past t: a request counts as
  outstanding until its completion time, and the KV in use is looked up in the step running at
  t of the replica's last window.
- Closed loop (`--concurrency N`, vLLM's --max-concurrency): N clients; request i belongs to
  client i mod N, which sends it when its previous request (i - N) completes or is refused (the
  first N at 0), and not before its trace arrival. With a stateless policy each client is
  pinned to the replica its first request is routed to, so a replica's new arrivals come only
  from its own completions, at the end of one of its spans, and replicas stay independent
  (round-robin by request id is the same pinning when N is a multiple of the replicas). With a
  stateful policy a completion on one replica sends a request anywhere, so an unsaturated window
  is also cut at the earliest time another replica could complete a request not yet known: the
  end of its current window, or now if it is idle with work to schedule. This is exact, and
  costs about one window per step per replica while several replicas decode.
- Sessions (`--sessions`, workloads/sessions.py): a closed loop per session. A turn is sent
  `think_s` after its session's previous turn completes, to the same replica under a stateless
  policy (session affinity: the replica that holds the history in its prefix cache), or where a
  stateful policy routes it. A turn refused takes its session's later turns with it (they are
  sent, and refused, when it is). Both closed loops are "a request sent after the one it
  follows": `--concurrency` is the chain i - N -> i without think time.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import numpy as np

from rdu_cluster.engine import replica_routing
from rdu_cluster.engine.replica import Replica, Window
from rdu_cluster.engine.replica_routing import ReplicaView
from rdu_cluster.engine.requests import DONE, Request
from workloads.errors import ConfigError

if TYPE_CHECKING:
    from rdu_cluster.engine.checkpoint import Checkpoint
    from rdu_cluster.engine.decided import Watch

# Closed loop: a replica's own completion may send a request to it. Spans end at completions,
# so the first span needs no cut, but no unsaturated plan may follow it in the same window: a
# finite horizon beyond any time does exactly that (replica.plan_window).
OWN_COMPLETION = sys.float_info.max
NOT_SERVED = "the previous turn of its session was not served"


class Pending:
    """Arrival times not reached yet, earliest first: those known up front (open loop: a
    sorted array and a cursor, 8 bytes a request, no object per request) and those sent as
    the run goes (closed loop: a heap)."""

    # `first`, the earliest arrival to come (math.inf: none), is the coupled loop's most
    # asked figure (~130 times a window): kept as an attribute, worked out again only where a
    # push or pop moves it, not a method call each time
    __slots__ = ("ahead", "first", "heap", "i", "n")

    def __init__(self, ahead: np.ndarray | None = None):
        self.ahead = np.zeros(0) if ahead is None else ahead
        self.n = len(self.ahead)
        self.i = 0
        self.heap: list[float] = []
        self.first = self._earliest()

    def __bool__(self) -> bool:
        return self.i < self.n or bool(self.heap)

    def push(self, t: float) -> None:
        heapq.heappush(self.heap, t)
        self.first = min(self.first, t)  # an equal one stays behind (as heapq keeps it)

    def pop(self) -> None:
        if self.heap and (self.i >= self.n or self.heap[0] <= self.ahead[self.i]):
            heapq.heappop(self.heap)
        else:
            self.i += 1
        self.first = self._earliest()

    def _earliest(self) -> float:
        if self.i < self.n:
            a = float(self.ahead[self.i])
            return min(a, self.heap[0]) if self.heap else a
        return self.heap[0] if self.heap else math.inf


class Dispatcher:
    route_of: np.ndarray | None  # open loop, routed up front: request -> replica (open_loop)

    def __init__(self, policy: str = replica_routing.DEFAULT, concurrency: int | None = None):
        if concurrency is not None and concurrency < 1:
            raise ConfigError(f"--concurrency: must be a positive number of clients, got "
                              f"{concurrency}")
        self.policy = replica_routing.get(policy)
        self.concurrency = concurrency
        self.coupled = self.policy.stateful
        self.replicas: list[Replica] = []
        self.route: np.ndarray | None = None  # stateless closed loop: request -> replica
        self.pending: dict[int | None, Pending] = {}  # replica (None: any) -> arrivals to come
        self.unsent = 0  # closed loop: requests not sent yet
        self.unsent_to: dict[int | None, int] = {}  # ... by the replica they are pinned to
        self.finish: dict[int, float] = {}  # request id -> when it completed or was refused
        self.outstanding: dict[int, list[Request]] = {}
        # replica -> (ends, kv blocks in use; None where no stateful view reads them)
        self.last: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        # closed loop: the requests each one sends, as ids sorted by the one they follow
        self.chain = np.zeros(0, dtype=np.int64)
        self.chain_key = np.zeros(0, dtype=np.int64)
        self.think_s: np.ndarray | None = None  # sessions: seconds after the previous turn
        self.least_think = 0.0  # the least of think_s still to come (_set_chain)
        self.sessions = False
        # open loop (open_loop): arrivals in time order, the next to make, routes up front
        self.order, self.fed, self.route_of = np.zeros(0, dtype=np.int64), 0, None
        self.make: Callable[[int], Request] | None = None
        self.mine: dict[int, np.ndarray] = {}  # replica -> its requests in arrival order
        self.made: dict[int, Request] = {}  # id -> made for an Arrival event not handled yet
        self.taken: set[int] = set()  # ids taken before their Arrival was handled (`take`)
        # replica -> the requests on their way to it as they are sent (a closed loop, a pair's
        # hand-overs), a heap of (time, order sent, request): the order their Arrival events
        # are handled in, which a window timed as it is planned takes them in (`take`)
        self.held: dict[int, list] = {}
        self.sends = 0
        # replica -> (sends before its last window timed as planned, that window's `until`)
        self.bound: dict[int, tuple[int, float]] = {}
        self.mark = 0  # sends as the window being planned started (known_until)
        self.watch: Watch | None = None  # told of every send (engine/decided.py)
        self.checkpoint: Checkpoint | None = None  # made due by a send (engine/checkpoint.py)

    # -- sending --------------------------------------------------------------------------
    def initial(self, make: Callable[[int], Request], n: int, replicas: list[Replica],
                after: np.ndarray | None = None, think_s: np.ndarray | None = None) -> list:
        """Closed loop: each client's or session's first request (made now: `make(i)` is
        request i); the others are made when the one they follow is through, so a run holds
        the requests in flight, not the trace. `after[i]`: the request i follows in its
        session (-1: none), sent `think_s[i]` after that one completes."""
        self._set_up(replicas)
        self.make = make
        follows = self._follows(n, after)
        self.think_s = think_s if self.sessions else None
        if not self.coupled:  # a stateless policy routes a chain as its first request
            blank = [ReplicaView(q.index, (), 0, q.kv.config.capacity_blocks, q)
                     for q in replicas]
            self.route = np.empty(n, dtype=np.int64)
            for i in range(n):
                p = follows[i]
                self.route[i] = self.policy.choose(make(i), blank) if p < 0 else self.route[p]
        sent_later = self._set_chain(follows)
        self.unsent = int(sent_later.sum())
        later = self.route[sent_later] if self.route is not None else np.zeros(0, np.int64)
        self.unsent_to = ({int(k): int(v) for k, v in zip(*np.unique(later, return_counts=True))}
                          if self.route is not None else {None: self.unsent})
        return [self._send(r, r.arrival_s)
                for r in map(make, np.flatnonzero(~sent_later).tolist())]

    def _set_up(self, replicas: list[Replica]) -> None:
        self.replicas = replicas
        self.outstanding = {rep.index: [] for rep in replicas}
        self.pending = {None: Pending()} | {rep.index: Pending() for rep in replicas}

    def open_loop(self, make: Callable[[int], Request], ready: np.ndarray,
                  replicas: list[Replica]) -> list:
        """Open loop, without a Request per trace row up front: request i is made (`make`)
        when the arrival before it in time is handled, and sent at ready[i]; the arrival times
        still to come wait as one sorted array (per replica under a stateless policy, routed
        up front in id order as `initial` routes them). Arrivals at equal times go in id
        order, as `initial`'s events do. Returns the first arrival."""
        self._set_up(replicas)
        n = len(ready)
        if self.watch is not None:
            self.watch.sent_all(ready)
        self.order = np.argsort(ready, kind="stable")
        self.make, self.ready, self.fed = make, ready, 0
        self.route_of = None
        if self.coupled:
            self.pending[None] = Pending(ready[self.order])
        else:
            blank = [ReplicaView(q.index, (), 0, q.kv.config.capacity_blocks, q)
                     for q in replicas]
            self.route_of = np.fromiter((self.policy.choose(make(i), blank) for i in range(n)),
                                        np.int64, n)
            routed = self.route_of[self.order]
            for q in replicas:
                mine = self.mine[q.index] = self.order[routed == q.index]
                self.pending[q.index] = Pending(ready[mine])
                q.pending = len(mine)
        return self.feed()

    def feed(self) -> list:
        """Open loop (`open_loop`): the next arrival, made now ([] when all are sent, and
        for a closed loop, whose arrivals `_send` makes); one already taken is passed over."""
        from rdu_cluster.engine.events import Arrival

        while self.fed < len(self.order):
            i = int(self.order[self.fed])
            self.fed += 1
            if i in self.taken:
                self.taken.discard(i)
                continue
            r = self.made[i] = self._make(i)
            return [Arrival(r.ready_s, r, None if self.route_of is None else int(self.route_of[i]))]
        return []

    def _make(self, i: int) -> Request:
        r = cast("Callable[[int], Request]", self.make)(i)  # open loop: set by open_loop
        r.arrival_s = r.ready_s = max(r.arrival_s, r.ready_s)
        return r

    def take(self, rep: Replica, t: float) -> list[Request]:
        """Routed up front: the requests that reach `rep` by t, arrived now, ahead of their
        Arrival events (a window timed as it is planned: engine/lookahead.py). Their events
        are passed over: one already made is skipped when handled (`skip`), one not made yet
        (open loop) is never made (`feed`)."""
        if not self.mine:  # sent as the run goes (held)
            return self._take_held(rep, t)
        p, mine, out = self.pending[rep.index], self.mine[rep.index], []
        while p and p.first <= t:
            i = int(mine[p.i])
            p.pop()
            rep.pending -= 1
            r = self.made.pop(i, None) or self._make(i)
            self.taken.add(i)
            rep.arrived(r)
            out.append(r)
        return out

    def _take_held(self, rep: Replica, t: float) -> list[Request]:
        held, out = self.held.get(rep.index), []
        while held and held[0][0] <= t:
            r = heapq.heappop(held)[2]
            self.pending[rep.index].pop()
            rep.pending -= 1
            self.taken.add(r.id)
            rep.arrived(r)
            out.append(r)
        return out

    def _hold(self, r: Request, t: float, replica: int | None) -> None:
        if replica is not None:
            heapq.heappush(self.held.setdefault(replica, []), (t, self.sends, r))
            self.sends += 1

    def _check_held(self, r: Request, replica: int, t: float) -> None:
        """r, held, arrives at t: the first of its replica's, and, where it was sent after
        that replica's window now running was planned, not sooner than that window's
        `until` (what was not known then cannot arrive sooner: known_until)."""
        _, sent, got = heapq.heappop(self.held[replica])
        if got is not r:
            raise RuntimeError(f"internal error: request {r.id} arrived before {got.id}")
        known, until = self.bound.get(replica, (0, -math.inf))
        if sent >= known and t < until and self.replicas[replica].busy:
            raise RuntimeError(f"internal error: request {r.id}, not known as its replica's "
                               f"window was planned to {until!r} s, arrived at {t!r} s")

    def skip(self, r: Request) -> bool:
        """Whether r's Arrival event comes after `take` took it (then it only feeds)."""
        if r.id in self.taken:
            self.taken.discard(r.id)
            return True
        return False

    def _follows(self, n: int, after: np.ndarray | None) -> np.ndarray:
        """The request each one is sent after (-1: sent at its arrival)."""
        if after is not None:
            if self.concurrency is not None:
                raise ConfigError("--concurrency: not with --sessions (a session is its own "
                                  "closed loop)")
            self.sessions = True
            return np.asarray(after, dtype=np.int64)
        c = self.concurrency
        i = np.arange(n, dtype=np.int64)
        return np.where(i >= c, i - c, -1) if c is not None else np.full(n, -1, np.int64)

    def _replica_of(self, i: int) -> int | None:
        """Closed loop: the replica request i is routed to up front (None: at arrival)."""
        return None if self.route is None else int(self.route[i])

    def _send(self, r: Request, t: float):
        from rdu_cluster.engine.events import Arrival

        r.arrival_s = r.ready_s = max(t, r.ready_s)
        if self.watch is not None:
            self.watch.sent(r.ready_s, r.id)
        rep = self._replica_of(r.id)
        self.pending[rep].push(r.ready_s)
        if rep is not None:
            self.replicas[rep].pending += 1
            self._hold(r, r.ready_s, rep)
        return Arrival(r.ready_s, r, rep)

    def arrive(self, r: Request, replica: int | None, t: float) -> Replica:
        """A request arrives at t: its replica (routed now unless routed up front)."""
        if replica is not None and replica in self.held:
            self._check_held(r, replica, t)
        self.made.pop(r.id, None)
        self.pending[replica].pop()
        if replica is not None:
            rep = self.replicas[replica]
            rep.pending -= 1
        else:
            index = self.policy.choose(r, self.views(t))
            if not 0 <= index < len(self.replicas):
                raise ConfigError(f"routing policy {self.policy.name!r} chose replica "
                                  f"{index}; there are {len(self.replicas)}")
            rep = self.replicas[index]
        rep.arrived(r)
        if self.coupled:  # what a stateful policy sees (views)
            self.outstanding[rep.index].append(r)
        return rep

    def views(self, t: float) -> list[ReplicaView]:
        out = []
        for rep in self.replicas:
            live = []
            for r in self.outstanding[rep.index]:
                if self.finish.get(r.id, math.inf) > t:
                    live.append(r)
                else:  # through: no view will see it again
                    self.finish.pop(r.id, None)
            self.outstanding[rep.index] = live
            out.append(ReplicaView(rep.index, tuple(live), self._kv_at(rep, t),
                                   rep.kv.config.capacity_blocks, rep))
        return out

    def _kv_at(self, rep: Replica, t: float) -> int:
        ends, blocks = self.last.get(rep.index, (np.zeros(0), np.zeros(0)))
        # only a stateful policy's views ask, and with one the windows keep their blocks
        # (Simulation.kv_steps)
        if len(ends) and t < ends[-1]:
            return int(cast(np.ndarray, blocks)[int(np.searchsorted(ends, t, side="left"))])
        return rep.kv.used

    # -- what a replica may assume --------------------------------------------------------
    def next_arrival(self, rep: Replica, now: float) -> float:
        """The earliest time a request its plan has not seen could arrive at `rep`."""
        own = OWN_COMPLETION if self._unsent_for(rep) else math.inf
        if not self.coupled:
            return min(self.pending[rep.index].first, own)
        h = min(self.pending[None].first, own)
        if self.unsent:
            for q in self.replicas:
                if q is rep:
                    continue
                if q.busy:
                    h = min(h, q.window_end)
                elif q.running or q.waiting or q.swapped:
                    h = min(h, now)
        return h

    def known_arrival(self, rep: Replica) -> float:
        """The next arrival at `rep` known now (routed up front), which a window timed as it
        is planned takes as it comes (lookahead.Clock)."""
        return self.pending[rep.index].first

    def known_until(self, rep: Replica, now: float) -> tuple[float, float]:
        """How far ahead the arrivals at `rep` are known, and the least time from one of its
        completions to an arrival it causes there (lookahead.Clock's until and back)."""
        self.mark = self.sends
        return self._bounds(rep)

    def _bounds(self, rep: Replica) -> tuple[float, float]:
        """Open loop: every arrival known, none caused. A closed loop routed up front: its
        chains (a client's requests, a session's turns) stay on their first one's replica,
        so what reaches `rep` not known yet follows one of its own completions, by the
        least think time still to come."""
        return math.inf, (self.least_think if self._unsent_for(rep) else math.inf)

    def timed(self, rep: Replica, until: float) -> None:
        """rep's window was timed as it was planned, with the arrivals sent so far, to
        `until` (known_until's, or sooner): one sent later that reaches it sooner, while it
        runs, stops the run (_check_held)."""
        self.bound[rep.index] = (self.mark, until)

    def more_arrivals(self, rep: Replica) -> bool:
        if not self.coupled:
            return rep.pending > 0 or self._unsent_for(rep)
        return bool(self.pending[None]) or self.unsent > 0

    def _unsent_for(self, rep: Replica) -> bool:
        """Closed loop: a request still to be sent may come to this replica (one of its
        clients', or any, with a stateful policy)."""
        return (self.unsent if self.coupled else self.unsent_to.get(rep.index, 0)) > 0

    def plans_hold(self) -> bool:
        """Whether every replica holding a client still has a request of it to send: then
        it plans as it would with more requests to come (engine/checkpoint.py)."""
        if self.route is None or self.concurrency is None:
            return False
        clients = np.unique(self.route[: self.concurrency]).tolist()
        return all(self.unsent_to.get(rep, 0) > 0 for rep in clients)

    def extend(self, make: Callable[[int], Request], n: int) -> None:
        """A closed loop of `--concurrency` clients continued to `n` requests, none of the new
        ones sent yet: each follows its client's request before it, to that one's replica
        (engine/checkpoint.py)."""
        c = self.concurrency
        if self.route is None or c is None or n < len(self.route):
            raise ValueError("only a stateless closed loop of clients continues")
        old = len(self.route)
        follows = self._follows(n, None)
        route = np.empty(n, dtype=np.int64)
        route[:old] = self.route
        for lo in range(old, n, c):  # each block of C follows the one before
            route[lo : lo + c] = route[follows[lo : lo + c]]
        self.route = route
        for k, v in zip(*np.unique(route[old:], return_counts=True)):
            self.unsent_to[int(k)] = self.unsent_to.get(int(k), 0) + int(v)
        self.unsent += n - old
        self._set_chain(follows)
        self.make = make

    def _set_chain(self, follows: np.ndarray) -> np.ndarray:
        """The requests sent after another, as ids sorted by the one they follow (chain,
        chain_key: _next); returns which those are."""
        sent_later = follows >= 0
        self.chain = np.flatnonzero(sent_later)[np.argsort(follows[sent_later], kind="stable")]
        self.chain_key = follows[self.chain]
        think = self.think_s
        # the least time from a completion to the request it sends (0 without sessions)
        self.least_think = (float(np.min(think[self.chain])) if think is not None
                            and len(self.chain) else 0.0)
        return sent_later

    # -- completions ----------------------------------------------------------------------
    def after_window(self, rep: Replica, window: Window, ends: np.ndarray,
                     blocks: np.ndarray) -> list:
        """Record the completion times of the window's requests (and the KV blocks in use at
        each step); closed loop: each completion sends the client's next request."""
        first = window.spans[0].first_step
        self.last[rep.index] = (ends, blocks)
        out = []
        if not (self.coupled or self.unsent):
            return []  # nothing reads completion times: open loop, stateless policy
        done = []
        for sp in window.spans:
            for r in [*sp.decode, *(q for q, _ in sp.prefill)]:
                if r.state == DONE and r.id not in self.finish:
                    self.finish[r.id] = float(ends[r.done_step - first])
                    out += self._next(r)
                    done.append(r.id)
        self._forget(done)
        return out

    def refused(self, r: Request, t: float) -> list:
        self.finish[r.id] = t
        out = self._next(r)
        self._forget([r.id])
        return out

    def _forget(self, ids: list[int]) -> None:
        """Completion times only a stateful policy's views read again (they drop them)."""
        if not self.coupled:
            for i in ids:
                del self.finish[i]

    def _next(self, r: Request) -> list:
        """The requests r sends, made now."""
        out = []
        lo, hi = np.searchsorted(self.chain_key, [r.id, r.id + 1])
        for i in self.chain[lo:hi].tolist():
            cp = self.checkpoint
            if cp is not None and i >= cp.at and not cp.taken:
                cp.due = True
            nxt = cast("Callable[[int], Request]", self.make)(i)  # closed loop: set by initial
            self.unsent -= 1
            self.unsent_to[self._replica_of(i)] -= 1
            if self.sessions and r.state != DONE:  # it needed this turn's answer
                nxt.reason = NOT_SERVED
            delay = float(self.think_s[i]) if self.think_s is not None else 0.0
            out.append(self._send(nxt, self.finish[r.id] + delay))
        return out
