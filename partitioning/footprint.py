"""Footprints: the bytes each socket holds in each memory tier under a plan, checked against the
tiers' capacities before anything runs.

Regions of a socket:
- weights: the parameters its program holds (dense parts sharded by the stage width, routed
  experts: num_experts / ep of them, each split over expert_tp; norms and router replicated),
  taken from the ops of its graph so the sharding rules live in one place (workloads.graph);
- kv_cache: the KV cache (and recurrent state) of its layers for the whole batch at full length
  (prompt + generated tokens), with the KV heads it holds (replicated where tp > KV heads);
- activations: the largest op working set (inputs + outputs) of a forward pass in HBM, at the
  runtime's token budget where it has one (a GPU engine profiles or plans its workspace at its
  batched-token budget, whatever the prompt), else of one prompt (prompts are prefilled one at
  a time); on an RDU the decode step's largest layer working set is an SRAM region;
- reserved: what the socket's runtime keeps (chip/runtime_memory.py: the engine's memory
  fraction, CUDA context, communication buffers, CUDA graphs; an RDU's program images in HBM
  and PMU buffers in SRAM), by part in `Footprint.reserved`, plus any fraction of a tier the
  placement policy sets aside. The evaluator gives a policy without a runtime the chip's.

A plan fits when every tier holds its regions: weights, the reservation, the activation
workspace and the KV cache of the batch at full length (one sequence of the longest request, for
a serving run), as an engine refuses to start otherwise.

A placement policy may spill to DDR: routed experts first (only the experts a step touches are
streamed), then the other weights, then the KV cache. Spilled bytes are streamed from DDR at DDR
bandwidth by the evaluator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from chip.runtime_memory import RuntimeMemory
from chip.spec import ChipSpec
from partitioning.plan import Plan
from partitioning.program import Program
from workloads import graph as graphs
from workloads import params
from workloads.errors import ConfigError
from workloads.ops import Op, OpClass, Shard, StepShape, Work
from workloads.spec import FFN, ModelSpec

SPILL_ORDER = ("experts", "dense_weights", "kv_cache")


class PlanDoesNotFit(ConfigError):
    """A plan whose footprint overflows a memory tier; the message names tier, socket, bytes."""


@dataclass(frozen=True)
class Placement:
    """Where regions live. weights / kv_cache: "hbm" (must fit HBM), "auto" (spill to DDR only
    what does not fit, in SPILL_ORDER), "ddr" (all in DDR). runtime: what the serving runtime
    reserves (None: the chip's, resolved by the evaluator from the execution options)."""

    weights: str = "hbm"
    kv_cache: str = "hbm"
    reserved_fraction: dict[str, float] = field(default_factory=dict)  # tier -> fraction
    runtime: RuntimeMemory | None = None

    def __post_init__(self) -> None:
        for name in ("weights", "kv_cache"):
            if getattr(self, name) not in ("hbm", "auto", "ddr"):
                raise ConfigError(f"placement.{name}: expected hbm, auto or ddr")

    def __hash__(self) -> int:
        return hash((self.weights, self.kv_cache, tuple(sorted(self.reserved_fraction.items())),
                     self.runtime))


@dataclass(frozen=True)
class Footprint:
    """Bytes per (region, tier) of one socket; values broadcast over the design points."""

    socket: int
    regions: dict[tuple[str, str], Work]  # (region, tier) -> bytes
    capacity: dict[str, float]  # tier -> bytes
    spilled_fraction: dict[str, Work]  # "experts" | "dense_weights" | "kv_cache" -> DDR share
    reserved: dict[str, Work] = field(default_factory=dict)  # the runtime's HBM parts
    runtime: str = ""  # whose reservation (chip/runtime_memory.py)

    def tier(self, name: str) -> Work:
        return sum((b for (_, t), b in self.regions.items() if t == name), 0.0)

    def region(self, name: str) -> Work:
        return sum((b for (r, _), b in self.regions.items() if r == name), 0.0)

    def overflow(self, name: str) -> Work:
        """Bytes beyond the tier's capacity (0 where it fits)."""
        return np.maximum(0.0, self.tier(name) - self.capacity.get(name, np.inf))


@dataclass(frozen=True)
class Demand:
    """Per-socket bytes before placement (an array over a grid of batches and contexts where
    they depend on them)."""

    experts: float
    dense_weights: float
    kv_cache: Work
    activations: Work
    sram_working_set: Work
    group: int = 1  # sockets that run a step together (communication buffers)

    @property
    def weights(self) -> float:
        return self.experts + self.dense_weights


def demand(spec: ModelSpec, program: Program, batch: Work, context: Work,
           prompt_len: Work) -> Demand:
    """Per-socket bytes before placement; batch, context and prompt_len (the tokens of the
    activation workspace's forward pass) may be arrays (one value per design point), and the
    result broadcasts over them."""
    # The stage's op tuples with their counts: its graph's bytes by layer kind.
    decode = program.stage_ops(spec, StepShape.decode(batch, context))
    # Prompts are prefilled one at a time (a batch fills up by continuous batching), so the
    # activation peak is one prompt's.
    prefill = program.stage_ops(spec, StepShape.prefill(1.0, prompt_len))
    # A tied head reuses the embedding rows the first stage already holds.
    skip_head = spec.tie_embeddings and program.first_stage
    dense, kv, peaks = 0.0, 0.0, []  # type: float, Work, list[Work]
    for ops, count in decode:
        w, k, peak = _block_bytes(ops, skip_head)
        dense, kv = dense + count * w, kv + count * k
        peaks.append(peak)
    if program.first_stage:
        rows = -(-spec.vocab_size // program.shard.embed_tp)
        dense += rows * spec.hidden_size * spec.precision.weights.bytes
    act = _largest([_block_bytes(ops, skip_head)[2] for ops, _ in prefill])
    return Demand(experts=_expert_bytes(spec, program), dense_weights=dense, kv_cache=kv,
                  activations=act, sram_working_set=_largest(peaks),
                  group=program.shard.sockets)


def _largest(values: list) -> Work:
    if all(np.ndim(v) == 0 for v in values):
        return max(values, default=0.0)
    out: Work = 0.0
    for v in values:
        out = np.maximum(out, v)
    return out


def kv_cache_per_socket(spec: ModelSpec, tp: int, batch: Work, context: Work) -> Work:
    """The KV cache (and recurrent state) one socket of a tensor-parallel group of `tp` holds
    for `batch` sequences of `context` tokens: KV heads replicated where tp exceeds them. The
    rule `demand` applies (the decode graph's KV reads), for scenarios that size memory
    themselves (a speculative draft, CoE experts, hosting)."""
    return graphs.step_graph(spec, StepShape.decode(batch, context),
                             Shard.tensor(tp)).total("kv_read_bytes")


_BLOCKS: dict[tuple[int, bool], tuple] = {}


def _block_bytes(ops: tuple[Op, ...], skip_head: bool) -> tuple[float, Work, Work]:
    """One layer's dense weight bytes, KV-cache reads and peak op working set (inputs +
    outputs). Memoised by the op tuple's identity (the entry keeps the tuple alive): the
    stages of every plan of a search are cut from the same cached graphs."""
    hit = _BLOCKS.get((id(ops), skip_head))
    if hit is not None and hit[0] is ops:
        return hit[1]
    weights, kv, peak = 0.0, 0.0, 0.0  # type: float, Work, Work
    for op in ops:
        if op.cls not in (OpClass.EXPERT, OpClass.EMBEDDING) and not (
            op.cls is OpClass.LM_HEAD and skip_head
        ):
            weights += float(np.max(op.weight_bytes))
        kv = kv + op.kv_read_bytes
        peak = np.maximum(peak, op.act_in_bytes + op.act_out_bytes)
    out = (weights, kv, peak)
    if all(np.ndim(x) == 0 for x in out):
        if len(_BLOCKS) > 65536:
            _BLOCKS.clear()
        _BLOCKS[(id(ops), skip_head)] = (ops, out)
    return out


def _expert_bytes(spec: ModelSpec, program: Program) -> float:
    if spec.moe is None:
        return 0.0
    first, end = program.layers
    layers = sum(layer.ffn is FFN.MOE for layer in spec.layers[first:end])
    e_local = -(-spec.moe.num_experts // program.shard.ep)
    per = params.expert_params(spec) / program.shard.expert_tp
    return layers * e_local * per * spec.precision.routed_expert_weights.bytes


def place(d: Demand, socket: int, chip: ChipSpec, policy: Placement) -> Footprint:
    """Put a socket's demand into tiers per the policy (spilling to DDR where allowed), point
    by point where the demand is an array."""
    cap = {t.name: t.capacity_bytes * (1 - policy.reserved_fraction.get(t.name, 0.0))
           for t in chip.tiers if t.name in ("sram", "hbm", "ddr")}
    regions: dict[tuple[str, str], Work] = {}
    for t in chip.tiers:
        frac = policy.reserved_fraction.get(t.name, 0.0)
        if frac:
            regions[("reserved", t.name)] = t.capacity_bytes * frac
    parts = _runtime_parts(d, chip, policy.runtime)
    if parts:
        regions[("reserved", "hbm")] = regions.get(("reserved", "hbm"), 0.0) + sum(parts.values())
    if "sram" in cap:
        regions[("activations", "sram")] = d.sram_working_set
        if policy.runtime is not None and policy.runtime.sram_bytes:
            regions[("reserved", "sram")] = policy.runtime.sram_bytes
    regions[("activations", "hbm")] = d.activations
    sizes = {"experts": d.experts, "dense_weights": d.dense_weights, "kv_cache": d.kv_cache}
    mode = {"experts": policy.weights, "dense_weights": policy.weights, "kv_cache": policy.kv_cache}
    in_ddr = {k: (v if mode[k] == "ddr" else _zero(v)) for k, v in sizes.items()}
    need = d.activations + sum(sizes.values()) - sum(in_ddr.values()) + sum(parts.values())
    for k in SPILL_ORDER:
        if mode[k] == "auto" and "ddr" in cap:
            moved = np.clip(need - cap["hbm"], 0.0, sizes[k])
            in_ddr[k] = in_ddr[k] + moved
            need = need - moved
    for k, v in sizes.items():
        region = "weights" if k != "kv_cache" else "kv_cache"
        key_h, key_d = (region, "hbm"), (region, "ddr")
        regions[key_h] = regions.get(key_h, 0.0) + v - in_ddr[k]
        if nonzero(in_ddr[k]):
            regions[key_d] = regions.get(key_d, 0.0) + in_ddr[k]
    spilled = {k: _fraction(in_ddr[k], v) for k, v in sizes.items()}
    return Footprint(socket, regions, cap, spilled, parts,
                     policy.runtime.runtime if policy.runtime is not None else "")


def _runtime_parts(d: Demand, chip: ChipSpec, runtime: RuntimeMemory | None) -> dict[str, Work]:
    """The runtime's HBM reservation by part (empty without a runtime)."""
    if runtime is None:
        return {}
    parts = runtime.parts(chip.hbm.capacity_bytes, d.weights, d.activations, d.group)
    return {k: v for k, v in parts.items() if nonzero(v)}


def nonzero(v: Work) -> bool:
    """np.any(v), without numpy for one point (a plan search asks thousands of times)."""
    return v != 0.0 if type(v) is float else bool(np.any(v))


def _zero(v: Work) -> Work:
    return 0.0 if np.ndim(v) == 0 else 0.0 * np.asarray(v)


def _fraction(part: Work, whole: Work) -> Work:
    """part / whole where whole > 0, else 0, point by point (plain floats for one point: a
    plan search places thousands)."""
    if np.ndim(part) == 0 and np.ndim(whole) == 0:
        return float(part) / float(whole) if whole > 0 else 0.0
    return np.divide(part, whole, out=np.zeros(np.shape(part)), where=np.asarray(whole) > 0)


def footprints(spec: ModelSpec, programs: tuple[Program, ...], chip: ChipSpec, batch: Work,
               context: Work, prompt_len: Work, policy: Placement) -> tuple[Footprint, ...]:
    """Footprint of every socket (sockets of one stage position share their demand)."""
    cache: dict = {}
    out = []
    budget = policy.runtime.token_budget if policy.runtime is not None else None
    act_len = prompt_len if budget is None else float(budget)
    for p in programs:
        key = (p.layers, p.first_stage, p.last_stage)
        if key not in cache:
            d = demand(spec, p, batch, context, act_len)
            cache[key] = place(d, p.socket, chip, policy)
        out.append(replace(cache[key], socket=p.socket))
    return tuple(out)


TIER_ORDER = ("hbm", "sram", "ddr")


def misfits(fps: tuple[Footprint, ...], plan: Plan, model: str, cluster: str) -> Any:
    """Per design point: "" where every tier of every socket fits, else the one-line reason
    (the first overflowing tier, in TIER_ORDER, of the lowest-numbered socket, with what it
    holds, the runtime's reservation named): the one message every command gives for a point
    that does not fit. A str for scalar points, else an object array of their shape."""
    needs = [(tier, fp, fp.tier(tier)) for tier in TIER_ORDER for fp in fps
             if tier in fp.capacity]
    if all(np.ndim(need) == 0 for _, _, need in needs):  # one point: no arrays to build
        return next((fit_message(plan, model, cluster, tier, fp.socket, float(need),
                                 fp.capacity[tier], holds(fp, tier))
                     for tier, fp, need in needs if need > fp.capacity[tier]), "")
    shape = np.broadcast_shapes(*(np.shape(need) for _, _, need in needs))
    reasons = np.full(int(np.prod(shape)), "", dtype=object)
    for tier, fp, need in needs:
        need = np.ravel(np.broadcast_to(need, shape))
        for i in np.flatnonzero((need > fp.capacity[tier]) & (reasons == "")):
            reasons[i] = fit_message(plan, model, cluster, tier, fp.socket, float(need[i]),
                                     fp.capacity[tier], holds(fp, tier, int(i), shape))
    return reasons.reshape(shape)


def holds(fp: Footprint, tier: str, i: int = 0, shape: tuple = ()) -> str:
    """What a socket's tier holds, region by region ("weights 84.9 + KV cache 0.1 + ...", GB),
    the reservation with its runtime and parts."""
    def at(v: Work) -> float:
        return float(np.ravel(np.broadcast_to(v, shape))[i]) if shape else float(v)

    names = {"kv_cache": "KV cache"}
    order = ("weights", "kv_cache", "activations", "reserved")
    out = []
    for (region, t), b in sorted(fp.regions.items(), key=lambda kv: (
            order.index(kv[0][0]) if kv[0][0] in order else len(order), kv[0][0])):
        if t != tier or not at(b):
            continue
        text = f"{names.get(region, region)} {at(b) / 1e9:.1f}"
        if region == "reserved" and fp.runtime:
            parts = ", ".join(f"{k.replace('_', ' ')} {at(v) / 1e9:.1f}"
                              for k, v in fp.reserved.items()) if tier == "hbm" else ""
            text = f"reserved by {fp.runtime} {at(b) / 1e9:.1f}" + (f" ({parts})" if parts else "")
        out.append(text)
    return " + ".join(out)


def fit_message(plan: Plan, model: str, cluster: str, tier: str, socket: int, need: float,
                capacity: float, held: str = "") -> str:
    over = need - capacity
    # As many decimals as show the overflow with two digits: at a fixed one, a plan short of a
    # few MB read "overflows by 0.0 GB (needs 0.5 GB, has 0.5 GB)".
    d = min(9, max(1, 1 - math.floor(math.log10(over / 1e9))))
    held = f": {held};" if held else ","
    return (f"plan {plan.name}: {model} does not fit {cluster}: {tier} of socket {socket} "
            f"overflows by {over / 1e9:.{d}f} GB (needs {need / 1e9:.{d}f} GB{held} has "
            f"{capacity / 1e9:.{d}f} GB)")
