"""The scenario a cost is asked for: a model on a cluster under a plan, at a batch and lengths,
with the chip's execution options, the MoE routing and the memory placement. Every cost entry
point (partitioning.evaluate.evaluate_plan and footprint, partitioning.estimate.estimate,
rdu_cluster.scenarios.speculative.speculative_estimate, rdu_cluster.scenarios.ablate.ablate)
takes one, so a new figure of the scenario is one field here, not one parameter in each.

A field left at None takes its default where it is used (routing: uniform; placement: all in
HBM; options: the chip's execution-model defaults). `batch`, `prompt_len` and `gen_len` may be
numpy arrays (a grid of design points); results broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from partitioning.cluster import ClusterSpec
from partitioning.expert_routing import RoutingModel
from partitioning.footprint import Placement
from partitioning.plan import Plan
from workloads.errors import ConfigError
from workloads.ops import Work
from workloads.spec import ModelSpec


@dataclass(frozen=True)
class Scenario:
    """The scenario a cost is asked for. `plan`: a Plan, or its text ("tp4pp2"); None is
    tensor parallelism over every socket of the cluster (one replica)."""

    spec: ModelSpec
    cluster: ClusterSpec
    plan: Plan = None  # type: ignore[assignment]  # None -> tp over all sockets (__post_init__)
    batch: Work = 1
    prompt_len: Work = 1024
    gen_len: Work = 256
    options: Any = None  # the execution options: a stack's GpuOptions, or DataflowOptions
    routing: RoutingModel | None = None
    placement: Placement | None = None

    def __post_init__(self) -> None:
        if self.plan is None:
            object.__setattr__(self, "plan", Plan(tp=self.cluster.sockets))
        elif isinstance(self.plan, str):
            object.__setattr__(self, "plan", Plan.parse(self.plan))

    def but(self, **changes: Any) -> Scenario:
        """This scenario with some fields changed (dataclasses.replace)."""
        return replace(self, **changes)


def tensor_plan(cluster: ClusterSpec, tp: int | None = None, flag: str = "tp") -> Plan:
    """Tensor parallelism over `tp` sockets (default all), replicated over the rest of
    `cluster`; `flag` names the option in the error for a tp that does not divide them."""
    tp = tp or cluster.sockets
    if tp < 1 or cluster.sockets % tp:
        raise ConfigError(f"{flag}: {tp} does not divide the {cluster.sockets} sockets of "
                          f"{cluster.name}")
    return Plan(tp=tp, dp=cluster.sockets // tp)
