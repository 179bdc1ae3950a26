"""Collective costs against closed forms, contention, algorithm choice, topology configs."""

from __future__ import annotations

import numpy as np
import pytest

from interconnect import (
    TopologySpec,
    build_topology,
    chosen_algorithm,
    collective_time,
    link_bytes,
    max_min_rates,
    route,
)
from workloads.errors import ConfigError
from workloads.ops import Collective
from workloads.ops import CollectiveKind as K

BW, LAT = 50e9, 1e-6


def topo(kind: str, sockets: int = 8, per_node: int | None = None, **kw):
    d = {"kind": kind, "link_bandwidth_bytes_per_s": BW, "link_latency_s": LAT,
         "source": "test", **kw}
    return build_topology(TopologySpec.from_dict(d), sockets, per_node or sockets)


def coll(kind, nbytes, p, group="attn_tp"):
    return Collective(kind, nbytes, group, p)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_ring_all_reduce_closed_form(p):
    t = topo("ring", p)
    b = np.array([1e3, 1e6, 1e8])
    got = collective_time(t, coll(K.ALL_REDUCE, b, p), range(p), algorithm="ring")
    np.testing.assert_allclose(got, 2 * (p - 1) * (LAT + b / p / BW))
    # Each link of the ring direction carries 2(p-1)/p of the bytes.
    per_link = link_bytes(t, K.ALL_REDUCE, range(p), 1e8, "ring")
    used = per_link[per_link > 0]
    assert len(used) == p
    np.testing.assert_allclose(used, 2 * (p - 1) / p * 1e8)


def test_gather_scatter_tree_closed_forms():
    p, b = 8, 8e6
    t = topo("full_mesh", p)
    ag = collective_time(t, coll(K.ALL_GATHER, b, p), range(p), algorithm="ring")
    assert ag == pytest.approx((p - 1) * (LAT + b / BW))
    rs = collective_time(t, coll(K.REDUCE_SCATTER, b, p), range(p), algorithm="ring")
    assert rs == pytest.approx((p - 1) * (LAT + b / p / BW))
    # Full mesh: every tree edge has its own link; depth 3, half the data on each tree.
    tree = collective_time(t, coll(K.ALL_REDUCE, b, p), range(p), algorithm="tree")
    assert tree == pytest.approx(2 * (3 * LAT + b / 2 / BW))


def test_one_shot_mesh_vs_switch():
    p, b = 8, 1e6
    mesh = collective_time(topo("full_mesh", p), coll(K.ALL_REDUCE, b, p), range(p),
                           algorithm="one_shot")
    assert mesh == pytest.approx(LAT + b / BW)  # one link per peer
    sw = collective_time(topo("switch", p), coll(K.ALL_REDUCE, b, p), range(p),
                         algorithm="one_shot")
    assert sw == pytest.approx(LAT + (p - 1) * b / BW)  # p-1 flows share the port
    two = collective_time(topo("switch", p), coll(K.ALL_REDUCE, b, p), range(p),
                          algorithm="two_shot")
    assert two == pytest.approx(2 * (LAT + (p - 1) / p * b / BW))


def test_max_min_two_flows_halve_a_link():
    caps = np.array([BW, BW, BW])
    rates = max_min_rates([(0,), (0, 1)], caps)
    np.testing.assert_allclose(rates, [BW / 2, BW / 2])
    # Max-min, not equal split: a flow off the shared bottleneck takes what is left.
    rates = max_min_rates([(0,), (0,), (1,), (1, 2)], np.array([BW, 3 * BW, BW]))
    np.testing.assert_allclose(rates, [BW / 2, BW / 2, 2 * BW, BW])


def test_contention_halves_bandwidth_of_concurrent_sends():
    t = topo("ring", 4)  # 0 -> 2 and 1 -> 2 both cross link 1 -> 2 going clockwise
    c = coll(K.SEND_RECV, 1e8, 2, "pp")
    alone = collective_time(t, c, (1, 2))
    shared = collective_time(t, c, (1, 2), concurrent=[(0, 2), (1, 2)])
    assert alone == pytest.approx(LAT + 1e8 / BW)
    assert route(t, 0, 2)[-1] == route(t, 1, 2)[0]
    assert shared == pytest.approx(LAT + 1e8 / (BW / 2))


def test_algorithm_picked_per_size_vectorized():
    t = topo("switch", 8)
    b = np.array([[0.0, 1e3], [1e6, 1e9]])
    c = coll(K.ALL_REDUCE, b, 8)
    got = collective_time(t, c, range(8))
    assert got.shape == (2, 2)
    names = chosen_algorithm(t, c, range(8))
    assert names[0, 1] in ("one_shot", "tree") and names[1, 1] in ("two_shot", "ring")
    for a in ("ring", "tree", "one_shot", "two_shot"):
        assert np.all(got <= collective_time(t, c, range(8), algorithm=a) + 1e-15)


def test_two_nodes_route_through_the_fabric():
    t = topo("switch", 16, 8, inter_node_bandwidth_bytes_per_s=25e9, inter_node_latency_s=5e-6)
    assert all(t.links[i].kind == "switch_port" for i in route(t, 0, 7))
    assert all(t.links[i].kind == "nic" for i in route(t, 0, 8))
    c = coll(K.SEND_RECV, 1e6, 2, "pp")
    assert collective_time(t, c, (0, 8)) == pytest.approx(5e-6 + 1e6 / 25e9)


def test_torus_routes_are_minimal():
    t = topo("torus2d", 16, torus_shape=[4, 4])
    assert len(route(t, 0, 5)) == 2 and len(route(t, 0, 3)) == 1  # wrap-around
    assert len(route(t, 0, 10)) == 4


@pytest.mark.parametrize("patch, fragment", [
    ({"kind": "hypercube"}, "kind"),
    ({"link_bandwidth_bytes_per_s": -1}, "link_bandwidth_bytes_per_s"),
    ({"speed": 1}, "speed: unknown field"),
    ({"algorithms": ["magic"]}, "algorithms"),
    ({"kind": "torus2d"}, "torus_shape"),
])
def test_bad_topology_tables(patch, fragment):
    d = {"kind": "ring", "link_bandwidth_bytes_per_s": BW, "link_latency_s": LAT, "source": "x"}
    with pytest.raises(ConfigError, match=fragment):
        TopologySpec.from_dict({**d, **patch}, "c.toml: topology")


@pytest.mark.parametrize("kind,sockets,per_node", [("full_mesh", 16, 16), ("switch", 16, 8),
                                                   ("ring", 8, 8), ("torus2d", 16, 16)])
def test_a_cached_collective_cost_is_the_uncached_formula(kind, sockets, per_node):
    """collective_time keeps one figure per (topology, kind, ranks, concurrent groups, bytes),
    shared by every plan that asks; on random groups, layouts and sizes it is the fastest
    schedule's time computed afresh, exactly, and the cache answers what it was given."""
    from interconnect import collectives

    extra = {"torus_shape": [4, 4]} if kind == "torus2d" else {}
    t = topo(kind, sockets, per_node, inter_node_bandwidth_bytes_per_s=BW / 4,
             inter_node_latency_s=5 * LAT, **extra)
    rng = np.random.default_rng(7)
    collectives.clear_caches()
    for _ in range(60):
        k = list(K)[rng.integers(len(K))]
        size = 2 if k is K.SEND_RECV else int(rng.choice([2, 4, 8]))
        layout = rng.permutation(sockets).reshape(-1, size)
        ranks = tuple(int(s) for s in layout[0])
        concurrent = tuple(tuple(int(s) for s in g) for g in layout[: rng.integers(1, 4)])
        nbytes = float(rng.choice([0.0, 1.0, 4096.0, 1e6 * rng.random(), 3e8]))
        c = coll(k, nbytes, size)
        first = collective_time(t, c, ranks, concurrent)
        again = collective_time(t, c, list(ranks), [list(g) for g in concurrent])
        conc = concurrent if nbytes else ()
        afresh = min(collectives.schedule(t, k, ranks, a, conc).time(nbytes)
                     for a in collectives.algorithms_for(t, k))
        assert first == again == afresh
        grid = collective_time(t, coll(k, np.array([nbytes, 2 * nbytes + 1]), size), ranks,
                               concurrent)
        assert grid[0] == first  # one size or an array of them: the same figure
    assert collectives._TIMES
    collectives.clear_caches()
    assert not collectives._TIMES
