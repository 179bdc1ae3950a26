"""Topologies: the [topology] table of a cluster TOML (TopologySpec) and the graph it builds
(Topology: sockets, switches and directed links, each with a bandwidth and a latency).

Kinds of the network inside a node:
- full_mesh: a direct link (or `links_per_pair` parallel links) between every two sockets of a
  node: the assumed SN40L P2P network (SambaNova publishes no topology).
- switch: every socket has one port into a non-blocking switch (NVSwitch); a route is two hops,
  socket -> switch -> socket, each carrying half of `link_latency_s`, so that figure stays the
  latency of one socket-to-socket traversal.
- ring: socket i linked to i +- 1 (what-if).
- torus2d: `torus_shape` = [x, y] sockets, each linked to its four neighbours with wrap-around.

Nodes (when a cluster has more than one) are joined through one non-blocking fabric switch
(InfiniBand): each socket has its own NIC port of `inter_node_bandwidth_bytes_per_s` each way;
`inter_node_latency_s` is one NIC -> switch -> NIC traversal, split over its two hops.
Bandwidths are per link, each way (links are full duplex: one directed link each way).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workloads import checks
from workloads.errors import ConfigError

KINDS = ("full_mesh", "switch", "ring", "torus2d")
ALGORITHMS = ("ring", "tree", "one_shot", "two_shot", "direct")


@dataclass(frozen=True)
class TopologySpec:
    kind: str
    link_bandwidth_bytes_per_s: float  # per link (or per socket-to-switch port), each way
    link_latency_s: float  # per socket-to-socket traversal of the node network
    inter_node_bandwidth_bytes_per_s: float = 0.0  # per socket NIC, each way; 0: single node
    inter_node_latency_s: float = 0.0
    links_per_pair: int = 1  # full_mesh: parallel links between two sockets
    torus_shape: tuple[int, ...] = ()  # torus2d: (x, y), x * y = sockets per node
    algorithms: tuple[str, ...] = ALGORITHMS  # collective algorithms the library may pick from
    source: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "topology") -> TopologySpec:
        required = {"kind", "link_bandwidth_bytes_per_s", "link_latency_s", "source"}
        numbers = {"inter_node_bandwidth_bytes_per_s", "inter_node_latency_s"}
        optional = numbers | {"links_per_pair", "torus_shape", "algorithms"}
        checks.exact_keys(d, required, where, optional)
        if d["kind"] not in KINDS:
            raise ConfigError(f"{where}.kind: {d['kind']!r} unknown; accepted: {', '.join(KINDS)}")
        checks.source(d, where)
        for key in sorted(numbers | {"link_bandwidth_bytes_per_s", "link_latency_s"}):
            checks.non_negative({key: d.get(key, 0.0)}, key, where)
        if d["link_bandwidth_bytes_per_s"] <= 0:
            raise ConfigError(f"{where}.link_bandwidth_bytes_per_s: must be positive")
        lpp = d.get("links_per_pair", 1)
        if isinstance(lpp, bool) or not isinstance(lpp, int) or lpp < 1:
            raise ConfigError(f"{where}.links_per_pair: expected a positive integer, got {lpp!r}")
        shape = tuple(d.get("torus_shape", ()))
        if d["kind"] == "torus2d" and (len(shape) != 2 or min(shape, default=0) < 1):
            raise ConfigError(f"{where}.torus_shape: torus2d needs [x, y], got {list(shape)!r}")
        algos = tuple(d.get("algorithms", ALGORITHMS))
        bad = [a for a in algos if a not in ALGORITHMS]
        if bad or not algos:
            raise ConfigError(
                f"{where}.algorithms: {bad[0] if bad else '[]'!r} unknown; accepted: "
                + ", ".join(ALGORITHMS)
            )
        return cls(
            kind=d["kind"],
            link_bandwidth_bytes_per_s=float(d["link_bandwidth_bytes_per_s"]),
            link_latency_s=float(d["link_latency_s"]),
            inter_node_bandwidth_bytes_per_s=float(d.get("inter_node_bandwidth_bytes_per_s", 0)),
            inter_node_latency_s=float(d.get("inter_node_latency_s", 0)),
            links_per_pair=lpp,
            torus_shape=tuple(int(x) for x in shape),
            algorithms=algos,
            source=d["source"],
        )


@dataclass(frozen=True)
class Link:
    """One direction of a physical link: `src` -> `dst` (vertex ids of the Topology)."""

    src: int
    dst: int
    bandwidth_bytes_per_s: float
    latency_s: float
    kind: str  # "p2p" | "switch_port" | "ring" | "torus" | "nic"


# eq=False: a Topology hashes by identity, so route and schedule caches can key on it.
@dataclass(frozen=True, eq=False)
class Topology:
    """Vertices 0..sockets-1 are sockets; the rest are switches (named in `vertex_names`)."""

    spec: TopologySpec
    sockets: int
    sockets_per_node: int
    vertex_names: tuple[str, ...]
    links: tuple[Link, ...]
    _out: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        out: dict[int, list[int]] = {}
        for i, link in enumerate(self.links):
            out.setdefault(link.src, []).append(i)
        self._out.update({v: tuple(ids) for v, ids in out.items()})

    def out_links(self, vertex: int) -> tuple[int, ...]:
        return self._out.get(vertex, ())

    def node_of(self, socket: int) -> int:
        return socket // self.sockets_per_node

    @property
    def capacities(self) -> np.ndarray:
        return np.array([link.bandwidth_bytes_per_s for link in self.links])


def build_topology(spec: TopologySpec, sockets: int, sockets_per_node: int) -> Topology:
    """The graph of `sockets` sockets in nodes of `sockets_per_node`, per `spec`."""
    if sockets < 1 or sockets_per_node < 1 or sockets % sockets_per_node:
        raise ConfigError(f"topology: {sockets} sockets in nodes of {sockets_per_node}")
    names = [f"socket{i}" for i in range(sockets)]
    links: list[Link] = []
    nodes = sockets // sockets_per_node
    if spec.kind == "torus2d" and math.prod(spec.torus_shape) != sockets_per_node:
        raise ConfigError(
            f"topology.torus_shape: {list(spec.torus_shape)} holds "
            f"{math.prod(spec.torus_shape)} sockets, the node has {sockets_per_node}"
        )
    for node in range(nodes):
        members = list(range(node * sockets_per_node, (node + 1) * sockets_per_node))
        links += _node_links(spec, members, names)
    if nodes > 1:
        if spec.inter_node_bandwidth_bytes_per_s <= 0:
            raise ConfigError(
                f"topology.inter_node_bandwidth_bytes_per_s: {nodes} nodes need a positive value"
            )
        fabric = len(names)
        names.append("fabric")
        half = spec.inter_node_latency_s / 2
        bw = spec.inter_node_bandwidth_bytes_per_s
        for s in range(sockets):
            links += [Link(s, fabric, bw, half, "nic"), Link(fabric, s, bw, half, "nic")]
    return Topology(spec, sockets, sockets_per_node, tuple(names), tuple(links))


def _node_links(spec: TopologySpec, members: list[int], names: list[str]) -> list[Link]:
    bw, lat, n = spec.link_bandwidth_bytes_per_s, spec.link_latency_s, len(members)
    both = lambda a, b, kind, bw=bw, lat=lat: [Link(a, b, bw, lat, kind), Link(b, a, bw, lat, kind)]
    links: list[Link] = []
    if spec.kind == "full_mesh":
        for i, a in enumerate(members):
            for b in members[i + 1 :]:
                # Parallel links are bonded: one link of their summed bandwidth.
                links += both(a, b, "p2p", bw=bw * spec.links_per_pair)
    elif spec.kind == "switch":
        sw = len(names)
        names.append(f"switch{members[0] // n}")
        for a in members:
            links += both(a, sw, "switch_port", lat=lat / 2)
    elif spec.kind == "ring":
        if n == 2:
            links += both(members[0], members[1], "ring")
        elif n > 2:
            for i in range(n):
                links += both(members[i], members[(i + 1) % n], "ring")
    else:  # torus2d
        x, y = spec.torus_shape
        seen: set[tuple[int, int]] = set()
        for i in range(n):
            cx, cy = i % x, i // x
            for nb in ((cx + 1) % x + cy * x, cx + ((cy + 1) % y) * x):
                pair = (min(i, nb), max(i, nb))
                if nb != i and pair not in seen:
                    seen.add(pair)
                    links += both(members[i], members[nb], "torus")
    return links
