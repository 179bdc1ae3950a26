"""Energy per token and cost per million tokens, and the [cost] table of a cluster TOML.

Cost is socket-hours times a named price per socket-hour (`[cost] socket_hour_usd`, with its
source: a cloud list price for GPUs; for SN40L, which has no public per-socket price, a stated
parity assumption). Energy comes from chip/power.py. Both are decode figures: the sockets of one
model replica (tp, plus a separate draft's sockets) over one decode step, divided by the tokens
that step emits for all sequences of the batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from chip import power
from chip.cost import StepCost
from partitioning.cluster import ClusterSpec
from workloads import checks
from workloads.ops import Work

COST_KEYS = ("socket_hour_usd", "source")
# A bound, not a price: on-demand cloud prices are under USD 100 an hour for a whole 8-GPU node
# (about USD 2-12 a GPU-hour in 2024-26 list prices), so 1e4 a socket-hour is 100x past any
# real one and keeps every derived figure finite (1e308 gave an infinite cost per token).
MAX_SOCKET_HOUR_USD = 1e4
COLUMNS = ("power_w", "joules_per_token", "socket_hour_usd", "cost_per_million_tokens_usd")


def parse_cost(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Check a cluster's [cost] table (exact keys) and return it as a plain dict; {} if absent."""
    if not table:
        return {}
    checks.exact_keys(table, COST_KEYS, where)
    return {
        "socket_hour_usd": checks.number(table.get("socket_hour_usd"),
                                         f"{where}.socket_hour_usd", 0.0, MAX_SOCKET_HOUR_USD),
        "source": checks.source(table, where),
    }


def socket_hour_usd(cluster: ClusterSpec) -> float | None:
    cost = getattr(cluster, "cost", None) or {}
    return cost.get("socket_hour_usd")


def cost_per_million_tokens(price: float | None, sockets: int, seconds: Work, tokens: Work):
    """USD per 1e6 tokens when `sockets` sockets take `seconds` to emit `tokens`."""
    if price is None:
        return None
    return price * sockets * np.asarray(seconds, dtype=float) / 3600.0 / tokens * 1e6


def step_columns(
    cluster: ClusterSpec, cost: StepCost, sockets: int, tokens: Work, seconds: Work | None = None
) -> dict[str, Any]:
    """The energy / cost columns of one decode step: `sockets` sockets each doing `cost`, the
    step lasting `seconds` (default cost.time_s) and emitting `tokens`."""
    seconds = cost.time_s if seconds is None else seconds
    p = power.socket_power_w(cost, cluster.chip)
    price = socket_hour_usd(cluster)
    return {
        "power_w": p,
        "joules_per_token": None if p is None else p * sockets * seconds / tokens,
        "socket_hour_usd": price,
        "cost_per_million_tokens_usd": cost_per_million_tokens(price, sockets, seconds, tokens),
    }


def estimate_columns(est, cluster: ClusterSpec) -> dict[str, Any]:
    """Columns for a partitioning.estimate.Estimate: one replica's tp sockets, `batch` tokens a
    decode step."""
    return step_columns(cluster, est.decode, est.group_sockets, est.batch)


def speculative_columns(sest, cluster: ClusterSpec) -> dict[str, Any]:
    """Columns for a SpecEstimate: draft and verification energy over the tokens a step emits.
    Power is the time-weighted mean over the sockets of the replica (the draft's sockets draw
    idle power while the target verifies, and the other way round)."""
    chip = cluster.chip
    tokens = sest.tokens_per_step * np.asarray(sest.base.batch, dtype=float)
    step = sest.step_time_s
    sockets = sest.sockets_per_replica
    energy = _spec_energy(sest, chip)
    price = socket_hour_usd(cluster)
    return {
        "power_w": None if energy is None else energy / (sockets * step),
        "joules_per_token": None if energy is None else energy / tokens,
        "socket_hour_usd": price,
        "cost_per_million_tokens_usd": cost_per_million_tokens(price, sockets, step, tokens),
    }


def _spec_energy(sest, chip) -> Work | None:
    idle = power.idle_power_w(chip)
    if idle is None:
        return None
    tp, d_tp = sest.base.tp, sest.draft_tp
    total_sockets = sest.sockets_per_replica
    verify = power.step_energy_j(sest.verify, chip, tp) + idle * (total_sockets - tp) * np.asarray(
        sest.verify.time_s, dtype=float)
    draft: Work = 0.0
    for c in sest.draft_steps:
        t = np.asarray(c.time_s, dtype=float)
        # not None: the chip has a [power] table (it has an idle power)
        draft = (draft + cast(Work, power.step_energy_j(c, chip, d_tp))
                 + idle * (total_sockets - d_tp) * t)
    transfer = idle * total_sockets * np.asarray(sest.transfer_s, dtype=float)
    return verify + draft + transfer
