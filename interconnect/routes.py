"""Routes between sockets: the links a message crosses, shortest by latency.

Routing is deterministic: Dijkstra on link latency, ties broken by fewer hops and then by the
lower link index, so a ring sends a message the short way round and a switched node never goes
out through the inter-node fabric. A torus gets a minimal route, not necessarily the
dimension-ordered one a real torus router takes (the same hop count; contention may differ).
"""

from __future__ import annotations

import heapq
from functools import lru_cache

from interconnect.topology import Topology
from workloads.errors import ConfigError

Route = tuple[int, ...]  # link indices, in order


def route(topology: Topology, src: int, dst: int) -> Route:
    if src == dst:
        return ()
    for s in (src, dst):
        if not 0 <= s < topology.sockets:
            raise ConfigError(f"route: socket {s} not in 0..{topology.sockets - 1}")
    found = _tree(topology, src).get(dst)
    if found is None:
        raise ConfigError(f"route: socket {dst} is unreachable from socket {src}")
    return found


def route_latency(topology: Topology, r: Route) -> float:
    return sum(topology.links[i].latency_s for i in r)


@lru_cache(maxsize=4096)
def _tree(topology: Topology, src: int) -> dict[int, Route]:
    """Shortest routes from `src` to every reachable socket."""
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
            link = topology.links[i]
            cand = (lat + link.latency_s, hops + 1, path + (i,))
            old = best.get(link.dst)
            if old is None or cand < old:
                best[link.dst] = cand
                heapq.heappush(heap, (*cand, link.dst))
    return {v: p for v, (_, _, p) in best.items() if v < topology.sockets and v != src}
