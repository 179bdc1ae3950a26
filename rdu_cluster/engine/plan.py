"""The serving plan: tensor (tp), expert (ep) and pipeline (pp) degrees, replicated over the rest
of the cluster, turned into one Program per socket.

`--plan` uses the partitioner's syntax: `tp16`, `tp2ep8` (attention, dense FFN and vocab over
the stage's 16 sockets; routed experts over 8 groups of 2) or `tp4pp4` (4 stages of 4 sockets,
layers cut where the partitioner cuts them: balanced by weight bytes). Replicas take
consecutive sockets.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from chip.program import Program
from partitioning.cluster import ClusterSpec
from partitioning.plan import Plan, validate
from partitioning.program import stage_layers
from workloads import graph as graphs
from workloads import params
from workloads.checks import show
from workloads.errors import ConfigError
from workloads.ops import OpClass, Shard, StepShape
from workloads.spec import ModelSpec
from workloads.speculative import Speculation


@dataclass(frozen=True)
class PlanSpec:
    tp: int
    ep: int = 1
    pp: int = 1
    adp: int = 1  # attention data-parallel groups of a stage (partitioning/plan.py)

    @classmethod
    def parse(cls, text: str | None, cluster: ClusterSpec, model: ModelSpec) -> PlanSpec:
        """The plan syntax of `simulate` and `plan` (tp16, tp4pp4, tp2ep8): one replica's
        degrees, no dp (the replicas fill the sockets, or --replicas gives them). The engine's
        tp is the stage width (tp x ep). Serve, its pools and serve sweeps all parse here."""
        if not text:
            return cls(cluster.sockets)
        p = Plan.parse(text)
        # A dp degree would be replaced by the replicas the cluster holds: refused, not changed
        # (after a successful parse, "dp" not after an "a" can only be that degree)
        if p.mixer_tp or p.micro_batches or re.search(r"(^|[^a])dp", text.lower()):
            raise ConfigError(f"--plan: {show(text)}: serve takes tp, ep, pp and adp degrees "
                              "only (the replicas are --replicas, or as many as the cluster "
                              "holds)")
        plan = cls(p.tp * p.ep, p.ep, p.pp, p.adp)
        plan.check(cluster, model)
        return plan

    def check(self, cluster: ClusterSpec, model: ModelSpec) -> None:
        group = self.tp * self.pp
        if min(self.tp, self.ep, self.pp) < 1 or cluster.sockets % group:
            raise ConfigError(
                f"--plan: tp x pp = {group} must divide the {cluster.sockets} sockets"
            )
        if self.ep > 1 and (model.moe is None or self.tp % self.ep
                            or model.moe.num_experts % self.ep):
            raise ConfigError("--plan: ep needs an MoE model and must divide tp and the experts")
        if self.pp > model.num_layers:
            raise ConfigError(f"--plan: pp={self.pp} exceeds the {model.num_layers} layers")
        if self.adp > 1:  # the partitioner's checks of the groups (plan.validate)
            validate(self.partition(cluster.sockets // group), model, cluster.sockets)

    @property
    def group(self) -> int:
        return self.tp * self.pp

    @property
    def name(self) -> str:
        """In the partitioner's syntax (tp2ep8: the stage width tp x ep is 16)."""
        return self.partition().name

    def partition(self, dp: int = 1) -> Plan:
        """The plan in the partitioner's terms (the engine's tp is the stage width), with `dp`
        replicas."""
        return Plan(tp=self.tp // self.ep, ep=self.ep, pp=self.pp, dp=dp, adp=self.adp)

    def shard(self) -> Shard:
        return self.partition().shard


@dataclass(frozen=True)
class ReplicaLayout:
    sockets: tuple[int, ...]
    stages: tuple[tuple[int, ...], ...]  # sockets of each pipeline stage
    programs: dict  # socket -> Program
    # Speculative decoding with the draft on its own sockets: stage 0 drafts, stage 1 (the
    # target) verifies; they prefill a prompt side by side (step_times.StepTimes.combine).
    draft_stage: bool = False


def layouts(model: ModelSpec, cluster: ClusterSpec, plan: PlanSpec, options=None,
            execution_model: str | None = None, first: int = 0,
            sockets: tuple[int, ...] | None = None) -> list[ReplicaLayout]:
    pool = sockets if sockets is not None else tuple(range(first, cluster.sockets))
    out = []
    cuts = stage_layers(model, plan.pp)  # the partitioner's stages (balanced by weight bytes)
    for r in range(len(pool) // plan.group):
        members = pool[r * plan.group : (r + 1) * plan.group]
        stages, programs = [], {}
        for k in range(plan.pp):
            stage = members[k * plan.tp : (k + 1) * plan.tp]
            layers = None if plan.pp == 1 else cuts[k]
            for s in stage:
                programs[s] = Program(model, plan.shard(), k, plan.pp, layers, stage,
                                      execution_model, options)
            stages.append(stage)
        out.append(ReplicaLayout(members, tuple(stages), programs))
    return out


def check_draft_sockets(cluster: ClusterSpec, plan: PlanSpec, draft_sockets: int) -> int:
    """The replica's sockets with a separate draft (the draft's tp must divide the cluster:
    its collectives are costed like a tp group's, estimate.tp_comm_time)."""
    group = draft_sockets + plan.group
    if draft_sockets < 1 or cluster.sockets % draft_sockets or group > cluster.sockets:
        raise ConfigError(
            f"--draft-sockets: {draft_sockets} must divide the {cluster.sockets} sockets and "
            f"leave room for the {plan.group} of the plan {plan.name} (with --draft-placement "
            "separate: give a smaller --plan or --tp)"
        )
    return group


def separate_draft_layouts(model: ModelSpec, draft: ModelSpec, cluster: ClusterSpec,
                           plan: PlanSpec, draft_sockets: int, speculation: Speculation,
                           options=None, execution_model: str | None = None
                           ) -> list[ReplicaLayout]:
    """Replicas of `draft_sockets` draft sockets (the draft tensor-parallel over them) followed
    by the target's tp x pp sockets; the sockets left over stay idle. `speculation` gives the
    programs their k (or tree)."""
    group = check_draft_sockets(cluster, plan, draft_sockets)
    spec: dict[str, Any] = {"spec_k": speculation.k, "spec_tree": speculation.branching}
    out = []
    for r in range(cluster.sockets // group):
        d = tuple(range(r * group, r * group + draft_sockets))
        (target,) = layouts(model, cluster, plan, options, execution_model,
                            sockets=tuple(range(d[-1] + 1, (r + 1) * group)))
        programs = {s: Program(draft, Shard.tensor(draft_sockets), 0, 2, None, d,
                               execution_model, options, spec_part="draft", **spec) for s in d}
        programs.update({s: replace(p, stage=1, stages=2, spec_part="verify", **spec)
                         for s, p in target.programs.items()})
        out.append(ReplicaLayout(d + target.sockets, (d, *target.stages), programs, True))
    return out


def _per_program(f: Callable[[Program], float]) -> Callable[[Program], float]:
    """f once per equal program: a pure function of it, asked for each socket of each replica
    each time a run lays them out (a capacity search lays out the same replicas tens of times,
    32 sockets each for DeepSeek-V3 on sn40l-16 adp32ep32: 4% of its CPU, in step graphs
    built again). A program that does not hash (its options unhashable) is not kept."""
    kept = functools.lru_cache(maxsize=256)(f)

    @functools.wraps(f)
    def once(program: Program) -> float:
        try:
            return kept(program)
        except TypeError:
            return f(program)
    return once


@_per_program
def resident_weight_bytes(program: Program) -> float:
    """Weights one socket holds: what its program reads at a batch that touches every expert,
    with the embedding's gathered rows replaced by its whole shard of the table (a socket
    without the prologue holds none of it; a tied embedding is the LM head's matrix)."""
    g = program.graph(StepShape.decode(1e6, 1.0))
    total = 0.0
    for block, op in g.ops():
        if op.cls is OpClass.EMBEDDING:
            if not program.model.tie_embeddings:
                w = program.model.precision.weights.bytes
                total += params.embedding_params(program.model) * w / program.shard.embed_tp
            continue
        total += block.repeat * float(np.max(op.weight_bytes))
    if program.draft is not None:  # a speculative draft shares the sockets (its shard)
        total += graphs.weight_bytes(program.draft) / program.shard.attn_tp
    return total


@_per_program
def kv_bytes_per_token(program: Program) -> float:
    """This socket's KV bytes per cached token: the slope of its decode KV read in context
    (exact for full attention; layers with a sliding window are counted as if they kept every
    token, an overestimate of their cache; recurrent state is not counted)."""
    g = program.graph(StepShape.decode(1.0, np.array([64.0, 65.0])))
    kv = np.asarray(g.total("kv_read_bytes"), dtype=float)
    own = float(kv[1] - kv[0]) or float(graphs.kv_bytes_per_token(program.model))
    if program.draft is not None:  # the draft caches every sequence's tokens as well
        own += float(graphs.kv_bytes_per_token(program.draft)) / program.shard.attn_tp
    return own
