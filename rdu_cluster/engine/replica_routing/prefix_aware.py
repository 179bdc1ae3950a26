"""Prefix-aware and load-balanced: NVIDIA Dynamo's KV-aware router cost, on the replicas' own
prefix caches. For each replica, in KV blocks:

    cost = OVERLAP_WEIGHT x blocks to prefill + blocks of the requests outstanding there

where blocks to prefill are the prompt's blocks less the ones its cache holds, those in HBM
credited in full and those in the tier below (DDR, host memory) at LOWER_TIER_WEIGHT (they must
be copied up); the outstanding requests' blocks are their prompts', the router's own account of
the load it sent (as Dynamo's active blocks). The cheapest wins; ties go to the fewer
outstanding requests, then the lowest index. A session's next turn goes back to the replica
holding its history unless that replica carries more load than the prefill it saves; a request
no cache holds goes where the least load is. A replica without a prefix cache
(`--prefix-cache off`) holds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from rdu_cluster.engine.replica_routing import ReplicaView, least, register
from rdu_cluster.engine.requests import Request

# Dynamo router defaults (docs.nvidia.com/dynamo, router "Configuration and Tuning", v1.2):
# --router-kv-overlap-score-weight 1.0; --router-host-cache-hit-weight 0.75 (prefix overlap
# held in host memory, the tier below HBM).
OVERLAP_WEIGHT = 1.0
LOWER_TIER_WEIGHT = 0.75


@register
class PrefixAware:
    name = "prefix-aware"
    stateful = True

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        cost = {v.index: _prefill_blocks(v, request) * OVERLAP_WEIGHT + _active_blocks(v)
                for v in replicas}
        return least(replicas, lambda v: (cost[v.index], len(v.outstanding)))


def _prefill_blocks(v: ReplicaView, r: Request) -> float:
    kv = v.replica.kv
    cache = getattr(v.replica, "prefix", None)
    found = cache.lookup(r) if cache is not None else {}
    credit = sum(n * (1.0 if tier == "hbm" else LOWER_TIER_WEIGHT) for tier, n in found.items())
    return (r.prompt_len - credit) / kv.config.block_tokens


def _active_blocks(v: ReplicaView) -> int:
    kv = v.replica.kv
    return sum(kv.blocks_for(q.prompt_len) for q in v.outstanding)
