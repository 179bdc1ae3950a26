"""Routes between sockets: the links a message crosses, shortest by latency.

Routing is deterministic: Dijkstra on link latency, ties broken by fewer hops and then by the
lower link index, so a ring sends a message the short way round and a switched node never goes
out through the inter-node fabric. A torus gets a minimal route, not necessarily the
dimension-ordered one a real torus router takes (the same hop count; contention may differ).
Routes are found on a template of the one or two nodes involved (all nodes are wired alike)
and mapped to the cluster's link ids, so a 4,096-socket cluster routes as fast as one node.
"""

from __future__ import annotations

import heapq
from functools import lru_cache

from interconnect.topology import Topology
from workloads.errors import ConfigError

Route = tuple[int, ...]  # link indices, in order


@lru_cache(maxsize=1 << 16)
def route(topology: Topology, src: int, dst: int) -> Route:
    """The links from `src` to `dst`, found on the template of their one or two nodes (a
    shortest route never crosses a third node: it would pass the fabric twice)."""
    if src == dst:
        return ()
    for s in (src, dst):
        if not 0 <= s < topology.sockets:
            raise ConfigError(f"route: socket {s} not in 0..{topology.sockets - 1}")
    spn = topology.sockets_per_node
    na, nb = src // spn, dst // spn
    if na == nb and _through_the_switch(topology):
        return _switched(topology, src, dst)
    nodes = (na,) if na == nb else tuple(sorted((na, nb)))
    local = lambda s: nodes.index(s // spn) * spn + s % spn
    found = _tree(topology.template(len(nodes)), local(src)).get(local(dst))
    if found is None:
        raise ConfigError(f"route: socket {dst} is unreachable from socket {src}")
    return topology.globalize(found, nodes)


def _through_the_switch(topology: Topology) -> bool:
    """Whether two sockets of a switched node route through its switch: Dijkstra's answer
    without a search (a socket's two links, in and out of the switch). Ties go to the lower
    link ids, the switch's; the fabric wins only where its two NIC hops are faster."""
    spec = topology.spec
    if spec.kind != "switch":
        return False
    return not topology.has_fabric or spec.link_latency_s <= spec.inter_node_latency_s


def _switched(topology: Topology, src: int, dst: int) -> Route:
    """socket -> switch -> socket in a switched node: in-node links 2s (up) and 2s + 1 (down)
    of node-local socket s (topology._node_links)."""
    spn, per = topology.sockets_per_node, len(topology.node_links)
    base = (src // spn) * per
    return (base + 2 * (src % spn), base + 2 * (dst % spn) + 1)


def route_latency(topology: Topology, r: Route) -> float:
    return sum(topology.latency_s(i) for i in r)


@lru_cache(maxsize=4096)
def _tree(topology: Topology, src: int) -> dict[int, Route]:
    """Shortest routes from `src` to every reachable socket (on a small template graph)."""
    best: dict[int, tuple[float, int, Route]] = {src: (0.0, 0, ())}
    heap: list[tuple[float, int, Route, int]] = [(0.0, 0, (), src)]
    done: set[int] = set()
    while heap:
        lat, hops, path, v = heapq.heappop(heap)
        if v in done:
            continue
        done.add(v)
        # Only sockets forward in a full mesh or ring; switches forward everywhere.
        if v != src and v < topology.sockets and topology.spec.kind == "full_mesh":
            continue
        for i in topology.out_links(v):
            link = topology.link(i)
            cand = (lat + topology.latency_s(i), hops + 1, path + (i,))
            old = best.get(link.dst)
            if old is None or cand < old:
                best[link.dst] = cand
                heapq.heappush(heap, (*cand, link.dst))
    return {v: p for v, (_, _, p) in best.items() if v < topology.sockets and v != src}
