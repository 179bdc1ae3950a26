"""`simulate --ablate`: the RDU run with each dataflow optimization off in turn, all off, and
the unfused host-orchestrated baseline of [MICRO24]; time per token and speed-up over the
baseline."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chip.dataflow import UNFUSED_BASELINE, DataflowOptions
from partitioning.estimate import estimate
from partitioning.scenario import Scenario
from rdu_cluster.output.report import text_table
from workloads.errors import ConfigError

VARIANTS: tuple[tuple[str, DataflowOptions], ...] = (
    ("all optimizations", DataflowOptions()),
    ("- KernelLooping", DataflowOptions(kernel_looping=False)),
    ("- BatchStreaming", DataflowOptions(batch_streaming=False)),
    ("- ScheduleOffloading", DataflowOptions(schedule_offloading=False)),
    ("fused, no optimization", DataflowOptions(False, False, False, True)),
    ("unfused baseline", UNFUSED_BASELINE),
)


@dataclass(frozen=True)
class AblationRow:
    variant: str
    options: DataflowOptions
    tpot_s: float
    tokens_per_s: float
    speedup_vs_baseline: float
    hbm_bw_utilization: float


def ablate(scenario: Scenario) -> list[AblationRow]:
    """The scenario under each of VARIANTS' dataflow options (in place of its own)."""
    cluster = scenario.cluster
    if cluster.chip.execution_model != "dataflow":
        raise ConfigError(f"--ablate: {cluster.name} does not run the dataflow execution model")
    runs = []
    for name, opts in VARIANTS:
        e = estimate(scenario.but(options=opts))
        runs.append((name, opts, _scalar(e.tpot_s), _scalar(e.hbm_bw_utilization)))
    base = runs[-1][2]
    return [AblationRow(n, o, t, 1.0 / t, base / t, u) for n, o, t, u in runs]


def format_ablation(rows: list[AblationRow], title: str = "") -> str:
    body = [
        [
            r.variant,
            f"{r.tpot_s * 1e3:.3f}",
            f"{r.tokens_per_s:,.1f}",
            f"{r.speedup_vs_baseline:.2f}x",
            f"{r.hbm_bw_utilization:.1%}",
        ]
        for r in rows
    ]
    header = ["variant", "ms/token", "tokens/s", "speed-up vs baseline", "HBM BW util"]
    return (title + "\n" if title else "") + text_table(header, body)


def _scalar(x) -> float:
    return float(np.ravel(np.asarray(x, dtype=float))[0])
