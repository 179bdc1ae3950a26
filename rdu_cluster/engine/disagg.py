"""Disaggregated serving: a prefill pool and a decode pool, possibly of different chips, with
each request's KV cache handed from its prefill replica to a decode replica over an inter-node
fabric (DistServe, Splitwise; vLLM's disaggregated prefill with its NIXL connector).

A request goes first to the prefill pool, where it is served as a request of one output token:
its prefill computes the prompt's KV. The KV then moves to the decode pool: the bytes are the
model's KV per token (workloads.graph.kv_cache_bytes) times the tokens sent, and the time is the
interconnect model's: each socket of the prefill replica sends its share to every socket of the
decode replica (the shards are re-cut when the two TP degrees differ), all the flows sharing
the fabric ports max-min fairly (interconnect.contention), one port per socket into a
non-blocking switch (the fabric TOML's bandwidth and latency, with their source). The decode
replica admits the request with that KV and decodes every output token, the first one included:
as vLLM's NIXL connector does, the prefill's sampled token is not streamed; the decode side
takes the prompt's KV except its last token and runs that token as its first decode step. So
TTFT = prefill queue + prefill + KV transfer + decode queue + one decode step.

Both pools run in one event loop (loop.run_coupled), each a Simulation of its own. A request
whose prefill ends (or that the prefill pool refuses) is handed on at once: its decode replica
is dealt round-robin as it is sent, and its KV transfer holds the ports of its prefill replica
and of its decode replica for its duration (Ports: a transfer that finds a port held waits for
it), so hand-overs contend on the fabric. Closed loops (--concurrency clients, --sessions) run
over the pools: a request through the decode pool sends its client's next request (its
session's next turn, after the think time) to the prefill pool, which holds the prefix cache
(a turn's history is found where it was prefilled; the decode pool receives the whole prompt's
KV). A replica of either pool plans ahead only to the earliest time something it cannot see
yet could reach it (Handover.frontier: another replica's next window, in either pool), so
every arrival is seen at the step boundary it would be in a step-by-step loop; a replica's
window is timed as it is planned up to there (engine/lookahead.py; a closed loop's prefill
replica up to Handover.returns), taking the arrivals known by then as they reach it. Replica
routing is round-robin in both pools (a stateful policy would need the other pool's state at
each hand-over). The prefill replica frees the KV when its step ends (the transfer overlapping
its later steps).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chip.socket import PREFILL
from interconnect.contention import max_min_rates
from interconnect.routes import route, route_latency
from interconnect.topology import TopologySpec, build_topology
from partitioning.cluster import ClusterSpec
from partitioning.plan import Plan as PartitionPlan
from rdu_cluster.backends import Backend
from rdu_cluster.config import MAX_SOCKETS, FabricSpec, load_cluster
from rdu_cluster.engine import (
    bench,
    checkpoint,
    decided,
    energy,
    lookahead,
    loop,
    metrics,
    replica_routing,
    summary,
)
from rdu_cluster.engine import plan as plans
from rdu_cluster.engine.checkpoint import Checkpoint
from rdu_cluster.engine.dispatch import OWN_COMPLETION, Dispatcher, Pending
from rdu_cluster.engine.events import Arrival, Event
from rdu_cluster.engine.replica import Replica, Window
from rdu_cluster.engine.replica_routing import ReplicaView
from rdu_cluster.engine.requests import DONE, UNSERVED, Request
from rdu_cluster.engine.simulation import ServeConfig, Simulation, Tables
from workloads import graph
from workloads.errors import ConfigError
from workloads.spec import ModelSpec
from workloads.traces import Trace, per_trace


@dataclass(frozen=True)
class Pool:
    """`CLUSTER:PLAN:N`: N replicas of PLAN on CLUSTER's chip and node network."""

    cluster: str
    plan: str
    replicas: int
    # the cluster's figures overridden (--set KEY=VALUE, as load_cluster takes them)
    overrides: tuple[tuple[str, object], ...] = ()

    @classmethod
    def parse(cls, text: str, flag: str) -> Pool:
        parts = str(text).split(":")
        if len(parts) != 3 or not all(parts):
            raise ConfigError(f"{flag}: {text!r}; expected CLUSTER:PLAN:N (sn40l-16:tp16:1)")
        try:
            n = int(parts[2])
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"{flag}: {text!r}: N must be a positive number of replicas")
        return cls(parts[0], parts[1], n)

    def spec(self, model: ModelSpec, fabric: FabricSpec) -> ClusterSpec:
        """The pool as a cluster: N plan groups on the cluster's chip; the nodes (when a pool
        spans several) are joined by the fabric unless the cluster names its own."""
        base = load_cluster(self.cluster, dict(self.overrides))
        group = group_sockets(self.plan)
        sockets = self.replicas * group
        if sockets > MAX_SOCKETS:
            raise ConfigError(f"{self}: {self.replicas:,} replicas of {group} sockets are "
                              f"{sockets:,} sockets; at most {MAX_SOCKETS:,} accepted")
        per_node = math.gcd(sockets, base.sockets_per_node)
        topo = base.topology
        if sockets > per_node and topo.inter_node_bandwidth_bytes_per_s <= 0:
            topo = replace(topo, inter_node_bandwidth_bytes_per_s=fabric.bandwidth_bytes_per_s,
                           inter_node_latency_s=fabric.latency_s)
        out = replace(base, sockets=sockets, sockets_per_node=per_node, topology=topo)
        plans.PlanSpec.parse(self.plan, out, model)  # ep against the model, pp the layers
        return out

    def __str__(self) -> str:
        return f"{self.cluster}:{self.plan}:{self.replicas}"


def group_sockets(plan: str) -> int:
    """Sockets of one replica of `plan` (tp x ep x pp in the partitioner's syntax)."""
    p = PartitionPlan.parse(plan)
    return p.tp * p.ep * p.pp


def transfer_time(fabric: FabricSpec, senders: int, receivers: int,
                  nbytes: np.ndarray) -> np.ndarray:
    """Seconds to move `nbytes` (per request) from a replica of `senders` sockets to one of
    `receivers`: every sender-receiver pair carries an equal share, at the max-min fair rates
    of the fabric's ports, after the route's latency."""
    latency, rate = _flows(fabric, senders, receivers)
    share = np.asarray(nbytes, dtype=float) / (senders * receivers)
    return np.where(share > 0, latency + share / rate, latency)


@lru_cache(maxsize=64)
def _flows(fabric: FabricSpec, senders: int, receivers: int) -> tuple[float, float]:
    """(latency, slowest flow's rate) of the all-pairs hand-over through the fabric's switch."""
    spec = TopologySpec("switch", fabric.bandwidth_bytes_per_s, fabric.latency_s,
                        source=fabric.source)
    topo = build_topology(spec, senders + receivers, senders + receivers)
    routes = [route(topo, s, senders + d) for s in range(senders) for d in range(receivers)]
    rates = max_min_rates(routes, topo.capacities)
    return max(route_latency(topo, r) for r in routes), float(rates.min())


@dataclass
class Disaggregated:
    model: ModelSpec
    prefill: Pool
    decode: Pool
    fabric: FabricSpec
    trace: Trace
    config: ServeConfig
    backend: Callable[[], object]  # a new backend for each pool
    progress: Callable[[int, int], None] | None = None
    summary_only: bool = False  # Simulation.summary_only, in both pools
    watch: decided.Watch | None = None  # stop once the verdict is certain (engine/decided.py)
    keep: bool = False  # keep a checkpoint to serve more requests from (continued)

    def __post_init__(self) -> None:
        if self.config.faults or self.config.coe is not None or self.config.speculation:
            raise ConfigError("--prefill-pool/--decode-pool: not with --fault, --coe-experts "
                              "or --draft")
        if replica_routing.get(self.config.routing).stateful:
            raise ConfigError(f"--routing {self.config.routing}: not with --prefill-pool/"
                              "--decode-pool (each pool deals its requests round-robin: a "
                              "request's decode replica is chosen as its prefill ends)")
        self.clusters = (self.prefill.spec(self.model, self.fabric),
                         self.decode.spec(self.model, self.fabric))
        self.kv_per_token = float(graph.kv_cache_bytes(self.model, 1, 1))
        self.checkpoint: Checkpoint | None = None
        self._resume: tuple[list, int] | None = None  # a kept run's event queue and count

    def run(self) -> Tables:
        """Both pools in one event loop (loop.run_coupled): the prefill pool sends each
        request on as its prefill ends (Handover), the decode pool's completions send a closed
        loop's next request to the prefill pool. With `keep`, a closed loop of clients keeps
        the checkpoint (`checkpoint`) from which `continued` serves more requests."""
        t, c = self.trace, self.config
        pre = Simulation(self.model, self.clusters[0], replace(
            t, output_len=np.ones(len(t), dtype=np.int64)), replace(c, plan=self.prefill.plan),
            self.backend())
        dec = Simulation(self.model, self.clusters[1], Trace(
            np.zeros(len(t)), t.prompt_len, t.output_len, source=t.source),
            replace(c, plan=self.decode.plan, concurrency=None), self.backend(), self.progress)
        pre.summary_only = dec.summary_only = self.summary_only
        sent = np.maximum(t.prompt_len - 1, 0)  # the decode side recomputes the last
        dec.received = sent
        hand = Handover(pre, dec, self._flows(pre, dec), sent * self.kv_per_token)
        pre.dispatch = _PrefillSide(c.routing, c.concurrency, hand)
        dec.dispatch = _DecodeSide(c.routing, None, hand)
        self.sims, self.hand = (pre, dec), hand
        hand.shift = {} if self.watch is not None else None
        self._watch(self.watch)
        started = time.perf_counter()
        try:
            for sim in self.sims:
                sim.start()
            hand.start()
            # each pool's arrivals are known up to its frontier (known_until); a request
            # refused as it arrives would send the next one at the window's start
            dec.lookahead = False
            for sim in self.sims:
                if hand.direct is None and sim.can_time():
                    sim.look_ahead()
        except BaseException:
            self._close()
            raise
        return self._loop([(0, e) for e in pre.initial_events()], None, started)

    def kept(self) -> Disaggregated | None:
        """The run as its checkpoint kept it (with `keep`, a closed loop of clients: None
        where none was taken, engine/checkpoint.py), to go on with more requests
        (`continued`)."""
        cp = self.checkpoint
        if cp is None or cp.state is None:
            return None
        paused, heap, order = cp.state
        paused._resume = (heap, order)
        return paused

    def _watch(self, watch: decided.Watch | None) -> None:
        """The run stops once `watch` is certain of its verdict (None: served to its end): it
        watches the sends to the prefill pool and the first tokens and completions of the
        decode pool; with `keep`, it raises at the end of its event (Watch.defer), where the
        run can be kept."""
        pre, dec = self.sims
        hand = self.hand
        self.watch = pre.dispatch.watch = hand.watch = watch
        dec.finished.watch = None
        if watch is not None:
            watch.waits = True  # told of each first token: TTFTs certain as they wait
            watch.defer = self.keep
            dec.finished.watch = decided.completions(watch, hand.shift)

    def _pending(self) -> decided.Decided | None:
        return None if self.watch is None else self.watch.pending

    def continues(self, trace: Trace, watch: decided.Watch | None = None) -> bool:
        """Whether `continued` serves `trace` from this kept run: `trace` its requests and
        more, none shorter or longer than they are (what the frontier and the hand-over
        assume: _least_prefill, Handover.least_move); with `watch`, a run stopped once its
        verdict is certain, where this run was watched and `watch` takes it up as it would
        have watched from the start (Watch.goes_on)."""
        t, n = self.trace, len(self.trace)
        if watch is not None and (self.watch is None or not watch.goes_on(self.watch)):
            return False
        return (self._resume is not None and len(trace) > n and trace.after is None
                and trace.content is None and trace.model is None and t.model is None
                and all(np.array_equal(getattr(trace, k)[:n], getattr(t, k))
                        for k in ("arrival_s", "prompt_len", "output_len"))
                and all(f(getattr(trace, k)) == f(getattr(t, k)) for f in (np.min, np.max)
                        for k in ("prompt_len", "output_len")))

    def continued(self, trace: Trace, watch: decided.Watch | None = None) -> Tables:
        """The run of `trace` (continues) from this kept run: the tables a run of it from the
        start gives (engine/checkpoint.py), or with `watch` its verdict where it stops once
        certain (Decided, as from the start); it keeps a checkpoint of its own where this one
        did (kept). Once: the run goes on from here."""
        if not self.continues(trace, watch):
            raise ValueError("continued: this run does not continue to that trace")
        resume, self._resume = self._resume, None
        old = self.watch
        self._extend(trace)
        if watch is not None and old is not None:  # (continues: a watched run has one)
            watch.take_up(old)
        else:
            self.hand.shift = None
        self._watch(watch)
        return self._loop([], resume, time.perf_counter())

    def _extend(self, t: Trace) -> None:
        """This (copied) run's trace continued to `t`: the per-request arrays and the closed
        loop's requests to send."""
        pre, dec = self.sims
        hand, n = self.hand, len(t)
        self.trace = t
        pre.trace = pre.build.trace = replace(t, output_len=np.ones(n, dtype=np.int64))
        dec.trace = dec.build.trace = Trace(np.zeros(n), t.prompt_len, t.output_len,
                                            source=t.source)
        sent = np.maximum(t.prompt_len - 1, 0)
        dec.received, hand.bytes_of = sent, sent * self.kv_per_token
        grown = np.zeros(n - len(hand.move))
        hand.move, hand.nbytes = (np.concatenate([a, grown]) for a in (hand.move, hand.nbytes))
        experts, ready = dec._routing()
        hand.make = functools.partial(dec._request, experts=experts, ready=ready)
        experts, ready = pre._routing()
        pre.dispatch.extend(functools.partial(pre._request, experts=experts, ready=ready), n)

    def _loop(self, events: list, resume: tuple | None, started: float) -> Tables:
        """Run the loop (from `resume`: an event queue and its count) and build the tables."""
        pre, dec = self.sims
        t, c = self.trace, self.config
        cp = None
        if (self.keep and c.concurrency is not None and t.after is None
                and all(getattr(s.backend, "name", "") == "local" for s in self.sims)):
            cp = pre.dispatch.checkpoint = Checkpoint(len(t) - c.concurrency,
                                                      pre.dispatch.plans_hold)
        try:
            ran = time.perf_counter()
            try:
                end = loop.run_coupled(self.sims, events, self.hand.take, cp, self,
                                       self._shared, resume,
                                       self._pending if self.watch and self.watch.defer
                                       else None)
            finally:  # a run stopped as certain (Decided) keeps the copy it took
                self.checkpoint = cp
            for sim in self.sims:  # each pool is made with its backend (run)
                cast(Backend, sim.backend).sync()
            built = time.perf_counter()
            p_tables, d_tables = pre.tables(end), dec.tables(end)
            out = self._combine(p_tables, d_tables, np.arange(len(t)), self.hand.move,
                                self.hand.nbytes)
            done = time.perf_counter()
        finally:
            closing = time.perf_counter()
            self._close()
        self.wall = {"start_s": ran - started, "run_s": built - ran, "tables_s": done - built,
                     "close_s": time.perf_counter() - closing}
        return out

    def _close(self) -> None:
        for sim in self.sims:
            sim.finished.drop()
            cast(Backend, sim.backend).close()

    def _shared(self) -> list:
        """What a checkpoint's copy shares with the run: the cost tables, the model and the
        trace (none of which a run changes)."""
        return [*checkpoint.shared_tables([s.backend for s in self.sims]), self.model,
                self.trace, *self.clusters, self.config, self.fabric]

    def _flows(self, pre: Simulation, dec: Simulation) -> tuple[int, int, float, float]:
        """(senders, receivers, latency, slowest flow's rate) of a replica-to-replica
        hand-over (transfer_time)."""
        ps, ds = pre.plan, dec.plan
        senders, receivers = ps.tp * ps.pp, ds.tp * ds.pp
        return (senders, receivers, *_flows(self.fabric, senders, receivers))

    # -- one set of tables --------------------------------------------------------------
    def _combine(self, p: Tables, d: Tables, idx, move, nbytes) -> Tables:
        pre, dec = self.sims
        n_rep = len(pre.replicas)
        # a disaggregated run is not streamed (no sink): each pool has its requests table
        req = _requests(cast(pa.Table, p.requests).to_pydict(),
                        cast(pa.Table, d.requests).to_pydict(), idx, move, nbytes, n_rep)
        meta = dict(dec.metadata(), cluster=f"{self.clusters[0].name}+{self.clusters[1].name}",
                    plan=f"prefill {self.prefill}, decode {self.decode}, fabric "
                    f"{self.fabric.name}", prefill_replicas=n_rep)
        steps = (None if p.steps is None  # summary_only: no steps table
                 else pa.concat_tables([p.steps, _shift(d.steps, {"replica": n_rep})]))
        sockets = pa.concat_tables([p.sockets, _shift(d.sockets, {
            "replica": n_rep, "socket": self.clusters[0].sockets,
            "node": self.clusters[0].nodes})])
        links = pa.concat_tables([p.links, _shift(d.links, {
            "src": self.clusters[0].sockets, "dst": self.clusters[0].sockets})])
        return Tables(
            requests=metrics.table(metrics.REQUESTS, req, meta),
            steps=None if steps is None else steps.replace_schema_metadata(_meta(steps, meta)),
            sockets=sockets.replace_schema_metadata(_meta(sockets, meta)),
            links=links.replace_schema_metadata(_meta(links, meta)),
            summary=self._summary(req, p, d, idx))

    def _summary(self, req: dict, p: Tables, d: Tables, idx) -> dict:
        dec = self.sims[1]
        end = max(p.summary["makespan_s"], d.summary["makespan_s"])
        out = dict(d.summary)
        served = [i for i, s in enumerate(req["state"]) if s == DONE]
        tokens = int(sum(req["generated_tokens"][i] for i in served))
        parts = [energy.summary(s.rates, s.rec.step_totals(), c.sockets, end, tokens)
                 for s, c in zip(self.sims, self.clusters)]
        total = {k: _sum(q[k] for q in parts) for k in ("energy_j", "cost_usd")}
        moves = [req["kv_transfer_s"][i] for i in served]
        out.update({
            "requests": len(req["state"]), "served": len(served),
            "unserved": sum(1 for s in req["state"] if s == UNSERVED),
            "makespan_s": end, "output_tokens": tokens,
            "tokens_per_s": tokens / end if end > 0 else 0.0,
            "ttft_s": metrics.percentiles([req["ttft_s"][i] for i in served]),
            "tpot_s": metrics.percentiles([req["tpot_s"][i] for i in served]),
            "steps": p.summary["steps"] + d.summary["steps"],
            "decode_steps": p.summary["decode_steps"] + d.summary["decode_steps"],
            "windows": p.summary["windows"] + d.summary["windows"],
            "preemptions": int(sum(req["preemptions"])), "swaps": int(sum(req["swaps"])),
            "energy_j": total["energy_j"], "cost_usd": total["cost_usd"],
            "power_w": energy._ratio(total["energy_j"], end),
            "joules_per_token": energy._ratio(total["energy_j"], tokens),
            "cost_per_million_tokens_usd": energy._ratio(
                None if total["cost_usd"] is None else total["cost_usd"] * 1e6, tokens),
            "overloaded": p.summary["overloaded"] or d.summary["overloaded"],
            "kv_transfer_ms": metrics.percentiles([m * 1e3 for m in moves]),
            "kv_transfer_bytes_mean": float(np.mean([req["kv_transfer_bytes"][i]
                                                     for i in served])) if served else 0.0,
            "pools": {"prefill": str(self.prefill), "decode": str(self.decode),
                      "fabric": self.fabric.name,
                      "sockets": [c.sockets for c in self.clusters]},
        })
        out.update({k: p.summary[k] for k in PREFIX_KEYS})  # prompts are cached where prefilled
        m = summary.measured(dec, _decode_rows(req, idx))
        out["bench"] = bench.summary(m, end, self.config.metrics)
        return out


PREFIX_KEYS = ("prefix_cache", "prefix_cache_hit_rate", "prefix_cache_hit_rate_by_tier",
               "prefix_copy_s")  # engine/prefix_cache.summary


def _requests(p: dict, d: dict, idx, move, nbytes, n_rep: int) -> dict:
    """Each request's row: the prefill pool's queue and admission, the decode pool's tokens
    and times, measured from the original arrival; energy and cost of both."""
    out = {k: list(v) for k, v in p.items()}
    out["prefill_replica"] = list(p["replica"])
    out["kv_transfer_s"] = [0.0] * len(p["state"])
    out["kv_transfer_bytes"] = [0.0] * len(p["state"])
    out["generated_tokens"] = [0] * len(p["state"])
    for j, i in enumerate(idx.tolist()):
        arrival = p["arrival_s"][i]
        for k in ("state", "output_len", "generated_tokens", "reason", "finish_s", "tpot_s"):
            out[k][i] = d[k][j]
        out["replica"][i] = d["replica"][j] + n_rep
        out["kv_transfer_s"][i], out["kv_transfer_bytes"][i] = float(move[j]), float(nbytes[j])
        shift = d["arrival_s"][j] - arrival  # prefill + transfer, before the decode pool
        # a request the prefill pool refused never queued there (null, as a pool's own row)
        out["queue_s"][i] = (None if p["queue_s"][i] is None
                             else p["queue_s"][i] + (d["queue_s"][j] or 0.0))
        out["ttft_s"][i] = None if d["ttft_s"][j] is None else d["ttft_s"][j] + shift
        out["e2e_s"][i] = None if d["e2e_s"][j] is None else d["e2e_s"][j] + shift
        for k in ("preemptions", "swaps"):
            out[k][i] = p[k][i] + d[k][j]
        for k in ("energy_j", "cost_usd"):
            out[k][i] = _sum((p[k][i], d[k][j]))
    return out


def _decode_rows(req: dict, idx) -> dict:
    """The combined columns in the decode simulation's request order."""
    return {k: [v[i] for i in idx.tolist()] for k, v in req.items()}


def _sum(values) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else float(sum(values))


def _shift(tbl: pa.Table, by: dict[str, int]) -> pa.Table:
    for name, k in by.items():
        i = tbl.schema.get_field_index(name)
        tbl = tbl.set_column(i, tbl.schema.field(i), pc.add(tbl.column(i), k))
    return tbl


def _meta(tbl: pa.Table, meta: dict) -> dict:
    out = dict(tbl.schema.metadata or {})
    out.update({f"rdu_cluster.{k}".encode(): str(v).encode() for k, v in meta.items()})
    return out


# -- the two pools in one loop ------------------------------------------------------------
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
        self.least_prefill = _least_prefill(self.pre)

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
            side = cast(_DecodeSide, self.dec.dispatch)  # as Disaggregated.run sets it
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
            if self.shift is not None:
                self.shift[rid] = arrive - sent
            out.append(cast(_DecodeSide, self.dec.dispatch).handoff(d, arrive, to))
        return out

    def decoded(self, r: Request, t: float) -> None:
        """r is through the decode pool at t (done or refused): its closed loop goes on."""
        side = cast(_PrefillSide, self.pre.dispatch)  # as Disaggregated.run sets it
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
                 else min(p.peek() for p in sim.dispatch.pending.values()))
            if sim is self.dec:
                t = min(t, dealt)
            for q in sim.replicas:
                if q is not rep:
                    t = min(t, _next_window(q, sim.now))
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
        now, pending = pre.now, pre.dispatch.pending
        prefill, move = self.least_prefill, self.least_move
        t = self._decode_next()
        for q in pre.replicas:
            if q is not rep:
                s = _next_window(q, now, pending[q.index]) + prefill + move
                t = min(t, s)
        return t + self._lag()

    def _decode_next(self) -> float:
        """The earliest a decode completion not known yet could come: no sooner than a decode
        replica's next window (a window's completions are known as it starts), which takes a
        hand-over no sooner than it arrives or, not dealt yet, could (_first_dealt)."""
        dec, now = self.dec, self.dec.now
        return min([self._first_dealt(), *[p.peek() for p in dec.dispatch.pending.values()],
                    *[_next_window(q, now) for q in dec.replicas]])

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
        worked: list[Replica] = []
        idle: list[Replica] = []
        for q in self.pre.replicas:
            (worked if q.running or q.waiting or q.swapped else idle).append(q)
        t = min([q.window_end if q.busy else now for q in worked], default=math.inf)
        if idle:
            # one without work starts at max(b, min(anywhere, its own next arrival)), b its
            # window's end (busy) or -inf: min(max(b, its own), max(b, anywhere)), so that
            # over them anywhere is asked once, beside the least b (to the bit: min and max
            # only choose; lists, not a min() a replica: ~2% of a sessions pair's settle)
            own = [max(q.window_end, pending[q.index].peek()) if q.busy
                   else pending[q.index].peek() for q in idle]
            least = min([q.window_end if q.busy else -math.inf for q in idle])
            anywhere = min(self._decode_next() + self._lag(), pending[None].peek())
            t = min(t, min(own), max(least, anywhere))
        return t + self.least_prefill

    def _prefills_due(self) -> float:
        """The earliest a request on its way to the prefill pool could be handed on to a
        decode replica but `direct`: not before it arrives, nor before its prefill replica's
        current window ends (a window admits nothing mid-way, and its completions are known
        as it starts). A request refused on arrival goes to decode replica 0 at once
        (prefilled), which therefore takes the arrivals as they are where one may be."""
        pending = self.pre.dispatch.pending
        t = pending[None].peek()  # routed on arrival (a stateful policy)
        for q in self.pre.replicas:
            a = pending[q.index].peek()
            t = min(t, max(a, q.window_end) if q.busy else a)
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


def _next_window(q: Replica, now: float, idle: Pending | None = None) -> float:
    """The earliest replica q's next window can start: its current one's end, now where it is
    idle with work, else its next arrival where `idle` (its arrivals to come) is given (read
    only then: a prefill replica's every window asks this of each other one)."""
    if q.busy:
        return q.window_end
    if q.running or q.waiting or q.swapped:
        return now
    return math.inf if idle is None else idle.peek()


@dataclass(frozen=True)
class Dealt(Event):
    """The prefills through by now are dealt to the decode pool (Handover.deal): an event of
    the decode pool's, before its windows at the same time start."""

    priority = 0

    def handle(self, sim: Simulation) -> list[Event]:
        side = sim.dispatch
        assert isinstance(side, _DecodeSide)
        return list(side.hand.deal(self.time))


class _PrefillSide(Dispatcher):
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
            _check_least(self.hand.least_prefill, window, ends, self.hand.pre.now,
                         [r for _, _, r in done])
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


class _DecodeSide(Dispatcher):
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
                for r in sp.decode:
                    if r.first_token_step == sp.first_step:
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
        h = min(self.pending[rep.index].peek(), self.hand.frontier(rep, decode=True))
        # closed loop: its own completion sends a request through the prefill pool to it
        return min(h, OWN_COMPLETION) if self.hand.pre.dispatch.unsent else h

    def more_arrivals(self, rep: Replica) -> bool:
        return bool(self.pending[rep.index]) or self.hand.prefill_active()


def _least_prefill(sim: Simulation) -> float:
    """A lower bound on a prefill step that completes a request in the prefill pool `sim`:
    LEAST_PREFILL_SHARE of the least its cost tables give a step of k of the shortest
    prompts (with a prefix cache over the trace's content, of the fewest tokens a request
    could leave uncached: _least_uncached), or of more tokens within the token budget (k = 1,
    2, 4 ... up to the budget's count of them or --max-batch: a grid of a few evaluations
    however short the prompts); where every prompt has one length and none is cached, the
    least of the steps of k = 1, 2, 3 ... of them, the only ones that complete a request
    (EXACT_PREFILL_SHARE: a 500-client pair's decode windows, cut where a prefill could end,
    went from 1,658 to 1,069: DeepSeek-V3, hgx-h200:tp8:2 + sn40l-16:tp32:3). A replica of
    several pipeline stages runs them one after another in a step (engine/step_times.py):
    the sum of each stage's least. 0 with chunked prefill (a step may complete a prompt's
    last few tokens), or where a stage's sockets do not share one program's tables."""
    t, lim = sim.trace, sim.config.limits
    if not len(t) or lim.chunked_prefill:
        return 0.0
    cached = t.content is not None and any(q.prefix is not None for q in sim.replicas)
    shortest = _least_uncached(t) if cached else int(t.prompt_len.min())
    if shortest < 1:
        return 0.0
    budget = max(lim.token_budget, shortest)
    most = max(min(budget // shortest, lim.max_batch), 1)  # sequences a step may hold
    # every prompt the same length, none cached: a step that completes one is k of them
    exact = not cached and int(t.prompt_len.max()) == shortest
    counts = (range(1, most + 1) if exact
              else sorted({*(2 ** e for e in range(most.bit_length())), most}))  # 1, 2, 4 ...
    shapes = ([(k, k * shortest, 0) for k in counts] if exact else
              [(k, int(n), 0) for k in counts
               for n in np.unique(np.linspace(k * shortest, budget, 8).astype(int))])
    stages = sim.layouts[0].stages
    predictor = sim.predictor or lookahead.Predictor(
        {k: sim.setups[k] for stage in stages for k in stage}, getattr(sim.backend, "memo", None))
    least = 0.0
    for stage in stages:
        tables = predictor.shared(stage)
        if tables is None:
            return 0.0
        tables.fill_prefill(shapes)
        least += min(tables.step_times(PREFILL, 0, 0, 1, shape)[0] for shape in shapes)
    return (EXACT_PREFILL_SHARE if exact else LEAST_PREFILL_SHARE) * least


@per_trace()
def _least_uncached(t: Trace) -> int:
    """The fewest prompt tokens a request of `t` could find uncached: its prompt past the
    longest token prefix (Trace.content) it shares with a request other than it and its
    later turns, prompt and output (any of those may have been prefilled first; a later
    turn, sent after this one completes, cannot). Tokens are a chunk's (id, offset), as the
    prefix cache's blocks hash them (prefix_cache.block_hashes): a chunk of the same id but
    another length behind the same prefix shares the shorter one's tokens. Once a trace
    (capacity's pair runs serve one trace over and over, 35 ms each)."""
    content = t.content or ()
    after = t.after
    nexts: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (prefix, id) -> (holder, n)
    for j, chunks in enumerate(content):
        key = 0
        for cid, n in chunks:
            nexts.setdefault((key, cid), []).append((j, n))
            key = hash((key, cid, n))

    def later(j: int, i: int) -> bool:  # j follows i in its session (or is i)
        while j >= 0 and j != i:
            j = int(after[j]) if after is not None else -1
        return j == i

    least = None
    for i, chunks in enumerate(content):
        key, hit = 0, 0
        own = functools.partial(later, i=i)
        for cid, n in chunks:
            held = _held(nexts[(key, cid)], n, own)
            hit += min(held, n)
            if held != n:  # a shorter or longer chunk of that id: the tokens part ways
                break
            key = hash((key, cid, n))
        left = int(t.prompt_len[i]) - hit
        least = left if least is None else min(least, left)
    return max(least or 0, 0)


def _held(holders: list[tuple[int, int]], n: int, own: Callable[[int], bool]) -> int:
    """n where a holder not `own` holds the chunk whole (the first such one ends the search:
    a shared prefix is held by most requests), else the longest part of it one holds (0:
    none)."""
    most = 0
    for j, m in holders:
        if not own(j):
            if m == n:
                return n
            most = max(most, m)
    return most


# Half the least a grid of steps costs: a step between the grid's points, or of the same
# tokens over other sequence counts (less attention), may cost less than its neighbours, by far less
# than half on the tables (_check_least stops a run where one does, rather than let it
# plan past an arrival).
LEAST_PREFILL_SHARE = 0.5
# Where the steps that complete a request are all on the grid (prompts of one length, none
# cached), the least of them, less what the absolute times' last bits may take from a step's
# length (about 1e-16 of a time; a run of days' times lose 1e-11 s, a step is milliseconds)
EXACT_PREFILL_SHARE = 1.0 - 1e-6


def _check_least(least: float, window: Window, ends: np.ndarray, t0: float,
                 done: list[Request]) -> None:
    """Each step of the window that completes a request took at least `least`."""
    starts = lookahead.starts(t0, ends, window.resumes)
    first = window.spans[0].first_step
    for r in done:
        i = r.done_step - first
        if ends[i] - starts[i] < least:
            raise RuntimeError(f"internal error: a prefill step took {ends[i] - starts[i]!r} s,"
                               f" under the least the pool's frontier assumes, {least!r} s")


def _completed(rep: Replica, window: Window, ends: np.ndarray
               ) -> list[tuple[float, int, Request]]:
    """(time, id, request) of each request the window completes: those the replica completed
    since the engine last took them (Replica.completed: it takes them after the window), not
    a pass over every span's batch."""
    first = window.spans[0].first_step
    return [(float(ends[r.done_step - first]), r.id, r) for r in rep.completed]


class Ports:
    """When each fabric port is held by a hand-over: a transfer starts at the first time at or
    after it is ready that all its ports are free for its duration (intervals booked earlier
    stand; those over before the loop's time are forgotten)."""

    def __init__(self) -> None:
        self.held: dict[tuple, list[tuple[float, float]]] = {}

    def book(self, ports: tuple, ready: float, hold: float, now: float) -> float:
        if hold <= 0:
            return ready
        lists = [self.held.setdefault(p, []) for p in ports]
        t, moved = ready, True
        while moved:
            moved = False
            for held in lists:
                for a, b in held:
                    if a < t + hold and b > t:
                        t, moved = b, True
        for held in lists:
            bisect.insort(held, (t, t + hold))
            held[:] = [(a, b) for a, b in held if b >= now]
        return t


__all__ = ["Disaggregated", "Pool", "transfer_time"]
