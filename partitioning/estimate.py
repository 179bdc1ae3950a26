"""One design point, end to end: a model on a cluster at a batch and lengths -> decode and
prefill figures with their breakdown.

Composition only: the graph comes from workloads, time from the chip's execution model and the
interconnect. Every input may be a numpy array (a grid of design points); results broadcast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chip import execution
from chip.cost import CAUSES, StepCost
from interconnect import comm_time_fn
from partitioning.cluster import ClusterSpec
from partitioning.evaluate import PlanEstimate, evaluate_plan, search_plans, topology_of
from partitioning.footprint import PlanDoesNotFit
from partitioning.plan import Plan
from partitioning.program import concurrent_groups, groups_of
from workloads import graph as graphs
from workloads.errors import ConfigError
from workloads.ops import Collective, Shard, StepShape, Work
from workloads.spec import ModelSpec


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
    model: ModelSpec,
    cluster: ClusterSpec,
    batch: Work = 1,
    prompt_len: Work = 1024,
    gen_len: Work = 256,
    tp: int | None = None,
    options: Any = None,
    execution_model: str | None = None,
    comm_time: Callable[[Collective], Work] | None = None,
) -> Estimate:
    """Tensor parallelism over `tp` sockets (default: all), replicated over the rest.

    Decode is costed at the mean context of the generation, prompt_len + (gen_len - 1) / 2: exact
    for every term linear in context (KV streaming, attention FLOPs), the bulk of decode cost.
    """
    tp = tp or cluster.sockets
    _check_positive(batch=batch, prompt_len=prompt_len, gen_len=gen_len, tp=tp)
    if cluster.sockets % tp:
        raise ConfigError(
            f"tp: {tp} does not divide the {cluster.sockets} sockets of {cluster.name}"
        )
    shard = Shard.tensor(tp)
    comm = comm_time or tp_comm_time(cluster, tp)
    batch_a, prompt_a, gen_a = (np.asarray(x, dtype=float) for x in (batch, prompt_len, gen_len))
    context = prompt_a + (gen_a - 1.0) / 2.0
    decode_g = graphs.step_graph(model, StepShape.decode(batch_a, context), shard)
    prefill_g = graphs.step_graph(model, StepShape.prefill(batch_a, prompt_a), shard)
    cost = lambda g: execution.step_cost(g, cluster.chip, comm, options, execution_model)
    weights = float(graphs.weight_bytes(model))
    kv = graphs.kv_cache_bytes(model, batch_a, prompt_a + gen_a)
    used = weights / tp + kv / tp
    _check_fit(model, cluster, tp, used)
    return Estimate(
        model=model.name,
        cluster=cluster.name,
        sockets=cluster.sockets,
        tp=tp,
        replicas=cluster.sockets // tp,
        batch=batch_a,
        prompt_len=prompt_a,
        gen_len=gen_a,
        decode=cost(decode_g),
        prefill=cost(prefill_g),
        weight_bytes=weights,
        kv_cache_bytes=kv,
        hbm_used_bytes=used,
        hbm_bandwidth=cluster.chip.hbm.bandwidth_bytes_per_s,
        plan=Plan(tp=tp, dp=cluster.sockets // tp).name,
    )


def tp_comm_time(cluster: ClusterSpec, tp: int) -> Callable[[Collective], Work]:
    """The interconnect's cost of each collective of a tensor-parallel plan over `tp` sockets,
    replicated over the rest: the same network code (topology, routes, algorithm choice,
    link sharing between replicas) that every plan goes through."""
    return plan_comm_time(cluster, Plan(tp=tp, dp=cluster.sockets // tp))


def plan_comm_time(cluster: ClusterSpec, plan: Plan) -> Callable[[Collective], Work]:
    """Collectives of socket 0's groups under `plan`, sharing links with the other groups."""
    return comm_time_fn(topology_of(cluster), groups_of(plan, 0), concurrent_groups(plan))


def _check_fit(model: ModelSpec, cluster: ClusterSpec, tp: int, used: Work) -> None:
    hbm = cluster.chip.hbm.capacity_bytes
    worst = float(np.max(used))
    if worst > hbm:
        raise ConfigError(
            f"{model.name} does not fit {cluster.name} at tp={tp}: weights + KV cache need "
            f"{worst / 1e9:.1f} GB of HBM per socket, {hbm / 1e9:.1f} GB available"
        )


def _check_positive(**values: Work) -> None:
    for name, value in values.items():
        if np.any(np.asarray(value) <= 0):
            raise ConfigError(f"{name.replace('_', '-')}: must be positive, got {value}")


def cause_columns(cost: StepCost, prefix: str) -> dict[str, Work]:
    return {f"{prefix}_{c}_s": cost.cause(c) for c in CAUSES}


def estimate_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
    batch: int = 1,
    prompt_len: int = 1024,
    gen_len: int = 256,
    options: Any = None,
) -> Estimate:
    """Any plan: tensor parallelism alone takes the vectorized path above; pipeline and expert
    parallelism go through the partitioner's per-stage evaluation (stages, micro-batches,
    bubbles, EP all-to-all, DDR spill), summarized as one Estimate whose decode breakdown is the
    slowest stage's plus the bubble and the DDR stream."""
    if plan.pp == 1 and plan.ep == 1 and not plan.mixer_tp and plan.sockets == cluster.sockets:
        return estimate(model, cluster, batch, prompt_len, gen_len, tp=plan.tp, options=options)
    pe = evaluate_plan(model, cluster, plan, batch, prompt_len, gen_len, options=options)
    return from_plan_estimate(model, cluster, pe)


def from_plan_estimate(model: ModelSpec, cluster: ClusterSpec, pe: PlanEstimate) -> Estimate:
    times = pe.stage_times_s
    slow = int(np.argmax(times))
    crit = pe.stage_decode[slow]
    bubble = pe.tpot_s - times[slow]
    m, pp = pe.micro_batches, pe.plan.pp
    by_cause = {k: float(np.max(v)) for k, v in crit.by_cause.items()}
    by_class = {k: float(np.max(v)) for k, v in crit.by_class.items()}
    for extra, t in (("ddr_streaming", pe.stage_ddr_s[slow]), ("pipeline_bubble", bubble)):
        by_cause[extra] = by_cause.get(extra, 0.0) + t
        by_class[extra] = by_class.get(extra, 0.0) + t
    # Per token period each socket streams its stage once per micro-batch.
    mean = lambda attr: m * sum(float(np.max(getattr(c, attr))) for c in pe.stage_decode) / pp
    decode = StepCost(
        pe.tpot_s,
        by_cause,
        by_class,
        mean("useful_hbm_bytes"),
        mean("flops"),
        float(np.max(crit.kernels)),
    )
    prefill = StepCost(pe.ttft_s if pe.ttft_s is not None else np.nan)
    return Estimate(
        model=model.name,
        cluster=cluster.name,
        sockets=pe.plan.sockets,
        tp=pe.plan.tp,
        replicas=pe.plan.dp,
        batch=np.asarray(pe.batch),
        prompt_len=np.asarray(pe.prompt_len),
        gen_len=np.asarray(pe.gen_len),
        decode=decode,
        prefill=prefill,
        weight_bytes=float(graphs.weight_bytes(model)),
        kv_cache_bytes=graphs.kv_cache_bytes(model, pe.batch, pe.prompt_len + pe.gen_len),
        hbm_used_bytes=pe.hbm_used_bytes,
        hbm_bandwidth=cluster.chip.hbm.bandwidth_bytes_per_s,
        extra={
            "expert_load": pe.expert_load,
            "bubble_fraction": pe.bubble_fraction,
            "ddr_used_bytes": pe.ddr_used_bytes,
            "bound": pe.bound,
        },
        plan=pe.plan.name,
        model_sockets=pe.plan.model_sockets,
    )


def best_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    objective: str = "latency",
    batch: int = 1,
    prompt_len: int = 1024,
    gen_len: int = 256,
    options: Any = None,
) -> Plan:
    """The feasible plan that ranks first for `objective` (latency | throughput | sockets)."""
    result = search_plans(model, cluster, objective, batch, prompt_len, gen_len, options=options)
    if not result.ranked:
        reason = result.rejected[-1][1] if result.rejected else "no valid plan"
        raise PlanDoesNotFit(
            f"{model.name} on {cluster.name}: no plan of {result.evaluated} "
            f"fits; the widest: {reason}"
        )
    return result.ranked[0].plan
