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
from partitioning.cluster import ClusterSpec
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
        return self.tp * self.decode.flops / self.batch

    @property
    def bytes_per_token(self) -> Work:
        """HBM bytes the whole model group must read to emit one token of each sequence."""
        return self.tp * self.decode.useful_hbm_bytes / self.batch


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
    )


def tp_comm_time(cluster: ClusterSpec, tp: int) -> Callable[[Collective], Work]:
    """First cost path: a ring all-reduce with an alpha-beta cost per step, over one link of the
    topology: 2(p-1) steps, each moving bytes/p and paying one hop of latency."""
    topo = cluster.topology

    def time(c: Collective) -> Work:
        p = c.size
        if p <= 1:
            return 0.0
        inter = cluster.nodes > 1 and tp > cluster.sockets_per_node
        bw = topo.inter_node_bandwidth_bytes_per_s if inter else topo.link_bandwidth_bytes_per_s
        alpha = topo.inter_node_latency_s if inter else topo.link_latency_s
        return 2 * (p - 1) * (alpha + np.asarray(c.bytes) / p / bw)

    return time


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
