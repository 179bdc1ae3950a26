"""The two pools in one loop: what passes between them (Handover: a request whose prefill ends
goes to a decode replica once its KV is over the fabric, a decode completion sends its closed
loop's next request to the prefill pool), how far ahead each pool's replicas know their
arrivals (Handover.frontier, Handover.returns), and each pool's front end (PrefillSide,
DecodeSide) with the event that deals the prefills through to the decode pool (Dealt)."""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import numpy as np

from rdu_cluster.engine import decided
from rdu_cluster.engine.disagg import prefill_bound
from rdu_cluster.engine.disagg.ports import Ports
from rdu_cluster.engine.dispatch import OWN_COMPLETION, Dispatcher, Pending
from rdu_cluster.engine.events import Arrival, Event
from rdu_cluster.engine.replica import Replica, Window
from rdu_cluster.engine.replica_routing import ReplicaView
from rdu_cluster.engine.requests import DONE, Request
from rdu_cluster.engine.simulation import Simulation


class Handover:
    """What passes between the pools: a request whose prefill ends (or that the prefill pool
    refuses) goes to a decode replica, dealt round-robin as it is sent, once its KV is over
    the fabric; a request the decode pool is through with sends its closed loop's next one
    (Dispatcher._next) to the prefill pool. Hand-overs contend for the ports (Ports): one
    waits while another holds its prefill replica's or its decode replica's ports."""

    PREFILL, DECODE = 0, 1

    def __init__(self, pre: Simulation, dec: Simulation, flows: tuple, nbytes: np.ndarray):
        self.pre, self.dec = pre, dec
        self.senders, self.receivers, self.latency, self.rate = flows
        self.bytes_of = nbytes
        self.move = np.zeros(len(nbytes))  # seconds from prefill end to decode arrival
        self.nbytes = np.zeros(len(nbytes))
        self.ports = Ports()
        self.out: list[tuple[int, Event]] = []
        # prefills through, not dealt yet: (end, id, prefill replica, its decode request, when
        # it was sent)
        self.due: list[tuple[float, int, int | None, Request, float]] = []
        self.alarm = math.inf  # the time of the Dealt event that deals the first of them
        self.known: tuple = (None, -math.inf)  # _known_until's key and value
        self.last_dealt = (-math.inf, -1)  # the (end, id) dealt last
        self.shift: dict[int, float] | None = None  # watched: id -> seconds from send to here
        self.watch: decided.Watch | None = None  # watched: told of each first token
        self.direct: int | None = 0  # the decode replica refusals go to at once (start)
        # told of each hand-over: handover(id, prefill replica, decode replica, its ports'
        # first free time, its arrival, bytes) (a timeline: output/timeline.py)
        self.observers: list = []
        self.least_prefill = 0.0  # the least a prefill step that completes a request takes
        # the least time from a prefill's end to its hand-over's arrival (prefilled: the
        # route's latency and the smallest KV's hold of the ports; a wait for them only adds)
        smallest = float(nbytes.min()) if len(nbytes) else 0.0
        self.least_hold = smallest / (self.senders * self.receivers) / self.rate
        self.least_move = self.latency + self.least_hold

    def start(self) -> None:
        experts, ready = self.dec._routing()
        self.make = functools.partial(self.dec._request, experts=experts, ready=ready)
        self.dec.dispatch._set_up(self.dec.replicas)
        self.blank = [ReplicaView(q.index, (), 0, q.kv.config.capacity_blocks, q)
                      for q in self.dec.replicas]
        # the replica refusals go to at once (prefilled): the first, or none where no request
        # can be refused in either pool
        self.direct = 0 if any(sim.may_refuse() for sim in (self.pre, self.dec)) else None
        self.least_prefill = prefill_bound.least_prefill(self.pre)

    def take(self) -> list[tuple[int, Event]]:
        """What the last event sent to the other pool, and the prefills through that are
        certain to come next in the order of ends (deal): none unknown ends before them. The
        rest are dealt at their ends at the latest (a Dealt event at the first one's)."""
        out, self.out = self.out, []
        if self.due and self.due[0][0] < self._known_until():
            out += [(self.DECODE, e) for e in self.deal(self._known_until(), False)]
        if self.due and self.due[0][0] < self.alarm:
            self.alarm = self.due[0][0]
            out.append((self.DECODE, Dealt(self.alarm)))
        return out

    def prefilled(self, r: Request, t: float, replica: int | None) -> None:
        """r is through the prefill pool at t (on `replica`; None: refused there). Known as
        its prefill window starts, it is dealt at t (deal)."""
        d = self.make(r.id)
        if r.state != DONE:  # refused on arrival at the decode pool too, with its reason
            d.reason = r.reason or "refused by the prefill pool"
            side = cast(DecodeSide, self.dec.dispatch)  # as Disaggregated.run sets it
            self.out.append((self.DECODE, side.handoff(d, t, 0)))
            return
        if (t, r.id) < self.last_dealt:  # dealt out of the order of ends: not canonical
            raise RuntimeError(f"internal error: a prefill ending at {t!r} s is known after one "
                               f"ending at {self.last_dealt[0]!r} s was dealt")
        heapq.heappush(self.due, (t, r.id, replica, d, r.arrival_s))

    def deal(self, until: float, inclusive: bool = True) -> list[Arrival]:
        """The hand-overs whose prefill ended by `until` (before it, not `inclusive`), in the
        order of those ends (then of ids), whatever order their prefill windows started in:
        each to the decode replica dealt round-robin, its KV over the ports from its
        prefill's end."""
        out = []
        if inclusive and until >= self.alarm:  # the Dealt event set for the first end
            self.alarm = math.inf
        while self.due and (self.due[0][0] <= until if inclusive else self.due[0][0] < until):
            t, rid, replica, d, sent = heapq.heappop(self.due)
            self.last_dealt = (t, rid)
            to = self.dec.dispatch.policy.choose(d, self.blank)
            nbytes = float(self.bytes_of[rid])
            hold = nbytes / (self.senders * self.receivers) / self.rate
            begin = self.ports.book((("prefill", replica), ("decode", to)), t, hold, t)
            arrive = begin + self.latency + hold
            self.move[rid], self.nbytes[rid] = arrive - t, nbytes
            for obs in self.observers:
                obs.handover(rid, replica, to, begin, arrive, nbytes)
            if self.shift is not None:
                self.shift[rid] = arrive - sent
            out.append(cast(DecodeSide, self.dec.dispatch).handoff(d, arrive, to))
        return out

    def decoded(self, r: Request, t: float) -> None:
        """r is through the decode pool at t (done or refused): its closed loop goes on."""
        side = cast(PrefillSide, self.pre.dispatch)  # as Disaggregated.run sets it
        self.out += [(self.PREFILL, e) for e in side.follow(r, t)]

    def frontier(self, rep: Replica, decode: bool = False) -> float:
        """The earliest time something not yet known could reach `rep` (of the decode pool
        where `decode`): a replica's next window (the end of its current one, or now if it is
        idle with work), or an arrival already on its way, in the prefill pool (for a decode
        replica but the one refusals go to at once, `direct`: the first, or none where no
        request can be refused, an arrival no earlier than its prefill replica's window ends:
        _prefills_due, and then a prefill step and a hand-over's least time later:
        least_prefill, without chunked prefill, and least_move, a
        transfer's latency and smallest hold, which cut a 2,000-turn sessions pair's 12,547
        windows to 10,884, 10,042 with `direct` and 5,853 with least_prefill; a 2,000-request
        pair's decode windows from 4,035 to 2,533 with least_prefill); in the decode pool the
        same, later by the least think time (_lag):
        what a decode replica does reaches a replica only through a completion's follow-up,
        sent that long after it (a window's completions and hand-overs are known as it
        starts: after_window). Without either, 2,000 turns of 500 sessions over five decode
        replicas ran 23,389 decode windows for 25,368 steps (11,340 with the lag, 7,921 with
        both), each replica's cut at the others' window ends and at every turn sent."""
        h = math.inf
        # to a decode replica refusals do not reach (direct), what the prefill pool does
        # arrives after a hand-over (a request refused goes on at once: prefilled)
        handed = decode and rep.index != self.direct
        # and no earlier than a prefill step after a prefill replica's next window starts
        move = self.least_prefill + self.least_move if handed else 0.0
        # a prefill through but not dealt yet (deal) reaches a decode replica a hand-over's
        # least time after its end, at the earliest
        dealt = self._first_dealt()
        if decode:
            h = dealt
        for sim, later in ((self.pre, move), (self.dec, self._lag() + move)):
            t = (self._prefills_due() if sim is self.pre and handed
                 else _first_pending(sim.dispatch.pending.values()))
            if sim is self.dec:
                t = min(t, dealt)
            t = min(t, _next_windows(sim.replicas, sim.now, rep))
            h = min(h, t + later)
        return h

    def _first_dealt(self) -> float:
        """The earliest a prefill through but not dealt yet reaches the decode pool: its
        end plus a hand-over's least time, added as `deal` adds them (a bound to the bit)."""
        return self.due[0][0] + self.latency + self.least_hold if self.due else math.inf

    def back(self, rep: Replica, decode: bool = False) -> float:
        """The least time from a completion of `rep` (of the decode pool where `decode`) to an
        arrival it causes there (math.inf where nothing is left to send): a decode
        replica's, the frontier's lag and prefill and hand-over; a prefill replica's, a
        hand-over and the lag after it (its decode completion's follow-up)."""
        if not decode:
            return self.least_move + self._lag()
        handed = rep.index != self.direct
        return self._lag() + (self.least_prefill + self.least_move if handed else 0.0)

    def returns(self, rep: Replica) -> float:
        """The earliest a request not known yet could reach prefill replica `rep` of a closed
        loop (its clients' and sessions' requests are routed up front): it follows a decode
        completion not known yet by the least think time (_lag), a completion no earlier
        than a decode replica's next window, a hand-over's arrival or a prefill (of another
        prefill replica, a prefill step and a hand-over's least time after its next window
        starts; this one's own: lookahead.Clock.back)."""
        pre = self.pre
        # the least next window, then the prefill and hand-over added (to the bit: a float
        # sum is monotone in each term, so its least is that of the least window)
        first = _next_windows(pre.replicas, pre.now, rep, pre.dispatch.pending)
        t = min(self._decode_next(), first + self.least_prefill + self.least_move)
        return t + self._lag()

    def _decode_next(self) -> float:
        """The earliest a decode completion not known yet could come: no sooner than a decode
        replica's next window (a window's completions are known as it starts), which takes a
        hand-over no sooner than it arrives or, not dealt yet, could (_first_dealt)."""
        dec = self.dec
        return min(self._first_dealt(), _first_pending(dec.dispatch.pending.values()),
                   _next_windows(dec.replicas, dec.now))

    def _known_until(self) -> float:
        """_first_unknown_end, worked out once a loop time and set of hand-overs not dealt:
        the events of one instant only move it later (a window started, a request arrived),
        so the first value stays a lower bound through them."""
        key = (self.pre.now, len(self.due), self.due[0][0] if self.due else None)
        if key != self.known[0]:
            self.known = (key, self._first_unknown_end())
        return self.known[1]

    def _first_unknown_end(self) -> float:
        """The earliest a prefill not known yet could end: a prefill step (least_prefill)
        after a prefill replica's next window starts with a request to prefill (its current
        window's end where it holds one, now where it is idle with one, else that request's
        arrival). A request not sent yet follows a decode completion not known yet, no
        earlier than a decode replica's next window (a hand-over not dealt yet decodes after
        it arrives), by the least think time (_lag)."""
        pending, now = self.pre.dispatch.pending, self.pre.now
        # one with work starts its next window at its current one's end (busy) or now; one
        # without starts at max(b, min(anywhere, its own next arrival)), b its window's end
        # (busy) or -inf: min(max(b, its own), max(b, anywhere)), so that over them anywhere
        # is asked once, beside the least b (to the bit: comparisons only choose; one pass
        # over the replicas, ~3 a window)
        t = own = least = math.inf
        idle = False
        for q in self.pre.replicas:
            if q.running or q.waiting or q.swapped:
                start = q.window_end if q.busy else now
                t = start if start < t else t
                continue
            idle = True
            arrival = pending[q.index].first
            if q.busy:
                end = q.window_end
                arrival = end if end > arrival else arrival
                least = end if end < least else least
            else:
                least = -math.inf
            own = arrival if arrival < own else own
        if idle:
            anywhere = min(self._decode_next() + self._lag(), pending[None].first)
            t = min(t, own, max(least, anywhere))
        return t + self.least_prefill

    def _prefills_due(self) -> float:
        """The earliest a request on its way to the prefill pool could be handed on to a
        decode replica but `direct`: not before it arrives, nor before its prefill replica's
        current window ends (a window admits nothing mid-way, and its completions are known
        as it starts). A request refused on arrival goes to decode replica 0 at once
        (prefilled), which therefore takes the arrivals as they are where one may be."""
        pending = self.pre.dispatch.pending
        t = pending[None].first  # routed on arrival (a stateful policy)
        for q in self.pre.replicas:
            a = pending[q.index].first
            if q.busy and q.window_end > a:
                a = q.window_end
            t = a if a < t else t
        return t

    def _lag(self) -> float:
        """The least time from a decode completion to the arrival it causes: its closed loop's
        follow-up is sent the follow-up's think time after it (Dispatcher._next; 0 without
        sessions); with nothing left to send, never."""
        d = self.pre.dispatch
        return d.least_think if d.unsent else math.inf

    def prefill_active(self) -> bool:
        """Whether the prefill pool may still hand a request on."""
        d = self.pre.dispatch
        return bool(d.unsent or self.due) or any(d.pending.values()) or any(
            q.busy or q.running or q.waiting or q.swapped for q in self.pre.replicas)


def _next_windows(replicas: list[Replica], now: float, but: Replica | None = None,
                  pending: dict[int | None, Pending] | None = None) -> float:
    """The earliest any of `replicas` (but `but`) can start its next window: its current
    one's end, now where it is idle with work, else its next arrival where `pending` (the
    arrivals to come, by replica) is given (read only then: a prefill replica's every window
    asks this of each other one). One pass of comparisons (they only choose: to the bit);
    the coupled loop asks it several times a window."""
    t = math.inf
    for q in replicas:
        if q is but:
            continue
        if q.busy:
            start = q.window_end
        elif q.running or q.waiting or q.swapped:
            start = now
        elif pending is not None:
            start = pending[q.index].first
        else:
            continue
        t = start if start < t else t
    return t


def _first_pending(pending: Iterable[Pending]) -> float:
    """The earliest arrival to come in any of `pending`."""
    t = math.inf
    for p in pending:
        a = p.first
        t = a if a < t else t
    return t


@dataclass(frozen=True)
class Dealt(Event):
    """The prefills through by now are dealt to the decode pool (Handover.deal): an event of
    the decode pool's, before its windows at the same time start."""

    priority = 0

    def handle(self, sim: Simulation) -> list[Event]:
        side = sim.dispatch
        assert isinstance(side, DecodeSide)
        return list(side.hand.deal(self.time))


class PrefillSide(Dispatcher):
    """The prefill pool's front end: as a pool's (open or closed loop), but a request through
    it goes on to the decode pool, and a closed loop's next request follows the decode
    pool's completion (Handover.decoded)."""

    def __init__(self, policy: str, concurrency: int | None, hand: Handover):
        super().__init__(policy, concurrency)
        self.hand = hand

    def after_window(self, rep: Replica, window: Window, ends: np.ndarray,
                     blocks: np.ndarray) -> list:
        done = sorted(_completed(rep, window, ends))
        if done and self.hand.least_prefill > 0:
            prefill_bound.check_least(self.hand.least_prefill, window, ends,
                                      self.hand.pre.now, [r for _, _, r in done])
        for t, _, r in done:
            self.hand.prefilled(r, t, rep.index)
        if self.hand.watch is not None:  # the waits, as time passes (a window at a time)
            self.hand.watch.check(self.hand.pre.now)
        return []

    def refused(self, r: Request, t: float) -> list:
        self.hand.prefilled(r, t, None)
        return []

    def follow(self, r: Request, t: float) -> list:
        """The requests r (through the decode pool at t) sends (Dispatcher._next)."""
        self.finish[r.id] = t
        out = self._next(r)
        del self.finish[r.id]
        return out

    def next_arrival(self, rep: Replica, now: float) -> float:
        h = super().next_arrival(rep, now)
        return min(h, self.hand.frontier(rep)) if self._unsent_for(rep) else h

    def _bounds(self, rep: Replica) -> tuple[float, float]:
        """A closed loop's next requests are known up to Handover.returns; open loop, all."""
        if self.route is None:
            return math.inf, math.inf
        return self.hand.returns(rep), self.hand.back(rep)


class DecodeSide(Dispatcher):
    """The decode pool's front end: requests arrive as the prefill pool hands them on."""

    def __init__(self, policy: str, concurrency: None, hand: Handover):
        super().__init__(policy, concurrency)
        self.hand = hand

    def handoff(self, r: Request, t: float, replica: int) -> Arrival:
        r.arrival_s = r.ready_s = t
        self.pending[replica].push(t)
        self.replicas[replica].pending += 1
        self._hold(r, t, replica)
        return Arrival(t, r, replica)

    def _bounds(self, rep: Replica) -> tuple[float, float]:
        """Arrivals are known up to the frontier (Handover.frontier); one of the replica's own
        completions sends its client's next request through the prefill pool to it, no sooner
        than the frontier's lag and hand-over after it (Handover.back)."""
        return self.hand.frontier(rep, decode=True), self.hand.back(rep, decode=True)

    def after_window(self, rep: Replica, window: Window, ends: np.ndarray,
                     blocks: np.ndarray) -> list:
        watch = self.hand.watch
        if watch is not None:  # the first tokens of the hand-overs it admits: their TTFTs
            for sp in window.spans:
                for r in sp.received:
                    watch.through(r.id)
            watch.check(self.hand.pre.now)
        # in time order, then id order: arrivals at equal times go in id order (dispatch.py)
        for t, _, r in sorted(_completed(rep, window, ends)):
            self.hand.decoded(r, t)
        return []

    def refused(self, r: Request, t: float) -> list:
        if self.hand.watch is not None:  # no first token: the run misses outright
            self.hand.watch.through(r.id)
        self.hand.decoded(r, t)
        return []

    def next_arrival(self, rep: Replica, now: float) -> float:
        h = min(self.pending[rep.index].first, self.hand.frontier(rep, decode=True))
        # closed loop: its own completion sends a request through the prefill pool to it
        return min(h, OWN_COMPLETION) if self.hand.pre.dispatch.unsent else h

    def more_arrivals(self, rep: Replica) -> bool:
        return bool(self.pending[rep.index]) or self.hand.prefill_active()


def _completed(rep: Replica, window: Window, ends: np.ndarray
               ) -> list[tuple[float, int, Request]]:
    """(time, id, request) of each request the window completes: those the replica completed
    since the engine last took them (Replica.completed: it takes them after the window), not
    a pass over every span's batch."""
    first = window.spans[0].first_step
    return [(float(ends[r.done_step - first]), r.id, r) for r in rep.completed]
