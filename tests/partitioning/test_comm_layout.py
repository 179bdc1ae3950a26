"""plan_comm_time: groups alone in their reach are costed on a template of their nodes
(interconnect.alone_layout), one function for a replica laid out alike on clusters of any size;
every collective costs what it costs among the concurrent groups of the whole cluster."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from partitioning import evaluate
from partitioning.evaluate import plan_comm_time, topology_of
from partitioning.plan import Plan
from partitioning.program import groups_of
from rdu_cluster.config import load_cluster
from workloads.ops import Collective, CollectiveKind

KINDS = (CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER,
         CollectiveKind.ALL_TO_ALL)
BYTES = (0.0, 4096.0, 3.3e6, 1.6e8, np.array([1e3, 2e5, 7e7]))


def _nodes(base, nodes: int):
    """`base` (its nodes) repeated `nodes` times, joined by a fabric where it names none (as
    disagg.Pool.spec joins a pool's nodes)."""
    topo = base.topology
    if topo.inter_node_bandwidth_bytes_per_s <= 0:
        topo = replace(topo, inter_node_bandwidth_bytes_per_s=50e9, inter_node_latency_s=5e-6)
    return replace(base, sockets=base.sockets * nodes, topology=topo)


def _among_all(cluster, plan: Plan, socket: int):
    """The collectives of `socket`'s groups on the whole cluster, among every concurrent group
    (what plan_comm_time gave before templates)."""
    return evaluate._comm(topology_of(cluster), evaluate._frozen(groups_of(plan, socket)),
                          evaluate._concurrent(plan))


@pytest.mark.parametrize("cluster, plan, socket", [
    ("sn40l-16", "tp8", 0), ("sn40l-16", "tp8", 8), ("sn40l-16", "tp16", 0),
    ("sn40l-16", "tp4", 4), ("sn40l-16-ring", "tp4", 0), ("sn40l-16-torus", "tp8", 0),
    ("sn40l-16-switch", "tp8", 0), ("dgx-h100", "tp4", 0), ("dgx-h100", "tp2", 6),
    ("dgx-h100", "tp8", 0), ("dgx-h100-2node", "tp16", 0), ("dgx-h100", "tp2ep4", 0),
    ("hgx-h200", "adp8ep8", 0), ("dgx-a100", "tp4pp2", 0)])
@pytest.mark.parametrize("nodes", [1, 3, 7])
def test_every_collective_costs_what_it_costs_among_all_groups(cluster, plan, socket, nodes):
    c = _nodes(load_cluster(cluster), nodes)
    p = Plan.parse(plan)
    p = replace(p, dp=c.sockets // (p.tp * p.ep * p.pp))
    if socket >= c.sockets:
        pytest.skip("a socket past the cluster")
    new, old = plan_comm_time(c, p, socket), _among_all(c, p, socket)
    for key, ranks in groups_of(p, socket).items():
        name, size = (key if isinstance(key, tuple) else (key, len(ranks)))
        kinds = (CollectiveKind.SEND_RECV,) if name == "pp" else KINDS
        for kind in kinds:
            for b in BYTES:
                coll = Collective(kind, b, name, size)
                assert np.array_equal(new(coll), old(coll)), (key, kind, b)


@pytest.mark.parametrize("cluster, plan, per_node, replicas", [
    ("dgx-h100", Plan(tp=2), 2, 9), ("dgx-h100", Plan(tp=2), 8, 12), ("sn40l-16", Plan(tp=8), 8, 5),
    ("sn40l-16", Plan(tp=4), 4, 11), ("hgx-h200", Plan(tp=2, ep=2), 4, 5)])
def test_a_pools_nodes_of_any_size_cost_as_the_cluster_did(cluster, plan, per_node, replicas):
    """A pool of N replicas is N plan groups in nodes of gcd(N x group, a node's sockets)
    (disagg.Pool.spec): a group within a node of 2 sockets costs what it costs in one of 8."""
    c = _nodes(load_cluster(cluster), 2)
    w = plan.tp * plan.ep
    c = replace(c, sockets=w * replicas, sockets_per_node=per_node)
    p = replace(plan, dp=replicas)
    new, old = plan_comm_time(c, p, 0), _among_all(c, p, 0)
    for key, ranks in groups_of(p, 0).items():
        name, size = (key if isinstance(key, tuple) else (key, len(ranks)))
        for kind in KINDS:
            for b in BYTES:
                coll = Collective(kind, b, name, size)
                assert np.array_equal(new(coll), old(coll)), (key, kind, b)


def test_a_replica_alike_on_clusters_of_any_size_gets_one_function():
    """A tensor-parallel replica within a node: the same function at 5, 6 and 8 nodes, alone
    without a fabric, and in nodes of 2 or 8 GPUs (the engine's cost tables key on it);
    groups that share links with others (a ring within a node whose sockets forward) keep one
    of their cluster's."""
    base = load_cluster("sn40l-16")
    fns = {plan_comm_time(_nodes(base, n), Plan(tp=8, dp=2 * n)) for n in (5, 6, 8)}
    assert len(fns) == 1
    h100 = _nodes(load_cluster("dgx-h100"), 3)
    pools = {plan_comm_time(replace(h100, sockets=2 * n, sockets_per_node=math.gcd(2 * n, 8)),
                            Plan(tp=2, dp=n)) for n in (9, 11, 12, 16)}
    assert len(pools) == 1  # nodes of 2 and of 8 GPUs
    # a pool of several nodes is given a fabric (disagg.Pool.spec), a replica alone none: a
    # node's template has no fabric to read, so the two share one function
    alone = replace(base, sockets=8, sockets_per_node=8)
    assert plan_comm_time(alone, Plan(tp=8)) in fns
    ring = load_cluster("sn40l-16-ring")
    shared = {plan_comm_time(_nodes(ring, n), Plan(tp=4, dp=4 * n)) for n in (5, 6)}
    assert len(shared) == 2
