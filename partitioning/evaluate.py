"""Cost a plan: programs -> per-stage step costs (chip execution model + interconnect) ->
pipeline period, tokens/s, footprints, bound.

Decode is costed at the mean context of the generation (prompt + (gen - 1) / 2), as
partitioning.estimate does. Pipeline: the batch is cut into m micro-batches (default min(batch,
pp)); a micro-batch's next token needs its previous one, so its period is the longer of its
trip through all stages (sum of stage times) and the time the busiest stage spends on all m
micro-batches: period = max(sum_s t_s, m * max_s t_s). At batch 1 (m = 1) a pipeline only adds
hops: the bubble is (pp - 1) / pp, which is why TP beats PP for single-stream decode.
Bytes spilled to DDR stream at DDR bandwidth, after (not overlapped with) the HBM stream: a
conservative rule, stated here. Expert-load imbalance comes from the routing model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from chip import execution
from chip.cost import StepCost
from interconnect import build_topology, comm_time_fn
from partitioning.cluster import ClusterSpec
from partitioning.footprint import Footprint, Placement, PlanDoesNotFit, check_fit, footprints
from partitioning.plan import Plan, validate
from partitioning.program import Program, build_programs, concurrent_groups
from partitioning.routing import RoutingModel, expert_load
from workloads.ops import Graph, OpClass, StepShape
from workloads.spec import ModelSpec


@dataclass(frozen=True)
class PlanEstimate:
    plan: Plan
    model: str
    cluster: str
    batch: float
    prompt_len: float
    gen_len: float
    stage_decode: tuple[StepCost, ...]  # one micro-batch decode step per stage
    stage_ddr_s: tuple[float, ...]  # DDR streaming added to each stage's decode step
    micro_batches: int
    tpot_s: float
    ttft_s: float | None
    footprints: tuple[Footprint, ...]
    expert_load: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s_per_request(self) -> float:
        return 1.0 / self.tpot_s

    @property
    def tokens_per_s_total(self) -> float:
        return self.plan.dp * self.batch / self.tpot_s

    @property
    def stage_times_s(self) -> tuple[float, ...]:
        return tuple(float(np.max(c.time_s)) + d for c, d in zip(self.stage_decode,
                                                                   self.stage_ddr_s))

    @property
    def bubble_fraction(self) -> float:
        busy = self.micro_batches * sum(self.stage_times_s)
        return 1.0 - busy / (self.plan.pp * self.tpot_s)

    @property
    def hbm_used_bytes(self) -> float:
        return max(fp.tier("hbm") for fp in self.footprints)

    @property
    def ddr_used_bytes(self) -> float:
        return max(fp.tier("ddr") for fp in self.footprints)

    @property
    def bound(self) -> str:
        """What sets the step time: the slowest stage's dominant cause, or the DDR stream, or
        the pipeline bubble when stages idle more than half the time."""
        times = self.stage_times_s
        s = int(np.argmax(times))
        if self.stage_ddr_s[s] > times[s] / 2:
            return "ddr"
        if self.bubble_fraction > 0.5:
            return "pipeline_bubble"
        return str(np.ravel(self.stage_decode[s].bound())[0])


def topology_of(cluster: ClusterSpec):
    key = (cluster.topology, cluster.sockets, cluster.sockets_per_node)
    if key not in _topologies:
        _topologies[key] = build_topology(*key)
    return _topologies[key]


_topologies: dict = {}


def evaluate_plan(
    spec: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
    batch: float = 1,
    prompt_len: float = 1024,
    gen_len: float = 256,
    placement: Placement | None = None,
    routing: RoutingModel | None = None,
    options: Any = None,
    prefill: bool = True,
    check: bool = True,
) -> PlanEstimate:
    """Cost `plan` for `spec` on `cluster`; raises ConfigError / PlanDoesNotFit first."""
    validate(plan, spec, cluster.sockets)
    placement = placement or Placement()
    programs = build_programs(spec, plan)
    fps = footprints(spec, programs, cluster.chip, batch, prompt_len + gen_len, prompt_len,
                     placement)
    if check:
        check_fit(fps, plan, spec.name, cluster.name)
    topo = topology_of(cluster)
    conc = concurrent_groups(plan)
    m = plan.micro_batches or int(min(batch, plan.pp))
    mb = batch / m
    load = _load(spec, plan, routing or RoutingModel(), mb)
    context = prompt_len + (gen_len - 1) / 2
    costs, ddr = [], []
    stage_heads = [p for p in programs if p.coords.dp == 0 and p.coords.ep == 0
                   and p.coords.tp == 0]
    for prog in stage_heads:
        g = prog.graph(spec, StepShape.decode(mb, context), load)
        cost, ddr_s = _stage_cost(g, prog, fps[prog.socket], cluster, topo, conc, options)
        costs.append(cost)
        ddr.append(ddr_s)
    times = [float(np.max(c.time_s)) + d for c, d in zip(costs, ddr)]
    tpot = max(sum(times), m * max(times))
    ttft = _prefill_time(spec, cluster, plan, stage_heads, fps, topo, conc, batch, prompt_len,
                         routing, options) if prefill else None
    return PlanEstimate(plan, spec.name, cluster.name, float(batch), float(prompt_len),
                        float(gen_len), tuple(costs), tuple(ddr), m, tpot, ttft, fps, load)


def _load(spec: ModelSpec, plan: Plan, routing: RoutingModel, tokens: float) -> float:
    if spec.moe is None or plan.ep <= 1:
        return 1.0
    return expert_load(routing, spec.moe.num_experts, spec.moe.top_k, plan.ep, tokens)


def _stage_cost(g: Graph, prog: Program, fp: Footprint, cluster: ClusterSpec, topo, conc,
                options) -> tuple[StepCost, float]:
    g, ddr_bytes = _spill(g, fp)
    comm = comm_time_fn(topo, prog.groups, conc)
    cost = execution.step_cost(g, cluster.chip, comm, options)
    ddr_s = 0.0
    if ddr_bytes:
        ddr_s = ddr_bytes / cluster.chip.tier("ddr").bandwidth_bytes_per_s
    return cost, ddr_s


def _spill(g: Graph, fp: Footprint) -> tuple[Graph, float]:
    """Move the spilled share of each op's weight / KV reads off HBM; return the DDR bytes."""
    fe, fd, fk = (fp.spilled_fraction.get(k, 0.0) for k in ("experts", "dense_weights",
                                                            "kv_cache"))
    if not (fe or fd or fk):
        return g, 0.0
    blocks, ddr = [], 0.0
    for block in g.blocks:
        ops = []
        for op in block.ops:
            fw = fe if op.cls is OpClass.EXPERT else fd
            kv = op.kv_read_bytes + op.kv_write_bytes
            ddr += block.repeat * float(np.max(op.weight_bytes * fw + kv * fk))
            ops.append(replace(op, weight_bytes=op.weight_bytes * (1 - fw),
                               kv_read_bytes=op.kv_read_bytes * (1 - fk),
                               kv_write_bytes=op.kv_write_bytes * (1 - fk)))
        blocks.append(replace(block, ops=tuple(ops)))
    return g.with_blocks(tuple(blocks)), ddr


def _prefill_time(spec, cluster, plan, stage_heads, fps, topo, conc, batch, prompt_len, routing,
                  options) -> float:
    """The prompt's forward pass through every stage in turn (no chunked pipelining)."""
    load = _load(spec, plan, routing or RoutingModel(), batch * prompt_len)
    total = 0.0
    for prog in stage_heads:
        g = prog.graph(spec, StepShape.prefill(batch, prompt_len), load)
        cost, ddr_s = _stage_cost(g, prog, fps[prog.socket], cluster, topo, conc, options)
        total += float(np.max(cost.time_s)) + ddr_s
    return total


def search_plans(
    spec: ModelSpec,
    cluster: ClusterSpec,
    objective: str = "latency",
    batch: float = 1,
    prompt_len: float = 1024,
    gen_len: float = 256,
    placement: Placement | None = None,
    routing: RoutingModel | None = None,
    options: Any = None,
    prefill: bool = False,
):
    """Every plan for `spec` on `cluster`, evaluated with evaluate_plan and ranked."""
    from partitioning.search import enumerate_plans, search

    def evaluator(plan: Plan) -> PlanEstimate:
        return evaluate_plan(spec, cluster, plan, batch, prompt_len, gen_len, placement,
                             routing, options, prefill=prefill)

    return search(enumerate_plans(spec, cluster.sockets), evaluator, objective)


def resolve_plan(
    spec: ModelSpec,
    cluster: ClusterSpec,
    plan: str | Plan | None = None,
    objective: str = "latency",
    **kwargs: Any,
) -> PlanEstimate:
    """`simulate --plan`: evaluate the named plan, or, with none, the best plan for `objective`
    (raises PlanDoesNotFit when no plan fits, with the widest plan's overflow)."""
    if plan is not None:
        p = plan if isinstance(plan, Plan) else Plan.parse(plan)
        return evaluate_plan(spec, cluster, p, **kwargs)
    prefill = kwargs.pop("prefill", True)
    result = search_plans(spec, cluster, objective, **kwargs)
    if not result.ranked:
        reason = result.rejected[-1][1] if result.rejected else "no valid plan"
        raise PlanDoesNotFit(f"no plan of {result.evaluated} fits; the widest: {reason}")
    best = result.ranked[0].plan
    return evaluate_plan(spec, cluster, best, prefill=prefill, **kwargs)
