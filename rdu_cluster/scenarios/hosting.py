"""Hosting footprint: how many nodes a system needs to host N experts, and where each byte lives.

Two placements per system, both with the experts tensor-parallel over the sockets of a node:
- "tiered": every expert in the capacity tier (DDR on an RDU, host DRAM on a GPU); HBM holds the
  router, a KV reserve and as many expert slots as fit. A request whose expert is not resident
  waits for the switch (rdu_cluster/scenarios/coe.py switch_time_s).
- "hbm": every expert resident in HBM, spread over as many nodes as it takes (each node with its
  own router and KV reserve); no switch.
The latency target bounds the time to first token of a request: router + (switch on a miss) +
the expert's prefill. Without a target the placement with fewer nodes wins (ties: "hbm", no
switch); with one, the smallest placement that meets it, or none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from chip import runtime_memory
from partitioning.cluster import ClusterSpec
from partitioning.estimate import estimate
from partitioning.footprint import kv_cache_per_socket
from partitioning.scenario import Scenario
from rdu_cluster.output.report import text_table
from rdu_cluster.scenarios.coe import DEFAULT_ROUTER, capacity_tier, switch_time_s
from workloads import graph as graphs
from workloads.catalog import load_model
from workloads.errors import ConfigError
from workloads.spec import ModelSpec, check_context


@dataclass(frozen=True)
class Placement:
    name: str  # "tiered" | "hbm"
    nodes: int
    ttft_s: float  # worst case: a miss for "tiered"
    hbm_bytes: dict[str, float]  # per node, by what: router, kv_reserve, reserved, experts
    tier_bytes: dict[str, float]  # per node, capacity tier: experts
    hbm_capacity: float  # per node
    tier_capacity: float  # per node
    tier_name: str
    experts_in_hbm: int  # per node
    fits: bool

    def meets(self, target: float | None) -> bool:
        return self.fits and (target is None or self.ttft_s <= target)


@dataclass(frozen=True)
class Footprint:
    cluster: str
    chip: str
    experts: int
    expert_model: str
    expert_bytes: float
    sockets_per_node: int
    latency_target_s: float | None
    placements: tuple[Placement, ...]
    dtypes: tuple[str, str] = ("bf16", "bf16")  # each expert's weights and KV cache

    @property
    def chosen(self) -> Placement | None:
        ok = [p for p in self.placements if p.meets(self.latency_target_s)]
        return min(ok, key=lambda p: (p.nodes, p.name != "hbm")) if ok else None

    @property
    def infeasible_reason(self) -> str | None:
        """Why no placement is chosen (None when one is): the table's row and the JSON's."""
        if self.chosen is not None:
            return None
        if any(p.fits for p in self.placements):
            return "no placement meets the target"
        return "no placement fits"


def footprint(
    experts: int,
    expert_model: str | ModelSpec,
    cluster: ClusterSpec,
    latency_target_s: float | None = None,
    router: str = DEFAULT_ROUTER,
    batch: int = 1,
    prompt_len: int = 512,
    gen_len: int = 20,
) -> Footprint:
    if experts < 1:
        raise ConfigError(f"--experts: expected a positive number, got {experts}")
    if latency_target_s is not None and latency_target_s <= 0:
        raise ConfigError(f"--latency-target: must be positive, got {latency_target_s}")
    node = _node(cluster)
    # an expert given as a spec: its dtypes set (footprint --weights / --kv-dtype)
    spec = load_model(expert_model) if isinstance(expert_model, str) else expert_model
    r_spec = load_model(router)
    for m, flag in ((spec, "--expert-model"), (r_spec, "--router")):
        check_context(m, prompt_len, gen_len, f"{flag} {m.name}: --prompt-len")
    e_bytes = graphs.weight_bytes(spec)
    r_bytes = graphs.weight_bytes(r_spec)
    # the node's sockets hold the KV cache tensor-parallel (heads replicated past their count)
    kv = node.sockets * float(np.max(kv_cache_per_socket(spec, node.sockets, batch,
                                                         prompt_len + gen_len)))
    prefill = _first_token_s(spec, r_spec, node, batch, prompt_len)
    switch = switch_time_s(spec, node)
    held = {"router": r_bytes, "kv_reserve": kv, "reserved": _reserved(node, r_bytes + e_bytes)}
    tiered = _tiered(experts, e_bytes, held, node, prefill + switch)
    in_hbm = _all_in_hbm(experts, e_bytes, held, node, prefill)
    return Footprint(cluster.name, cluster.chip.name, experts, spec.name, e_bytes,
                     node.sockets, latency_target_s, (tiered, in_hbm),
                     (spec.precision.weights.value, spec.precision.kv_cache.value))


def _node(cluster: ClusterSpec) -> ClusterSpec:
    """One node of the cluster (the unit a footprint counts)."""
    return replace(cluster, sockets=cluster.sockets_per_node)


def _first_token_s(spec, r_spec, node: ClusterSpec, batch: int, prompt_len: int) -> float:
    r = estimate(Scenario(r_spec, node, batch=batch, prompt_len=prompt_len, gen_len=1))
    e = estimate(Scenario(spec, node, batch=batch, prompt_len=prompt_len, gen_len=1))
    return _f(r.ttft_s) + _f(r.tpot_s) + _f(e.ttft_s)


def _capacities(node: ClusterSpec) -> tuple[float, float, str]:
    tier = capacity_tier(node)
    n = node.sockets
    return n * node.chip.hbm.capacity_bytes, n * node.chip.tier(tier).capacity_bytes, tier


def _reserved(node: ClusterSpec, weights: float) -> float:
    """What the node's runtime keeps from its HBM (chip/runtime_memory.py, the chip's runtime:
    a GPU's default stack), its sockets holding `weights` tensor-parallel."""
    rt = runtime_memory.of(node.chip)
    n = node.sockets
    return n * float(sum(rt.parts(node.chip.hbm.capacity_bytes, weights / n, 0.0, n).values()))


def _tiered(n: int, e: float, held: dict[str, float], node: ClusterSpec,
            ttft: float) -> Placement:
    hbm, cap, tier = _capacities(node)
    slots = int((hbm - sum(held.values())) // e)
    # Experts are whole (each lives on one node): a node's tier holds floor(cap / e) of them.
    # Dividing the total bytes by cap instead counted fractions of an expert, and the busiest
    # node then held more than its tier (65,536 x 70B on sn40l-8: 12,135 of 12,000 GB of DDR).
    room = int(cap // e)
    nodes = math.ceil(n / room) if room else 1
    per_node = math.ceil(n / nodes)
    slots = max(0, min(slots, per_node))
    return Placement(
        name="tiered",
        nodes=nodes,
        ttft_s=ttft,
        hbm_bytes={**held, "expert_slots": slots * e},
        tier_bytes={"experts": per_node * e},
        hbm_capacity=hbm,
        tier_capacity=cap,
        tier_name=tier,
        experts_in_hbm=slots,
        fits=slots >= 1 and room >= 1,
    )


def _all_in_hbm(n: int, e: float, held: dict[str, float], node: ClusterSpec,
                ttft: float) -> Placement:
    hbm, cap, tier = _capacities(node)
    per_node = int((hbm - sum(held.values())) // e)
    fits = per_node >= 1
    nodes = math.ceil(n / per_node) if fits else 0
    resident = min(per_node, n) if fits else 0
    return Placement(
        name="hbm",
        nodes=nodes,
        ttft_s=ttft,
        hbm_bytes={**held, "experts": resident * e},
        tier_bytes={"experts": 0.0},
        hbm_capacity=hbm,
        tier_capacity=cap,
        tier_name=tier,
        experts_in_hbm=resident,
        fits=fits,
    )


def report(fps: list[Footprint]) -> str:
    """Text: one block per system, its placements and the chosen one, bytes per tier per node."""
    lines = []
    first = fps[0]
    target = (f"{first.latency_target_s * 1e3:g} ms time to first token"
              if first.latency_target_s else "none")
    lines.append(f"{first.experts} experts of {first.expert_model} "
                 f"(weights {first.dtypes[0]}, KV cache {first.dtypes[1]}; "
                 f"{first.expert_bytes / 1e9:.2f} GB each, "
                 f"{first.experts * first.expert_bytes / 1e12:.2f} TB in all); "
                 f"latency target: {target}")
    header = ["system", "placement", "nodes", "TTFT ms (miss)", "HBM per node GB",
              "capacity tier per node GB", "experts in HBM per node", ""]
    rows: list[list[str | None]] = []
    for fp in fps:
        chosen = fp.chosen
        for p in fp.placements:
            mark = "<- chosen" if p is chosen else ("" if p.meets(fp.latency_target_s) else
                                                   "misses target" if p.fits else "does not fit")
            rows.append([
                f"{fp.cluster} ({fp.sockets_per_node} x {fp.chip})",
                p.name,
                str(p.nodes) if p.fits else "-",
                f"{p.ttft_s * 1e3:.1f}",
                _bytes_cell(p.hbm_bytes, p.hbm_capacity),
                _bytes_cell(p.tier_bytes, p.tier_capacity, p.tier_name),
                str(p.experts_in_hbm),
                mark,
            ])
        if chosen is None:
            rows.append([fp.cluster, "-", "-", "", "", "", "", fp.infeasible_reason])
    lines.append(text_table(header, rows))
    lines.append(_ratio_line(fps))
    return "\n".join(line for line in lines if line)


def _bytes_cell(parts: dict[str, float], capacity: float, tier: str = "") -> str:
    used = sum(parts.values())
    detail = " + ".join(f"{k} {v / 1e9:.0f}" for k, v in parts.items() if v)
    label = f"{tier}: " if tier else ""
    return f"{label}{used / 1e9:,.0f} of {capacity / 1e9:,.0f} ({detail or 'none'})"


def _ratio_line(fps: list[Footprint]) -> str:
    chosen = [(fp.cluster, fp.chosen) for fp in fps if fp.chosen]
    if len(chosen) < 2:
        return ""
    base_name, base = min(chosen, key=lambda c: c[1].nodes)
    parts = [f"{name} {p.nodes / base.nodes:.1f}x" for name, p in chosen if name != base_name]
    return f"nodes relative to {base_name} ({base.nodes}): " + ", ".join(parts)


def _f(x) -> float:
    return float(np.ravel(np.asarray(x, dtype=float))[0])
