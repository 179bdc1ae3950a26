"""Least outstanding requests (vLLM production-stack / Envoy's least-request balancing): the
replica with the fewest requests routed to it and not yet finished."""

from __future__ import annotations

from collections.abc import Sequence

from rdu_cluster.engine.replica_routing import ReplicaView, least, register
from rdu_cluster.engine.requests import Request


@register
class LeastOutstanding:
    name = "least-outstanding"
    stateful = True

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        return least(replicas, lambda v: len(v.outstanding))
