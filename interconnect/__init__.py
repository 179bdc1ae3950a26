"""Inter-socket networks: topologies, links, routes, collectives and contention.

    build_topology(spec, sockets, sockets_per_node) -> Topology
    collective_time(topology, collective, ranks, concurrent=(), algorithm=None) -> seconds
    comm_time_fn(topology, groups, concurrent) -> CommTime for chip.execution
    alone_layout(topology, groups, concurrent) -> (template, groups) where no flow is shared
    max_min_rates(routes, capacities) -> bytes/s per flow
"""

from interconnect.collectives import (
    alone_layout,
    chosen_algorithm,
    collective_time,
    comm_time_fn,
    link_bytes,
    schedule,
)
from interconnect.contention import max_min_rates
from interconnect.routes import route, route_latency
from interconnect.topology import Link, Topology, TopologySpec, build_topology

__all__ = [
    "Link",
    "Topology",
    "TopologySpec",
    "alone_layout",
    "build_topology",
    "chosen_algorithm",
    "collective_time",
    "comm_time_fn",
    "link_bytes",
    "max_min_rates",
    "route",
    "route_latency",
    "schedule",
]
