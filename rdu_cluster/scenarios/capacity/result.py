"""A verified deployment: its run's figures, its verdict on the SLO and how far it misses; and
the ranking of rows."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rdu_cluster.scenarios.capacity.deployment import Deployment
from rdu_cluster.scenarios.capacity.slo import SLO


@dataclass
class Result:
    deployment: Deployment
    summary: dict
    ttft_ms: float
    tpot_ms: float
    miss: float
    serve_args: list[str]
    below: float | None = None  # the miss of one replica fewer (the boundary's other side)
    below_at_least: bool = False  # that run stopped once certain to miss: a lower bound
    slo: SLO | None = None  # the SLO `miss` is on (a pool's part is judged on it: search)
    steady: dict = field(default_factory=dict)  # how the steady state was checked (settle)
    # nodes and $/Mtok ends, robust (intervals.with_ends)
    interval: dict = field(default_factory=dict)
    # a run stopped once certain to miss (engine/decided.py): metric -> its pP at least (ms);
    # its other figures are lower bounds (0 where nothing is known) and its summary holds
    # nothing else: only a verdict, never a row
    decided: dict = field(default_factory=dict)
    # a pair left at its prefill pool's start, missing in the ramp's transient (search's
    # `doubled`): searched at the doubled count, whatever its verdict there (settle)
    transient: bool = False

    @property
    def meets_slo(self) -> bool:
        return self.miss <= 0

    def answers(self, slo: SLO) -> bool:
        """Whether the run's verdict on `slo` is known: a whole run, or one stopped where a
        metric `slo` bounds is certain to exceed that bound (its pP at least a value over it)."""
        bound = lambda m: getattr(slo, f"{m}_ms")
        return not self.decided or any(bound(m) is not None and at_least > bound(m)
                                       for m, at_least in self.decided.items())


def judged(r: Result, slo: SLO) -> float:
    """r's miss under `slo` (the worst seed's, where several were served)."""
    if not math.isfinite(r.miss) and r.miss > 0:
        return math.inf  # refused requests, or none served
    pairs = r.steady.get("runs") or [(r.ttft_ms, r.tpot_ms)]
    return max(slo.misses(a, b) for a, b in pairs)


def ranked(results: list[Result]) -> list[Result]:
    """Meeting the SLO first, then the cheapest per hour, then the fewest sockets."""
    return sorted(results, key=lambda r: (not r.meets_slo, r.deployment.price_per_hour
                                          if r.deployment.price_per_hour is not None
                                          else math.inf, r.deployment.sockets, r.miss))
