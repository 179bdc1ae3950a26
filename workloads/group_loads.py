"""An expert-parallel group's load in a step: its routed assignments over the mean group's
(tokens x top_k / ep). The serving engine draws the counts (engine/expert_loads.py); the cost
tables key the steps they cost on the loads those counts can give (chip/loaded_steps.py), so
both compute a load here, the same division to the bit."""

from __future__ import annotations

import math

import numpy as np

SPREAD_SDS = 6.0  # support: counts within this many standard deviations of the mean


def unit(tokens: int, top_k: int, ep: int) -> float:
    """The mean group's routed assignments in a step of `tokens` tokens."""
    return tokens * top_k / ep


def loads(counts: np.ndarray, tokens: int, top_k: int, ep: int) -> np.ndarray:
    """Each group's load from its count of the step's assignments (1.0: the mean)."""
    return counts / unit(tokens, top_k, ep)


def support(tokens: int, top_k: int, ep: int) -> np.ndarray:
    """The loads a group's count takes within SPREAD_SDS standard deviations of its mean
    (a group's count of the tokens x top_k assignments, each to one of ep groups: binomial
    with p = 1 / ep, balanced routing), in ascending order."""
    n, p = tokens * top_k, 1.0 / ep
    mean, sd = n * p, math.sqrt(n * p * (1.0 - p))
    lo, hi = max(0, math.floor(mean - SPREAD_SDS * sd)), min(n, math.ceil(mean + SPREAD_SDS * sd))
    return loads(np.arange(lo, hi + 1, dtype=np.int64), tokens, top_k, ep)
