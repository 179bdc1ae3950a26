"""A pool of a disaggregated pair (`CLUSTER:PLAN:N`: N replicas of PLAN on CLUSTER's chip and
node network), and the time of a KV hand-over from a replica of one pool to a replica of the
other over the fabric (the interconnect model's all-pairs flows through its switch)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from interconnect.contention import max_min_rates
from interconnect.routes import route, route_latency
from interconnect.topology import TopologySpec, build_topology
from partitioning.cluster import ClusterSpec
from partitioning.plan import Plan as PartitionPlan
from rdu_cluster.config import MAX_SOCKETS, FabricSpec, load_cluster
from rdu_cluster.engine import plan as plans
from workloads.errors import ConfigError
from workloads.spec import ModelSpec


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
    latency, rate = kv_flows(fabric, senders, receivers)
    share = np.asarray(nbytes, dtype=float) / (senders * receivers)
    return np.where(share > 0, latency + share / rate, latency)


@lru_cache(maxsize=64)
def kv_flows(fabric: FabricSpec, senders: int, receivers: int) -> tuple[float, float]:
    """(latency, slowest flow's rate) of the all-pairs hand-over through the fabric's switch."""
    spec = TopologySpec("switch", fabric.bandwidth_bytes_per_s, fabric.latency_s,
                        source=fabric.source)
    topo = build_topology(spec, senders + receivers, senders + receivers)
    routes = [route(topo, s, senders + d) for s in range(senders) for d in range(receivers)]
    rates = max_min_rates(routes, topo.capacities)
    return max(route_latency(topo, r) for r in routes), float(rates.min())
