"""THE plan evaluator: a Plan plus arrays of batch, prompt and generation lengths -> per-stage
step costs, the per-socket footprint of every tier, whether each point fits, and the derived
figures (TPOT, TTFT, tokens/s, bound). Every command goes through `evaluate_plan`; the flat
`Estimate` that tables print (partitioning.estimate) is a view of its result.

Decode is costed at the mean context of the generation, prompt + (gen - 1) / 2: exact for every
term linear in context (KV streaming, attention FLOPs), the bulk of decode cost. Pipeline: the
batch is cut into m micro-batches (default min(batch, pp)); a micro-batch's next token needs its
previous one, so its period is the longer of its trip through all stages (sum of stage times)
and the time the busiest stage spends on all m micro-batches: period = max(sum_s t_s,
m * max_s t_s). At batch 1 (m = 1) a pipeline only adds hops: the bubble is (pp - 1) / pp,
which is why TP beats PP for single-stream decode. Bytes spilled to DDR stream at DDR
bandwidth, after (not overlapped with) the HBM stream: a conservative rule, stated here.
Expert-load imbalance comes from the routing model, per point (it depends on the tokens a step
routes). Prefill is the prompt's forward pass through every stage in turn.

Vectorized: every array input broadcasts; a stage is costed by one step_cost call over all the
points. What plans share is cached (graphs per shard shape in partitioning.program, footprints
per stage, collective cost functions per group layout), so a plan search costs each distinct
stage shape once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np

from chip import execution, runtime_memory
from chip.cost import StepCost
from chip.serving_stacks import stack_of
from interconnect import alone_layout, build_topology, comm_time_fn
from partitioning.cluster import ClusterSpec
from partitioning.expert_routing import RoutingModel, expert_load
from partitioning.footprint import (
    Footprint,
    Placement,
    PlanDoesNotFit,
    footprints,
    misfits,
    nonzero,
)
from partitioning.plan import Plan, validate
from partitioning.program import Program, build_programs, concurrent_groups, groups_of
from partitioning.scenario import Scenario
from workloads.errors import ConfigError
from workloads.ops import Collective, Graph, OpClass, StepShape, Work
from workloads.spec import ModelSpec, part

CommTime = Callable[[Collective], Work]


@dataclass(frozen=True)
class PlanEstimate:
    """The evaluator's result; every figure broadcasts over the design points."""

    plan: Plan
    model: str
    cluster: str
    batch: Work
    prompt_len: Work
    gen_len: Work
    stage_decode: tuple[StepCost, ...]  # one micro-batch decode step per stage
    stage_ddr_s: tuple[Work, ...]  # DDR streaming added to each stage's decode step
    micro_batches: Work
    tpot_s: Work
    prefill: StepCost | None  # the prompt through every stage, None when not asked for
    footprints: tuple[Footprint, ...]
    expert_load: Work
    misfit: Any  # per point: "" where it fits, else the one-line reason (footprint.misfits)
    hbm_bandwidth: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    stack: str | None = None  # the GPU serving stack it ran (chip.serving_stacks.stack_of)

    @property
    def ttft_s(self) -> Work | None:
        return None if self.prefill is None else self.prefill.time_s

    @property
    def fits(self) -> Work:
        return self.misfit == ""

    @property
    def tokens_per_s_per_request(self) -> Work:
        return 1.0 / self.tpot_s

    @property
    def tokens_per_s_total(self) -> Work:
        return self.plan.dp * self.batch / self.tpot_s

    @property
    def stage_times_s(self) -> tuple[Work, ...]:
        return tuple(c.time_s + d for c, d in zip(self.stage_decode, self.stage_ddr_s))

    @property
    def slowest_stage(self) -> Work:
        """Per point, the index of the stage that takes longest."""
        return np.argmax(np.stack(np.broadcast_arrays(*self.stage_times_s)), axis=0)

    @property
    def bubble_fraction(self) -> Work:
        busy = self.micro_batches * sum(self.stage_times_s)
        return 1.0 - busy / (self.plan.pp * self.tpot_s)

    @property
    def hbm_used_bytes(self) -> Work:
        return self._per_point(_max(fp.tier("hbm") for fp in self.footprints))

    @property
    def ddr_used_bytes(self) -> Work:
        return self._per_point(_max(fp.tier("ddr") for fp in self.footprints))

    @property
    def kv_cache_bytes_per_socket(self) -> Work:
        """The KV cache (and recurrent state) the fullest socket holds, in every tier: the
        batch's at full length, over the KV heads and sequences the plan gives it."""
        return self._per_point(_max(fp.region("kv_cache") for fp in self.footprints))

    @property
    def memory(self) -> dict[str, Work]:
        """The HBM of the fullest socket by region ("weights", "kv_cache", "activations",
        "reserved") and the reservation by part ("reserved_<part>"), per point."""
        fp = max(self.footprints, key=lambda f: float(np.max(f.tier("hbm"))))
        out = {r: self._per_point(b) for (r, t), b in fp.regions.items() if t == "hbm"}
        out.update({f"reserved_{k}": self._per_point(v) for k, v in fp.reserved.items()})
        return out

    @property
    def reserved_by(self) -> str:
        """The runtime whose reservation the footprint counts (chip/runtime_memory.py)."""
        return self.footprints[0].runtime if self.footprints else ""

    def _per_point(self, value: Work) -> Work:
        shape = np.shape(self.tpot_s)
        return np.broadcast_to(value, shape).astype(float) if shape else float(value)

    @property
    def decode(self) -> StepCost:
        """One token period of the slowest stage, as one StepCost: its breakdown plus the DDR
        stream and the pipeline bubble, so the causes still add up to the TPOT."""
        idx = self.slowest_stage
        crit = _pick_cost(self.stage_decode, idx)
        ddr = _pick(self.stage_ddr_s, idx)
        bubble = self.tpot_s - _pick(self.stage_times_s, idx)
        by_cause, by_class = dict(crit.by_cause), dict(crit.by_class)
        for extra, t in (("ddr_streaming", ddr), ("pipeline_bubble", bubble)):
            by_cause[extra] = by_cause.get(extra, 0.0) + t
            by_class[extra] = by_class.get(extra, 0.0) + t
        # Per token period each socket streams its stage once per micro-batch.
        m, pp = self.micro_batches, self.plan.pp
        mean = lambda attr: m * sum(getattr(c, attr) for c in self.stage_decode) / pp
        return StepCost(self.tpot_s, by_cause, by_class, mean("useful_hbm_bytes"),
                        mean("flops"), crit.kernels)

    @property
    def bound(self) -> str | np.ndarray:
        """What sets the step time, per point: the slowest stage's dominant cause, or the DDR
        stream, or the pipeline bubble when stages idle more than half the time."""
        idx = self.slowest_stage
        crit = _pick_cost(self.stage_decode, idx)
        times = _pick(self.stage_times_s, idx)
        ddr = _pick(self.stage_ddr_s, idx)
        shape = np.shape(self.tpot_s)
        out = np.broadcast_to(crit.bound(), shape).astype(object)
        out = np.where(np.broadcast_to(self.bubble_fraction > 0.5, shape), "pipeline_bubble", out)
        out = np.where(np.broadcast_to(ddr > times / 2, shape), "ddr", out)
        return out if out.ndim else str(out)


def _max(values) -> Work:
    out: Work = 0.0
    for v in values:
        out = np.maximum(out, v)
    return out


def _pick(values: tuple[Work, ...], idx: Work) -> Work:
    if len(values) == 1:
        return values[0]
    stacked = np.stack(np.broadcast_arrays(*values, idx)[:-1])
    return np.take_along_axis(stacked, np.asarray(idx)[None, ...], axis=0)[0]


def _pick_cost(costs: tuple[StepCost, ...], idx: Work) -> StepCost:
    if len(costs) == 1:
        return costs[0]
    pick = lambda attr: _pick(tuple(getattr(c, attr) for c in costs), idx)
    keyed = lambda attr, k: _pick(tuple(getattr(c, attr).get(k, 0.0) for c in costs), idx)
    causes = {k for c in costs for k in c.by_cause}
    classes = {k for c in costs for k in c.by_class}
    return StepCost(pick("time_s"), {k: keyed("by_cause", k) for k in sorted(causes)},
                    {k: keyed("by_class", k) for k in sorted(classes)},
                    pick("useful_hbm_bytes"), pick("flops"), pick("kernels"))


def topology_of(cluster: ClusterSpec):
    return _topology(cluster.topology, cluster.sockets, cluster.sockets_per_node)


@lru_cache(maxsize=64)
def _topology(spec, sockets: int, per_node: int):
    return build_topology(spec, sockets, per_node)


def plan_comm_time(cluster: ClusterSpec, plan: Plan, socket: int = 0) -> CommTime:
    """Collectives of `socket`'s groups under `plan`, sharing links with the other groups (they
    run the same collective at once). Cached per group layout: plans that share it share the
    collective costs. Groups alone in their reach are costed on a template of just their
    sockets or nodes (interconnect.alone_layout: the same values), so a replica laid out alike
    on clusters of any size, in nodes of any size, gets one function, and the engine's runs at
    every replica count one process's cost tables (backends/local.shared_tables: the sessions
    question of bench_capacity.py, in one process, filled 4,840 decode tables for 1,372
    distinct, a set for each replica count and pool node size; now 2,858, the rest again
    where a program's tables left the process's few, SHARED_TABLES)."""
    return _plan_comm(topology_of(cluster), plan, socket)


@lru_cache(maxsize=4096)
def _plan_comm(topology, plan: Plan, socket: int) -> CommTime:
    groups, concurrent = groups_of(plan, socket), _concurrent(plan)
    alone = alone_layout(topology, groups, dict(concurrent))
    if alone is not None:
        return _comm(alone[0], _frozen(alone[1]), ())
    return _comm(topology, _frozen(groups), concurrent)


@lru_cache(maxsize=1024)
def _concurrent(plan: Plan) -> tuple:
    return _frozen(concurrent_groups(plan))


def tp_comm_time(cluster: ClusterSpec, tp: int) -> CommTime:
    """A tensor-parallel plan over `tp` sockets, replicated over the rest."""
    return plan_comm_time(cluster, Plan(tp=tp, dp=cluster.sockets // tp))


def _frozen(groups: dict) -> tuple:
    """The groups as a cache key, in a fixed order (names are str or (str, degree))."""
    return tuple(sorted(groups.items(), key=_group_order))


def _group_order(item: tuple) -> tuple:
    name = item[0]
    return (name, 0) if type(name) is str else name


@lru_cache(maxsize=1024)
def _comm(topology, groups: tuple, concurrent: tuple) -> CommTime:
    return comm_time_fn(topology, dict(groups), dict(concurrent))


def evaluate_plan(
    scenario: Scenario,
    *,
    prefill: bool = True,
    check: bool = True,
    execution_model: str | None = None,
    comm_time: CommTime | None = None,
    expert_load: Work | None = None,
) -> PlanEstimate:
    """Cost the scenario's plan for its model on its cluster at every (batch, prompt_len,
    gen_len) point.

    Raises ConfigError for a plan that cannot run the model on the cluster, and, with `check`,
    PlanDoesNotFit (the one footprint message) when a point does not fit; with check=False the
    points that do not fit are costed all the same and carry their reason in `misfit`.
    `comm_time` replaces the interconnect's costs (a what-if), `execution_model` the chip's;
    `expert_load` the decode step's busiest-group load (the routing model's expectation by
    default; the serving engine draws one per step)."""
    s = _checked(scenario)
    spec, cluster, plan, batch, prompt_len, gen_len = (
        s.spec, s.cluster, s.plan, s.batch, s.prompt_len, s.gen_len)
    routing = s.routing or RoutingModel()
    # Replicas hold and run the same: one replica's programs stand for all (a 1,024-socket plan
    # costs what its model group costs); the other replicas enter through concurrent_groups.
    programs = build_programs(spec, replace(plan, dp=1))
    fps, misfit = _fit(s, programs, check)
    heads = [p for p in programs if p.coords.dp == 0 and p.coords.ep == 0 and p.coords.tp == 0]
    m: Work = (float(plan.micro_batches) if plan.micro_batches
               else np.maximum(1.0, np.minimum(batch, plan.pp)))
    load = (_load(spec, plan, routing, routing.routed_tokens(batch / m, batch / m))
            if expert_load is None else expert_load)
    context = prompt_len + (gen_len - 1.0) / 2.0
    cost = _Stager(spec, cluster, plan, fps, s.options, execution_model, comm_time)
    same = routing.identical
    decode = [cost(p, replace(StepShape.decode(batch / m, context), identical=same), load)
              for p in heads]
    costs, ddr = tuple(c for c, _ in decode), tuple(d for _, d in decode)
    times = [c.time_s + d for c, d in zip(costs, ddr)]
    tpot = np.maximum(sum(times), m * _max(times))
    pre = None
    if prefill:
        pload = _load(spec, plan, routing, routing.routed_tokens(batch * prompt_len, batch))
        shape = replace(StepShape.prefill(batch, prompt_len), identical=same)
        pre = _sum_costs([cost(p, shape, pload) for p in heads])
    return PlanEstimate(plan, spec.name, cluster.name, batch, prompt_len, gen_len, costs, ddr,
                        m, tpot, pre, fps, load, misfit, cluster.chip.hbm.bandwidth_bytes_per_s,
                        stack=stack_of(cluster.chip, s.options))


def footprint(scenario: Scenario, check: bool = True) -> tuple[tuple[Footprint, ...], Any]:
    """The footprint of every socket of the scenario's plan and, per point, why it does not fit
    ("" where it does): the one fit check, for commands that need memory without the step
    costs (the serving engine's socket set-up)."""
    s = _checked(scenario)
    return _fit(s, build_programs(s.spec, s.plan), check)


def kv_batch(scenario: Scenario) -> int:
    """The most sequences whose KV a replica of the scenario's plan holds at its lengths (0
    where the plan does not fit): what the weights, the activation workspace and the runtime's
    reservation (chip/runtime_memory.py) leave on the fullest socket, over one sequence's KV
    cache (heads replicated where tp exceeds them), as the engine sizes its KV blocks from the
    same regions; attention data-parallel groups each hold their own sequences'."""
    return kv_capacity(scenario)[0]


def kv_capacity(scenario: Scenario) -> tuple[int, float]:
    """kv_batch, and the tokens of KV that room holds before it is rounded to whole
    sequences of the scenario's lengths (a prefix cache's capacity), from one footprint."""
    room, per_seq = _kv_room(scenario)
    adp = scenario.plan.adp
    return (adp * int(room // per_seq),
            adp * room / per_seq * float(scenario.prompt_len + scenario.gen_len))


def _kv_room(scenario: Scenario) -> tuple[float, float]:
    """The HBM bytes the KV cache has on the fullest socket (0 where the plan does not fit)
    and one sequence's KV bytes there."""
    fps, why = footprint(scenario, check=False)
    if np.any(np.asarray(why) != ""):
        return 0.0, 1.0
    hbm = scenario.cluster.chip.hbm.capacity_bytes
    resident = max(_scalar(fp.region("weights") + fp.regions.get(("activations", "hbm"), 0.0)
                           + fp.regions.get(("reserved", "hbm"), 0.0)) for fp in fps)
    per_seq = max(_scalar(fp.region("kv_cache")) / _scalar(scenario.batch) for fp in fps)
    return max(hbm - resident, 0.0), per_seq


def _scalar(x: Any) -> float:
    return float(np.max(x))


def _checked(s: Scenario) -> Scenario:
    """The scenario with its lengths positive and as floats, its plan valid for its model."""
    _check_positive(batch=s.batch, prompt_len=s.prompt_len, gen_len=s.gen_len)
    validate(s.plan, s.spec, s.cluster.sockets)
    return replace(s, batch=_num(s.batch), prompt_len=_num(s.prompt_len),
                   gen_len=_num(s.gen_len),
                   placement=with_runtime(s.placement, s.cluster, s.options))


def with_runtime(placement: Placement | None, cluster: ClusterSpec, options: Any) -> Placement:
    """The placement with the runtime whose reservation the fit counts: its own, else the
    chip's for these execution options (chip/runtime_memory.py)."""
    placement = placement or Placement()
    if placement.runtime is not None:
        return placement
    return replace(placement, runtime=runtime_memory.of(cluster.chip, options))


def _fit(s: Scenario, programs, check: bool):
    fps = _footprints(s, programs)
    # Sockets of a stage hold the same; its first socket is the lowest-numbered.
    misfit = misfits(fps[:: s.plan.width][: s.plan.pp], s.plan, s.spec.name, s.cluster.name)
    if check and (misfit != "" if type(misfit) is str else np.any(misfit != "")):
        raise PlanDoesNotFit(next(r for r in np.ravel(misfit) if r))
    return fps, misfit


def _num(x: Work) -> Work:
    a = np.asarray(x, dtype=float)
    return float(a) if a.ndim == 0 else a


def _check_positive(**values: Work) -> None:
    for name, value in values.items():
        if value <= 0 if type(value) in (int, float) else np.any(np.asarray(value) <= 0):
            raise ConfigError(f"{name.replace('_', '-')}: must be positive, got {value}")


_FOOTPRINTS: dict = {}


def _footprints(s: Scenario, programs):
    """footprints(), cached for scalar points by what decides them (the model, the shard
    degrees, the stages, the chip, the shape and the placement): a plan search asks for the
    same ones again and again (plans that differ only in dp)."""
    spec, plan, chip = s.spec, s.plan, s.cluster.chip
    placement = part(s.placement, "placement (set by _checked)")
    batch, prompt_len, context = s.batch, s.prompt_len, s.prompt_len + s.gen_len
    if any(np.ndim(x) for x in (batch, context, prompt_len)):
        return footprints(spec, programs, chip, batch, context, prompt_len, placement)
    # Keyed by identity (a spec or chip is not cheap to hash); the entry keeps both alive and
    # is used only while they are the very same objects.
    # Sockets are numbered 0..n-1 in the programs' order, so the degrees and n decide them.
    key = (id(spec), id(chip), plan.tp, plan.ep, plan.pp, plan.adp, plan.mixer_tp, batch,
           context, prompt_len, placement, len(programs))
    hit = _FOOTPRINTS.get(key)
    if hit is not None and hit[0] is spec and hit[1] is chip:
        return hit[2]
    stage = footprints(spec, programs[:: plan.width][: plan.pp], chip, batch, context,
                       prompt_len, placement)
    out = tuple(replace(stage[p.coords.pp], socket=p.socket) for p in programs)
    if len(_FOOTPRINTS) > 4096:
        _FOOTPRINTS.clear()
    _FOOTPRINTS[key] = (spec, chip, out)
    return out


def _load(spec: ModelSpec, plan: Plan, routing: RoutingModel, tokens: Work) -> Work:
    if spec.moe is None or plan.ep <= 1:
        return 1.0
    one = lambda t: expert_load(routing, spec.moe.num_experts, spec.moe.top_k, plan.ep, t)
    if np.ndim(tokens) == 0:
        return one(float(tokens))
    flat = np.ravel(tokens)
    values, inverse = np.unique(flat, return_inverse=True)
    return np.array([one(v) for v in values])[inverse].reshape(np.shape(tokens))


@dataclass
class _Stager:
    """Costs one stage's step: its graph on the chip's execution model, its collectives on the
    interconnect, and the DDR stream of what its socket spilled."""

    spec: ModelSpec
    cluster: ClusterSpec
    plan: Plan
    fps: tuple[Footprint, ...]
    options: Any
    execution_model: str | None
    comm_time: CommTime | None

    def __call__(self, prog: Program, shape: StepShape, load: Work) -> tuple[StepCost, Work]:
        g, ddr_bytes = _spill(prog.graph(self.spec, shape, load), self.fps[prog.socket])
        comm = self.comm_time or plan_comm_time(self.cluster, self.plan, prog.socket)
        cost = shared_step_cost(g, self.cluster.chip, comm, self.options, self.execution_model)
        ddr_s: Work = 0.0
        if nonzero(ddr_bytes):
            ddr_s = ddr_bytes / self.cluster.chip.tier("ddr").bandwidth_bytes_per_s
        return cost, ddr_s


_COSTS: dict[tuple, tuple] = {}
CACHED_COSTS = 4096


def shared_step_cost(g: Graph, chip, comm: CommTime, options: Any = None,
                     model: str | None = None) -> StepCost:
    """execution.step_cost, shared by the plans whose stage is the same graph and whose
    interconnect answers the same for every collective the execution model asked about (plans
    that differ in dp, or in groups whose links nothing else shares). Exact: the execution
    model is a function of the graph, the chip, the options and those answers. A graph of
    arrays (a grid of points) is costed as is."""
    try:
        key = (id(g), id(chip), options, model)
        entry = _COSTS.get(key)
    except TypeError:
        return execution.step_cost(g, chip, comm, options, model)
    if entry is None or entry[0] is not g or entry[1] is not chip:
        if len(_COSTS) >= CACHED_COSTS:
            _COSTS.clear()
        entry = _COSTS[key] = (g, chip, [])
    for seen, answers, cost in entry[2]:
        if tuple(float(comm(c)) for c in seen) == answers:
            return cost
    asked: dict = {}

    def recording(c: Collective) -> Work:
        t = comm(c)
        try:
            asked[c] = float(t)
        except TypeError:  # array-valued: the cost is not shared (below)
            pass
        return t

    cost = execution.step_cost(g, chip, recording, options, model)
    if np.ndim(cost.time_s) == 0:
        entry[2].append((tuple(asked), tuple(asked.values()), cost))
    return cost


def clear_caches() -> None:
    """Forget what plans shared (a benchmark's cold start; a test that results do not depend
    on what was cached)."""
    from chip import breakdown, dataflow
    from interconnect import collectives
    from partitioning import program
    from partitioning.footprint import _BLOCKS
    from partitioning.plan import _TRAITS

    for cache in (_COSTS, _FOOTPRINTS, program._GRAPHS, program._STAGES, program._LAYERS,
                  program._PROGRAMS, program._KINDS, program._SENDS, _BLOCKS,
                  dataflow._MEMOS, dataflow._OPS, dataflow._PROGRAMS, breakdown._SUMS,
                  execution._PARAMS, _TRAITS):
        cache.clear()
    dataflow._COMM.clear()
    collectives.clear_caches()
    for fn in (_plan_comm, _concurrent, _comm, program._with_cached):  # (topologies kept)
        fn.cache_clear()


def _sum_costs(parts: list[tuple[StepCost, Work]]) -> StepCost:
    """Stages one after another (a prompt through the pipeline): times and breakdowns add."""
    if len(parts) == 1 and not np.any(parts[0][1]):
        return parts[0][0]
    by_cause: dict = {}
    by_class: dict = {}
    for c, ddr in parts:
        for k, v in c.by_cause.items():
            by_cause[k] = by_cause.get(k, 0.0) + v
        for k, v in c.by_class.items():
            by_class[k] = by_class.get(k, 0.0) + v
        if np.any(ddr):
            by_cause["ddr_streaming"] = by_cause.get("ddr_streaming", 0.0) + ddr
            by_class["ddr_streaming"] = by_class.get("ddr_streaming", 0.0) + ddr
    total = lambda attr: sum(getattr(c, attr) for c, _ in parts)
    return StepCost(sum(c.time_s + d for c, d in parts), by_cause, by_class,
                    total("useful_hbm_bytes"), total("flops"), total("kernels"))


def _spill(g: Graph, fp: Footprint) -> tuple[Graph, Work]:
    """Move the spilled share of each op's weight / KV reads off HBM; return the DDR bytes."""
    fe, fd, fk = (fp.spilled_fraction.get(k, 0.0) for k in ("experts", "dense_weights",
                                                            "kv_cache"))
    if not (nonzero(fe) or nonzero(fd) or nonzero(fk)):
        return g, 0.0
    blocks, ddr = [], 0.0  # type: list, Work
    for block in g.blocks:
        ops = []
        for op in block.ops:
            fw = fe if op.cls is OpClass.EXPERT else fd
            kv = op.kv_read_bytes + op.kv_write_bytes
            ddr = ddr + block.repeat * (op.weight_bytes * fw + kv * fk)
            ops.append(replace(op, weight_bytes=op.weight_bytes * (1 - fw),
                               kv_read_bytes=op.kv_read_bytes * (1 - fk),
                               kv_write_bytes=op.kv_write_bytes * (1 - fk)))
        blocks.append(replace(block, ops=tuple(ops)))
    return g.with_blocks(tuple(blocks)), ddr


def search_plans(scenario: Scenario, objective: str = "latency", prefill: bool = False):
    """Every plan for the scenario's model on its cluster (in place of its plan), evaluated
    with evaluate_plan and ranked."""
    from partitioning.search import check_searchable, enumerate_plans, search

    check_searchable(scenario.cluster.sockets_per_node)

    def evaluator(plan: Plan) -> PlanEstimate:
        return evaluate_plan(replace(scenario, plan=plan), prefill=prefill)

    return search(enumerate_plans(scenario.spec, scenario.cluster.sockets), evaluator,
                  objective)
