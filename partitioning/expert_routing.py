"""Expert-load imbalance under expert parallelism, from a routing model.

`expert_load` is the expected tokens-routed-to-the-busiest-group over the mean (>= 1): the
busiest socket sets the step time of an EP layer. It is estimated by Monte Carlo with a seeded
numpy Generator (deterministic): each trial routes N tokens x top_k choices to experts drawn
from a popularity distribution, experts sit round-robin on `ep` groups (expert e on group
e % ep), and the load of each group is counted.

Routing models:
- "uniform": every expert equally likely. Even so, a few tokens leave groups unevenly loaded
  (1 token with top-8 of 256 experts on 16 groups: the busiest group gets 1 or 2 of the 8).
- "zipf": popularity of the i-th most popular expert proportional to 1 / i**s (stated
  distribution; `s` a parameter, 0 = uniform); which experts are popular is a seeded random
  permutation, so hot experts are not all on one group by construction.
- "identical": every sequence of a batch is the same (one prompt replicated and decoded
  greedily: TensorRT-LLM's run.py, other benchmark scripts), so the batch routes as one sequence
  does, uniformly: its tokens reach the experts one sequence's tokens reach, each expert's rows
  multiplied by the batch (`routed_tokens`).
Choices of one token are drawn with replacement (a token picking the same expert twice is
rare at top_k << E and changes the counts little).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from workloads import checks
from workloads.errors import ConfigError
from workloads.ops import Work


@dataclass(frozen=True)
class RoutingModel:
    kind: str = "uniform"  # "uniform" | "zipf" | "identical"
    zipf_s: float = 1.0
    seed: int = 0
    trials: int = 256

    def __post_init__(self) -> None:
        if self.kind not in ("uniform", "zipf", "identical"):
            raise ConfigError(
                f"routing: {self.kind!r} unknown; accepted: uniform, zipf, identical"
            )
        # s past 100: all traffic on one expert already (1/2^100); negative s is not a Zipf law
        checks.number(self.zipf_s, "--routing zipf:S", 0.0, 100.0)
        checks.integer(self.seed, "--seed", 0, 2**63 - 1)

    @property
    def identical(self) -> bool:
        return self.kind == "identical"

    def routed_tokens(self, tokens: Work, batch: Work) -> Work:
        """Tokens whose routings are drawn independently: one sequence's when all are the same."""
        return tokens / batch if self.identical else tokens

    def popularity(self, num_experts: int) -> np.ndarray:
        if self.kind != "zipf" or self.zipf_s == 0:
            return np.full(num_experts, 1.0 / num_experts)
        p = 1.0 / np.arange(1, num_experts + 1) ** self.zipf_s
        rng = np.random.default_rng(self.seed)
        return rng.permutation(p / p.sum())


def expert_load(model: RoutingModel, num_experts: int, top_k: int, ep: int, tokens: int) -> float:
    """Expected busiest-group load over the mean, for `tokens` tokens routed at once."""
    if ep <= 1:
        return 1.0
    return _load(model, num_experts, top_k, ep, max(1, round(float(tokens))))


@lru_cache(maxsize=1024)
def _load(model: RoutingModel, num_experts: int, top_k: int, ep: int, tokens: int) -> float:
    rng = np.random.default_rng(model.seed + 1)
    counts = rng.multinomial(tokens * top_k, model.popularity(num_experts), size=model.trials)
    groups = counts.reshape(model.trials, num_experts // ep, ep).sum(axis=1)  # e -> e % ep
    mean = tokens * top_k / ep
    return float(np.mean(groups.max(axis=1)) / mean)
