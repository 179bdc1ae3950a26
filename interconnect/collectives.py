"""Collectives on a topology: algorithms, their alpha-beta cost with contention, and the choice.

An algorithm is a schedule of phases. In a phase every flow of a pattern (ring neighbours, tree
edges, all pairs) moves `fraction` of the payload at once, `count` times in a row. A flow's time
in a phase is latency (its route's per-hop latencies, times `latency_hops` for pipelined trees)
plus bytes over its max-min fair rate, with every flow of the phase -- and of the groups named
`concurrent`, which run the same collective at the same moment -- sharing the links. The phase
takes as long as its slowest flow. Payload `bytes` follows workloads.ops.Collective: what each
rank contributes (for all-reduce and reduce-scatter: the full tensor each rank holds).

Per collective and message size the fastest applicable algorithm is used, as NCCL's tuner does
(it predicts each algorithm's time from a latency + bandwidth model and picks the minimum);
`algorithm=` forces one. Closed forms on p ranks, link bandwidth b, hop latency a, payload B:
- ring all-reduce: 2(p-1) steps of B/p: 2(p-1)(a + B/(p b)); each link carries 2(p-1)/p B.
- tree all-reduce (double binary tree, reduce then broadcast, pipelined, half the data on each
  tree): 2(ceil(log2 p) a + (B/2) / r) with r the fair rate of a tree edge.
- one-shot all-reduce: every rank sends its whole tensor to every other and reduces locally:
  a + B / r, r the fair rate with p(p-1) flows (b on a full mesh, b/(p-1) through a switch).
- two-shot all-reduce: direct reduce-scatter then direct all-gather: 2(a + (B/p) / r).
- all-gather / reduce-scatter: ring (p-1 steps) or direct (all pairs at once).
- all-to-all: direct, every pair exchanges B/p. send/recv: one flow.
Everything is vectorized over numpy arrays of bytes: a schedule is reduced to (latency,
seconds-per-byte) terms once and evaluated as max over terms of affine functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from interconnect.contention import max_min_rates
from interconnect.routes import route, route_latency
from interconnect.topology import Topology
from workloads.errors import ConfigError
from workloads.ops import Collective, CollectiveKind, Work

Ranks = tuple[int, ...]
Pair = tuple[int, int]

APPLICABLE = {
    CollectiveKind.ALL_REDUCE: ("ring", "tree", "one_shot", "two_shot"),
    CollectiveKind.ALL_GATHER: ("ring", "direct"),
    CollectiveKind.REDUCE_SCATTER: ("ring", "direct"),
    CollectiveKind.ALL_TO_ALL: ("direct",),
    CollectiveKind.SEND_RECV: ("direct",),
}


@dataclass(frozen=True)
class Phase:
    count: float  # consecutive repeats (ring steps)
    latency_hops: float  # multiplier on route latency (pipeline depth of a tree)
    fraction: float  # of the payload each flow moves per repeat
    terms: tuple[tuple[float, float], ...]  # (route latency s, s per byte) of the group's flows

    def time(self, nbytes: np.ndarray) -> np.ndarray:
        per = [self.latency_hops * lat + self.fraction * nbytes * spb for lat, spb in self.terms]
        return self.count * np.maximum.reduce(per) if per else np.zeros_like(nbytes)


@dataclass(frozen=True)
class Schedule:
    algorithm: str
    phases: tuple[Phase, ...]

    def time(self, nbytes: Work) -> np.ndarray:
        b = np.asarray(nbytes, dtype=float)
        return sum((ph.time(b) for ph in self.phases), np.zeros_like(b))


# ---- flow patterns --------------------------------------------------------------------------


def ring_pairs(ranks: Ranks) -> tuple[Pair, ...]:
    p = len(ranks)
    return tuple((ranks[i], ranks[(i + 1) % p]) for i in range(p)) if p > 1 else ()


def all_pairs(ranks: Ranks) -> tuple[Pair, ...]:
    return tuple((a, b) for a in ranks for b in ranks if a != b)


def tree_pairs(ranks: Ranks) -> tuple[Pair, ...]:
    """Child -> parent edges of two binary trees (heap order over the ranks and over the ranks
    reversed): NCCL's double binary tree, where a rank that is inner in one is a leaf in the
    other, so both trees together keep every rank's links busy."""
    edges = []
    for order in (ranks, ranks[::-1]):
        edges += [(order[i], order[(i - 1) // 2]) for i in range(1, len(order))]
    return tuple(edges)


def tree_depth(p: int) -> int:
    return max(1, math.ceil(math.log2(p))) if p > 1 else 0


# ---- schedules ------------------------------------------------------------------------------


def _phases(kind: CollectiveKind, algorithm: str, p: int) -> Sequence[tuple[float, float, float, str]]:
    """(count, latency_hops, fraction, pattern) per phase."""
    if kind is CollectiveKind.ALL_REDUCE:
        return {
            "ring": [(2 * (p - 1), 1, 1 / p, "ring")],
            "tree": [(1, tree_depth(p), 0.5, "tree"), (1, tree_depth(p), 0.5, "tree_down")],
            "one_shot": [(1, 1, 1.0, "pairs")],
            "two_shot": [(1, 1, 1 / p, "pairs"), (1, 1, 1 / p, "pairs")],
        }[algorithm]
    if kind is CollectiveKind.ALL_GATHER:
        return [(p - 1, 1, 1.0, "ring")] if algorithm == "ring" else [(1, 1, 1.0, "pairs")]
    if kind is CollectiveKind.REDUCE_SCATTER:
        return [(p - 1, 1, 1 / p, "ring")] if algorithm == "ring" else [(1, 1, 1 / p, "pairs")]
    if kind is CollectiveKind.ALL_TO_ALL:
        return [(1, 1, 1 / p, "pairs")]
    return [(1, 1, 1.0, "send")]


def _pattern(name: str, ranks: Ranks) -> tuple[Pair, ...]:
    if name == "ring":
        return ring_pairs(ranks)
    if name == "tree":
        return tree_pairs(ranks)
    if name == "tree_down":
        return tuple((b, a) for a, b in tree_pairs(ranks))
    if name == "send":
        return ((ranks[0], ranks[1]),)
    return all_pairs(ranks)


@lru_cache(maxsize=65536)
def schedule(
    topology: Topology,
    kind: CollectiveKind,
    ranks: Ranks,
    algorithm: str,
    concurrent: tuple[Ranks, ...] = (),
) -> Schedule:
    """The phases of `algorithm` for `kind` over `ranks`, reduced to latency/bandwidth terms,
    with the flows of the `concurrent` groups sharing the links."""
    if algorithm not in APPLICABLE[kind]:
        raise ConfigError(f"collective {kind.value}: algorithm {algorithm!r} does not apply")
    p = len(ranks)
    if p < 2:
        return Schedule(algorithm, ())
    if kind is CollectiveKind.SEND_RECV and p != 2:
        raise ConfigError(f"send_recv: needs 2 ranks (src, dst), got {p}")
    alone = _alone(topology, ranks, concurrent)
    if alone is not None and alone != (topology, ranks):
        return schedule(alone[0], kind, alone[1], algorithm)
    if alone is not None:
        concurrent = ()
    phases = []
    for count, hops, fraction, pattern in _phases(kind, algorithm, p):
        folded = _folded_pairs(topology, ranks) if pattern == "pairs" and not concurrent else None
        own, weights = folded or (_pattern(pattern, ranks), None)
        routes = [route(topology, a, b) for a, b in own]
        shared, _ = _sharing(topology, routes, pattern, ranks, concurrent)
        rates = _shared_rates(topology, routes, shared, weights)
        terms = {(route_latency(topology, r), 1.0 / rate) for r, rate in zip(routes, rates)}
        phases.append(Phase(count, hops, fraction, _pareto(terms)))
    return Schedule(algorithm, tuple(phases))


def _folded_pairs(topology: Topology, ranks: Ranks) -> tuple[list, list] | None:
    """All pairs of a group holding the same sockets in each of n > 2 nodes, folded onto two
    of them: node permutations map the flow set onto itself, so the max-min rates are equal
    along each orbit, and the flows of nodes 0 and 1 with each flow between them standing
    for its n - 1 copies (weight n - 1: the load it puts on a NIC) give every rate. p(p - 1)
    flows become about 4 p^2 / n^2 (tp1024 on 64 nodes: 1,047,552 -> 1,020)."""
    spn = topology.sockets_per_node
    by_node: dict[int, list[int]] = {}
    for s in ranks:
        by_node.setdefault(s // spn, []).append(s % spn)
    n = len(by_node)
    nodes = sorted(by_node)
    if n <= 2 or any(sorted(by_node[x]) != sorted(by_node[nodes[0]]) for x in nodes):
        return None
    two = [s for s in ranks if s // spn in nodes[:2]]
    pairs = all_pairs(tuple(two))
    return list(pairs), [1.0 if a // spn == b // spn else n - 1.0 for a, b in pairs]


def _alone(topology: Topology, ranks: Ranks, concurrent: tuple[Ranks, ...]) -> tuple | None:
    """Where no other concurrent group has a socket in the group's reach (its nodes; its
    sockets where they do not forward), no flow shares its links: (template, ranks) to cost it
    on alone, a template of just its nodes with its sockets renumbered there. One schedule
    then serves every group laid out alike: in every replica, stage and plan, on any cluster
    of this wiring. None where others may share (they are then searched: `_sharing`)."""
    spn, grain = topology.sockets_per_node, _grain(topology)
    index = _groups_by_node(grain, concurrent)
    if any(concurrent[g] != ranks for k in {s // grain for s in ranks} for g in index.get(k, ())):
        return None
    nodes = sorted({s // spn for s in ranks})
    at = {n: i for i, n in enumerate(nodes)}
    return topology.template(len(nodes)), tuple(at[s // spn] * spn + s % spn for s in ranks)


def _sharing(topology: Topology, own: list, pattern: str, ranks: Ranks,
             concurrent: tuple[Ranks, ...]) -> tuple[list, set[int]]:
    """Routes of the concurrent groups' flows that share links, directly or through others,
    with the group's own, and which groups they belong to: max-min rates of one connected set
    of flows do not depend on flows outside it, so the rest of the cluster (every identical
    group elsewhere) is never routed. A flow only crosses links of its two end nodes (and
    their NICs), so candidates are the flows of groups with a socket in a node the set has
    reached -- or, where sockets do not forward (full mesh, switch), flows with an end at a
    socket the set has reached (they cross only links of their own two sockets)."""
    grain = _grain(topology)
    index = _groups_by_node(grain, concurrent)
    links: set[int] = set()
    nodes: set[int] = set()
    new_links: list[int] = []
    new_nodes = sorted({s // grain for s in ranks})
    waiting: dict[int, list] = {}  # link -> candidate flows crossing it, not yet joined
    seen: set[int] = set()
    shared: list[tuple[int, ...]] = []
    groups: set[int] = set()

    def reach(r: tuple[int, ...], ends: tuple[int, ...]) -> None:
        new_links.extend(i for i in r if i not in links)
        links.update(r)
        new_nodes.extend(x // grain for x in ends if x // grain not in nodes)

    for r in own:
        reach(r, ())
    while new_links or new_nodes:
        for n in new_nodes:
            nodes.add(n)
            for g in index.get(n, ()):
                if g in seen or concurrent[g] == ranks:
                    continue
                seen.add(g)
                for f in _pattern(pattern, concurrent[g]):
                    flow = [g, f, route(topology, *f), False]
                    for i in flow[2]:
                        waiting.setdefault(i, []).append(flow)
                    new_links.extend(i for i in flow[2] if i in links)  # re-examine: may join
        new_nodes = []
        while new_links:
            for flow in waiting.pop(new_links.pop(), ()):
                if not flow[3]:
                    flow[3] = True
                    shared.append(flow[2])
                    groups.add(flow[0])
                    reach(flow[2], flow[1])
    return shared, groups


def _grain(topology: Topology) -> int:
    """Sockets per key of the sharing search: 1 where a flow crosses only links owned by its
    two end sockets (full mesh, switch; NICs are per socket), else the node (ring and torus
    routes pass other sockets of the node)."""
    return 1 if topology.spec.direct else topology.sockets_per_node


@lru_cache(maxsize=256)
def _groups_by_node(grain: int, concurrent: tuple[Ranks, ...]) -> dict[int, tuple]:
    """Key (socket // grain) -> the concurrent groups with a socket there."""
    out: dict[int, list[int]] = {}
    for g, ranks in enumerate(concurrent):
        for n in sorted({s // grain for s in ranks}):
            out.setdefault(n, []).append(g)
    return {n: tuple(gs) for n, gs in out.items()}


def _shared_rates(topology: Topology, own: list, others: list,
                  weights: list | None = None) -> np.ndarray:
    """Max-min rates of the own flows among `others` (on the links they cross only)."""
    ids: dict[int, int] = {}
    local = [tuple(ids.setdefault(i, len(ids)) for i in r) for r in (*own, *others)]
    caps = np.array([topology.bandwidth(i) for i in ids])
    w = None if weights is None else np.concatenate([weights, np.ones(len(others))])
    return max_min_rates(local, caps, w)[: len(own)]


def _pareto(terms: set[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Drop terms no larger than another in both latency and s/byte: they never set the max."""
    keep = [t for t in terms if not any(o != t and o[0] >= t[0] and o[1] >= t[1] for o in terms)]
    return tuple(sorted(keep))


def algorithms_for(topology: Topology, kind: CollectiveKind) -> tuple[str, ...]:
    """The algorithms the topology's library offers for `kind` (falls back to the first
    applicable one, ring or direct, if the config allows none of them)."""
    allowed = tuple(a for a in APPLICABLE[kind] if a in topology.spec.algorithms)
    return allowed or APPLICABLE[kind][:1]


# ---- the public cost ------------------------------------------------------------------------


def collective_time(
    topology: Topology,
    collective: Collective,
    ranks: Sequence[int],
    concurrent: Sequence[Sequence[int]] = (),
    algorithm: str | None = None,
) -> Work:
    """Seconds for `collective` over `ranks` (socket ids, in ring order), the fastest algorithm
    per byte count unless `algorithm` is given. Broadcasts over an array of bytes."""
    ranks = _ranks(ranks)
    if len(ranks) != collective.size:
        raise ConfigError(
            f"collective {collective.kind.value} over {collective.group}: size "
            f"{collective.size} but {len(ranks)} ranks"
        )
    conc: tuple = (concurrent if isinstance(concurrent, tuple) and type(concurrent) in (tuple, Groups)
                   else Groups(_ranks(g) for g in concurrent))
    nbytes = collective.bytes
    if isinstance(nbytes, (float, int)):
        # One message size: a pure function of these values, shared by every plan (and every
        # comm_time function) that asks for the same collective on the same group layout.
        key = (topology, collective.kind, ranks, conc if nbytes else (), algorithm,
               float(nbytes))
        t = _TIMES.get(key)
        if t is None:
            if len(_TIMES) >= CACHED_TIMES:
                _TIMES.clear()
            t = _TIMES[key] = _fastest(topology, collective.kind, ranks, key[3], algorithm,
                                       key[-1])
        return t
    if not np.any(nbytes):
        conc = ()
    return _fastest(topology, collective.kind, ranks, conc, algorithm, nbytes)


_TIMES: dict[tuple, Work] = {}
CACHED_TIMES = 1 << 16


def _fastest(topology: Topology, kind: CollectiveKind, ranks: Ranks, conc: tuple,
             algorithm: str | None, nbytes: Work) -> Work:
    """The fastest algorithm's time (or `algorithm`'s). Empty messages (barriers) come with
    conc = (): latency only, which link sharing cannot change."""
    names = (algorithm,) if algorithm else algorithms_for(topology, kind)
    times = [schedule(topology, kind, ranks, a, conc).time(nbytes) for a in names]
    return np.minimum.reduce(times)


def clear_caches() -> None:
    """Forget every collective's cost (a benchmark's cold start); schedules and routes are
    kept (they belong to a topology's wiring, like the topology itself)."""
    _TIMES.clear()


class Groups(tuple):
    """The concurrent groups of one kind (a tuple of rank tuples), hashed once: the schedule
    caches key on them at every collective, and a 1,024-socket plan's are long."""

    def __hash__(self) -> int:
        h = self.__dict__.get("hash")
        if h is None:
            h = self.__dict__["hash"] = tuple.__hash__(self)
        return h


def _ranks(ranks: Sequence[int]) -> Ranks:
    if type(ranks) is tuple:
        return ranks
    return tuple(int(r) for r in ranks)


def chosen_algorithm(
    topology: Topology, collective: Collective, ranks: Sequence[int],
    concurrent: Sequence[Sequence[int]] = (),
) -> np.ndarray:
    """Which algorithm collective_time picks, per byte count (an array of names)."""
    ranks, conc = tuple(ranks), tuple(tuple(g) for g in concurrent)
    names = algorithms_for(topology, collective.kind)
    times = np.stack([
        np.broadcast_to(schedule(topology, collective.kind, ranks, a, conc).time(collective.bytes),
                        np.shape(collective.bytes))
        for a in names
    ])
    return np.asarray(names, dtype=object)[np.argmin(times, axis=0)]


def link_bytes(
    topology: Topology, kind: CollectiveKind, ranks: Sequence[int], nbytes: float, algorithm: str
) -> np.ndarray:
    """Bytes each link carries during one collective (for checks against closed forms)."""
    ranks = tuple(ranks)
    out = np.zeros(len(topology.links))
    for count, _, fraction, pattern in _phases(kind, algorithm, len(ranks)):
        for a, b in _pattern(pattern, ranks):
            for link in route(topology, a, b):
                out[link] += count * fraction * nbytes
    return out


def alone_layout(topology: Topology, groups: Mapping,
                 concurrent: Mapping) -> tuple[Topology, dict] | None:
    """`groups` (comm_time_fn's) on a template of just their sockets, renumbered there (a
    template, groups), where every group of two or more ranks is alone in its reach (no other
    concurrent group's flows can share its links: _alone). Within one node whose flows cross
    only their own two sockets' links (full mesh, switch: every socket of a node alike) the
    template is a node of just the groups' sockets; across nodes, the groups must span the
    same nodes, and the template is those nodes. A collective then costs on the template,
    without the concurrent groups, what it costs on `topology` among them, bit for bit, so
    layouts alike on clusters of any size (and nodes of any size) give one CommTime. None
    otherwise."""
    spn = topology.sockets_per_node
    members = sorted({s for ranks in groups.values() for s in ranks})
    nodes = sorted({s // spn for s in members})
    if len(nodes) == 1 and _grain(topology) == 1:
        at = {s: i for i, s in enumerate(members)}
        template = topology.node_of_sockets(len(members))
    else:
        at = {s: nodes.index(s // spn) * spn + s % spn for s in members}
        template = topology.template(len(nodes))
    out = {}
    for key, ranks in groups.items():
        ranks = _ranks(ranks)
        out[key] = tuple(at[s] for s in ranks)
        if len(ranks) > 1:
            conc = concurrent.get(key, ())
            placed = _alone(topology, ranks, conc if type(conc) is Groups
                            else Groups(_ranks(g) for g in conc))
            if placed is None or len({s // spn for s in ranks}) != len(nodes):
                return None
    return template, out


def comm_time_fn(
    topology: Topology,
    groups: Mapping,
    concurrent: Mapping | None = None,
):
    """A CommTime for chip.execution: each collective is costed over the ranks of its group
    (groups maps "attn_tp", "mlp_tp", "expert_tp", "ep", "vocab_tp", "pp", or a (name, size) pair
    where a hybrid plan gives a group a different degree per block, to socket ids)."""
    # Groups as tuples of ints once, not at every collective (a 1,024-socket plan has many).
    concurrent = {k: v if type(v) is Groups else Groups(_ranks(g) for g in v)
                  for k, v in (concurrent or {}).items()}
    memo: dict = {}  # scalar byte counts repeat across layers and plans: cost each once

    def comm_time(c: Collective) -> Work:
        scalar = isinstance(c.bytes, (float, int))
        if scalar and c.size > 1:
            t = memo.get((c.kind, c.group, c.size, c.bytes))
            if t is not None:
                return t
        if c.size <= 1:
            return np.zeros(np.shape(c.bytes))
        # A group may have a different degree per block (hybrid plans): (name, size) first.
        key = (c.group, c.size) if (c.group, c.size) in groups else c.group
        if key not in groups:
            raise ConfigError(f"collective over {c.group!r}: the plan defines no such group")
        t = collective_time(topology, c, groups[key], concurrent.get(key, ()))
        if scalar:
            memo[(c.kind, c.group, c.size, c.bytes)] = t
        return t

    return comm_time
