"""The serving simulation: builds the sockets of a plan on a backend, routes a trace over the
replicas, runs the event loop and assembles the tables.

Layers: entities (requests.py, replica.py), policies (schedulers/), the time predictor (the
sockets' cost tables, chip/socket.py, over the chip's execution model), the event loop (loop.py,
events.py) and metrics (metrics.py). Which request goes to which replica, and when closed
loops (clients, sessions) send the next one: engine/dispatch.py. Prefix caching:
engine/prefix_cache.py, one cache per replica.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from chip.cost import CAUSES
from chip.memory import MemoryTiers
from chip.socket import COMM_ROW, DECODE, MIXED, PREFILL, ROWS, SENT_ROW
from partitioning.cluster import ClusterSpec
from partitioning.evaluate import footprint, plan_comm_time, tp_comm_time
from partitioning.footprint import PlanDoesNotFit, fit_message
from partitioning.plan import Plan as PartitionPlan
from rdu_cluster.backends import SocketSetup
from rdu_cluster.backends.messages import Message, Router
from rdu_cluster.engine import (
    bench,
    energy,
    lookahead,
    loop,
    metrics,
    prefix_cache,
    replica_routing,
    schedulers,
)
from rdu_cluster.engine import plan as plans
from rdu_cluster.engine.dispatch import Dispatcher
from rdu_cluster.engine.events import Event, FaultAt
from rdu_cluster.engine.faults import LINK_DETOUR_FACTOR, Fault
from rdu_cluster.engine.finished import Finished
from rdu_cluster.engine.kv import BLOCK_TOKENS, KV_MEMORY_FRACTION, KVConfig, KVManager
from rdu_cluster.engine.prefix_cache import PrefixCache, PrefixConfig
from rdu_cluster.engine.replica import Replica, Span, Window
from rdu_cluster.engine.requests import DONE, UNSERVED, Request
from rdu_cluster.engine.routing import RoutingSampler
from rdu_cluster.scenarios import coe
from rdu_cluster.scenarios.speculative import PLACEMENTS, resolve_draft
from workloads import traces
from workloads.errors import ConfigError
from workloads.spec import ModelSpec
from workloads.speculative import Speculation
from workloads.traces import Trace

PHASE_NAMES = np.array(["decode", "prefill", "mixed"])
TOKEN_ID_BYTES = 4  # a token id on the wire: int32 (every catalog vocabulary is < 2^31)
N_CAUSES = len(CAUSES)


@dataclass(frozen=True)
class ServeConfig:
    plan: str | None = None
    scheduler: str = "continuous"
    limits: schedulers.Limits = field(default_factory=schedulers.Limits)
    seed: int = 0
    kv_memory_fraction: float = KV_MEMORY_FRACTION
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
    prefix: PrefixConfig = field(default_factory=PrefixConfig)  # engine/prefix_cache.py


@dataclass
class Tables:
    requests: object
    steps: object
    sockets: object
    links: object
    summary: dict


class Simulation:
    def __init__(self, model: ModelSpec, cluster: ClusterSpec, trace: Trace, config: ServeConfig,
                 backend, progress: Callable[[int, int], None] | None = None):
        if not 0 < config.kv_memory_fraction <= 1:
            raise ConfigError("--kv-fraction: must be in (0, 1]")
        self.model, self.cluster, self.trace, self.config = model, cluster, trace, config
        traces.check_fits(trace, model.max_context, model.name)
        self.backend = backend
        self.progress = progress
        self.hooks: list[Callable[[Simulation, int], None]] = []
        # Called after each window with what it ran (output/timeline.py records the run):
        # observer.window(sim, replica, window, per-socket results, per-step dict, t0, steps).
        self.observers: list = []
        self.plan = plans.PlanSpec.parse(config.plan, cluster, model)
        self.faults = [Fault.parse(f, cluster) for f in config.faults]
        self.router = Router(cluster)
        self.rates = energy.Rates.of(cluster)  # idle W, USD per socket-hour: engine/energy.py
        self.rec = metrics.Recorder(split=energy.split_columns(self.rates))
        self.now, self.seq, self.windows = 0.0, 0, 0
        self.failed: set[int] = set()
        self.home: dict[int, tuple[int, ...]] = {}  # each replica's sockets at the start
        self.late_fault = False  # a fault came after every request was through
        self.refused_s = 0.0  # when the last refusal was recorded
        # replica -> its weight reload's recovery row, recorded when the replica runs again (or
        # at the end): a failure during the reload cuts it short first
        self.reloads: dict[int, dict] = {}
        self.degradation: dict[int, list[float]] = {}
        self.layouts: dict[int, plans.ReplicaLayout] = {}
        self.replicas: list[Replica] = []
        # the requests table, a row as each request is through (engine/finished.py)
        self.finished = Finished(self.rec)
        self.keep_measured = False  # keep the ITLs past run() (a disaggregated run reads them)
        self.sampler = None
        self.dispatch = Dispatcher(config.routing, config.concurrency)
        self.spawned: list[Event] = []  # events a window's completions cause (closed loop)
        self.received: np.ndarray | None = None  # per request: KV tokens it arrives with
        self.lookahead = False  # windows are timed as they are planned (set at start)
        self.predictor: lookahead.Predictor | None = None
        self.draft = resolve_draft(config.draft, model) if config.speculation else None
        if config.speculation and self.plan.pp > 1:
            raise ConfigError("--draft: speculative decoding needs a plan without pipeline stages")
        _check_placement(config)
        if self.draft is not None and config.draft_placement == "separate":
            plans.check_draft_sockets(cluster, self.plan, config.draft_sockets)
        _check_coe(config)
        self.coe_memory = self._coe_memory() if config.coe else None
        self._fps: dict = {}  # plan -> (footprints, reason), once asked for (_footprint)
        self._orders: dict = {}  # replica -> its layout's socket order (_socket_order)
        config.prefix.check()
        self.prefix_mode = config.prefix.resolved(self._lower_tier())
        self.prefix_live = prefix_cache.Liveness(trace.content)  # shared by the replicas

    # -- set-up ---------------------------------------------------------------------------
    def start(self) -> None:
        layouts = [self._with_router(lay) for lay in self._layouts()]
        setups = {}
        for r, lay in enumerate(layouts):
            self.layouts[r] = lay
            self.home[r] = tuple(lay.sockets)
            setups.update(self._setups(lay, self.plan))
        self.backend.start(setups)
        for r, lay in enumerate(layouts):
            sched = schedulers.get(self.config.scheduler, self.config.limits)
            kv = self._kv(lay)
            self.replicas.append(Replica(r, list(lay.sockets), sched, kv, self._swap_tier(),
                                         self._speculate(), self._experts(),
                                         self._prefix_cache(kv), self._lookahead()))
            self.replicas[-1].expecting = functools.partial(self.dispatch.more_arrivals,
                                                            self.replicas[-1])
        if self.plan.ep > 1:
            moe = self.model.moe
            self.sampler = RoutingSampler(moe.num_experts, moe.top_k, self.plan.ep,
                                          self.config.seed)
        self.lookahead = self._can_look_ahead()
        if self.lookahead:
            self.predictor = lookahead.Predictor(setups, getattr(self.backend, "memo", None))

    def _can_look_ahead(self) -> bool:
        """Whether windows are timed as they are planned (engine/lookahead.py): only where the
        next arrivals at a replica are known in advance (open loop, routed up front), no span
        draws random numbers as it opens (expert routing, speculation) or switches an expert
        in (CoE), and no fault changes a socket's speed or program."""
        c = self.config
        return (not self.dispatch.coupled and c.concurrency is None and self.trace.after is None
                and self.sampler is None and c.speculation is None and c.coe is None
                and not self.faults)

    def _layouts(self) -> list[plans.ReplicaLayout]:
        c = self.config
        if self.draft is not None and c.draft_placement == "separate":
            return plans.separate_draft_layouts(
                self.model, self.draft, self.cluster, self.plan, c.draft_sockets,
                c.speculation.k, c.speculation.branching, c.options, c.execution_model)
        return [self._with_draft(lay) for lay in plans.layouts(
            self.model, self.cluster, self.plan, c.options, c.execution_model)]

    def _with_draft(self, lay: plans.ReplicaLayout) -> plans.ReplicaLayout:
        if self.draft is None:
            return lay
        spec = self.config.speculation
        progs = {s: replace(p, draft=self.draft, spec_k=spec.k, spec_tree=spec.branching)
                 for s, p in lay.programs.items()}
        return replace(lay, programs=progs)

    def _with_router(self, lay: plans.ReplicaLayout) -> plans.ReplicaLayout:
        """CoE: the router runs on the replica's sockets, in the step that admits a request."""
        if self.config.coe is None:
            return lay
        router = self.config.coe.router
        return replace(lay, programs={s: replace(p, router=router)
                                      for s, p in lay.programs.items()})

    def _speculate(self) -> Callable[[int, int, int], np.ndarray] | None:
        """Tokens each of a step's n decodes emits, drawn from the acceptance model, seeded by
        (seed, replica, step): the same draw however the steps are grouped into windows."""
        spec = self.config.speculation
        if spec is None:
            return None
        seed = self.config.seed
        return lambda rep, step, n: spec.sample_tokens(
            np.random.default_rng([seed, rep, step]), n)

    def _lookahead(self) -> int:
        """The most tokens a decode step writes (schedulers.View.lookahead): k drafts and the
        target's own token with speculative decoding."""
        spec = self.config.speculation
        return 1 if spec is None else spec.k + 1

    def _coe_memory(self) -> coe.Memory:
        sc = self.config.coe
        ctx = int(np.max(self.trace.prompt_len + self.trace.output_len, initial=1))
        mem = coe.memory(sc, self.cluster, self.config.limits.max_batch, ctx, self.plan.tp)
        if not mem.fits_tier:
            raise ConfigError(coe.oom_message(sc, self.cluster, mem))
        if self.plan.pp > 1 or self.plan.ep > 1:
            raise ConfigError("--coe-experts: needs a tensor-parallel plan (tpN)")
        return mem

    def _experts(self) -> coe.ExpertResidency | None:
        mem = self.coe_memory
        if mem is None:
            return None
        return coe.ExpertResidency(mem.slots, self.config.coe.policy, mem.tier_name)

    def _setups(self, lay: plans.ReplicaLayout, plan: plans.PlanSpec
                ) -> dict[int, SocketSetup]:
        # The engine's tp is the stage width, ep a split of it (partitioning's tp x ep); a
        # replica re-planned after a fault has degrees of its own (Simulation._smaller_plan)
        tp, ep = plan.tp, plan.ep
        comm = plan_comm_time(self.cluster, PartitionPlan(tp=tp // ep, ep=ep,
                                                          dp=self.cluster.sockets // tp))
        ref = _kv_reference(lay)
        out = {}
        for s, prog in lay.programs.items():
            w = plans.resident_weight_bytes(prog)
            first, last = prog.layers or (0, prog.model.num_layers)
            name = f"weights/{prog.model.name}/layers/{first}-{last - 1}"
            act = self._activations(lay, s)
            self._check_fits(prog, w + act)
            weights = ((["alloc", name, "hbm", w, "weights"],
                        ["alloc", f"activations/{prog.model.name}", "hbm", act, "activations"])
                       if self.config.coe is None
                       else coe.socket_regions(self.config.coe, self.cluster, tp))
            own = comm if prog.spec_part != "draft" else tp_comm_time(self.cluster,
                                                                       len(prog.group))
            out[s] = SocketSetup(self.cluster.chip, prog, own, self.cluster.node_of(s), weights,
                                 plans.kv_bytes_per_token(prog) / ref)
        return out

    def partition_plan(self, plan: plans.PlanSpec | None = None) -> PartitionPlan:
        """A serving plan (default: the run's) in the partitioner's terms (the engine's tp is
        the stage width), replicated over the cluster."""
        p = plan or self.plan
        return PartitionPlan(tp=p.tp // p.ep, ep=p.ep, pp=p.pp, dp=self.cluster.sockets // p.group)

    def _footprint(self, plan: plans.PlanSpec, check: bool = True):
        """The one footprint check (partitioning.evaluate.footprint) at the trace's longest
        request, alone: what a replica must hold to serve anything. (footprints, reason); with
        check, a plan that does not fit raises PlanDoesNotFit in the words of every command."""
        if plan not in self._fps:
            longest = (int(np.max(self.trace.prompt_len, initial=1)),
                       int(np.max(self.trace.output_len, initial=1)))
            self._fps[plan] = footprint(self.model, self.cluster, self.partition_plan(plan), 1,
                                        *longest, check=False)
        fps, why = self._fps[plan]
        if check and why:
            raise PlanDoesNotFit(why)
        return fps, why

    def _activations(self, lay: plans.ReplicaLayout, socket: int) -> float:
        """HBM the socket keeps for one prompt's activations (the footprint's region); a draft
        on sockets of its own and CoE (coe.memory sizes its sockets) keep none here."""
        prog = lay.programs[socket]
        if self.config.coe is not None or prog.spec_part == "draft":
            return 0.0
        stages = lay.stages[1:] if lay.draft_stage else lay.stages
        target = [s for stage in stages for s in stage]
        plan = replace(self.plan, tp=len(stages[0]), ep=prog.shard.ep, pp=len(stages))
        fps, _ = self._footprint(plan)
        return float(np.max(fps[target.index(socket)].regions.get(("activations", "hbm"), 0.0)))

    def _check_fits(self, prog, needed: float) -> None:
        """What the footprint does not see (a draft's weights beside the target's), against
        the same capacity, in the same words."""
        hbm = self.cluster.chip.hbm.capacity_bytes
        if needed >= hbm:
            raise PlanDoesNotFit(fit_message(self.partition_plan(), prog.model.name,
                                             self.cluster.name, "hbm", 0, needed, hbm))

    def _kv(self, lay: plans.ReplicaLayout) -> KVManager:
        """KV blocks the replica can hold: the fewest any of its sockets has room for (a
        block takes each socket's own bytes per token; the replica counts the target's)."""
        bt = self.config.block_tokens
        blocks = min(self._kv_blocks(p, bt, self._activations(lay, s))
                     for s, p in lay.programs.items())
        return KVManager(KVConfig(blocks, bt, _kv_reference(lay)))

    def _kv_blocks(self, prog, block_tokens: int, activations: float) -> int:
        weights = plans.resident_weight_bytes(prog) + activations
        if self.coe_memory is not None:  # the router and the HBM slots of the experts
            weights = self.coe_memory.router + self.coe_memory.slots * self.coe_memory.expert
        free = self.config.kv_memory_fraction * (self.cluster.chip.hbm.capacity_bytes - weights)
        return int(free // (plans.kv_bytes_per_token(prog) * block_tokens))

    def _swap_tier(self) -> str:
        return "ddr" if self.cluster.chip.has_tier("ddr") else "host"

    def _lower_tier(self) -> str | None:
        """The tier below HBM (DDR on an RDU, host memory on a GPU), if the chip has one."""
        tier = self._swap_tier()
        return tier if self.cluster.chip.has_tier(tier) else None

    def _prefix_cache(self, kv: KVManager) -> PrefixCache | None:
        if self.prefix_mode == "off":
            return None
        return prefix_cache.build(self.config.prefix, self.prefix_mode, self.cluster.chip, kv,
                                  self._lower_tier(), self._lower_reserved(kv),
                                  self.prefix_live)

    def _lower_reserved(self, kv: KVManager) -> float:
        """Bytes per socket the lower tier keeps for other things: CoE experts, and with swap
        preemption the whole HBM KV cache swapped out."""
        tier = self._lower_tier()
        held = 0.0
        if self.config.coe is not None:
            held += sum(op[3] for op in coe.socket_regions(self.config.coe, self.cluster,
                                                           self.plan.tp) if op[2] == tier)
        if self.config.limits.preemption == "swap":
            held += kv.config.capacity_blocks * kv.config.block_bytes
        return held

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
        if self.received is not None:  # disaggregated decode (engine/disagg.py)
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
            if self.late_fault:  # the loop's last event: a fault after the run's work
                end = self._work_end()
            for index in list(self.reloads):
                self._record_reload(index, math.inf)
            self.backend.sync()  # results the backend still owes (Ray: the followers' replies)
            ran = time.perf_counter()
            tables = self.tables(end)
            built = time.perf_counter()
            ok = True
        finally:
            closing = time.perf_counter()
            if not (ok and self.keep_measured):  # the ITLs' spill file goes with the run
                self.finished.drop()
            self.backend.close()
        self.wall = {"start_s": started - t, "run_s": ran - started, "tables_s": built - ran,
                     "close_s": time.perf_counter() - closing}
        return tables

    def admit_to_queue(self, rep: Replica, r: Request) -> list[Event]:
        """Queue an arrived request, or refuse it (what follows: closed loop, a freed slot)."""
        r.probe = rep.prefix.peek if rep.prefix is not None else None
        reason = self._refusal(rep, r)
        if reason:
            r.state, r.reason = UNSERVED, reason
            return self._refused(r)
        rep.waiting.append(r)
        return []

    def _refused(self, r: Request) -> list[Event]:
        """Record a request refused now (unserved, with its reason); closed loop: its client's
        next request, or its session's next turn (refused in turn), is sent now."""
        self.finished.add(r)
        self.refused_s = max(self.refused_s, self.now)
        return self.dispatch.refused(r, self.now)

    def take_spawned(self) -> list[Event]:
        out, self.spawned = self.spawned, []
        return out

    def _refusal(self, rep: Replica, r: Request) -> str:
        if r.reason:  # refused before it arrived (its session's previous turn was)
            return r.reason
        if getattr(rep, "refused", ""):
            return rep.refused
        if rep.kv.blocks_for(r.prompt_len + r.output_len) > rep.kv.config.capacity_blocks:
            return "needs more KV cache than the replica holds"
        lim = self.config.limits
        if not lim.chunked_prefill and r.prompt_len > lim.token_budget:
            return "prompt exceeds the token budget (use --chunked-prefill)"
        return ""

    def horizon(self, rep: Replica, plan) -> float:
        """When `plan` could change: the next pending fault, and, for a plan that is not
        saturated, the next arrival routed to this replica."""
        h = min((f.time_s for f in self.faults if f.time_s > self.now), default=math.inf)
        if not plan.saturated:
            h = min(h, self.dispatch.next_arrival(rep, self.now))
        return h

    def execute_window(self, rep: Replica, t0: float) -> float | None:
        if self.reloads:
            self._record_reload(rep.index, math.inf)
        clock = self._clock(rep, t0) if self.lookahead else None
        window = rep.plan_window(lambda p: self.horizon(rep, p), clock)
        if not window.spans:
            return None
        self.seq += 1
        loads, load_max = self._loads(rep, window)
        res = self.backend.run(self.seq, window.ops, window.columns(), loads, rep.sockets)
        step = self._combine(rep, window, res)
        step["expert_load_max"] = load_max
        m = len(step["time_s"])
        last = window.spans[-1]
        ends = lookahead.ends(t0, step["time_s"], window.resumes)
        if clock is not None:
            _check_prediction(clock.predicted(), ends)
        if last.cut_at < math.inf:  # the window's only span (Replica.plan_window)
            m = min(last.steps, int(np.searchsorted(ends, last.cut_at, side="left")) + 1)
            rep.advance(last, m)
            step = {k: v[:m] for k, v in step.items()}
            ends = ends[:m]  # a running sum: the first m ends do not depend on the rest
        step["start_s"] = lookahead.starts(t0, ends, window.resumes)
        step["kv_blocks"] = window.kv_blocks(rep.kv.config.block_tokens)
        end = self._record(rep, window, step, res, t0, m, ends)
        for obs in self.observers:
            obs.window(self, rep, window, res, step, t0, m)
        self.spawned += self.dispatch.after_window(rep, window, ends,
                                                   step["kv_blocks"])
        for r in rep.completed:
            self.finished.add(r)
        rep.completed = []
        self.windows += 1
        for hook in self.hooks:
            hook(self, self.windows)
        return end

    def _clock(self, rep: Replica, t0: float) -> lookahead.Clock:
        """The window's time as it is planned (engine/lookahead.py): the predicted replies
        combined as the sockets' are; arrivals taken from the dispatcher as time passes them."""
        lay = self.layouts[rep.index]
        # One stage of sockets that run one program: the step time is that program's, as
        # _combine finds it (every socket equal, nothing to add but moves and copies).
        alone = self.predictor.shared(rep.sockets) if len(lay.stages) == 1 else None

        def row(sp: Span) -> np.ndarray:
            return alone.span_rows(sp.kind, len(sp.decode), sp.ctx_sum, sp.steps,
                                   (len(sp.prefill), sp.pre_tokens,
                                    sp.pre_prefix))[0]

        def time_of(spans: list) -> np.ndarray:
            if alone is not None and not any(sp.prefix_copy_s for sp in spans):
                if len(spans) == 1:
                    return row(spans[0])
                alone.fill_prefill((len(sp.prefill), sp.pre_tokens, sp.pre_prefix)
                                   for sp in spans if sp.prefill)  # at once, as window() does
                return np.concatenate([row(sp) for sp in spans])
            w = Window(spans, [])
            return self._combine(rep, w, self.predictor.replies(rep.sockets, w.columns()))["time_s"]

        def step_times(sp: Span) -> list[float]:
            if alone is not None and not sp.prefix_copy_s:  # most calls, as Clock.steps times
                return alone.step_times(sp.kind, len(sp.decode), sp.ctx_sum, sp.steps,
                                        (len(sp.prefill), sp.pre_tokens, sp.pre_prefix))
            return time_of([sp]).tolist()

        return lookahead.Clock(t0, time_of, lambda: self.dispatch.next_arrival(rep, t0),
                               lambda t: self._deliver(rep, t), step_times)

    def _deliver(self, rep: Replica, t: float) -> None:
        """The requests that reach `rep` by t join its queue now, as their arrivals would."""
        for r in self.dispatch.take(rep, t):
            self.finished.arrived(r, rep.index)
            self.spawned += self.admit_to_queue(rep, r)

    def _loads(self, rep: Replica, window: Window):
        n = window.steps
        if self.sampler is None:
            return None, np.ones(n)
        spec = self.config.speculation
        per_decode = 1 if spec is None else spec.verify_tokens()  # tokens through the experts
        parts = []
        for sp in window.spans:
            tokens = len(sp.decode) * per_decode + sp.pre_tokens
            parts.append(self.sampler.loads(rep.index, sp.first_step, tokens, sp.steps))
        loads = np.concatenate(parts)  # (steps, the run's ep)
        lay = self.layouts[rep.index]
        stages = lay.stages[1:] if lay.draft_stage else lay.stages
        shard = lay.programs[stages[0][0]].shard  # the replica's degrees: a re-planned one
        if shard.ep < loads.shape[1]:  # (_smaller_plan) holds the experts in fewer groups
            loads = loads.reshape(len(loads), shard.ep, -1).mean(axis=2)
        out = {}
        for stage in stages:
            for pos, s in enumerate(stage):
                out[s] = np.ascontiguousarray(loads[:, pos // shard.expert_tp])
        return out, loads.max(axis=1)

    def _combine(self, rep: Replica, window: Window, res: dict) -> dict:
        """Per-step times of the replica: at each step the slowest socket of each stage holds
        the others back (they synchronize at its collectives), stages run one after another
        with the activations sent between them, and KV moves (swaps) run before the step."""
        lay = self.layouts[rep.index]
        stages = lay.stages
        n = window.steps
        ar = np.arange(n)
        time, causes = np.zeros(n), np.zeros((N_CAUSES, n))
        straggler, straggler_s = np.zeros(n, dtype=np.int64), np.zeros(n)
        per_stage = []
        for k, stage in enumerate(stages):
            first = res[stage[0]][0]
            if all(res[s][0] is first for s in stage):  # one reply for a symmetric group
                tmax, j = first[0], np.zeros(n, dtype=np.int64)  # argmax's first of equals
                per_stage.append((tmax, first[1 : 1 + N_CAUSES]))
            else:
                R = np.stack([res[s][0] for s in stage])  # (sockets, ROWS, steps)
                j = np.argmax(R[:, 0, :], axis=0)
                tmax = R[j, 0, ar]
                per_stage.append((tmax, R[j, 1 : 1 + N_CAUSES, ar].T))
                straggler_s += tmax - R[:, 0, :].min(axis=0)
            time += tmax
            causes += per_stage[-1][1]
            if k == (1 if lay.draft_stage else 0):  # the target's first stage
                straggler = np.asarray(stage)[j]
        hops = np.zeros((n, 0))
        if lay.draft_stage:
            hops = self._draft_then_verify(window, stages, per_stage, time, causes)
        elif len(stages) > 1:
            hops = self._add_transfers(window, stages, time, causes)
        swap, switch = self._moves_per_step(window, res, rep.sockets)
        copy = window.per_step(lambda sp: sp.prefix_copy_s, float)
        exposed = prefix_cache.exposed(copy, time, self.model.num_layers // self.plan.pp)
        # stage_s / hop_s (steps first, so a cut window keeps its rows): each stage's slowest
        # socket and each message between stages, for timelines (output/timeline.py)
        return {"time_s": time + swap + switch + exposed, "causes": causes.T,
                "straggler_socket": straggler, "straggler_s": straggler_s, "kv_swap_s": swap,
                "switch_s": switch, "stage_s": np.stack([t for t, _ in per_stage], axis=1),
                "hop_s": hops, "prefix_copy_s": copy, "prefix_exposed_s": exposed}

    def _add_transfers(self, window: Window, stages, time, causes) -> np.ndarray:
        """The activations sent from each stage to the next (time and causes in place); returns
        each transfer's seconds, (steps, stages - 1)."""
        act = self.model.precision.activations.bytes * self.model.hidden_size
        tokens = window.per_step(lambda sp: len(sp.decode) + sp.pre_tokens,
                                 float)
        hops = []
        for a, b in itertools.pairwise(stages):
            msg = Message(a[0], b[0], "activations", tokens * act)
            t = np.broadcast_to(self.router.route(msg.encode()), time.shape)
            time += t
            causes[COMM_ROW - 1] += t
            hops.append(t)
        return np.stack(hops, axis=1)

    def _draft_then_verify(self, window: Window, stages, per_stage, time, causes) -> np.ndarray:
        """A separate draft: in a decode step the drafts go to the target (token ids, the
        tree's too) and the verdict (accepted count and the target's token) comes back, each
        one routed message; a prefill step runs the draft's and the target's prefill side by
        side, so it lasts the slower of the two (time and causes in place)."""
        kind = window.per_step(lambda sp: sp.kind)
        seqs = window.per_step(lambda sp: len(sp.decode), float)
        side = kind == PREFILL
        (t0, c0), (t1, c1) = per_stage
        time[side] = np.maximum(t0, t1)[side]
        causes[:, side] = np.where((t0 >= t1)[None, :], c0, c1)[:, side]
        spec = self.config.speculation
        out = Message(stages[0][0], stages[1][0], "drafts",
                      seqs * spec.verify_tokens() * TOKEN_ID_BYTES)
        back = Message(stages[1][0], stages[0][0], "verdict", seqs * 2 * TOKEN_ID_BYTES)
        hops = np.stack([np.where(seqs > 0, self.router.route(m.encode()), 0.0)
                         for m in (out, back)], axis=1)  # (steps, 2): drafts out, verdict back
        time += hops.sum(axis=1)
        causes[COMM_ROW - 1] += hops.sum(axis=1)
        return hops

    def _moves_per_step(self, window: Window, res: dict, sockets: list[int]) -> tuple:
        """Region copies before each span's first step: (KV swaps, CoE expert switches). A span
        that switches has no swap (the coe policy switches only with nothing running)."""
        first = res[sockets[0]][1]
        moves = (first if all(res[s][1] is first for s in sockets)
                 else np.max(np.stack([res[s][1] for s in sockets]), axis=0))
        out = np.zeros((2, window.steps))
        if not moves.any():  # most windows move nothing
            return out[0], out[1]
        switch = np.fromiter((sp.switch for sp in window.spans), bool, len(window.spans))
        firsts = np.concatenate([[0], np.cumsum([sp.steps for sp in window.spans])[:-1]])
        out[0, firsts.astype(np.int64)] = np.where(switch, 0.0, moves)
        out[1, firsts.astype(np.int64)] = np.where(switch, moves, 0.0)
        return out[0], out[1]

    def _record(self, rep: Replica, window: Window, step: dict, res: dict, t0: float,
                m: int, ends: np.ndarray) -> float:
        spans = window.spans
        dur, starts = step["time_s"], step["start_s"]
        bb = rep.kv.config.block_bytes
        # every per-span count at once: one (spans, 7) array repeated over the spans' steps
        per = np.repeat(np.array(
            [(sp.kind, len(sp.decode) + len(sp.prefill), sp.pre_tokens,
              len(sp.decode), sp.emitted, sp.expert, sp.prefix_hit) for sp in spans],
            dtype=np.int64), [sp.steps for sp in spans], axis=0)
        cols = {
            "replica": np.full(m, rep.index), "window": np.full(m, self.windows),
            "step": spans[0].first_step + np.arange(m),  # spans run consecutive steps
            "phase": PHASE_NAMES[per[:, 0]], "start_s": starts, "time_s": dur,
            "batch": per[:, 1], "prefill_tokens": per[:, 2], "decode_tokens": per[:, 3],
            "emitted_tokens": per[:, 4], "expert": per[:, 5],
            "switch_s": step["switch_s"], "prefix_copy_s": step["prefix_copy_s"],
            "prefix_exposed_s": step["prefix_exposed_s"], "prefix_hit_tokens": per[:, 6],
            "kv_used_bytes": step["kv_blocks"] * bb,
            "kv_swap_s": step["kv_swap_s"], "expert_load_max": step["expert_load_max"][:m],
            "straggler_socket": step["straggler_socket"], "straggler_s": step["straggler_s"],
        }
        for i, c in enumerate(CAUSES):
            cols[f"{c}_s"] = step["causes"][:, i]
        cols["sockets"] = np.full(m, len(rep.sockets))
        cols.update(energy.step_columns(self.rates, energy.dynamic_j(res, rep.sockets, m),
                                        len(rep.sockets), dur))
        energy.split_over_requests(spans, cols, self.rec.split)
        self.rec.add_steps(rep.index, cols, ends)
        for i in np.flatnonzero(step["switch_s"]):
            self.rec.switch_s[(rep.index, int(cols["step"][i]))] = float(step["switch_s"][i])
        end = float(ends[-1])
        waits = sum(t - float(ends[i - 1]) for i, t in window.resumes if 0 < i < m)
        self._record_sockets(rep, window, res, t0, end, m, end - t0 - waits)
        rep.window_end = end
        return end

    def _record_sockets(self, rep: Replica, window: Window, res: dict, t0: float, end: float,
                        m: int, span: float) -> None:
        """One sockets-table row per socket of the replica, as columns (metrics.SocketRows):
        `span` is the time the window's steps cover (its idle waits for arrivals left out, as
        they fall between windows without lookahead)."""
        switch = np.fromiter((sp.switch for sp in window.spans), bool, len(window.spans))
        socks, nodes, links = self._socket_order(rep)
        first = res[socks[0]][0]
        rows = (np.broadcast_to(first, (len(socks), *first.shape))  # one reply: no copies
                if all(res[s][0] is first for s in socks)
                else np.stack([res[s][0] for s in socks]))  # (sockets, ROWS, steps)
        busy, sent = rows[:, 0, :m].sum(axis=1), rows[:, SENT_ROW, :m].sum(axis=1)
        switches = int(switch.sum())
        self.rec.sockets.add_window({
            "socket": socks, "replica": rep.index, "node": nodes,
            "window": self.windows, "time_s": end, "window_s": span, "busy_s": busy,
            # at most 1: `span` is a difference of absolute times, which loses their last
            # bits (nanoseconds, 194 days in) where busy sums the steps, so it can come out short
            "busy_fraction": np.minimum(busy / span, 1.0) if span > 0 else np.zeros(len(socks)),
            "sent_bytes": sent, "switches": switches,
            "switch_s": ([float(np.sum(np.asarray(res[s][1])[: len(switch)][switch]))
                          for s in socks]
                         if switches else 0.0),
            **energy.socket_columns(self.rates, rows, m, span)},
            [res[s][2] for s in socks])  # occupancies: mappings the backend may fill later
        if self.rec.sink is not None:
            self.rec.flush_sockets()
        sent_s = sent.tolist()
        for i, link, share in links:
            self.rec.link_bytes[link] = self.rec.link_bytes.get(link, 0.0) + sent_s[i] * share

    def _socket_order(self, rep: Replica) -> tuple[list[int], list[int], list]:
        """The replica's sockets stage by stage, their nodes, and the links each socket's bytes
        go over, with its position and the share it sends there: what every window's sockets
        rows need, kept per layout (a re-planned replica gets a new one). On a full mesh a
        socket has a link to every other socket of its stage and the collectives spread over
        them (interconnect/collectives.py), so its bytes are split evenly over them; charged to
        the one ring link, they showed links used up to 5x their bandwidth. Elsewhere, the ring
        link to the next socket of its stage carries them all."""
        lay = self.layouts[rep.index]
        got = self._orders.get(rep.index)
        if got is None or got[0] is not lay:
            socks = [s for stage in lay.stages for s in stage]
            mesh = self.cluster.topology.kind == "full_mesh"
            links = [(socks.index(s), (s, t), share)
                     for stage in lay.stages if len(stage) > 1
                     for s, targets, share in _sends(stage, mesh) for t in targets]
            got = self._orders[rep.index] = (lay, socks,
                                             [self.cluster.node_of(s) for s in socks], links)
        return got[1], got[2], got[3]

    def report_progress(self) -> None:
        if self.progress is not None:
            self.progress(self.finished.count, len(self.trace))

    # -- faults ---------------------------------------------------------------------------
    def apply_fault(self, f: Fault) -> list[Event]:
        if self.finished.count == len(self.trace):
            # Every request is through: the run is over, and a fault now changes nothing it
            # measures (applied, a failure's reload stretched the duration to the fault's time).
            self.late_fault = True
            return []
        if f.target == "link":
            factor = LINK_DETOUR_FACTOR if f.kind == "failed" else 1.0 / f.fraction
            for lay in self.layouts.values():
                for stage in lay.stages:
                    if f.a in stage and f.b in stage:
                        for s in stage:
                            self._degrade(s, comm=factor)
            return []
        if f.kind == "degraded":
            self._degrade(f.a, compute=1.0 / f.fraction)
            return []
        return self._fail_socket(f.a)

    def _degrade(self, s: int, compute: float | None = None, comm: float | None = None) -> None:
        d = self.degradation.setdefault(s, [1.0, 1.0])
        d[0] = compute if compute is not None else d[0]
        d[1] = max(d[1], comm) if comm is not None else d[1]
        if s not in self.failed:
            self.backend.set_fault(s, d[0], d[1], False)

    def _work_end(self) -> float:
        """When the run's work ended: its last step (a recovery row's reload included) or its
        last refusal."""
        return max([self.refused_s, *(max(rep.window_end, rep.down_until)
                                      for rep in self.replicas)])

    def _fail_socket(self, s: int) -> list[Event]:
        # Sockets failing at the same instant fail together: the group is re-planned once on
        # what survives them all (one by one, each re-plan reloaded weights onto a socket
        # failing at that instant, in recovery rows overlapping in time).
        for x in [s, *(g.a for g in self.faults if g.time_s == self.now and g.target == "socket"
                       and g.kind == "failed")]:
            if x not in self.failed:
                self.failed.add(x)
                self.backend.set_fault(x, 1.0, 1.0, True)
        out = []
        for rep in self.replicas:
            if s in rep.sockets:
                out += self._route_around(rep)
        return out

    def _route_around(self, rep: Replica) -> list[Event]:
        """Re-plan the replica on its healthy sockets, or refuse its requests; returns what the
        refusals send (closed loop)."""
        # The healthy sockets of those the replica started on: a second failure re-plans over
        # them all, not only over the smaller group the first one left.
        healthy = tuple(x for x in self.home[rep.index] if x not in self.failed)
        new = self._smaller_plan(len(healthy))
        rep.drop_all_kv()
        if new is None:
            rep.refused = "a socket of its replica failed and no plan fits the remaining sockets"
            return [e for r in rep.refuse_all(rep.refused) for e in self._refused(r)]
        lay = self._with_draft(plans.layouts(self.model, self.cluster, new, self.config.options,
                                             self.config.execution_model,
                                             sockets=healthy[: new.group])[0])
        setups = self._setups(lay, new)
        for s, setup in setups.items():
            self.backend.reprogram(s, setup)
            d = self.degradation.get(s)
            if d:
                self.backend.set_fault(s, d[0], d[1], False)
        self.layouts[rep.index] = lay
        rep.sockets, rep.kv = list(lay.sockets), self._kv(lay)
        out = []
        for r in list(rep.waiting):
            if self._refusal(rep, r):
                rep.waiting.remove(r)
                r.state, r.reason = UNSERVED, self._refusal(rep, r)
                out += self._refused(r)
        self._recovery(rep, setups)
        return out

    def _smaller_plan(self, healthy: int) -> plans.PlanSpec | None:
        if self.plan.pp > 1:
            return None  # re-staging a pipeline is left to partitioning/
        tp = self.plan.tp // 2
        while tp >= 1:
            if tp <= healthy:
                cand = replace(self.plan, tp=tp, ep=math.gcd(self.plan.ep, tp))
                try:
                    if not self._footprint(cand, check=False)[1]:
                        return cand
                except ConfigError:  # a degree the model does not divide: try the next
                    pass
            tp //= 2
        return None

    def _recovery(self, rep: Replica, setups: dict[int, SocketSetup]) -> None:
        """The re-planned group reloads its weights: a recovery row in the steps table."""
        mem = MemoryTiers.of(self.cluster.chip)
        weights = max(op[3] for s in setups.values() for op in s.weights)
        reload_s = mem.copy_time(weights, self._swap_tier(), "hbm")
        start = max(self.now, rep.window_end)
        self._record_reload(rep.index, start)  # a reload still running stops where this starts
        rep.down_until = start + reload_s
        cols = {f.name: np.zeros(1) for f in metrics.STEPS}
        cols.update({"replica": np.array([rep.index]), "step": np.array([rep.step]),
                     "window": np.array([self.windows]), "phase": np.array(["recovery"]),
                     "start_s": np.array([start]), "time_s": np.array([reload_s]),
                     "straggler_socket": np.array([-1]), "expert_load_max": np.ones(1),
                     "expert": np.array([-1]), "sockets": np.array([len(setups)])})
        for name in ("batch", "prefill_tokens", "decode_tokens", "emitted_tokens"):
            cols[name] = np.zeros(1, dtype=np.int64)
        # The reloading sockets draw idle power (the copy's energy beyond idle is not modelled).
        cols.update(energy.step_columns(self.rates, None, len(setups), cols["time_s"]))
        self.reloads[rep.index] = cols

    def _record_reload(self, index: int, until: float) -> None:
        """Record replica `index`'s pending recovery row, cut at `until` if its reload was still
        running then (another failure re-planned the group: recorded whole, the two reloads'
        rows overlapped in time, and their idle energy was counted twice); a reload cut before
        it began leaves no row."""
        cols = self.reloads.pop(index, None)
        if cols is None:
            return
        start, reload_s = float(cols["start_s"][0]), float(cols["time_s"][0])
        if until < start + reload_s:
            if until <= start:
                return
            cols["time_s"] = np.array([until - start])
            cols.update(energy.step_columns(self.rates, None, int(cols["sockets"][0]),
                                            cols["time_s"]))
        self.rec.add_steps(index, cols)

    # -- results --------------------------------------------------------------------------
    def tables(self, end: float) -> Tables:
        meta = self.metadata()
        req_tbl = self.finished.close(meta)
        req_cols = self.finished.summary_columns()
        link_cols = self._link_columns(end)
        steps_tbl = sockets_tbl = None
        if self.rec.sink is None:
            steps = metrics.steps_columns(self.rec)
            steps_tbl = metrics.table(metrics.STEPS, steps, meta)
            sockets_tbl = metrics.table(metrics.SOCKETS, metrics.sockets_columns(self.rec), meta)
            totals = metrics.step_totals(steps)
        else:  # the rest of the rows go to the sink; the summary reads the steps' totals
            self.rec.finish()
            totals = self.rec.step_totals()
        return Tables(
            requests=req_tbl,
            steps=steps_tbl, sockets=sockets_tbl,
            links=metrics.table(metrics.LINKS, link_cols, meta),
            summary=self.summary(req_cols, totals, end),
        )

    def _link_columns(self, end: float) -> dict:
        top = self.cluster.topology
        bw = top.link_bandwidth_bytes_per_s * (top.links_per_pair if top.kind == "full_mesh"
                                               else 1)
        links = sorted(self.rec.link_bytes)
        nbytes = [self.rec.link_bytes[k] for k in links]
        return {"src": [a for a, _ in links], "dst": [b for _, b in links], "bytes": nbytes,
                "bandwidth_bytes_per_s": [bw] * len(links),
                "utilization": [b / (bw * end) if end > 0 else 0.0 for b in nbytes]}

    def metadata(self) -> dict:
        c = self.config
        desc = repr((self.model.name, self.cluster.name, self.plan, c.scheduler, c.limits,
                     c.seed, c.kv_memory_fraction, c.block_tokens, c.execution_model, c.faults,
                     self.trace.source, len(self.trace), c.speculation, c.draft, c.coe,
                     c.draft_placement, c.draft_sockets, c.routing, c.concurrency,
                     c.prefix))
        return {"model": self.model.name, "cluster": self.cluster.name,
                "plan": self.partition_plan().name,
                "scheduler": c.scheduler, "seed": c.seed, "trace": self.trace.source,
                "config_hash": hashlib.sha256(desc.encode()).hexdigest()[:16]}

    def summary(self, req: dict[str, np.ndarray], steps: dict, end: float) -> dict:
        """The run's figures from the requests' summary columns (Finished.summary_columns:
        NaN for null) and the steps' totals (metrics.step_totals)."""
        served = req["state"] == DONE
        ttft = metrics.percentiles(req["ttft_s"][served])
        tpot = req["tpot_s"][served]
        tpot = metrics.percentiles(tpot[~np.isnan(tpot)])  # null: a one-token output
        tokens = int(np.sum(req["generated_tokens"][served]))
        return {
            "requests": len(self.trace), "served": int(np.sum(served)),
            "unserved": int(np.sum(req["state"] == UNSERVED)),
            "makespan_s": end, "output_tokens": tokens,
            "tokens_per_s": tokens / end if end > 0 else 0.0,
            "ttft_s": ttft, "tpot_s": tpot,
            "steps": steps["steps"], "decode_steps": steps["decode_steps"],
            "windows": self.windows,
            "preemptions": int(np.sum(req["preemptions"])),  # recompute preemptions
            "swaps": self.finished.swaps,  # swap preemptions (--preemption swap)
            "switches": len(self.rec.switch_s),
            "switch_waited": int(np.count_nonzero(req["switch_wait_s"])),
            "switch_s": float(sum(self.rec.switch_s.values())),
            "tokens_per_decode": _tokens_per_decode(steps),
            "speculation": _describe(self.config),
            **energy.summary(self.rates, steps, self.cluster.sockets, end, tokens),
            "bench": bench.summary(self._measured(req), end, self.config.metrics),
            "overloaded": self._overloaded(req, end),
            **prefix_cache.summary(self.finished.admitted, self.finished.prefix_tokens,
                                   self.finished.prefix_copy_s, self.prefix_mode,
                                   self._lower_tier()),
        }

    def _measured(self, req: dict) -> bench.Measured:
        """The completed requests' client-side times (engine/bench.py): `req`'s columns
        (this run's, or a disaggregated run's in this run's request order) and the chunk
        times and ITLs recorded as they completed (in request order)."""
        done = np.asarray(req["state"]) == DONE  # a mask: no Python object per request
        col = lambda name: np.asarray(req[name])[done].astype(float)
        return bench.Measured(
            send_s=col("arrival_s"), ttft_s=col("ttft_s"), e2el_s=col("e2e_s"),
            output_len=col("generated_tokens").astype(np.int64),
            prompt_len=col("prompt_len").astype(np.int64),
            itl_s=self.finished.itl_s, chunk_s=self.finished.chunk_s)

    def _overloaded(self, req: dict, end: float) -> bool:
        if self.config.concurrency is not None or self.trace.after is not None:
            return False  # closed loop (clients, sessions): they bound the queue
        arrival = req["arrival_s"]
        admit = np.where(np.isnan(req["queue_s"]), math.inf, arrival + req["queue_s"])
        return bench.overloaded(arrival, admit)


def _sends(stage: list[int], mesh: bool) -> list[tuple[int, list[int], float]]:
    """(socket, the sockets its bytes go to, the share each takes) for a stage of two or
    more: on a full mesh, every other socket of the stage, evenly; else the next one, all."""
    if mesh:
        return [(s, [t for t in stage if t != s], 1.0 / (len(stage) - 1)) for s in stage]
    return [(s, [stage[(pos + 1) % len(stage)]], 1.0) for pos, s in enumerate(stage)]


def _kv_reference(lay: plans.ReplicaLayout) -> float:
    """KV bytes per token the replica's region ops count in: its target sockets' largest."""
    return max(plans.kv_bytes_per_token(p) for p in lay.programs.values()
               if p.spec_part != "draft")


def _check_placement(config: ServeConfig) -> None:
    if config.draft_placement not in PLACEMENTS:
        raise ConfigError(f"--draft-placement: {config.draft_placement!r} unknown; accepted: "
                          f"{', '.join(PLACEMENTS)}")
    if config.draft_placement == "separate" and config.faults:
        raise ConfigError("--fault: not with --draft-placement separate (re-planning a group "
                          "keeps the draft on the target's sockets only)")


def _describe(config: ServeConfig) -> str:
    """The speculation of the run, for the summary ("" without one)."""
    spec = config.speculation
    if spec is None:
        return ""
    shape = (f"tree {','.join(map(str, spec.branching))}" if spec.branching else f"k={spec.k}")
    where = ("on the target's sockets" if config.draft_placement == "shared"
             else f"on {config.draft_sockets} sockets of its own")
    return f"draft {config.draft} {where}, {shape}, acceptance {spec.acceptance.describe()}"


def _check_coe(config: ServeConfig) -> None:
    # a CoE batch holds one expert's requests: only the coe policy plans so, and needs experts
    if config.coe is not None and config.scheduler != "coe":
        raise ConfigError(f"--scheduler {config.scheduler}: not with --coe-experts, which runs "
                          "--scheduler coe (its default)")
    if config.coe is None and config.scheduler == "coe":
        raise ConfigError("--scheduler coe: only with --coe-experts")
    if config.coe is not None and config.faults:
        raise ConfigError("--fault: not with --coe-experts (a re-planned group would lose its "
                          "expert copies)")


def _tokens_per_decode(steps: dict) -> float:
    """Mean tokens a sequence's decode step emits (1 without speculation)."""
    decodes = float(steps["decode_tokens"])
    return float(steps["emitted_tokens"]) / decodes if decodes else float("nan")


def _check_prediction(predicted: np.ndarray, ends: np.ndarray) -> None:
    """The sockets' step times are the ones the window was planned with (engine/lookahead.py):
    otherwise the window is not what a step-by-step loop would have done."""
    n = len(predicted)
    if not np.array_equal(predicted, ends[:n]):
        bad = int(np.flatnonzero(predicted != ends[:n])[0])
        raise RuntimeError(f"internal error: step {bad} of a window ended at {ends[bad]!r} s, "
                           f"planned with {predicted[bad]!r} s")


__all__ = ["DECODE", "MIXED", "PREFILL", "ROWS", "ServeConfig", "Simulation", "Tables"]
