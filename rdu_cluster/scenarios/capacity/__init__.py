"""Capacity planning to a latency SLO: the cheapest deployments of a model that serve a traffic
at a TTFT / TPOT bound, found in two passes (as AIConfigurator and Vidur's config search do):

1. Analytic pre-filter (sizing.py): per system and replica plan, the largest batch whose decode
   step keeps TPOT within the bound, one prompt's prefill, and the fewest replicas whose load
   passes; a pair of pools sizes its decode pool on TPOT and its prefill pool on utilization.
2. Verification: each short-listed deployment is served by the engine (verification.py:
   engine/simulation.py or engine/disagg/) and the SLO percentile of TTFT and TPOT is
   measured (engine/bench.py), each client's first request left out as warm-up. `search`
   bisects to the boundary: the fewest replicas that meet, one fewer verified to miss, within
   --max-nodes. `settle` (steady.py) then serves the boundary row with twice the requests
   until it moves less than STEADY_TOL (its own move: a row found at the longer count is
   measured on its own run at half it), with SEEDS seeds where lengths are drawn, and searches
   the interval's ends (intervals.py: the SLO's bounds over the uncertainty model's factors,
   on the same runs). A search's run stops once it certainly misses the bound it is judged on
   (engine/decided.py: most runs miss), and is served again to its end where its figures, or
   another bound, are asked for.

Closed loops (clients, sessions) start over a ramp of one estimated cycle (E2E and think time)
so that they do not all prefill at once; pairs of pools are verified as aggregated deployments
are (engine/disagg/ runs both pools in one event loop).

A module per concept, each importing only those before it here: slo (the bound), traffic (what
is served, and how many requests verify it), deployment (pools of replicas and their price),
sizing (pass 1), result (a verified run, its verdict, the ranking), search (the boundary),
intervals (the uncertainty model's ends), verification (an engine run), steady (settle),
candidates (the command's: the analytic pass over processes, the shortlist, the verification
over processes or Ray; imported as a module, not re-exported here).
"""

from rdu_cluster.engine.disagg import Pool
from rdu_cluster.scenarios.capacity.deployment import Deployment
from rdu_cluster.scenarios.capacity.intervals import Bands, bands, loosest, with_ends
from rdu_cluster.scenarios.capacity.result import Result, judged, ranked
from rdu_cluster.scenarios.capacity.search import PAIR_PASSES, resized, saturated, search
from rdu_cluster.scenarios.capacity.sizing import (
    BATCHES,
    MAX_BATCH_CAP,
    PREFILL_THROTTLE,
    PrefillLoad,
    ReplicaCost,
    aggregated,
    disaggregated,
    pool_ttft,
    prefill_replicas,
    replica_cost,
    replica_plans,
)
from rdu_cluster.scenarios.capacity.slo import SLO
from rdu_cluster.scenarios.capacity.steady import SEEDS, STEADY_DOUBLINGS, settle
from rdu_cluster.scenarios.capacity.traffic import (
    STEADY_START,
    STEADY_TOL,
    Traffic,
    uncached_tokens,
)
from rdu_cluster.scenarios.capacity.verification import serve_args, verify

__all__ = [
    "BATCHES", "MAX_BATCH_CAP", "PAIR_PASSES", "PREFILL_THROTTLE", "SEEDS", "SLO",
    "STEADY_DOUBLINGS", "STEADY_START", "STEADY_TOL", "Bands", "Deployment", "Pool", "PrefillLoad",
    "ReplicaCost", "Result", "Traffic", "aggregated", "bands", "disaggregated", "judged", "loosest",
    "pool_ttft", "prefill_replicas", "ranked", "replica_cost", "replica_plans", "resized",
    "saturated", "search", "serve_args", "settle", "uncached_tokens", "verify", "with_ends",
]
