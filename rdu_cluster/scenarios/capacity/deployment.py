"""A deployment a capacity question weighs: one pool of replicas (aggregated) or a prefill pool
and a decode pool, the max batch it is served at, its closed loops' ramp, and its price by the
socket-hour."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import cast

from rdu_cluster.engine.disagg import Pool, group_sockets
from workloads.speculative import Speculation


@dataclass(frozen=True)
class Deployment:
    label: str  # the system: a cluster name, or PREFILL->DECODE
    pools: tuple[Pool, ...]  # one (aggregated) or (prefill, decode)
    max_batch: int
    ramp_s: float  # closed loop: clients (sessions) start one after another over this
    sockets_per_node: tuple[int, ...]
    socket_prices: tuple[float | None, ...]  # USD per socket-hour of each pool's chip
    analytic: dict = field(default_factory=dict, compare=False)
    draft: str | None = None  # speculative decoding (aggregated only)
    speculation: Speculation | None = None
    stack: str | None = None  # the GPU pools' serving stack; None where no pool is a GPU

    @property
    def disaggregated(self) -> bool:
        return len(self.pools) == 2

    @property
    def sockets(self) -> int:
        return sum(p.replicas * group_sockets(p.plan) for p in self.pools)

    @property
    def price_per_hour(self) -> float | None:
        """Sockets are priced by the socket-hour (a deployment need not fill its last node)."""
        if None in self.socket_prices:
            return None
        prices = cast("tuple[float, ...]", self.socket_prices)  # none is None (above)
        return sum(u * p.replicas * group_sockets(p.plan) for u, p in zip(prices, self.pools))

    @property
    def pool_nodes(self) -> list[int]:
        """The nodes each pool takes (its sockets in whole nodes)."""
        return [-(-p.replicas * group_sockets(p.plan) // n)
                for p, n in zip(self.pools, self.sockets_per_node)]

    @property
    def nodes(self) -> int:
        return sum(self.pool_nodes)

    def within(self, max_nodes: int) -> bool:
        """Whether every pool holds at most `max_nodes` nodes (--max-nodes: per pool)."""
        return max(self.pool_nodes) <= max_nodes

    def most_replicas(self, pool: int, max_nodes: int) -> int:
        """The most replicas pool `pool` takes within `max_nodes` nodes."""
        p = self.pools[pool]
        return max(1, max_nodes * self.sockets_per_node[pool] // group_sockets(p.plan))

    def with_replicas(self, pool: int, n: int) -> Deployment:
        pools = list(self.pools)
        pools[pool] = replace(pools[pool], replicas=n)
        return replace(self, pools=tuple(pools))
