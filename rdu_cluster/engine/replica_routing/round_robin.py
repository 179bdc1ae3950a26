"""Round-robin by request id: request i goes to replica i mod N (what the engine always did).
It needs no state, so the engine routes a trace up front and replicas run independently."""

from __future__ import annotations

from collections.abc import Sequence

from rdu_cluster.engine.replica_routing import ReplicaView, register
from rdu_cluster.engine.requests import Request


@register
class RoundRobin:
    name = "round-robin"
    stateful = False

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        return request.id % len(replicas)
