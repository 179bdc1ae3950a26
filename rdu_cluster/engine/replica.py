"""A replica: the sockets that serve one copy of the model (a tensor-parallel group, times its
pipeline stages), its scheduler, KV cache and request queues, and the planning of windows.

A window is the set of spans sent to the sockets in one round trip. A span is a run of steps
with a fixed batch composition: a decode span runs until the next completion or the step whose
KV growth no longer fits; a prefill or mixed step is a span of one. Planning is count-based (how
many tokens, which requests), so several spans can be planned before any time is known, as
long as no plan could have been changed by a request arriving meanwhile: every plan after the
first must be saturated (schedulers/__init__.py). The first plan of a window is made with every
request that has arrived by then; if it is not saturated, or a fault is pending, its span is
the only one in the window and is cut at the first step boundary at or after the next arrival
(or fault). This is conservative time advance at step boundaries, with lookahead: the window is
what a step-by-step loop would have done, in one round trip. Where the arrivals are known in
advance, the engine times the spans as they are planned (engine/lookahead.py), and a window
runs through arrivals instead of ending at the first.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain, pairwise
from typing import Protocol

import numpy as np

from chip.cost_tables import DECODE, MIXED, PREFILL, Spans
from rdu_cluster.engine.kv import KVManager
from rdu_cluster.engine.lockstep import Lockstep, bring_all
from rdu_cluster.engine.lookahead import Clock
from rdu_cluster.engine.prefix_cache import Claim, PrefixCache
from rdu_cluster.engine.requests import (
    DONE,
    RUNNING,
    SWAPPED,
    UNSERVED,
    Request,
    decode_batch,
    decode_lockstep,
)
from rdu_cluster.engine.schedulers import Scheduler, StepPlan, View

MAX_SPANS = 2048  # spans per window: bounds a command's size (about 50 bytes a span)
MAX_STEPS = 65536  # steps per window: bounds a result's size (14 rows, ROWS, x 8 bytes a step)
# Requests a window may complete: their rows are recorded once the window's step times are
# back, so this bounds the requests held beyond those in flight (a window timed as it is
# planned can otherwise run through hundreds of arrivals).
MAX_COMPLETED = 256
KV_GROUP = 1 << 18  # (decode, step) cells Window.kv_blocks takes at once (about): 2 MB an array


class Experts(Protocol):
    """CoE residency (rdu_cluster/scenarios/coe.py ExpertResidency): the region ops that bring an expert
    into HBM (empty when it is the one in use or resident), chosen by its replacement policy."""

    def switch_ops(self, expert: int) -> list: ...


@dataclass(slots=True)  # slots: a light-load window holds hundreds of them
class Span:
    kind: int
    steps: int
    first_step: int
    decode: Sequence[Request]  # never changed: a plan's tuple, or a list
    prefill: list[tuple[Request, int]]
    ctx_sum: int = 0
    pre_tokens: int = field(init=False)  # the new tokens its prefills bring
    pre_prefix: int = 0
    running: int = 0
    # (blocks in use, decodes' cached tokens, blocks they hold, decode step, decodes per phase)
    # as it opened: the KV blocks in use at each of its steps follow from these and its steps
    # (Window.kv_blocks). Under Lockstep, the decodes it keeps apart and its phase counts;
    # else every decode, and no phase counts.
    kv_at_open: tuple[int, list[int], list[int], int, tuple[int, ...]] = (0, [], [], 0, ())
    cut_at: float = math.inf  # run up to the first step boundary at or after (conservative)
    tokens: np.ndarray | None = None  # speculative: tokens each decode emits (span of 1 step)
    expert: int = -1  # CoE: the expert the span runs
    switch: bool = False  # CoE: its ops switch the expert in (the request waits for the copy)
    prefix_hit: int = 0  # tokens its admissions found in the prefix cache
    prefix_copy_s: float = 0.0  # seconds to copy the blocks found below HBM up to HBM
    # disaggregated: the hand-overs admitted as it opened, their first token its first step's
    received: Sequence[Request] = ()

    def __post_init__(self) -> None:
        self.pre_tokens = sum([t for _, t in self.prefill]) if self.prefill else 0

    @property
    def emitted(self) -> int:
        """Tokens the decodes of one step of the span emit."""
        return len(self.decode) if self.tokens is None else int(self.tokens.sum())


@dataclass
class Window:
    spans: list[Span]
    ops: list[list]  # ops[i] before span i; ops[-1] after the last
    # (step, time): the replica, idle, resumed at an arrival within the window (lookahead)
    resumes: list[tuple[int, float]] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return sum(s.steps for s in self.spans)

    def per_step(self, f: Callable[[Span], float], dtype=np.int64) -> np.ndarray:
        """f(span) for every step of the window (each span's value repeated over its steps)."""
        sp = self.spans
        if len(sp) == 1:  # light load: most windows are one span
            return np.full(sp[0].steps, f(sp[0]), dtype=dtype)
        return np.repeat(np.fromiter((f(s) for s in sp), dtype=dtype, count=len(sp)),
                         [s.steps for s in sp])

    def kv_blocks(self, block_tokens: int) -> np.ndarray:
        """KV blocks in use during each step of the window (after the step's writes): once a
        window, not once a span, since at light load a window holds hundreds of short spans
        and numpy's cost is in its calls (groups of spans bounded by KV_GROUP elements)."""
        sp = self.spans
        n = np.fromiter((s.steps for s in sp), np.int64, len(sp))
        b = np.fromiter((len(s.kv_at_open[1]) for s in sp), np.int64, len(sp))
        cuts = np.flatnonzero(np.diff(np.cumsum((b + 1) * n) // KV_GROUP)) + 1
        parts = [_kv_per_step(sp[lo:hi], n[lo:hi], b[lo:hi], block_tokens)
                 for lo, hi in pairwise([0, *cuts.tolist(), len(sp)])]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def columns(self) -> Spans:
        # one pass over the spans (hundreds at light load), then a row per column
        rows = np.array([(s.kind, s.steps, len(s.decode), s.ctx_sum, len(s.prefill),
                          s.pre_tokens, s.pre_prefix) for s in self.spans],
                        dtype=np.int64).reshape(-1, 7)
        kind, steps, batch, ctx_sum, pre_seqs, pre_tokens, pre_prefix = rows.T.copy()
        return Spans(kind=kind, steps=steps, batch=batch, ctx_sum=ctx_sum, pre_seqs=pre_seqs,
                     pre_tokens=pre_tokens, pre_prefix=pre_prefix)


@dataclass(frozen=True)
class ReplicaParts:
    """What a replica runs besides its scheduler and KV cache (engine/build.py makes them)."""

    swap_tier: str  # where swap preemption puts KV: the tier below HBM
    speculate: Callable[[int, int, int], np.ndarray] | None = None  # (replica, step, n) -> tokens
    experts: Experts | None = None  # CoE: the experts' residency in HBM
    prefix: PrefixCache | None = None
    lookahead: int = 1  # the most tokens a decode step writes (View.lookahead)


class Replica:
    refused: str  # why it refuses all: set where a failure leaves no plan (engine/recovery.py)

    def __init__(self, index: int, sockets: list[int], scheduler: Scheduler, kv: KVManager,
                 parts: ReplicaParts):
        self.index = index
        self.prefix = parts.prefix
        self.speculate = parts.speculate  # (replica, step, n) -> tokens each of n decodes emits
        self.lookahead = parts.lookahead  # the most tokens a decode step writes
        self.experts = parts.experts
        self.sockets = sockets
        self.scheduler = scheduler
        self.kv = kv
        self.swap_tier = parts.swap_tier
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.swapped: list[Request] = []
        self.requests: list[Request] = []  # arrived here; those through pruned (arrived)
        self.kept = 32  # how many self.requests may hold before it is pruned again
        self.pending = 0  # requests routed here that have not arrived yet
        self.expecting: Callable[[], bool] = lambda: self.pending > 0  # more may arrive
        self.window_end = 0.0  # end of its last (while busy: current) window
        self.step = 0
        self.decode_steps = 0  # its steps with decodes (Request.emits counts them)
        # the policy decodes every decoding sequence at every decode step: a sequence's
        # chunks are one run while it decodes (Request.decoding_since), not one a span
        self.lockstep = bool(getattr(scheduler, "lockstep", False))
        self.stale_decodes = bool(getattr(scheduler, "stale_decodes", False))  # (View.fresh)
        self.decoding = 0  # sequences with such a run open
        # one token a step, too: the decoding sequences in aggregate (engine/lockstep.py)
        self.together = (Lockstep(kv.config.block_tokens)
                         if self.lockstep and parts.speculate is None else None)
        self.busy, self.down_until = False, 0.0  # in a window; failed until (recovery.py)
        self.synced: dict[int, int] = {}  # request id -> KV blocks the sockets hold for it
        self.grows_regions = True  # the sockets' KV regions follow each growth (_sync_growth)
        self.next_ops: list = []  # region ops for the start of the next window
        self.completed: list[Request] = []  # completed since the engine last took them

    # -- planning -----------------------------------------------------------------------
    def view(self) -> View:
        every = self.together if self.decoding == len(self.running) else None  # all decode
        if not self.stale_decodes:
            self._fresh()
        return View(self.running, self.waiting, self.swapped, self.kv, self.expecting(),
                    self.lookahead, every, self.decode_steps, self._fresh)

    def _fresh(self) -> None:
        """Every decoding sequence's counts brought to now (View.fresh)."""
        if self.together is not None:
            bring_all(self.running, self.decode_steps)

    def plan_window(self, horizon_of, clock: Clock | None = None) -> Window:
        """Spans until a time-dependent boundary, MAX_SPANS or MAX_STEPS. `horizon_of(plan)`
        is the time at which the plan could change (math.inf: never).

        With a `clock` (engine/lookahead.py: the window is timed as it is planned), there is
        no such boundary: an unsaturated plan first takes the requests that arrived by the
        clock's time, and its span runs to the first step boundary at or after the next
        arrival; planning goes on, and a replica left with nothing to run waits for the next
        arrival within the window. Only a span whose region moves the clock cannot time (KV
        swapped out or in: their seconds come from the sockets' memory) falls back to the
        conservative rule, and ends the window."""
        spans: list[Span]
        spans, ops = [], [self.next_ops]
        self.next_ops = []
        steps = 0
        follow = None  # the plan that stands after the last span (StepPlan.stands)
        while len(spans) < MAX_SPANS and steps < MAX_STEPS and len(self.completed) < MAX_COMPLETED:
            if follow is not None:
                plan, follow = follow, None
            else:
                got = self._plan(clock, bool(spans))
                if got is None:  # the clock is at its bound: what comes next is not known
                    break
                plan = got
            if plan.empty:
                if spans and clock is not None and clock.idle():
                    continue
                break
            timed = clock is not None and not self._moves(plan)
            horizon = math.inf if timed else horizon_of(plan)
            if horizon < math.inf and spans:
                break
            span = self._open(plan, ops[-1])
            if span is None:
                continue
            spans.append(span)
            if horizon < math.inf:
                span.cut_at = horizon
                ops.append([])
                break
            planned = span.steps
            n = clock.steps(span, plan.saturated) if timed and clock is not None else planned
            done = len(self.completed)
            rest = self.advance(span, n)
            if timed and clock is not None and len(self.completed) > done:
                clock.completed()
            steps += n
            ops.append(self.next_ops)
            self.next_ops = []
            if clock is not None and not timed:
                break  # the clock cannot tell when this span ended
            if plan.stands and n == planned and rest and clock is not None:
                follow = self._follow(plan, rest, clock)
        if not spans:
            self.next_ops = [op for part in ops for op in part]
            return Window([], [])
        ops[-1] = ops[-1] + _sync_growth(self)
        return Window(spans, ops, [] if clock is None else clock.resumes)

    def _plan(self, clock: Clock | None, later: bool = False) -> StepPlan | None:
        if clock is None:
            return self.scheduler.step(self.view())
        return clock.plan(lambda: self.scheduler.step(self.view()), later)

    def _follow(self, plan: StepPlan, rest: Sequence[Request], clock: Clock) -> StepPlan | None:
        """The plan after a span that ran to its end, without asking the scheduler: the same
        decodes less those that completed, where the plan stands (StepPlan.stands), no request
        arrived by the span's end, and each decode's next step fits in the free KV blocks."""
        h = clock.next_arrival()
        # a decode grows by one block at most: a clock never times speculation (lookahead 1)
        if h < math.inf and (clock.untimed or clock.t >= h) or self.kv.free < len(rest):
            return None
        # a standing plan decodes and does nothing else
        return StepPlan(decode=tuple(rest), saturated=plan.saturated, stands=True,
                        expert=plan.expert)

    def _moves(self, plan: StepPlan) -> bool:
        """Whether opening the plan's span moves KV between tiers (swap preemption, swap-in)."""
        return bool(plan.swap_in) or (bool(plan.preempt)
                                      and self.scheduler.limits.preemption == "swap")

    def _open(self, plan: StepPlan, ops: list) -> Span | None:
        """Apply what happens at the start of a span (preemption, swap-in, admission) and make
        the span; None when the plan only preempted."""
        if not (plan.prefill or plan.admit or plan.preempt or plan.swap_in or plan.expert >= 0):
            # a decode plan (two spans in three at light load): nothing to apply
            return self._span(DECODE, plan.decode, [], -1) if plan.decode else None
        for r in plan.preempt:
            self._preempt(r, ops)
        for r in plan.swap_in:
            self._swap_in(r, ops)
        switch = self._switch(plan, ops)
        received = [r for r in plan.admit if r.received is not None]
        hit, copy_s = 0, 0.0
        for r in plan.admit:
            found = self._admit(r, plan.reserve_output, ops)
            hit, copy_s = hit + found.total, copy_s + found.copy_s
            if switch:
                r.switch_step = self.step
        for r in received:  # their KV came with them: they decode from this span
            r.first_token_step = self.step  # the first token a decode step's
            self._start_run(r, self.decode_steps)
        if plan.admit or plan.preempt or plan.swap_in:  # else free blocks are as advance left them
            self._fit_prefix()
        # a plan's decodes are running sequences, less those it preempts
        decode = ([r for r in plan.decode if r.state == RUNNING] if plan.preempt
                  else list(plan.decode)) + list(plan.swap_in) + received
        prefill = plan.prefill
        if received:  # their KV came from a prefill replica: they decode, nothing to prefill
            prefill = tuple(p for p in prefill if p[0] not in received)
            if not prefill:  # no prefill step after all: every running sequence decodes
                every = self.lockstep and self.decoding == len(self.running)  # all have runs
                decode = list(self.running) if every else [r for r in self.running
                                                          if not r.prefilling]
        if not decode and not prefill:
            return None
        kind = MIXED if decode and prefill else (PREFILL if prefill else DECODE)
        span = self._span(kind, decode, list(prefill), plan.expert, switch, hit, copy_s)
        span.received = received
        return span

    def _span(self, kind: int, decode: Sequence[Request], prefill: list[tuple[Request, int]],
              expert: int, switch: bool = False, hit: int = 0, copy_s: float = 0.0) -> Span:
        """The span of these decodes and prefills from this step: a decode span runs to its
        first completion or as far as its KV growth fits."""
        steps = 1
        together = self.together
        if together is not None and decode:
            at = self.decode_steps
            ctx = together.context(at)
            if kind == DECODE:
                steps = max(1, _fit(self.kv, together.count, together.least_remaining(at),
                                    lambda n: together.growth(at, n)))
            cached, held, phases = together.at_open(at)
        else:
            # lists, not arrays: a light-load batch is a dozen sequences, and numpy's cost is
            # in its calls (Window.kv_blocks makes arrays of a whole window's spans at once)
            at, phases = 0, ()
            cached = [r.cached for r in decode]
            have = self.kv.held
            held = [have.get(r.id, 0) for r in decode]
            ctx = sum(cached)
            if kind == DECODE and self.speculate is None:
                limit = min([r.output_len - r.generated for r in decode])  # remaining_output
                growth = _growth(self.kv, cached, held)
                steps = max(1, _fit(self.kv, len(decode), limit, growth))
        span = Span(kind, steps, self.step, decode, prefill, ctx_sum=ctx,
                    pre_prefix=sum([r.cached for r, _ in prefill]) if prefill else 0,
                    running=len(self.running), expert=expert, switch=switch,
                    prefix_hit=hit, prefix_copy_s=copy_s)
        if self.speculate is not None and decode:
            left = np.fromiter((r.remaining_output for r in decode), np.int64, len(decode))
            span.tokens = np.minimum(self.speculate(self.index, self.step, len(decode)), left)
        span.kv_at_open = (self.kv.used, cached, held, at, phases)
        return span

    def _switch(self, plan: StepPlan, ops: list) -> bool:
        """CoE: bring the plan's expert into HBM first (region ops at the span's start)."""
        if self.experts is None or plan.expert < 0:
            return False
        switch = self.experts.switch_ops(plan.expert)
        ops += switch
        return bool(switch)

    # -- state changes ------------------------------------------------------------------
    def advance(self, span: Span, steps: int) -> Sequence[Request]:
        """The span ran `steps` steps: move tokens, record completions, grow the KV cache.
        Returns its decodes that did not complete."""
        span.steps = steps
        last = span.first_step + steps - 1
        prefilled = [r for r, _ in span.prefill]
        d0 = self.decode_steps
        if self.lockstep and span.decode and len(span.decode) != self.decoding:
            raise RuntimeError(f"replica {self.index}: a lockstep policy decodes "
                               f"{len(span.decode)} of {self.decoding} decoding sequences")
        together = self.together
        if together is not None and span.decode:  # before a prefill here joins the batch
            self.kv.used += together.growth(d0, steps)
        for r, tokens in span.prefill:
            before = r.generated
            r.prefill(tokens, span.first_step)
            if r.generated > before:
                r.emit_prefill(self.index, span.first_step)
                if r.state == RUNNING:  # it decodes from the next decode step on
                    self._start_run(r, d0 + (steps if span.decode else 0))
            if self.prefix is not None and not r.prefilling:
                self.prefix.computed(r, r.cached)
        if not span.decode:  # a prefill step
            done: Sequence[Request] = ()
        elif span.tokens is None and together is not None:  # those completing, from the heap
            done = together.due(d0 + steps, span.decode)
            for r in done:
                r.state, r.done_step = DONE, last
        elif span.tokens is None:
            done = (decode_lockstep(span.decode, steps, span.first_step) if self.lockstep
                    else decode_batch(span.decode, steps, span.first_step, self.index, d0))
        else:
            for r, t in zip(span.decode, span.tokens.tolist()):
                r.decode_speculative(t, last)
                if not self.lockstep:
                    r.emit(self.index, d0 + steps - 1, 1)
            done = [r for r in span.decode if r.state == DONE]
        if span.decode:
            self.decode_steps = d0 + steps
            if together is not None and together.apart:
                together.settle(self.decode_steps)
        for r in done:
            self._finish(r)
        for r in prefilled:
            if r.state == DONE:
                self._finish(r)
        rest = _left(span.decode, done) if done else span.decode
        if rest and together is None:
            self.kv.grow(rest)
        if prefilled:
            self.kv.grow([r for r in prefilled if r.state != DONE])
        self.step += steps
        self._fit_prefix()
        return rest

    def _start_run(self, r: Request, decode_step: int) -> None:
        """Under a lockstep policy, r decodes in every decode step from `decode_step` on."""
        if self.lockstep:
            r.decoding_since = decode_step
            self.decoding += 1
            if self.together is not None:
                self.together.join(r, decode_step, self.kv.held.get(r.id, 0))

    def _end_run(self, r: Request) -> None:
        """r stops decoding here: its run of decode steps joins its chunks (Request.emits)."""
        if r.decoding_since >= 0:
            n = self.decode_steps - r.decoding_since
            if n:
                r.emits.append((self.index, r.decoding_since, n))
            r.decoding_since = -1
            self.decoding -= 1
            if self.together is not None:
                self.together.leave(r, self.decode_steps)
                self.kv.record(r)

    def _fit_prefix(self) -> None:
        if self.prefix is not None:
            self.prefix.fit(self.kv.free)

    def _admit(self, r: Request, reserve_output: bool, ops: list) -> Claim:
        self.waiting.remove(r)
        r.admit(self.step)
        if r.received is not None:  # disaggregated: the prompt's KV arrived with it
            r.cached = r.target = r.received
            r.received = None
            found = Claim()
        else:
            found = self._claim(r)
        tokens = r.prompt_len + (r.output_len if reserve_output else r.generated)
        self.kv.set(r, tokens)
        self.running.append(r)
        blocks = self.kv.held[r.id]
        ops.append(["alloc", f"kv/{r.id}", "hbm", blocks * self.kv.config.block_bytes, "kv"])
        self.synced[r.id] = blocks
        return found

    def _claim(self, r: Request) -> Claim:
        """The prefix cache's blocks of r's prompt: r starts with them cached."""
        r.admitted_tokens += r.target
        if self.prefix is None:
            return Claim()
        found = self.prefix.claim(r)
        r.cached = found.total
        r.prefix_copy_s += found.copy_s
        for tier, n in found.tokens.items():
            r.prefix_tokens[tier] = r.prefix_tokens.get(tier, 0) + n
        return found

    def _finish(self, r: Request) -> None:
        self._end_run(r)
        self.completed.append(r)
        self.running.remove(r)
        self.kv.release(r)
        if self.prefix is not None:
            self.prefix.release(r, r.cached)
        if self.synced.pop(r.id, None) is not None:
            self.next_ops.append(["free", f"kv/{r.id}"])

    def _preempt(self, r: Request, ops: list) -> None:
        self._end_run(r)
        self.running.remove(r)
        blocks = self.kv.release(r)
        if self.prefix is not None:
            self.prefix.release(r, r.cached)
        name = f"kv/{r.id}"
        if self.scheduler.limits.preemption == "swap":
            r.preempt_swap()
            self.swapped.append(r)
            ops += [["resize", name, blocks * self.kv.config.block_bytes],
                    ["move", name, self.swap_tier]]
            self.synced[r.id] = blocks
        else:
            r.preempt_recompute()
            self.waiting.appendleft(r)
            if self.synced.pop(r.id, None) is not None:
                ops.append(["free", name])

    def _swap_in(self, r: Request, ops: list) -> None:
        self.swapped.remove(r)
        r.state = RUNNING
        self.kv.set(r, r.cached)
        self._start_run(r, self.decode_steps)
        self.running.append(r)
        ops.append(["move", f"kv/{r.id}", "hbm"])

    # -- faults -------------------------------------------------------------------------
    def drop_all_kv(self) -> None:
        """The group lost a socket: every cached sequence goes back to the queue, to be
        recomputed (its KV shards on the failed socket are gone)."""
        victims = list(self.running) + list(self.swapped)
        for r in victims:
            self._end_run(r)
            self.kv.release(r)
            r.preempt_recompute()
        if self.prefix is not None:
            self.prefix.clear()
        self.running.clear()
        self.swapped.clear()
        self.waiting = deque(sorted(victims + list(self.waiting), key=_order))
        self.synced.clear()
        self.next_ops = []

    def arrived(self, r: Request) -> None:
        """A request routed here arrived. Those through are pruned from the list as it
        doubles, so it holds about the requests in flight, not the trace."""
        self.requests.append(r)
        if len(self.requests) > 2 * self.kept:
            self.requests = [q for q in self.requests if q.state not in (DONE, UNSERVED)]
            self.kept = max(len(self.requests), 32)

    def refuse_all(self, reason: str) -> list[Request]:
        """Refuse every request here not through yet; returns them."""
        out = []
        for r in self.requests:
            if r.state not in (DONE, UNSERVED):
                self._end_run(r)
                r.state, r.reason = UNSERVED, reason
                out.append(r)
        self.running.clear()
        self.waiting.clear()
        self.swapped.clear()
        return out


def _sync_growth(rep: Replica) -> list:
    """Resize the sockets' KV regions to the blocks `rep` now holds, once a window (without
    grows_regions only the blocks held: engine/simulation.py summary_only). Without region ops
    to send, a lockstep batch's entries are left as they are (its growth is counted in
    `used`): KVManager.blocks reads a decoding sequence's blocks from its cached tokens, its
    entry is brought up to date as its run ends (Replica._end_run), and every other running
    sequence's entry grows with its spans (Replica.advance)."""
    if rep.together is not None:
        if not rep.grows_regions:
            return []
        bring_all(rep.running, rep.decode_steps)  # (Lockstep.bring)
    out: list = []
    kv = rep.kv
    bb, bt = kv.config.block_bytes, kv.config.block_tokens
    held, synced, grows = kv.held, rep.synced, rep.grows_regions
    for r in rep.running:  # KVManager.record, inline: once a window per running request
        rid = r.id
        blocks, need = held.get(rid, 0), -(-r.cached // bt)
        if need > blocks and rid in held:
            blocks = held[rid] = need
        if grows and synced.get(rid) != blocks:
            out.append(["resize", f"kv/{rid}", blocks * bb])
            synced[rid] = blocks
    return out


def _left(decode: Sequence[Request], done: Sequence[Request]) -> list[Request]:
    """The decodes of a span less those that completed in it, in order. A span runs to its
    first completion, so those are a few of a batch of hundreds: removing each (a scan in C)
    is cheaper than a pass testing every decode's state (2% of a pair's run)."""
    if 8 * len(done) > len(decode):
        return [r for r in decode if r.state != DONE]
    rest = list(decode)
    for r in done:
        rest.remove(r)
    return rest


def _fit(kv: KVManager, decodes: int, limit: int, growth: Callable[[int], int]) -> int:
    """The most steps (up to `limit`) whose KV growth (`growth(n)` blocks in n steps) fits
    in the free blocks of `kv`."""
    free = kv.free
    # A sequence holds the blocks of its cached tokens (KVManager.grow after every span),
    # so n more tokens take at most ceil(n / bt) more blocks: at light load, a bound
    # that settles most spans without counting.
    if decodes * -(-limit // kv.config.block_tokens) <= free or growth(limit) <= free:
        return limit
    lo, hi = 0, limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if growth(mid) <= free else (lo, mid)
    return lo


def _growth(kv: KVManager, cached: list[int], held: list[int]) -> Callable[[int], int]:
    """Blocks n steps of decodes holding (cached, held) take, a pass over them (Lockstep
    counts them in aggregate)."""
    bt = kv.config.block_tokens
    return lambda n: sum([max(0, -(-(c + n) // bt) - h) for c, h in zip(cached, held)])


def _kv_per_step(spans: list[Span], n: np.ndarray, b: np.ndarray, bt: int) -> np.ndarray:
    """The blocks in use at each step of consecutive spans (`n` steps, `b` decodes listed
    each): those in use as a span opened, plus the blocks its decodes' cached tokens have grown
    past what they held then (a decode writes one token a step), those listed one by one and
    those counted by phase (Lockstep) together."""
    out = np.repeat(np.fromiter((sp.kv_at_open[0] for sp in spans), np.int64, len(spans)), n)
    counted = [i for i, sp in enumerate(spans) if sp.kv_at_open[4]]
    if counted:
        out += _phase_growth(spans, counted, n, bt)
    if not b.any():
        return out
    cells = int(b.sum())
    cached = np.fromiter(chain.from_iterable(sp.kv_at_open[1] for sp in spans), np.int64, cells)
    held = np.fromiter(chain.from_iterable(sp.kv_at_open[2] for sp in spans), np.int64, cells)
    reps = np.repeat(n, b)  # each decode's steps in its span
    first = np.repeat(np.cumsum(n) - n, b)  # its span's first step in the group
    k = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)  # 0, 1, ...
    extra = np.maximum(0, -(-(np.repeat(cached, reps) + k + 1) // bt) - np.repeat(held, reps))
    grown = np.bincount(np.repeat(first, reps) + k, weights=extra, minlength=len(out))
    return out + grown.astype(np.int64)


def _phase_growth(spans: list[Span], counted: list[int], n: np.ndarray, bt: int) -> np.ndarray:
    """The blocks taken by step k of each span in `counted` and the steps before it in the span
    (the growth of the decodes it counts by phase): at decode step D, those of phase -D mod bt."""
    phases = np.array([spans[i].kv_at_open[4] for i in counted], dtype=np.int64)
    m = n[counted]
    at = np.fromiter((spans[i].kv_at_open[3] for i in counted), np.int64, len(counted))
    k = np.arange(int(m.sum())) - np.repeat(np.cumsum(m) - m, m)  # step within its span
    taken = phases[np.repeat(np.arange(len(counted)), m), -(np.repeat(at, m) + k) % bt]
    total = np.cumsum(taken)
    within = total - np.repeat(total[np.cumsum(m) - m] - taken[np.cumsum(m) - m], m)
    out = np.zeros(int(n.sum()), dtype=np.int64)
    first = np.cumsum(n) - n  # each span's first step in the group
    out[np.repeat(first[counted], m) + k] = within
    return out


def _order(r: Request) -> tuple:
    return (r.arrival_s, r.id)


__all__ = ["SWAPPED", "Replica", "ReplicaParts", "Span", "Window"]
