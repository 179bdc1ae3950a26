"""Round-robin: the k-th request routed goes to replica k mod N. The engine routes requests in
id order, so request i goes to replica i mod N (what the engine always did); the later turns of
a session, and a closed-loop client's later requests, follow their first (engine/dispatch.py)
and are not dealt, so sessions spread over the replicas whatever their length. It depends on no
replica's state, so the engine routes a trace up front and replicas run independently."""

from __future__ import annotations

from collections.abc import Sequence

from rdu_cluster.engine.replica_routing import ReplicaView, register
from rdu_cluster.engine.requests import Request


@register
class RoundRobin:
    name = "round-robin"
    stateful = False

    def __init__(self) -> None:
        self.dealt = 0

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        self.dealt += 1
        return (self.dealt - 1) % len(replicas)
