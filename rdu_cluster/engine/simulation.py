"""The serving simulation: builds the sockets of a plan on a backend, routes a trace over the
replicas, runs the event loop and assembles the tables.

Layers: entities (requests.py, replica.py), policies (schedulers/), the time predictor (the
sockets' cost tables, chip/cost_tables.py, over the chip's execution model), the event loop
(loop.py, events.py) and metrics (metrics.py). Which request goes to which replica, and when closed
loops (clients, sessions) send the next one: engine/dispatch.py. Prefix caching:
engine/prefix_cache/, one cache per replica.

The Simulation holds the run's state and sends each concern to its part:
- set-up (engine/build.py): the replicas' layouts, socket programs, memory and KV cache;
- window execution (engine/windows.py): plan, run and cut a replica's window, with its step
  times combined from the sockets' replies (engine/step_times.py) and recorded
  (engine/record.py);
- faults (engine/recovery.py): degraded and failed sockets and links, re-planning;
- results (engine/summary.py): the tables and the summary.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from chip.cost_tables import DECODE, MIXED, PREFILL, ROWS
from partitioning.cluster import ClusterSpec
from rdu_cluster.backends import Backend
from rdu_cluster.backends.messages import Router
from rdu_cluster.engine import (
    bench,
    energy,
    lookahead,
    loop,
    metrics,
    replica_routing,
    schedulers,
    summary,
)
from rdu_cluster.engine import plan as plans
from rdu_cluster.engine.build import Build
from rdu_cluster.engine.dispatch import Dispatcher
from rdu_cluster.engine.events import Event, FaultAt
from rdu_cluster.engine.expert_loads import ExpertLoadSampler
from rdu_cluster.engine.faults import Fault
from rdu_cluster.engine.finished import Finished
from rdu_cluster.engine.kv import BLOCK_TOKENS
from rdu_cluster.engine.prefix_cache import PrefixConfig
from rdu_cluster.engine.record import WindowRecorder
from rdu_cluster.engine.recovery import Recovery
from rdu_cluster.engine.replica import Replica
from rdu_cluster.engine.requests import UNSERVED, Request
from rdu_cluster.engine.step_times import StepTimes
from rdu_cluster.engine.summary import Tables
from rdu_cluster.engine.windows import WindowExecutor
from rdu_cluster.scenarios import coe
from workloads.spec import ModelSpec, MoESpec
from workloads.speculative import Speculation
from workloads.traces import Trace


@dataclass(frozen=True)
class ServeConfig:
    plan: str | None = None
    scheduler: str = schedulers.DEFAULT
    limits: schedulers.Limits = field(default_factory=schedulers.Limits)
    seed: int = 0
    # The KV cache's share of what the weights, the activation workspace and the runtime's
    # fixed parts leave (TensorRT-LLM free_gpu_memory_fraction's meaning, whatever the stack);
    # None: the runtime's own rule and fraction (chip/runtime_memory.py).
    kv_memory_fraction: float | None = None
    block_tokens: int = BLOCK_TOKENS
    execution_model: str | None = None
    options: object = None
    faults: tuple[str, ...] = ()
    speculation: Speculation | None = None  # speculative decoding with `draft`
    draft: str | None = None
    draft_placement: str = "shared"  # the target's sockets, or `draft_sockets` of its own
    draft_sockets: int = 1
    coe: coe.CoEScenario | None = None  # Composition of Experts: `model` is ignored
    metrics: bench.MetricSpec = field(default_factory=bench.MetricSpec)  # vLLM's statistics
    routing: str = replica_routing.DEFAULT  # replica routing policy (engine/replica_routing/)
    concurrency: int | None = None  # closed loop: clients (vLLM --max-concurrency); None: open
    prefix: PrefixConfig = field(default_factory=PrefixConfig)  # engine/prefix_cache/


class Simulation:
    def __init__(self, model: ModelSpec, cluster: ClusterSpec, trace: Trace, config: ServeConfig,
                 backend, progress: Callable[[int, int], None] | None = None):
        """`backend`: the sockets' backend, or a function making one, called once the run's
        set-up is checked and laid out (start): a bad plan is refused before Ray starts."""
        # the set-up checks the run's inputs first: nothing starts on a bad combination
        self.build = Build(model, cluster, trace, config)
        self.model, self.cluster, self.trace, self.config = model, cluster, trace, config
        made = hasattr(backend, "start")
        self.backend: Backend | None = backend if made else None
        self._make_backend: Callable[[], Backend] | None = None if made else backend
        self.progress = progress
        self.hooks: list[Callable[[Simulation, int], None]] = []
        # Called after each window with what it ran (output/timeline.py records the run):
        # observer.window(sim, replica, window, per-socket results, per-step dict, t0, steps);
        # and, where it has one, observer.recovery(sim, replica, start, seconds) after each
        # recovery row (weights reloaded after a failure).
        self.observers: list = []
        self.plan = self.build.plan
        self.faults = self.build.faults
        self.router = Router(cluster)
        self.rates = energy.Rates.of(cluster)  # idle W, USD per socket-hour: engine/energy.py
        self.rec = metrics.Recorder(split=energy.split_columns(self.rates))
        self.now, self.seq, self.windows = 0.0, 0, 0
        self.refused_s = 0.0  # when the last refusal was recorded
        self.layouts: dict[int, plans.ReplicaLayout] = {}
        self.replicas: list[Replica] = []
        # the requests table, a row as each request is through (engine/finished.py)
        self.finished = Finished(self.rec)
        self.keep_measured = False  # keep the chunk times past run() (alike's merge reads them)
        # the summary is all that is read (capacity's verification): the sockets and links
        # tables are left empty, the requests' energy and cost not split, of the steps only
        # the columns the summary reads are kept (no steps table), no ITL nor peak figure
        # taken, and the sockets' KV regions not grown (Replica.grows_regions: no one reads
        # their occupancy, and the KV manager bounds the KV; a region is sized at admission
        # and again before a swap moves it; the resizes were 8% of the Llama 3.1 70B
        # question's CPU in bench_capacity.py; start)
        self.summary_only = False
        self.sampler: ExpertLoadSampler | None = None
        self.dispatch = Dispatcher(config.routing, config.concurrency)
        self.spawned: list[Event] = []  # events a window's completions cause (closed loop)
        self.received: np.ndarray | None = None  # per request: KV tokens it arrives with
        self.lookahead = False  # windows are timed as they are planned (set at start)
        self.predictor: lookahead.Predictor | None = None
        self.step_times = StepTimes(model, self.plan, self.router, config.speculation)
        self.executor = WindowExecutor(self)
        self.recorder = WindowRecorder(self)
        self.recovery = Recovery(self)

    # -- set-up ---------------------------------------------------------------------------
    def start(self) -> None:
        """Lay the replicas out (engine/build.py) and start their sockets on the backend."""
        build = self.build
        if self.summary_only:
            self.rec.split = {}  # the requests' energy_j and cost_usd: null
            self.rec.fields = metrics.LEAN_STEP_COLUMNS
            self.finished.itl_s = None  # its summary's ITL statistics: None (bench.summary)
        layouts = [build.with_router(lay) for lay in build.layouts()]
        setups = {}
        for r, lay in enumerate(layouts):
            self.layouts[r] = lay
            self.recovery.home[r] = tuple(lay.sockets)
            setups.update(build.setups(lay, self.plan))
        self.setups = setups  # each socket's chip and program (a Predictor's, on demand)
        if self.backend is None:  # __init__ was given the function that makes it
            self.backend = cast("Callable[[], Backend]", self._make_backend)()
        self.backend.start(setups)
        for r, lay in enumerate(layouts):
            self.replicas.append(build.replica(r, lay))
            self.replicas[-1].grows_regions = not self.summary_only
            self.replicas[-1].expecting = functools.partial(self.dispatch.more_arrivals,
                                                            self.replicas[-1])
        if self.plan.ep > 1:
            moe = cast(MoESpec, self.model.moe)  # ep > 1: an MoE model (PlanSpec.check)
            self.sampler = ExpertLoadSampler(moe.num_experts, moe.top_k, self.plan.ep,
                                          self.config.seed)
        if self._can_look_ahead():
            self.look_ahead()

    def _can_look_ahead(self) -> bool:
        """Whether windows are timed as they are planned (engine/lookahead.py): only where the
        next arrivals at a replica are known in advance (routed up front: an open loop's all,
        a closed loop's but those its own completions send, Dispatcher.known_until; a pair's
        pools, up to their frontiers: engine/disagg/handover.py) and the spans can be timed
        (`can_time`)."""
        c = self.config
        closed = c.concurrency is not None or self.trace.after is not None
        # a request refused as it arrives sends its closed loop's next one at once: at the
        # window's start, where a window takes it as it is planned
        return self.can_time() and not (closed and self.may_refuse())

    def can_time(self) -> bool:
        """Whether the engine can time a span as it plans it: routed up front, no span draws
        random numbers as it opens (expert routing, speculation) or switches an expert in
        (CoE), and no fault changes a socket's speed or program."""
        c = self.config
        return (not self.dispatch.coupled and self.sampler is None and c.speculation is None
                and c.coe is None and not self.faults)

    def look_ahead(self) -> None:
        """Time windows as they are planned from now on (started: its sockets set up)."""
        self.lookahead = True
        if self.predictor is None:
            self.predictor = lookahead.Predictor(self.setups,
                                                 getattr(self.backend, "memo", None))

    # -- requests -------------------------------------------------------------------------
    def initial_events(self) -> list[Event]:
        """The first arrivals and the faults. Open loop: a Request is made from the trace's
        columns when its arrival is next (Dispatcher.open_loop); a closed loop makes one when
        the request it follows is through (Dispatcher.initial): the run holds the requests in
        flight, not the trace."""
        experts, ready = self._routing()
        make = functools.partial(self._request, experts=experts, ready=ready)
        if self.trace.after is None and self.config.concurrency is None:
            sent = np.maximum(np.asarray(self.trace.arrival_s, dtype=float), ready)
            events = self.dispatch.open_loop(make, sent, self.replicas)
        else:
            events = self.dispatch.initial(make, len(self.trace), self.replicas,
                                           self.trace.after, self.trace.think_s)
        return events + [FaultAt(f.time_s, f) for f in self.faults]

    def _request(self, i: int, experts: np.ndarray, ready: np.ndarray) -> Request:
        """Request i of the trace (its expert and when the scheduler sees it: _routing)."""
        t = self.trace
        r = Request(i, float(t.arrival_s[i]), int(t.prompt_len[i]), int(t.output_len[i]),
                    t.model[i] if t.model else self.model.name, expert=int(experts[i]),
                    ready_s=float(ready[i]), content=t.content[i] if t.content else (),
                    session=int(t.session[i]) if t.session is not None else -1)
        if self.received is not None:  # disaggregated decode (engine/disagg/)
            r.received = int(self.received[i])
        return r

    def _routing(self) -> tuple[np.ndarray, np.ndarray]:
        """Each request's expert (CoE: coe.assign_experts; else -1) and when the scheduler
        sees it: on arrival. The router's pass is costed on the sockets, in the prefill step
        that admits the request (CostTables._router_rows), so it holds the sockets as the
        experts do; its verdict is drawn up front (seeded), which lets planning stay
        count-based."""
        arrival = np.asarray(self.trace.arrival_s, dtype=float)
        sc = self.config.coe
        if sc is None:
            return np.full(len(arrival), -1), arrival
        return coe.assign_experts(self.trace, sc, self.config.seed), arrival

    # -- running --------------------------------------------------------------------------
    def run(self, sink: Callable[[str, object], None] | None = None,
            chunk_rows: int = metrics.CHUNK_ROWS) -> Tables:
        """Start the sockets, run the trace, build the tables, close the backend. The tables
        are built before the close: a backend's teardown (Ray's worker processes exiting) would
        otherwise compete for the CPUs. `self.wall` keeps the wall seconds of each phase (for
        reports only: never in a table).

        With a `sink` (name, Arrow table), the requests, steps and sockets rows are handed to
        it in chunks of `chunk_rows` as the run records them (a request's row once it is
        through), in table order, and not kept: the Tables then hold None for them."""
        t = time.perf_counter()
        ok = False
        try:
            self.start()
            if sink is not None:
                self.rec.sink, self.rec.chunk_rows = sink, chunk_rows
                self.rec.meta = self.metadata()
            started = time.perf_counter()
            end = loop.run(self, self.initial_events())
            if self.recovery.late_fault:  # the loop's last event: a fault after the run's work
                end = self.recovery.work_end()
            for index in list(self.recovery.reloads):
                self.recovery.record_reload(index, math.inf)
            # results the backend (started above) still owes (Ray: the followers' replies)
            cast(Backend, self.backend).sync()
            ran = time.perf_counter()
            tables = self.tables(end)
            built = time.perf_counter()
            ok = True
        finally:
            closing = time.perf_counter()
            if not (ok and self.keep_measured):  # the spill files go with the run
                self.finished.drop()
            if self.backend is not None:
                self.backend.close()
        self.wall = {"start_s": started - t, "run_s": ran - started, "tables_s": built - ran,
                     "close_s": time.perf_counter() - closing}
        return tables

    def admit_to_queue(self, rep: Replica, r: Request) -> list[Event]:
        """Queue an arrived request, or refuse it (what follows: closed loop, a freed slot)."""
        r.probe = rep.prefix.peek if rep.prefix is not None else None
        reason = self.refusal(rep, r)
        if reason:
            r.state, r.reason = UNSERVED, reason
            return self.refused(r)
        rep.waiting.append(r)
        return []

    def refused(self, r: Request) -> list[Event]:
        """Record a request refused now (unserved, with its reason); closed loop: its client's
        next request, or its session's next turn (refused in turn), is sent now."""
        self.finished.add(r)
        self.refused_s = max(self.refused_s, self.now)
        return self.dispatch.refused(r, self.now)

    def take_spawned(self) -> list[Event]:
        out, self.spawned = self.spawned, []
        return out

    def refusal(self, rep: Replica, r: Request) -> str:
        """Why `rep` cannot serve `r` ("": it can)."""
        if r.reason:  # refused before it arrived (its session's previous turn was)
            return r.reason
        if getattr(rep, "refused", ""):
            return rep.refused
        if rep.kv.blocks_for(r.prompt_len + r.output_len) > rep.kv.config.capacity_blocks:
            return "needs more KV cache than the replica holds"
        return ""

    def may_refuse(self) -> bool:
        """Whether a request of the trace could be refused as it arrives (`refusal`: a prompt
        and output past a replica's KV; a turn after a refused one is refused in turn), the
        replicas alike and without faults."""
        t, kv = self.trace, self.replicas[0].kv
        if not len(t):
            return False
        return kv.blocks_for(int((t.prompt_len + t.output_len).max())) > kv.config.capacity_blocks

    @property
    def kv_steps(self) -> bool:
        """Whether a window's KV blocks in use per step are read: by the steps table, or by a
        stateful routing policy's views (dispatch.Dispatcher._kv_at)."""
        return not self.summary_only or self.dispatch.policy.stateful

    def report_progress(self) -> None:
        if self.progress is not None:
            self.progress(self.finished.count, len(self.trace))

    # -- the parts ------------------------------------------------------------------------
    def execute_window(self, rep: Replica, t0: float) -> float | None:
        """Run replica `rep`'s next window from t0 (engine/windows.py); returns when it ends
        (None: nothing to run)."""
        return self.executor.execute(rep, t0)

    def apply_fault(self, f: Fault) -> list[Event]:
        """Apply fault `f` now (engine/recovery.py); returns what it sends."""
        return self.recovery.apply(f)

    def tables(self, end: float) -> Tables:
        """The run's tables and summary (engine/summary.py)."""
        return summary.tables(self, end)

    def metadata(self) -> dict:
        """The tables' metadata: model, cluster, plan, scheduler, seed, trace, config hash."""
        return summary.metadata(self)


__all__ = ["DECODE", "MIXED", "PREFILL", "ROWS", "ServeConfig", "Simulation", "Tables"]
