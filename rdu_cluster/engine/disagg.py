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

The pools run one after the other: the decode pool never feeds back into the prefill pool under
open-loop load, so the prefill pool's completion times (plus the transfers) are the decode
pool's arrivals. A closed loop would feed back (a completion sends the next request to prefill)
and is not supported here. The prefill replica is taken to free the KV when its step ends (the
transfer overlapping later steps), and the transfers do not share ports with each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from interconnect.contention import max_min_rates
from interconnect.routes import route, route_latency
from interconnect.topology import TopologySpec, build_topology
from partitioning.cluster import ClusterSpec
from partitioning.plan import Plan as PartitionPlan
from rdu_cluster.config import MAX_SOCKETS, FabricSpec, load_cluster
from rdu_cluster.engine import bench, energy, metrics, summary
from rdu_cluster.engine import plan as plans
from rdu_cluster.engine.requests import DONE, UNSERVED
from rdu_cluster.engine.simulation import ServeConfig, Simulation, Tables
from workloads import graph
from workloads.errors import ConfigError
from workloads.spec import ModelSpec
from workloads.traces import Trace


@dataclass(frozen=True)
class Pool:
    """`CLUSTER:PLAN:N`: N replicas of PLAN on CLUSTER's chip and node network."""

    cluster: str
    plan: str
    replicas: int

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
        base = load_cluster(self.cluster)
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

    def __post_init__(self) -> None:
        if self.config.concurrency is not None:
            raise ConfigError("--concurrency: not with --prefill-pool/--decode-pool (the "
                              "decode pool's completions would pace the prefill pool)")
        if self.trace.after is not None:
            raise ConfigError("--sessions: not with --prefill-pool/--decode-pool (a turn waits "
                              "for the decode pool to finish the one before)")
        if self.config.faults or self.config.coe is not None or self.config.speculation:
            raise ConfigError("--prefill-pool/--decode-pool: not with --fault, --coe-experts "
                              "or --draft")
        self.clusters = (self.prefill.spec(self.model, self.fabric),
                         self.decode.spec(self.model, self.fabric))
        self.kv_per_token = float(graph.kv_cache_bytes(self.model, 1, 1))

    def run(self) -> Tables:
        t = self.trace
        pre = Simulation(self.model, self.clusters[0], replace(
            t, output_len=np.ones(len(t), dtype=np.int64)), replace(
            self.config, plan=self.prefill.plan), self.backend())
        p_tables = pre.run()
        p_req = p_tables.requests.to_pydict()
        served = np.array([s == DONE for s in p_req["state"]])
        idx = np.flatnonzero(served)
        sent = np.maximum(t.prompt_len[idx] - 1, 0)  # the decode side recomputes the last
        nbytes = sent * self.kv_per_token
        ps, ds = (plans.PlanSpec.parse(p.plan, c, self.model)
                  for p, c in zip((self.prefill, self.decode), self.clusters))
        move = transfer_time(self.fabric, ps.tp * ps.pp, ds.tp * ds.pp, nbytes)
        ready = np.asarray(p_req["finish_s"], dtype=float)[idx] + move
        dec = Simulation(self.model, self.clusters[1], Trace(
            ready, t.prompt_len[idx], t.output_len[idx], source=t.source),
            replace(self.config, plan=self.decode.plan), self.backend(), self.progress)
        dec.received = sent
        dec.keep_measured = True  # its ITLs make this run's summary (_summary)
        try:
            d_tables = dec.run()
            self.wall = {k: pre.wall[k] + dec.wall[k] for k in pre.wall}
            self.sims = (pre, dec)
            return self._combine(p_tables, d_tables, idx, move, nbytes)
        finally:
            dec.finished.drop()

    # -- one set of tables --------------------------------------------------------------
    def _combine(self, p: Tables, d: Tables, idx, move, nbytes) -> Tables:
        pre, dec = self.sims
        n_rep = len(pre.replicas)
        req = _requests(p.requests.to_pydict(), d.requests.to_pydict(), idx, move, nbytes,
                        n_rep)
        meta = dict(dec.metadata(), cluster=f"{self.clusters[0].name}+{self.clusters[1].name}",
                    plan=f"prefill {self.prefill}, decode {self.decode}, fabric "
                    f"{self.fabric.name}", prefill_replicas=n_rep)
        steps = pa.concat_tables([p.steps, _shift(d.steps, {"replica": n_rep})])
        sockets = pa.concat_tables([p.sockets, _shift(d.sockets, {
            "replica": n_rep, "socket": self.clusters[0].sockets,
            "node": self.clusters[0].nodes})])
        links = pa.concat_tables([p.links, _shift(d.links, {
            "src": self.clusters[0].sockets, "dst": self.clusters[0].sockets})])
        return Tables(
            requests=metrics.table(metrics.REQUESTS, req, meta),
            steps=steps.replace_schema_metadata(_meta(steps, meta)),
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
        out["queue_s"][i] = p["queue_s"][i] + (d["queue_s"][j] or 0.0)
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


__all__ = ["Disaggregated", "Pool", "transfer_time"]
