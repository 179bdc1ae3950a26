"""Sensitivity of a plan's speed to the hardware figures.

`link_sensitivity`: each unpublished link figure (P2P link bandwidth, per-hop latency) scaled by
a factor while every other figure stays at its config value. `hardware_sensitivity`: the
elasticity of TPOT, TTFT and tokens/s to every hardware figure of the cluster (peak FLOP/s,
SRAM, HBM and DDR bandwidth and capacity, link bandwidth and latency, PCU / PMU counts), with
the mechanism (decode cause) that carries each; `rdu-cluster sensitivity` prints it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from partitioning.evaluate import evaluate_plan
from partitioning.scenario import Scenario
from workloads.errors import ConfigError

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


# ---- every hardware figure: elasticities ------------------------------------------------------

# The hardware figures an architect varies, each a function (cluster, factor) -> cluster, and
# the chips it applies to (tiers a chip lacks, tile-array counts of a chip without them, are
# skipped). The `--set` path of each is what `key` names.
HARDWARE = (
    ("peak FLOP/s", "chip.peak_flops.*"),
    ("SRAM capacity", "chip.tiers.sram.capacity_bytes"),
    ("HBM bandwidth", "chip.tiers.hbm.bandwidth_bytes_per_s"),
    ("HBM capacity", "chip.tiers.hbm.capacity_bytes"),
    ("DDR bandwidth", "chip.tiers.ddr.bandwidth_bytes_per_s"),
    ("DDR capacity", "chip.tiers.ddr.capacity_bytes"),
    ("host-memory bandwidth", "chip.tiers.host.bandwidth_bytes_per_s"),
    ("link bandwidth", "topology.link_bandwidth_bytes_per_s"),
    ("link latency", "topology.link_latency_s"),
    ("PCUs", "chip.execution.pcus"),
    ("PMUs", "chip.execution.pmus"),
)
# A figure is scaled by 1/STEP and by STEP; the elasticity is the log-ratio of the metric over
# the log-ratio of the figure (a central difference in log space, exact for a power law). 25%
# moves a binding mechanism visibly and keeps a capacity within reach of its bound.
STEP = 1.25


def scaled(cluster, key: str, factor: float):
    """The cluster (a ClusterSpec) with one hardware figure scaled, or None where the chip has
    no such figure.
    Tile-array counts stay whole numbers (at least 1)."""
    chip = cluster.chip
    if key == "chip.peak_flops.*":
        flops = {k: v * factor for k, v in chip.peak_flops.items()}
        return replace(cluster, chip=replace(chip, peak_flops=flops))
    if key.startswith("chip.tiers."):
        _, _, tier, field = key.split(".")
        if not chip.has_tier(tier):
            return None
        tiers = tuple(replace(t, **{field: getattr(t, field) * factor}) if t.name == tier else t
                      for t in chip.tiers)
        return replace(cluster, chip=replace(chip, tiers=tiers))
    if key.startswith("chip.execution."):
        name = key.rsplit(".", 1)[1]
        if name not in chip.execution:
            return None
        value = max(1, round(chip.execution[name] * factor))
        return replace(cluster, chip=replace(chip, execution={**chip.execution, name: value}))
    name = key.split(".", 1)[1]
    return replace(cluster, topology=replace(cluster.topology,
                                             **{name: getattr(cluster.topology, name) * factor}))


METRICS = ("tpot_s", "ttft_s", "tokens_per_s_total")


@dataclass(frozen=True)
class Elasticity:
    figure: str  # "HBM bandwidth"
    key: str  # its --set path
    elasticity: dict[str, float | None]  # metric -> d ln(metric) / d ln(figure); None: no fit
    change: dict[str, tuple[float | None, float | None]]  # metric -> (at 1/STEP, at STEP) ratio
    mechanism: str  # the decode cause that moves most (or "-" when nothing moves)
    note: str = ""  # e.g. "does not fit at 0.8x"


def hardware_sensitivity(scenario: Scenario, **kwargs: Any) -> list[Elasticity]:
    """The elasticity of TPOT, TTFT and total tokens/s to each hardware figure of the
    scenario's cluster, ranked by |elasticity of TPOT| (then of TTFT), with the cause that
    carries it (`kwargs`: evaluate_plan's)."""
    base = evaluate_plan(scenario, **kwargs)
    out = []
    for figure, key in HARDWARE:
        variants = [scaled(scenario.cluster, key, f) for f in (1 / STEP, STEP)]
        if variants[0] is None:
            continue
        runs: list[Any] = []
        notes: list[str] = []
        for f, c in zip((1 / STEP, STEP), variants):
            try:
                runs.append(evaluate_plan(scenario.but(cluster=c), **kwargs))
            except ConfigError as e:  # a capacity cut below what the plan needs
                runs.append(None)
                notes.append(f"does not fit at {f:g}x: {e}")
        out.append(_elasticity(figure, key, base, runs, "; ".join(notes)))
    return sorted(out, key=lambda e: (-abs(e.elasticity["tpot_s"] or 0.0),
                                      -abs(e.elasticity["ttft_s"] or 0.0)))


def _elasticity(figure: str, key: str, base, runs, note: str) -> Elasticity:
    el: dict[str, float | None] = {}
    change: dict[str, tuple[float | None, float | None]] = {}
    for m in METRICS:
        b = _value(base, m)
        lo, hi = (None if r is None else _value(r, m) for r in runs)
        change[m] = (None if lo is None or not b else lo / b,
                     None if hi is None or not b else hi / b)
        el[m] = None
        if lo is not None and hi is not None and lo > 0 and hi > 0:
            el[m] = math.log(hi / lo) / math.log(STEP * STEP)
        elif b and hi:  # one side only (the other does not fit): one-sided
            el[m] = math.log(hi / b) / math.log(STEP)
        elif b and lo:
            el[m] = math.log(lo / b) / math.log(1 / STEP)
    return Elasticity(figure, key, el, change, _mechanism(runs), note)


def _value(e, metric: str) -> float | None:
    v = getattr(e, metric)
    return None if v is None else float(np.ravel(np.asarray(v, dtype=float))[0])


def _mechanism(runs) -> str:
    """The decode cause (of the slowest stage) whose time differs most between the two
    variants; where decode does not move, the prefill's, named "prefill CAUSE"."""
    if any(r is None for r in runs):
        return "fit (capacity)"
    lo, hi = (max(r.stage_decode, key=lambda c: float(np.max(c.time_s))) for r in runs)
    best = _moved(lo, hi)
    if best is None and all(r.prefill is not None for r in runs):
        best = _moved(runs[0].prefill, runs[1].prefill)
        return "-" if best is None else f"prefill {best}"
    return "-" if best is None else best


def _moved(lo, hi) -> str | None:
    """The cause whose time differs most between two step costs, if any moves by more than a
    millionth of the step."""
    causes = set(lo.by_cause) | set(hi.by_cause)
    diff = {c: abs(float(np.max(lo.cause(c))) - float(np.max(hi.cause(c)))) for c in causes}
    best = max(diff, key=lambda c: diff[c], default=None)
    floor = 1e-6 * float(np.max(lo.time_s))
    return best if best is not None and diff[best] > floor else None
