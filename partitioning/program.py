"""Programs: what ONE socket runs under a plan -- its layers, shard degrees and groups.

The partitioner cuts the model's layers into `pp` contiguous stages (balanced by weight bytes),
and gives every socket its stage's blocks, sharded by the plan's degrees (graphs come from
workloads.graph.step_graph; a Block is split where a stage boundary cuts it). Stage 0 holds the
embedding, the last stage the final norm, LM head and sampling; every stage but the last ends in
a send of its activations to the next (a SEND_RECV over group "pp"). Each program names the
socket ids of its groups, so the interconnect can cost its collectives on real routes.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

import numpy as np

from interconnect.collectives import Groups
from partitioning.plan import Plan
from workloads import graph as graphs
from workloads import params
from workloads.ops import (
    Block,
    Collective,
    CollectiveKind,
    Graph,
    Op,
    OpClass,
    Shard,
    StepShape,
    Work,
)
from workloads.spec import Mixer, ModelSpec, layer_runs

T = TypeVar("T")

GROUPS = ("attn_tp", "mlp_tp", "expert_tp", "ep", "vocab_tp", "pp")


@dataclass(frozen=True)
class Coords:
    dp: int
    pp: int
    ep: int
    tp: int


@dataclass(frozen=True)
class Program:
    socket: int
    coords: Coords
    layers: tuple[int, int]  # [first, end) of the stage
    first_stage: bool
    last_stage: bool
    shard: Shard  # degrees of the stage's main blocks (expert_load set per step)
    mixer_tp: tuple[tuple[Mixer, int], ...]  # attn_tp of each mixer kind
    groups: Mapping  # group name, or (name, size) for per-block degrees -> socket ids

    @property
    def stage(self) -> int:
        return self.coords.pp

    def graph(self, spec: ModelSpec, shape: StepShape, expert_load: Work = 1.0) -> Graph:
        """The socket's work for one step: its stage's blocks plus the communication ops
        (`expert_load` may be an array, one value per design point of `shape`)."""
        load = float(expert_load) if np.ndim(expert_load) == 0 else expert_load
        # the sockets of a stage, and plans that share a stage, share its graph
        key = (self.layers, self.first_stage, self.last_stage, self.shard, self.mixer_tp,
               shape, load)
        return _per_model(_STAGES, spec, key, lambda: self._graph(spec, shape, load))

    def stage_ops(self, spec: ModelSpec, shape: StepShape,
                  expert_load: Work = 1.0) -> tuple[tuple[tuple[Op, ...], int], ...]:
        """What `graph` holds, by layer kind rather than block by block: each op tuple of the
        step with how many times it runs (a layer kind's ops times its layers in the stage;
        the prologue, the epilogue or the pp send once). For sums that do not depend on the
        order, as the footprint's: a hybrid's stage has a hundred blocks of three kinds."""
        load = float(expert_load) if np.ndim(expert_load) == 0 else expert_load
        shard = _with(self.shard, "expert_load", load)
        base = _step_graph(spec, shape, shard)
        full = {m: _step_graph(spec, shape, _with(shard, "attn_tp", d)) for m, d in self.mixer_tp}
        kinds, first_block = _layer_kinds(spec)
        out = [(base.blocks[0].ops, 1)] if self.first_stage else []
        first, end = self.layers
        for k, n in enumerate(np.bincount(kinds[first:end], minlength=len(first_block))):
            if n:
                i = first_block[k]
                mixer = spec.layers[base.blocks[i].first_layer].mixer
                out.append((full.get(mixer, base).blocks[i].ops, int(n)))
        tail = base.blocks[-1] if self.last_stage else _pp_send(spec, shape)
        return (*out, (tail.ops, 1))

    def _graph(self, spec: ModelSpec, shape: StepShape, load: Work) -> Graph:
        shard = _with(self.shard, "expert_load", load)
        full = {m: _step_graph(spec, shape, _with(shard, "attn_tp", d)) for m, d in self.mixer_tp}
        base = _step_graph(spec, shape, shard)
        if not full and self.first_stage and self.last_stage:  # the whole model, as built
            return base
        blocks: list[Block] = []
        if self.first_stage:
            blocks.append(base.blocks[0])
        # Layer blocks are in layer order: visit only those the stage's range overlaps.
        first, end = self.layers
        starts = [b.first_layer for b in base.blocks[1:-1]]
        lo = max(1, bisect.bisect_right(starts, first))
        hi = bisect.bisect_left(starts, end) + 1
        for i in range(lo, hi):
            block = base.blocks[i]
            mixer = spec.layers[block.first_layer].mixer
            src = full[mixer].blocks[i] if mixer in full else block
            clipped = _clip(src, first, end)
            if clipped is not None:
                blocks.append(clipped)
        if self.last_stage:
            blocks.append(base.blocks[-1])
        else:
            blocks.append(_pp_send(spec, shape))
        return Graph(spec.name, shape, shard, tuple(blocks))


def _with(shard: Shard, name: str, value: Work) -> Shard:
    """The shard with one degree (or the expert load) changed; made once per value where
    hashable (every stage of a search asks for the same few)."""
    try:
        # an array is not hashable: lru_cache raises the TypeError caught here
        return _with_cached(shard, name, value)  # type: ignore[arg-type]
    except TypeError:  # an array of loads
        return _shard_with(shard, name, value)


@lru_cache(maxsize=4096)
def _with_cached(shard: Shard, name: str, value: Work) -> Shard:
    return _shard_with(shard, name, value)


def _shard_with(shard: Shard, name: str, value: Work) -> Shard:
    return Shard(**{**{k: getattr(shard, k) for k in Shard.__dataclass_fields__}, name: value})


# Graphs by (model identity, shape, shard) and stage graphs by the stage's key too: an entry
# keeps its model alive, so an id is not reused while it is a key.
_GRAPHS: dict[tuple, tuple] = {}
_STAGES: dict[tuple, tuple] = {}
_LAYERS: dict[tuple, tuple] = {}  # stage_layers per (model, pp)
_PROGRAMS: dict[tuple, tuple] = {}  # build_programs per (model, plan)
_KINDS: dict[tuple, tuple] = {}  # _layer_kinds per model
_SENDS: dict[tuple, tuple] = {}  # _pp_send per (model, shape)
CACHED_GRAPHS = 2048


def _per_model(cache: dict, spec: ModelSpec, key: tuple, make: Callable[[], T]) -> T:
    """`make()`, cached per model and key. A spec is keyed by identity (hashing one would cost
    more than most hits save), so an entry also keeps the spec: a recycled id() cannot hit. A
    key holding arrays (design points in the shape) is unhashable: built afresh."""
    try:
        full = (id(spec), *key)
        hit = cache.get(full)
    except TypeError:
        return make()
    if hit is not None and hit[0] is spec:
        return hit[1]
    out = make()
    if len(cache) >= CACHED_GRAPHS:
        cache.clear()
    cache[full] = (spec, out)
    return out


def _layer_kinds(spec: ModelSpec) -> tuple[np.ndarray, tuple[int, ...]]:
    """Per layer, the index of its kind (identical layers share a kind, and their blocks
    share one op tuple: workloads.graph.step_graph), and per kind the graph block of its
    first run (blocks: the prologue, one per run of identical layers, the epilogue)."""
    return _per_model(_KINDS, spec, (), lambda: _make_layer_kinds(spec))


def _make_layer_kinds(spec: ModelSpec) -> tuple[np.ndarray, tuple[int, ...]]:
    index: dict = {}
    first_block: list[int] = []
    kinds = np.empty(spec.num_layers, dtype=np.int64)
    for b, (first, count, layer) in enumerate(layer_runs(spec.layers), start=1):
        if layer not in index:
            index[layer] = len(first_block)
            first_block.append(b)
        kinds[first:first + count] = index[layer]
    return kinds, tuple(first_block)


def _step_graph(spec: ModelSpec, shape: StepShape, shard: Shard) -> Graph:
    return _per_model(_GRAPHS, spec, (shape, shard),
                      lambda: graphs.step_graph(spec, shape, shard))


def _clip(block: Block, first: int, end: int) -> Block | None:
    lo, hi = max(first, block.first_layer), min(end, block.first_layer + block.repeat)
    if hi <= lo:
        return None
    if (lo, hi - lo) == (block.first_layer, block.repeat):
        return block
    return Block(f"{block.name}[{lo}-{hi - 1}]", block.ops, repeat=hi - lo, first_layer=lo)


def _pp_send(spec: ModelSpec, shape: StepShape) -> Block:
    """The send of a stage's activations to the next; one block per model and shape (every
    stage of every plan of a search sends the same)."""
    return _per_model(_SENDS, spec, (shape,), lambda: _make_pp_send(spec, shape))


def _make_pp_send(spec: ModelSpec, shape: StepShape) -> Block:
    tokens = np.asarray(shape.batch, dtype=float) * np.asarray(shape.new_tokens, dtype=float)
    nbytes = tokens * spec.hidden_size * spec.precision.activations.bytes
    op = Op("pp_send", OpClass.COLLECTIVE,
            comm=Collective(CollectiveKind.SEND_RECV, nbytes, "pp", 2))
    return Block("pp_send", (op,))


# ---- stages and groups ----------------------------------------------------------------------


def stage_layers(spec: ModelSpec, pp: int) -> tuple[tuple[int, int], ...]:
    """Contiguous layer ranges, cut where the cumulative layer weight is closest to k/pp of
    the total (each stage at least one layer). Cached per model and pp: every plan of a
    search with that pp asks."""
    return _per_model(_LAYERS, spec, (pp,), lambda: _stage_layers(spec, pp))


def _stage_layers(spec: ModelSpec, pp: int) -> tuple[tuple[int, int], ...]:
    n = spec.num_layers
    if pp <= 1:
        return ((0, n),)
    sizes = np.array([sum(params.layer_params(spec, layer).values()) for layer in spec.layers],
                     dtype=float)
    cum = np.cumsum(sizes)
    cuts = [0]
    for k in range(1, pp):
        target = cum[-1] * k / pp
        c = int(np.argmin(np.abs(cum - target))) + 1
        c = min(max(c, cuts[-1] + 1), n - (pp - k))
        cuts.append(c)
    cuts.append(n)
    return tuple((cuts[i], cuts[i + 1]) for i in range(pp))


def coords_of(plan: Plan, socket: int) -> Coords:
    tp_i = socket % plan.tp
    ep_i = socket // plan.tp % plan.ep
    pp_i = socket // plan.width % plan.pp
    return Coords(socket // (plan.width * plan.pp), pp_i, ep_i, tp_i)


def groups_of(plan: Plan, socket: int) -> dict:
    c = coords_of(plan, socket)
    w, tp = plan.width, plan.tp
    base = socket - (c.ep * tp + c.tp)
    stage = tuple(range(base, base + w))
    local = c.ep * tp + c.tp
    out: dict = {g: stage for g in ("attn_tp", "mlp_tp", "vocab_tp")}
    out["expert_tp"] = tuple(range(base + c.ep * tp, base + (c.ep + 1) * tp))
    out["ep"] = tuple(base + g * tp + c.tp for g in range(plan.ep))
    if c.pp + 1 < plan.pp:
        out["pp"] = (socket, socket + w)
    for d in _attention_degrees(plan):
        out[("attn_tp", d)] = tuple(range(base + local // d * d, base + (local // d + 1) * d))
    return out


def _attention_degrees(plan: Plan) -> tuple[int, ...]:
    """Degrees of the attention groups smaller than the stage: per-block mixer degrees, or
    the attention data-parallel groups (adjacent sockets, as the mixer groups)."""
    if plan.adp > 1:
        return (plan.attn_width,) if plan.attn_width > 1 else ()
    return tuple(d for _, d in plan.mixer_tp)


class _Groups(Mapping):
    """groups_of(plan, socket), worked out when first read: a plan search builds thousands
    of programs and costs their collectives through plan_comm_time, not through these."""

    __slots__ = ("_groups", "_plan", "_socket")

    def __init__(self, plan: Plan, socket: int) -> None:
        self._plan, self._socket = plan, socket
        self._groups: dict | None = None

    def _get(self) -> dict:
        if self._groups is None:
            self._groups = groups_of(self._plan, self._socket)
        return self._groups

    def __getitem__(self, key):
        return self._get()[key]

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return repr(self._get())


@lru_cache(maxsize=256)
def concurrent_groups(plan: Plan) -> dict:
    """Every group of each kind in the cluster: they run the same collective at once (SPMD), so
    their flows share links. Built from the layout's regularity (the groups groups_of gives
    each socket, each listed once, in order), not socket by socket: a 1,024-socket plan has
    thousands. Cached per plan: do not mutate the result."""
    w, tp, n = plan.width, plan.tp, plan.sockets
    blocks = lambda size: Groups(tuple(range(b, b + size)) for b in range(0, n, size))
    stage = blocks(w)
    out: dict = {g: stage for g in ("attn_tp", "mlp_tp", "vocab_tp")}
    out["expert_tp"] = blocks(tp)
    out["ep"] = Groups(tuple(b + g * tp + t for g in range(plan.ep))
                       for b in range(0, n, w) for t in range(tp))
    if plan.pp > 1:
        out["pp"] = Groups((s, s + w) for s in range(n) if s // w % plan.pp + 1 < plan.pp)
    for d in _attention_degrees(plan):
        out[("attn_tp", d)] = blocks(d)
    return out


def build_programs(spec: ModelSpec, plan: Plan) -> tuple[Program, ...]:
    """One program per socket of the plan, socket ids 0..plan.sockets-1 (cached per model
    and plan: the evaluator and the footprint ask for the same ones)."""
    return _per_model(_PROGRAMS, spec, (plan,), lambda: _build_programs(spec, plan))


def _build_programs(spec: ModelSpec, plan: Plan) -> tuple[Program, ...]:
    stages = stage_layers(spec, plan.pp)
    shard = plan.shard
    programs = []
    for s in range(plan.sockets):
        c = coords_of(plan, s)
        programs.append(Program(
            socket=s, coords=c, layers=stages[c.pp], first_stage=c.pp == 0,
            last_stage=c.pp == plan.pp - 1, shard=shard, mixer_tp=plan.mixer_tp,
            groups=_Groups(plan, s),
        ))
    return tuple(programs)
