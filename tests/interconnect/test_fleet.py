"""Fleet scale: structural topologies, template routes, the sparse max-min solver, and the
symmetry shortcuts (components, canonical templates, folded all-pairs) against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from interconnect import TopologySpec, build_topology, collective_time, max_min_rates, route
from interconnect.collectives import _shared_rates, all_pairs
from workloads.ops import Collective
from workloads.ops import CollectiveKind as K

BW, LAT, NIC = 50e9, 1e-6, 25e9


def topo(kind: str, sockets: int, per_node: int, **kw):
    d = {"kind": kind, "link_bandwidth_bytes_per_s": BW, "link_latency_s": LAT, "source": "t",
         "inter_node_bandwidth_bytes_per_s": NIC, "inter_node_latency_s": 5e-6, **kw}
    return build_topology(TopologySpec.from_dict(d), sockets, per_node)


def dense_max_min(routes, caps):
    """The progressive filling over a dense flows x links matrix (the solver before #18)."""
    n = len(routes)
    rates = np.full(n, np.inf)
    active = np.array([len(r) > 0 for r in routes])
    inc_m = np.zeros((n, len(caps)))
    for f, r in enumerate(routes):
        for link in r:
            inc_m[f, link] += 1.0
    rates[active] = 0.0
    rem = caps.astype(float).copy()
    while active.any():
        load = inc_m[active].sum(axis=0)
        used = load > 0
        share = np.full(len(caps), np.inf)
        share[used] = rem[used] / load[used]
        inc = share.min()
        rates[active] += inc
        rem -= inc * load
        full = used & (share <= inc * (1 + 1e-12))
        active &= ~(active & (inc_m[:, full].sum(axis=1) > 0))
    return rates


def test_sparse_solver_matches_dense_on_random_flows():
    rng = np.random.default_rng(7)
    for _ in range(30):
        links = int(rng.integers(2, 12))
        caps = rng.uniform(1, 5, links)
        routes = [tuple(int(x) for x in rng.choice(links, int(rng.integers(0, 4))))
                  for _ in range(int(rng.integers(1, 20)))]
        np.testing.assert_allclose(max_min_rates(routes, caps), dense_max_min(routes, caps))


def test_a_weighted_flow_counts_as_its_copies():
    caps = np.array([3.0, 10.0])
    got = max_min_rates([(0,), (0, 1)], caps, np.array([2.0, 1.0]))
    np.testing.assert_allclose(got, max_min_rates([(0,), (0,), (0, 1)], caps)[1:])


def test_links_and_routes_computed_from_structure_match_a_small_cluster():
    big = topo("switch", 4096, 8)
    assert len(big.links) == 4096 * 2 + 2 * 4096  # a port each way per GPU, a NIC each way
    assert big.link(len(big.links) - 1).kind == "nic"
    # A route between nodes 300 and 301 is the one between nodes 0 and 1, shifted.
    small = topo("switch", 16, 8)
    far, near = route(big, 300 * 8 + 3, 301 * 8 + 5), route(small, 3, 13)
    assert [big.link(i).kind for i in far] == [small.link(i).kind for i in near]
    assert big.link(far[0]).src == 300 * 8 + 3
    assert big.link(far[-1]).dst == 301 * 8 + 5


@pytest.mark.parametrize("kind", ["switch", "full_mesh", "ring"])
def test_folded_all_pairs_equal_every_pair(kind):
    t = topo(kind, 32, 8)
    ranks = tuple(range(32))
    pairs = list(all_pairs(ranks))
    full = _shared_rates(t, [route(t, a, b) for a, b in pairs], [])
    lat = lambda r: sum(t.link(i).latency_s for i in r)
    want = sorted({(lat(route(t, a, b)), 1 / x) for (a, b), x in zip(pairs, full)})
    got = collective_time(t, Collective(K.ALL_REDUCE, 1e6, "attn_tp", 32), ranks,
                          algorithm="one_shot")
    assert got == pytest.approx(max(lt + 1e6 * spb for lt, spb in want))


def test_groups_on_other_nodes_do_not_change_a_groups_cost():
    t = topo("switch", 64, 8)
    c = Collective(K.ALL_REDUCE, np.array([1e3, 1e8]), "attn_tp", 16)
    groups = [tuple(range(i, i + 16)) for i in range(0, 64, 16)]
    for algo in ("ring", "tree", "one_shot", "two_shot"):
        alone = collective_time(t, c, groups[1], algorithm=algo)
        crowded = collective_time(t, c, groups[1], groups, algorithm=algo)
        np.testing.assert_allclose(crowded, alone)
        # and the same group laid out on nodes 0-1 of a 2-node cluster
        np.testing.assert_allclose(
            collective_time(topo("switch", 16, 8), c, range(16), algorithm=algo), alone)


def test_interleaved_groups_still_share_links():
    """Two groups in one ring node, interleaved: their flows cross the same links, and the
    canonical template keeps the other group (contention as computed by brute force)."""
    t = topo("ring", 16, 8)
    c = Collective(K.ALL_GATHER, 1e8, "ep", 4)
    a, b = (0, 2, 4, 6), (1, 3, 5, 7)
    shared = collective_time(t, c, a, (a, b), algorithm="ring")
    alone = collective_time(t, c, a, algorithm="ring")
    assert shared > alone
    pairs = [(x, y) for g in (a, b) for x, y in zip(g, g[1:] + g[:1])]
    rates = dense_max_min([route(t, x, y) for x, y in pairs], t.capacities)
    lat = max(sum(t.link(i).latency_s for i in route(t, x, y)) for x, y in pairs[:4])
    assert shared == pytest.approx(3 * (lat + 1e8 / min(rates[:4])), rel=1e-9)


@pytest.mark.parametrize("text", ["tp4pp2dp2", "tp2pp4ep2dp2", "ep8pp2", "tp16@mamba2=8",
                                  "tp8@full_attention=2,sliding_attention=4", "tp1pp16"])
def test_concurrent_groups_are_every_sockets_groups(text):
    """The groups built from the layout's regularity are those groups_of gives each socket."""
    from partitioning.plan import Plan
    from partitioning.program import concurrent_groups, groups_of

    plan = Plan.parse(text)
    want: dict = {}
    for s in range(plan.sockets):
        for key, ranks in groups_of(plan, s).items():
            want.setdefault(key, set()).add(ranks)
    got = concurrent_groups(plan)
    assert set(got) == set(want)
    for key, groups in want.items():
        assert tuple(got[key]) == tuple(sorted(groups)), key
