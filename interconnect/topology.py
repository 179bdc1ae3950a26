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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
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

    @property
    def direct(self) -> bool:
        """Whether a route between two sockets of a node crosses only those two sockets' own
        links (full mesh: their link; switch: their ports), so no other socket's flows share
        it and a node's size changes none of its routes; a ring's and a torus's routes pass
        other sockets of the node."""
        return self.kind in ("full_mesh", "switch")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "topology") -> TopologySpec:
        required = {"kind", "link_bandwidth_bytes_per_s", "link_latency_s", "source"}
        numbers = {"inter_node_bandwidth_bytes_per_s", "inter_node_latency_s"}
        optional = numbers | {"links_per_pair", "torus_shape", "algorithms"}
        checks.exact_keys(d, required, where, optional)
        if d["kind"] not in KINDS:
            raise ConfigError(f"{where}.kind: {d['kind']!r} unknown; accepted: {', '.join(KINDS)}")
        checks.source(d, where)
        checks.rate(d, "link_bandwidth_bytes_per_s", where)
        if d.get("inter_node_bandwidth_bytes_per_s", 0):  # 0: one node, no fabric
            checks.rate(d, "inter_node_bandwidth_bytes_per_s", where)
        checks.non_negative({"inter_node_bandwidth_bytes_per_s": d.get(
            "inter_node_bandwidth_bytes_per_s", 0.0)}, "inter_node_bandwidth_bytes_per_s", where)
        for key in ("link_latency_s", "inter_node_latency_s"):
            checks.latency({key: d.get(key, 0.0)}, key, where)
        lpp = checks.integer(d.get("links_per_pair", 1), f"{where}.links_per_pair", 1, 64)
        if d["kind"] != "full_mesh" and "links_per_pair" in d:  # only a full mesh reads it
            raise ConfigError(f"{where}.links_per_pair: only a full_mesh has parallel links; "
                              f"kind is {d['kind']!r}")
        shape = d.get("torus_shape", [])
        if not isinstance(shape, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 2**16 for x in shape):
            raise ConfigError(f"{where}.torus_shape: expected a list of positive integers, got "
                              f"{shape!r:.40}")
        shape = tuple(shape)
        if d["kind"] == "torus2d" and len(shape) != 2:
            raise ConfigError(f"{where}.torus_shape: torus2d needs [x, y], got {list(shape)!r}")
        if d["kind"] != "torus2d" and shape:
            raise ConfigError(f"{where}.torus_shape: only a torus2d has one; kind is "
                              f"{d['kind']!r}")
        algos = d.get("algorithms", list(ALGORITHMS))
        if not isinstance(algos, list):
            raise ConfigError(f"{where}.algorithms: expected a list of names, got {algos!r:.40}")
        algos = tuple(algos)
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
    """Vertices 0..sockets-1 are sockets, then one switch per node (kind "switch"), then the
    fabric switch (when there is more than one node, or `fabric` says so).

    Held by structure, not as a list of every link: all nodes are wired alike, so one node's
    links (`node_links`, in node-local vertex ids) and the per-socket NIC pair describe the
    whole graph; link i is computed on demand. Link ids: node n's in-node links are
    n * L .. (n + 1) * L - 1 (L = len(node_links), in the node's order); then each socket's NIC
    up and down link, in socket order. A 4,096-socket cluster is a handful of numbers."""

    spec: TopologySpec
    sockets: int
    sockets_per_node: int
    fabric: bool | None = None  # the fabric switch and NICs; default: more than one node

    @cached_property
    def nodes(self) -> int:
        return self.sockets // self.sockets_per_node

    @cached_property
    def has_fabric(self) -> bool:
        return self.nodes > 1 if self.fabric is None else self.fabric

    @cached_property
    def node_links(self) -> tuple[Link, ...]:
        """Node 0's links; vertices: its sockets 0..spn-1 and its switch as spn."""
        names = [f"socket{i}" for i in range(self.sockets_per_node)]
        return tuple(_node_links(self.spec, list(range(self.sockets_per_node)), names))

    @property
    def links(self) -> Sequence[Link]:
        return _LinkView(self)

    @cached_property
    def link_count(self) -> int:
        return self.nodes * len(self.node_links) + (2 * self.sockets if self.has_fabric else 0)

    @cached_property
    def _figures(self) -> tuple[int, tuple[float, ...], tuple[float, ...]]:
        """(first NIC link id, in-node latencies, in-node bandwidths) for the fast lookups."""
        return (self.nodes * len(self.node_links),
                tuple(link.latency_s for link in self.node_links),
                tuple(link.bandwidth_bytes_per_s for link in self.node_links))

    def latency_s(self, i: int) -> float:
        """link(i).latency_s without building the Link (the hot path of routes and costs)."""
        nic, lat, _ = self._figures
        return lat[i % len(lat)] if i < nic else self.spec.inter_node_latency_s / 2

    def bandwidth(self, i: int) -> float:
        nic, _, bw = self._figures
        return bw[i % len(bw)] if i < nic else self.spec.inter_node_bandwidth_bytes_per_s

    def link(self, i: int) -> Link:
        per = len(self.node_links)
        if not 0 <= i < self.link_count:
            raise IndexError(f"link {i} not in 0..{self.link_count - 1}")
        if i < self.nodes * per:
            node, j = divmod(i, per)
            base = self.node_links[j]
            return replace(base, src=self._vertex(base.src, node), dst=self._vertex(base.dst, node))
        socket, down = divmod(i - self.nodes * per, 2)
        bw, half = self.spec.inter_node_bandwidth_bytes_per_s, self.spec.inter_node_latency_s / 2
        ends = (socket, self.fabric_vertex)
        return Link(*(ends[::-1] if down else ends), bw, half, "nic")

    def _vertex(self, local: int, node: int) -> int:
        spn = self.sockets_per_node
        return node * spn + local if local < spn else self.sockets + node  # the node's switch

    @property
    def fabric_vertex(self) -> int:
        return self.sockets + (self.nodes if self.spec.kind == "switch" else 0)

    @cached_property
    def vertex_names(self) -> tuple[str, ...]:
        names = [f"socket{i}" for i in range(self.sockets)]
        if self.spec.kind == "switch":
            names += [f"switch{n}" for n in range(self.nodes)]
        return tuple(names + (["fabric"] if self.has_fabric else []))

    @cached_property
    def _node_out(self) -> dict[int, tuple[int, ...]]:
        out: dict[int, list[int]] = {}
        for j, link in enumerate(self.node_links):
            out.setdefault(link.src, []).append(j)
        return {v: tuple(ids) for v, ids in out.items()}

    def out_links(self, vertex: int) -> tuple[int, ...]:
        spn, per, nic = self.sockets_per_node, len(self.node_links), self.nodes * len(
            self.node_links)
        if vertex < self.sockets:
            node, local = divmod(vertex, spn)
            ids = tuple(node * per + j for j in self._node_out.get(local, ()))
            return ids + ((nic + 2 * vertex,) if self.has_fabric else ())
        if self.has_fabric and vertex == self.fabric_vertex:
            return tuple(range(nic + 1, nic + 2 * self.sockets, 2))
        node = vertex - self.sockets
        return tuple(node * per + j for j in self._node_out.get(spn, ()))

    def node_of(self, socket: int) -> int:
        return socket // self.sockets_per_node

    @property
    def capacities(self) -> np.ndarray:
        return np.array([link.bandwidth_bytes_per_s for link in self.links])

    def template(self, nodes: int) -> Topology:
        """The same wiring with `nodes` nodes (and this fabric): the graph routes are found
        on. A route between two sockets stays inside their nodes and the fabric, and nodes are
        alike, so it is the template's route with node numbers mapped (`globalize`)."""
        return _template(self.spec, self.sockets_per_node, nodes, self.has_fabric)

    def node_of_sockets(self, sockets: int) -> Topology:
        """One node of this wiring of `sockets` sockets, no fabric: where a route between two
        sockets of a node crosses only their own links (full mesh, switch), every socket of a
        node is alike and a node's size changes none of its routes. Its spec without the
        fabric's figures, which it has no link to read (a pair's pool of several nodes is
        given the pair's fabric: its replicas' cost tables were a set apart from the same
        replica's alone, 2 of the 14 sets a capacity worker of the sessions question made)."""
        spec = replace(self.spec, inter_node_bandwidth_bytes_per_s=0.0, inter_node_latency_s=0.0)
        return _template(spec, sockets, 1, False)

    def globalize(self, local: tuple[int, ...], nodes: tuple[int, ...]) -> tuple[int, ...]:
        """Link ids of a template over len(nodes) nodes -> this topology's, template node j
        being node nodes[j] (sorted, so ties between equal routes break the same way)."""
        per, k, spn = len(self.node_links), len(nodes), self.sockets_per_node
        out = []
        for i in local:
            if i < k * per:
                j, r = divmod(i, per)
                out.append(nodes[j] * per + r)
            else:
                s, down = divmod(i - k * per, 2)
                socket = nodes[s // spn] * spn + s % spn
                out.append(self.nodes * per + 2 * socket + down)
        return tuple(out)


class _LinkView(Sequence):
    """topology.links without building them: len and indexing computed from the structure."""

    def __init__(self, topology: Topology):
        self._t = topology

    def __len__(self) -> int:
        return self._t.link_count

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._t.link(j) for j in range(len(self))[i]]
        return self._t.link(i if i >= 0 else i + len(self))


@lru_cache(maxsize=256)
def _template(spec: TopologySpec, sockets_per_node: int, nodes: int, fabric: bool) -> Topology:
    return Topology(spec, nodes * sockets_per_node, sockets_per_node, fabric)


# A full mesh gives each socket a direct link to every other socket of its node. Accelerators
# have at most 18 such links (H100 and B200: 18 NVLink links; AMD MI300X: 7 Infinity Fabric
# links); 64 leaves room for what-ifs. A larger node is switched (kind = "switch"). Bounding it
# also bounds the links a node's table holds: n(n - 1) (2,048 sockets: 4.2 million).
MAX_MESH_SOCKETS = 64


def check_node(spec: TopologySpec, sockets_per_node: int, where: str = "topology") -> None:
    """A node of `sockets_per_node` sockets that `spec` can wire."""
    if spec.kind == "full_mesh" and sockets_per_node > MAX_MESH_SOCKETS:
        raise ConfigError(
            f"{where}.kind: a full mesh of {sockets_per_node} sockets gives each socket "
            f"{sockets_per_node - 1} direct links; a full-mesh node holds at most "
            f"{MAX_MESH_SOCKETS} (accelerators have at most 18: H100, B200 NVLink); a larger "
            "node is switched: kind = \"switch\"")


def build_topology(spec: TopologySpec, sockets: int, sockets_per_node: int) -> Topology:
    """The graph of `sockets` sockets in nodes of `sockets_per_node`, per `spec`."""
    if sockets < 1 or sockets_per_node < 1 or sockets % sockets_per_node:
        raise ConfigError(f"topology: {sockets} sockets in nodes of {sockets_per_node}")
    nodes = sockets // sockets_per_node
    check_node(spec, sockets_per_node)
    if spec.kind == "torus2d" and math.prod(spec.torus_shape) != sockets_per_node:
        raise ConfigError(
            f"topology.torus_shape: {list(spec.torus_shape)} holds "
            f"{math.prod(spec.torus_shape)} sockets, the node has {sockets_per_node}"
        )
    if nodes > 1 and spec.inter_node_bandwidth_bytes_per_s <= 0:
        raise ConfigError(
            f"topology.inter_node_bandwidth_bytes_per_s: {nodes} nodes need a positive value"
        )
    return Topology(spec, sockets, sockets_per_node)


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
