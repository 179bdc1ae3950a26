"""A seeded MoE routing sampler: the per-step load of each expert-parallel group.

partitioning/expert_routing.py gives analytic plans the *expected* load of the busiest group; a serving
run needs the load of each step, drawn here. Each token of a step is routed to top_k experts
drawn uniformly (balanced routing in expectation: the load-balancing loss's target); a step's
N * top_k assignments are one multinomial draw over the experts (distinctness of a token's k
experts is ignored: a few per cent at k/E = 1/4). A group's load is its assignments over the
mean group's, so the busiest group's load is the straggler factor of the step
(Shard.expert_load). Each step's draw is keyed by (seed, replica, step): the same plan gives the
same loads in any backend, window or restart, however the steps fall into spans and windows
(keyed by a span's first step, a span cut at another window's end drew afresh, so a change of
where windows end, which changes no time of a dense run, moved an expert-parallel one).
"""

from __future__ import annotations

import numpy as np

from workloads import group_loads


class ExpertLoadSampler:
    def __init__(self, num_experts: int, top_k: int, ep: int, seed: int):
        self.experts, self.top_k, self.ep, self.seed = num_experts, top_k, ep, seed
        self.p = np.full(num_experts, 1.0 / num_experts)

    def loads(self, replica: int, first_step: int, tokens: int, steps: int) -> np.ndarray:
        """(steps, ep) load of each group per step, 1.0 = the mean."""
        n = tokens * self.top_k
        counts = np.array([np.random.default_rng([self.seed, replica, step]).multinomial(n, self.p)
                           for step in range(first_step, first_step + steps)],
                          dtype=np.int64).reshape(steps, self.experts)
        groups = counts.reshape(steps, self.ep, -1).sum(axis=2)
        return group_loads.loads(groups, tokens, self.top_k, self.ep)
