"""The flat view of the plan evaluator (partitioning.evaluate) that result tables print: a model
on a cluster under a plan at a batch and lengths -> decode and prefill figures with their
breakdown. `estimate` and `best_plan` are entry points onto `evaluate_plan`, each taking the
Scenario (partitioning.scenario) a cost is asked for; its batch and lengths may be numpy arrays
(a grid of design points); results broadcast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chip.cost import StepCost
from partitioning.cluster import ClusterSpec
from partitioning.evaluate import (
    PlanEstimate,
    evaluate_plan,
    plan_comm_time,
    search_plans,
    tp_comm_time,
)
from partitioning.footprint import PlanDoesNotFit
from partitioning.plan import Plan
from partitioning.scenario import Scenario
from workloads import graph as graphs
from workloads.ops import Collective, Work
from workloads.spec import ModelSpec

__all__ = [
    "Estimate",
    "best_plan",
    "estimate",
    "from_plan_estimate",
    "plan_comm_time",
    "tp_comm_time",
]


@dataclass(frozen=True)
class Estimate:
    model: str
    cluster: str
    sockets: int
    tp: int
    replicas: int
    batch: Work
    prompt_len: Work
    gen_len: Work
    decode: StepCost  # one mean decode step of one socket
    prefill: StepCost  # the prompt's forward pass on one socket
    weight_bytes: float  # the whole model
    kv_cache_bytes: Work  # the whole batch at full length
    hbm_used_bytes: Work  # per socket
    hbm_bandwidth: float
    extra: dict[str, Any] = field(default_factory=dict)
    plan: str = ""  # the partitioning plan's name ("tp16", "tp4pp2", "tp8ep2")
    model_sockets: int = 0  # sockets holding one copy of the model (default: tp)
    misfit: Any = ""  # per point: "" where it fits, else why not (partitioning.footprint)
    kv_cache_bytes_per_socket: Work = np.nan  # the fullest socket's share of kv_cache_bytes
    stack: str | None = None  # the GPU serving stack it ran (chip.serving_stacks.stack_of)

    @property
    def group_sockets(self) -> int:
        return self.model_sockets or self.tp

    @property
    def tpot_s(self) -> Work:
        return self.decode.time_s

    @property
    def ttft_s(self) -> Work:
        return self.prefill.time_s

    @property
    def tokens_per_s_per_request(self) -> Work:
        return 1.0 / self.decode.time_s

    @property
    def tokens_per_s_total(self) -> Work:
        return self.replicas * self.batch / self.decode.time_s

    @property
    def hbm_bw_utilization(self) -> Work:
        return self.decode.useful_hbm_bytes / (self.decode.time_s * self.hbm_bandwidth)

    @property
    def flops_per_token(self) -> Work:
        return self.group_sockets * self.decode.flops / self.batch

    @property
    def bytes_per_token(self) -> Work:
        """HBM bytes the whole model group must read to emit one token of each sequence."""
        return self.group_sockets * self.decode.useful_hbm_bytes / self.batch


def estimate(
    scenario: Scenario,
    *,
    check: bool = True,
    execution_model: str | None = None,
    comm_time: Callable[[Collective], Work] | None = None,
) -> Estimate:
    """The scenario through the one plan evaluator (stages, micro-batches, bubbles, EP
    all-to-all, DDR spill) at every (batch, prompt_len, gen_len) point, as one flat Estimate
    whose decode breakdown is the slowest stage's plus the bubble and the DDR stream. With
    check=False the points that do not fit are costed too, and carry their reason in
    `misfit`."""
    pe = evaluate_plan(scenario, check=check, execution_model=execution_model,
                       comm_time=comm_time)
    return from_plan_estimate(scenario.spec, scenario.cluster, pe)


def from_plan_estimate(model: ModelSpec, cluster: ClusterSpec, pe: PlanEstimate) -> Estimate:
    return Estimate(
        model=model.name,
        cluster=cluster.name,
        sockets=pe.plan.sockets,
        tp=pe.plan.tp,
        replicas=pe.plan.dp,
        batch=pe.batch,
        prompt_len=pe.prompt_len,
        gen_len=pe.gen_len,
        decode=pe.decode,
        prefill=pe.prefill if pe.prefill is not None else StepCost(np.nan),
        weight_bytes=float(graphs.weight_bytes(model)),
        kv_cache_bytes=graphs.kv_cache_bytes(model, pe.batch, pe.prompt_len + pe.gen_len),
        hbm_used_bytes=pe.hbm_used_bytes,
        hbm_bandwidth=pe.hbm_bandwidth,
        extra={
            "expert_load": pe.expert_load,
            "bubble_fraction": pe.bubble_fraction,
            "ddr_used_bytes": pe.ddr_used_bytes,
            "bound": pe.bound,
            "memory": pe.memory,
            "reserved_by": pe.reserved_by,
        },
        plan=pe.plan.name,
        model_sockets=pe.plan.model_sockets,
        misfit=pe.misfit,
        kv_cache_bytes_per_socket=pe.kv_cache_bytes_per_socket,
        stack=pe.stack,
    )


def best_plan(scenario: Scenario, objective: str = "latency") -> Plan:
    """The feasible plan (in place of the scenario's) that ranks first for `objective`
    (latency | throughput | sockets)."""
    result = search_plans(scenario, objective)
    if not result.ranked:
        reason = result.rejected[-1][1] if result.rejected else "no valid plan"
        raise PlanDoesNotFit(
            f"{scenario.spec.name} on {scenario.cluster.name}: no plan of {result.evaluated} "
            f"fits; the widest: {reason}"
        )
    return result.ranked[0].plan
