"""The set-up of a serving run: what each replica's sockets hold (their programs, weights,
activations and KV cache), checked against each tier, before any request runs.

Simulation.start lays the replicas out with it; a replica re-planned after a fault
(engine/recovery.py) is laid out again by the same calls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import numpy as np

from chip import runtime_memory, serving_stacks
from chip.runtime_memory import RuntimeMemory
from partitioning.cluster import ClusterSpec
from partitioning.evaluate import footprint, plan_comm_time, tp_comm_time
from partitioning.footprint import Placement, PlanDoesNotFit, fit_message
from partitioning.plan import Plan as PartitionPlan
from partitioning.scenario import Scenario
from rdu_cluster.backends import SocketSetup
from rdu_cluster.engine import plan as plans
from rdu_cluster.engine import prefix_cache, schedulers
from rdu_cluster.engine.faults import Fault
from rdu_cluster.engine.kv import KVConfig, KVManager
from rdu_cluster.engine.prefix_cache import PrefixCache
from rdu_cluster.engine.replica import Replica, ReplicaParts
from rdu_cluster.scenarios import coe
from rdu_cluster.scenarios.speculative import PLACEMENTS, resolve_draft
from workloads import traces
from workloads.errors import ConfigError
from workloads.spec import ModelSpec
from workloads.traces import Trace

if TYPE_CHECKING:
    from rdu_cluster.engine.simulation import ServeConfig
    from workloads.speculative import Speculation


class Build:
    """The run's layout and memory: built once from the model, cluster, trace and config,
    which it checks (a bad combination raises ConfigError, a plan that does not fit
    PlanDoesNotFit) before any socket starts."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, trace: Trace,
                 config: ServeConfig) -> None:
        if config.kv_memory_fraction is not None and not 0 < config.kv_memory_fraction <= 1:
            raise ConfigError("--kv-fraction: must be in (0, 1]")
        self.model, self.cluster, self.trace, self.config = model, cluster, trace, config
        traces.check_fits(trace, model.max_context, model.name)
        self.plan = plans.PlanSpec.parse(config.plan, cluster, model)
        self.faults = [Fault.parse(f, cluster) for f in config.faults]
        # speculation comes with its draft (ServeConfig)
        self.draft = (resolve_draft(cast(str, config.draft), model) if config.speculation
                      else None)
        if config.speculation and (self.plan.pp > 1 or self.plan.adp > 1):
            raise ConfigError("--draft: speculative decoding needs a plan without pipeline stages "
                              "or attention data parallelism (adp)")
        _check_placement(config)
        if self.draft is not None and config.draft_placement == "separate":
            plans.check_draft_sockets(cluster, self.plan, config.draft_sockets)
        _check_coe(config)
        self.coe_memory = self._coe_memory() if config.coe else None
        self._fps: dict = {}  # plan -> (footprints, reason), once asked for (footprint)
        config.prefix.check()
        self.prefix_mode = config.prefix.resolved(
            self.lower_tier(), serving_stacks.spills_prefix_cache(cluster.chip))
        self.prefix_live = prefix_cache.Liveness(trace.content)  # shared by the replicas

    def layouts(self) -> list[plans.ReplicaLayout]:
        c = self.config
        if self.draft is not None and c.draft_placement == "separate":
            return plans.separate_draft_layouts(  # a draft: only with speculation (__init__)
                self.model, self.draft, self.cluster, self.plan, c.draft_sockets,
                cast("Speculation", c.speculation), c.options, c.execution_model)
        return [self.with_draft(lay) for lay in plans.layouts(
            self.model, self.cluster, self.plan, c.options, c.execution_model)]

    def with_draft(self, lay: plans.ReplicaLayout) -> plans.ReplicaLayout:
        if self.draft is None:
            return lay
        spec = cast("Speculation", self.config.speculation)  # a draft: only with speculation
        progs = {s: replace(p, draft=self.draft, spec_k=spec.k, spec_tree=spec.branching)
                 for s, p in lay.programs.items()}
        return replace(lay, programs=progs)

    def with_router(self, lay: plans.ReplicaLayout) -> plans.ReplicaLayout:
        """CoE: the router runs on the replica's sockets, in the step that admits a request."""
        if self.config.coe is None:
            return lay
        router = self.config.coe.router
        return replace(lay, programs={s: replace(p, router=router)
                                      for s, p in lay.programs.items()})

    def speculate(self) -> Callable[[int, int, int], np.ndarray] | None:
        """Tokens each of a step's n decodes emits, drawn from the acceptance model, seeded by
        (seed, replica, step): the same draw however the steps are grouped into windows."""
        spec = self.config.speculation
        if spec is None:
            return None
        seed = self.config.seed
        return lambda rep, step, n: spec.sample_tokens(
            np.random.default_rng([seed, rep, step]), n)

    def lookahead_tokens(self) -> int:
        """The most tokens a decode step writes (schedulers.View.lookahead): k drafts and the
        target's own token with speculative decoding."""
        spec = self.config.speculation
        return 1 if spec is None else spec.k + 1

    def replica(self, index: int, lay: plans.ReplicaLayout) -> Replica:
        """Replica `index` on the sockets of `lay`: its scheduler, KV cache, prefix cache and
        the draws and experts its steps need."""
        c = self.config
        kv = self.kv(lay)
        parts = ReplicaParts(self.swap_tier(), self.speculate(), self.experts(),
                             self.prefix_cache(kv), self.lookahead_tokens())
        return Replica(index, list(lay.sockets), schedulers.get(c.scheduler, c.limits), kv, parts)

    def _coe_memory(self) -> coe.Memory:
        sc = cast(coe.CoEScenario, self.config.coe)  # asked for only with CoE (__init__)
        ctx = int(np.max(self.trace.prompt_len + self.trace.output_len, initial=1))
        mem = coe.memory(sc, self.cluster, self.config.limits.max_batch, ctx, self.plan.tp)
        if not mem.fits_tier:
            raise ConfigError(coe.oom_message(sc, self.cluster, mem))
        if self.plan.pp > 1 or self.plan.ep > 1 or self.plan.adp > 1:
            raise ConfigError("--coe-experts: needs a tensor-parallel plan (tpN)")
        return mem

    def experts(self) -> coe.ExpertResidency | None:
        mem = self.coe_memory
        if mem is None:
            return None
        sc = cast(coe.CoEScenario, self.config.coe)  # coe_memory: only with CoE (__init__)
        return coe.ExpertResidency(mem.slots, sc.policy, mem.tier_name)

    def setups(self, lay: plans.ReplicaLayout, plan: plans.PlanSpec) -> dict[int, SocketSetup]:
        # The engine's tp is the stage width, ep a split of it (partitioning's tp x ep); a
        # replica re-planned after a fault has degrees of its own (Recovery.smaller_plan)
        tp = plan.tp
        comm = plan_comm_time(self.cluster, replace(plan, pp=1).partition(
            self.cluster.sockets // tp))
        ref = _kv_reference(lay)
        out = {}
        for s, prog in lay.programs.items():
            w = plans.resident_weight_bytes(prog)
            first, last = prog.layers or (0, prog.model.num_layers)
            name = f"weights/{prog.model.name}/layers/{first}-{last - 1}"
            act = self.activations(lay, s)
            held = self.reserved(prog, w, act)
            self._check_fits(prog, w + act + held)
            weights = ((["alloc", name, "hbm", w, "weights"],
                        ["alloc", f"activations/{prog.model.name}", "hbm", act, "activations"],
                        ["alloc", f"reserved/{self.runtime.runtime}", "hbm", held, "reserved"])
                       if self.config.coe is None
                       else coe.socket_regions(self.config.coe, self.cluster, tp))
            own = comm if prog.spec_part != "draft" else tp_comm_time(self.cluster,
                                                                       len(prog.group))
            out[s] = SocketSetup(self.cluster.chip, prog, own, self.cluster.node_of(s), weights,
                                 plans.kv_bytes_per_token(prog) / ref / prog.shard.attn_dp)
        return out

    def partition_plan(self, plan: plans.PlanSpec | None = None) -> PartitionPlan:
        """A serving plan (default: the run's) in the partitioner's terms (the engine's tp is
        the stage width), replicated over the cluster."""
        p = plan or self.plan
        return p.partition(self.cluster.sockets // p.group)

    def footprint(self, plan: plans.PlanSpec, check: bool = True):
        """The one footprint check (partitioning.evaluate.footprint) at the trace's longest
        request, alone: what a replica must hold to serve anything. (footprints, reason); with
        check, a plan that does not fit raises PlanDoesNotFit in the words of every command."""
        if plan not in self._fps:
            longest = (int(np.max(self.trace.prompt_len, initial=1)),
                       int(np.max(self.trace.output_len, initial=1)))
            # the runtime at its own fraction: what an engine of the stack would start with
            # (an explicit --kv-fraction sizes the KV pool, _kv_blocks)
            default = replace(self.runtime, rule=self._stack_runtime.rule,
                              fraction=self._stack_runtime.fraction)
            scenario = Scenario(self.model, self.cluster, self.partition_plan(plan), 1, *longest,
                                options=self.config.options,
                                placement=Placement(runtime=default))
            self._fps[plan] = footprint(scenario, check=False)
        fps, why = self._fps[plan]
        if check and why:
            raise PlanDoesNotFit(why)
        return fps, why

    def activations(self, lay: plans.ReplicaLayout, socket: int) -> float:
        """HBM the socket keeps for one prompt's activations (the footprint's region); a draft
        on sockets of its own and CoE (coe.memory sizes its sockets) keep none here."""
        prog = lay.programs[socket]
        if self.config.coe is not None or prog.spec_part == "draft":
            return 0.0
        stages = lay.stages[1:] if lay.draft_stage else lay.stages
        target = [s for stage in stages for s in stage]
        plan = replace(self.plan, tp=len(stages[0]), ep=prog.shard.ep, pp=len(stages))
        fps, _ = self.footprint(plan)
        return float(np.max(fps[target.index(socket)].regions.get(("activations", "hbm"), 0.0)))

    @functools.cached_property
    def _stack_runtime(self) -> RuntimeMemory:
        return runtime_memory.of(self.cluster.chip, self.config.options)

    @functools.cached_property
    def runtime(self) -> RuntimeMemory:
        """What the serving runtime reserves (chip/runtime_memory.py), with the run's KV share
        where --kv-fraction gives one; a GPU engine's activation workspace at the run's token
        budget."""
        rt = self._stack_runtime.with_fraction(self.config.kv_memory_fraction)
        if rt.token_budget is not None:
            rt = replace(rt, token_budget=self.config.limits.token_budget)
        return rt

    def reserved(self, prog, weights: float, activations: float) -> float:
        """HBM the runtime keeps on a socket holding `weights` and `activations` (the
        footprint's rule: RuntimeMemory.parts)."""
        return float(sum(self.runtime.parts(self.cluster.chip.hbm.capacity_bytes, weights,
                                            activations, len(prog.group)).values()))

    def _check_fits(self, prog, needed: float) -> None:
        """What the footprint does not see (a draft's weights beside the target's), against
        the same capacity, in the same words."""
        hbm = self.cluster.chip.hbm.capacity_bytes
        if needed >= hbm:
            raise PlanDoesNotFit(fit_message(self.partition_plan(), prog.model.name,
                                             self.cluster.name, "hbm", 0, needed, hbm))

    def kv(self, lay: plans.ReplicaLayout) -> KVManager:
        """KV blocks the replica can hold: the fewest any of its sockets has room for (a
        block takes each socket's own bytes per token; the replica counts the target's)."""
        bt = self.config.block_tokens
        # Attention data-parallel groups hold different sequences: the replica holds as many
        # blocks as each group's sockets have room for, times the groups (one pool stands for
        # theirs: requests are not pinned to a group).
        blocks = min(self._kv_blocks(p, bt, self.activations(lay, s)) * p.shard.attn_dp
                     for s, p in lay.programs.items())
        return KVManager(KVConfig(blocks, bt, _kv_reference(lay)))

    def _kv_blocks(self, prog, block_tokens: int, activations: float) -> int:
        """What the weights, the activation workspace and the runtime's reservation leave."""
        weights = plans.resident_weight_bytes(prog)
        if self.coe_memory is not None:  # the router and the HBM slots of the experts
            weights = self.coe_memory.router + self.coe_memory.slots * self.coe_memory.expert
        held = weights + activations + self.reserved(prog, weights, activations)
        free = max(0.0, self.cluster.chip.hbm.capacity_bytes - held)
        return int(free // (plans.kv_bytes_per_token(prog) * block_tokens))

    def swap_tier(self) -> str:
        return "ddr" if self.cluster.chip.has_tier("ddr") else "host"

    def lower_tier(self) -> str | None:
        """The tier below HBM (DDR on an RDU, host memory on a GPU), if the chip has one."""
        tier = self.swap_tier()
        return tier if self.cluster.chip.has_tier(tier) else None

    def prefix_cache(self, kv: KVManager) -> PrefixCache | None:
        if self.prefix_mode == "off":
            return None
        return prefix_cache.build(self.config.prefix, self.prefix_mode, self.cluster.chip, kv,
                                  self.lower_tier(), self._lower_reserved(kv),
                                  self.prefix_live)

    def _lower_reserved(self, kv: KVManager) -> float:
        """Bytes per socket the lower tier keeps for other things: CoE experts, and with swap
        preemption the whole HBM KV cache swapped out."""
        tier = self.lower_tier()
        held = 0.0
        if self.config.coe is not None:
            held += sum(op[3] for op in coe.socket_regions(self.config.coe, self.cluster,
                                                           self.plan.tp) if op[2] == tier)
        if self.config.limits.preemption == "swap":
            held += kv.config.capacity_blocks * kv.config.block_bytes
        return held


def _kv_reference(lay: plans.ReplicaLayout) -> float:
    """KV bytes per token the replica's region ops count in: its target sockets' largest."""
    return max(plans.kv_bytes_per_token(p) for p in lay.programs.values()
               if p.spec_part != "draft")


def _check_placement(config: ServeConfig) -> None:
    if config.draft_placement not in PLACEMENTS:
        raise ConfigError(f"--draft-placement: {config.draft_placement!r} unknown; accepted: "
                          f"{', '.join(PLACEMENTS)}")
    if config.draft_placement == "separate" and config.faults:
        raise ConfigError("--fault: not with --draft-placement separate (re-planning a group "
                          "keeps the draft on the target's sockets only)")


def _check_coe(config: ServeConfig) -> None:
    # a CoE batch holds one expert's requests: only the coe policy plans so, and needs experts
    if config.coe is not None and config.scheduler != "coe":
        raise ConfigError(f"--scheduler {config.scheduler}: not with --coe-experts, which runs "
                          "--scheduler coe (its default)")
    if config.coe is None and config.scheduler == "coe":
        raise ConfigError("--scheduler coe: only with --coe-experts")
    if config.coe is not None and config.faults:
        raise ConfigError("--fault: not with --coe-experts (a re-planned group would lose its "
                          "expert copies)")

