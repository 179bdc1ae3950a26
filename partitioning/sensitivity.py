"""Sensitivity of a plan's speed to the link figures SambaNova does not publish.

Each unpublished figure (P2P link bandwidth, per-hop latency) is scaled by a factor while every
other figure stays at its config value; the plan is re-evaluated on the modified topology.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from partitioning.evaluate import evaluate_plan
from partitioning.scenario import Scenario

FIGURES = ("link_bandwidth_bytes_per_s", "link_latency_s")
FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class SensitivityRow:
    figure: str
    factor: float
    value: float
    tokens_per_s_per_request: float
    tokens_per_s_total: float
    communication_share: float  # of the decode step (slowest stage)
    ttft_s: float | None  # the prompt's forward pass (None: evaluated without prefill)


def link_sensitivity(
    scenario: Scenario,
    factors: Sequence[float] = FACTORS,
    figures: Sequence[str] = FIGURES,
    **kwargs: Any,
) -> list[SensitivityRow]:
    """One row per (figure, factor): the scenario's decode speed with that figure scaled
    (`kwargs`: evaluate_plan's)."""
    rows = []
    cluster = scenario.cluster
    for figure in figures:
        base = getattr(cluster.topology, figure)
        for f in factors:
            topo = replace(cluster.topology, **{figure: base * f})
            e = evaluate_plan(replace(scenario, cluster=replace(cluster, topology=topo)),
                              **kwargs)
            stage = max(e.stage_decode, key=lambda c: float(c.time_s))
            share = float(stage.cause("communication")) / float(stage.time_s)
            rows.append(SensitivityRow(  # one scenario point: every figure a scalar
                figure, f, base * f, float(e.tokens_per_s_per_request),
                float(e.tokens_per_s_total), share,
                None if e.ttft_s is None else float(e.ttft_s)))
    return rows
