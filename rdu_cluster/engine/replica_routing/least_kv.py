"""Least KV-cache load (llm-d's KV-cache utilization scorer; Dynamo's KV-aware router without
its prefix-overlap term): the replica whose KV cache in use is the smallest share of its
capacity; ties to the fewer outstanding requests (a queue behind an idle cache), then the
lowest index."""

from __future__ import annotations

from collections.abc import Sequence

from rdu_cluster.engine.replica_routing import ReplicaView, least, register
from rdu_cluster.engine.requests import Request


@register
class LeastKV:
    name = "least-kv"
    stateful = True

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        return least(replicas, lambda v: (v.kv_used_fraction, len(v.outstanding)))
