"""Dataflow execution (RDU): a whole decoder layer is one kernel whose ops run as a pipeline.

A fused kernel costs about the maximum over its resources -- the HBM stream (weights, KV cache,
spilled activations), compute, and P2P bandwidth of collectives streamed inside the kernel --
plus the latency of its dependency chain (pipeline fill and drain: each op's stage latency and
each collective's latency) plus, per kernel call, synchronization and launch. Intermediates stay
in on-chip SRAM and spill to HBM only when they do not fit.

Toggles (DataflowOptions), all on by default; see docs/execution_models.md:
- kernel_looping: the `repeat` calls of a layer kernel become one call with a pipelined outer
  loop: per-call sync, argument load and HBM refill are paid once per block, and the next layer's
  weight stream runs during the current layer's dependency stalls (as far as SRAM can buffer it).
- batch_streaming: the sequences of a batch stream through the layer pipeline one after another,
  so the matrix phases of one sequence overlap the attention of another (max over resources of
  the layer, not a sum over its phases) and only a sequence's intermediates need SRAM.
- schedule_offloading: kernel calls are sequenced by the on-chip orchestrator (AGCU) instead of
  the host, and the per-token host work (sampling hand-off, stop checks, step loop) vanishes.
- fused=False: the unfused, host-orchestrated baseline of [MICRO24] when combined with
  schedule_offloading=False: one op a kernel, each with its own program load, its intermediates
  through HBM, its collectives as separate kernels.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chip import efficiency, tile_array
from chip.breakdown import OVERHEAD, Ledger, fractions
from chip.cost import StepCost
from chip.execution import CommTime, options_of, params_for, parse_params, register
from chip.spec import ChipSpec
from workloads.checks import show
from workloads.errors import ConfigError
from workloads.ops import Block, Collective, CollectiveKind, Graph, Op, OpClass

ATTENTION_LIKE = {OpClass.ATTENTION, OpClass.LINEAR_ATTENTION}


@dataclass(frozen=True)
class DataflowOptions:
    kernel_looping: bool = True
    batch_streaming: bool = True
    schedule_offloading: bool = True
    fused: bool = True


UNFUSED_BASELINE = DataflowOptions(False, False, False, False)
# Tile-array units a chip may declare: 2^20, a thousand times SN40L's 1,040 PCUs / PMUs.
MAX_UNITS = 1 << 20


@dataclass(frozen=True)
class DataflowParams:
    hbm_efficiency: float
    compute_efficiency: float
    hbm_latency_s: float
    op_latency_s: float
    call_sync_s: float
    argument_load_s: float
    program_load_s: float
    host_command_s: float
    device_command_s: float
    host_step_s: float
    sram_activation_fraction: float
    collective_latency_s: float
    prefetch_fraction: float
    pcus: float
    pmus: float


@dataclass(frozen=True)
class _Res:
    """One pipelined region's resource demands (seconds at sustained rates) and bytes."""

    hbm: Any
    compute: Any
    p2p: Any
    weights: Any
    kv: Any
    spill: Any


class Dataflow:
    name = "dataflow"

    def check_params(self, table: Mapping[str, Any], where: str) -> None:
        params = parse_params(DataflowParams, table, where)
        for key in ("pcus", "pmus"):  # the tile array: whole units, at least one
            v = getattr(params, key)
            if v < 1 or v != int(v) or v > MAX_UNITS:
                raise ConfigError(f"{where}.{key}: {show(v)}; accepted: a whole number of units, "
                                  f"1 to {MAX_UNITS:,}")

    def check_chip(self, chip: ChipSpec, where: str) -> None:
        """The model reads the SRAM (its stage buffers, residency, prefetch) from the sram
        tier."""
        if not chip.has_tier("sram"):
            raise ConfigError(f"{where}: the dataflow model needs an sram tier (a kind = \"rdu\" "
                              "chip)")

    def step_cost(
        self, graph: Graph, chip: ChipSpec, comm_time: CommTime, options: Any = None
    ) -> StepCost:
        opts = _options(options)
        p = params_for(DataflowParams, chip)
        sram = tile_array.sram_plan(graph, chip, p, opts.batch_streaming) if opts.fused else None
        ctx = _Ctx(chip, p, comm_time, opts, np.asarray(graph.shape.batch, dtype=float), sram,
                   np.asarray(graph.shape.new_tokens, dtype=float))
        ledger = Ledger()
        calls = 0.0
        if opts.fused:
            memo = _memo(chip)
            keys: dict[tuple, object] = {}
            # A block's cost depends on its ops, repeat and place in a call only: a hybrid's
            # hundred blocks are a dozen distinct ones, each looked up once and booked once
            # times its count (not merged with another of equal content that the memo returns
            # the same costs for: the sums must not depend on the memo, which a grid of design
            # points, or a table of token counts, does not use).
            blocks: dict[tuple, list] = {}
            for segment in _segments(graph.blocks, opts.kernel_looping):
                looped = opts.kernel_looping and sum(b.repeat for b in segment) > 1
                for i, block in enumerate(segment):
                    key = (id(block.ops), block.repeat, looped, i == 0)
                    blocks.setdefault(key, [block, 0])[1] += 1
            for (_, _, looped, head), (block, n) in blocks.items():
                sub, n_calls = _fused_block_once(memo, keys, block, ctx, looped, head)
                ledger.merge(sub, n)
                calls += n * n_calls
        else:
            for block in graph.blocks:
                calls += _unfused_block(ledger, block, ctx)
        if not opts.schedule_offloading:
            ledger.add("host", OVERHEAD, p.host_step_s)
        return ledger.cost(graph, kernels=np.asarray(calls, dtype=float))


@dataclass(frozen=True)
class _Ctx:
    chip: ChipSpec
    p: DataflowParams
    comm_time: CommTime
    opts: DataflowOptions
    batch: np.ndarray
    sram: tile_array.Sram | None = None
    new_tokens: np.ndarray | float = 1.0  # a sequence's tokens this step (prefill: the prompt)
    # a collective's size-dependent time, once a step (a grid's collectives are costed on arrays)
    parts: dict = field(default_factory=dict)

    @property
    def bw(self) -> float:
        return self.chip.hbm.bandwidth_bytes_per_s

    @property
    def command_s(self) -> float:
        return self.p.device_command_s if self.opts.schedule_offloading else self.p.host_command_s

    @property
    def sram_budget(self) -> float:
        return self.p.sram_activation_fraction * self.chip.tier("sram").capacity_bytes


def _options(options: Any) -> DataflowOptions:
    return options_of(options, DataflowOptions, "dataflow")


def _program(block: Block) -> tuple:
    """What identifies a kernel's program: its ops' names and classes (not their sizes).
    Once per op tuple (the entry keeps it alive): the stages of a plan search share them.
    Array-valued ops (a step per point: drawn expert loads) are made anew for each
    evaluation and never asked again: not kept (50,000 entries of them held GBs)."""
    hit = _PROGRAMS.get(id(block.ops))
    if hit is not None and hit[0] is block.ops:
        return hit[1]
    program = tuple((op.name, op.cls) for op in block.ops)
    if _hashable(block.ops) is None:
        return program
    if len(_PROGRAMS) > MEMO_ENTRIES:
        _PROGRAMS.clear()
    _PROGRAMS[id(block.ops)] = (block.ops, program)
    return program


_PROGRAMS: dict[int, tuple] = {}


def _segments(blocks: tuple[Block, ...], looping: bool) -> list[list[Block]]:
    """The kernel calls' grouping. Without kernel looping every block is its own segment (each
    of its layers a call). With it, a run of layer blocks whose programs repeat with a period
    (a hybrid's 3 linear-attention layers + 1 full-attention layer, 12 times) is one looped
    call whose body is one period; a run that does not repeat splits into its blocks."""
    if not looping:
        return [[b] for b in blocks]
    segments: list[list[Block]] = []
    run: list[Block] = []
    programs: dict[int, tuple] = {}  # blocks of one layer kind share their op tuple
    for block in [*blocks, None]:
        if block is not None and block.first_layer >= 0:
            run.append(block)
            if id(block.ops) not in programs:
                programs[id(block.ops)] = _program(block)
            continue
        if run:
            body = [programs[id(b.ops)] for b in run]
            segments += [run] if _periodic(body) else [[b] for b in run]
            run = []
        if block is not None:
            segments.append([block])
    return segments


def _periodic(programs: list[tuple]) -> bool:
    n = len(programs)
    return n == 1 or any(
        n % period == 0 and all(programs[i] == programs[i - period] for i in range(period, n))
        for period in range(1, n // 2 + 1)
    )


# ---- fused: one kernel per layer -------------------------------------------------------------


_MEMOS: dict[int, tuple[ChipSpec, dict]] = {}
MEMO_ENTRIES = 50_000  # a plan search of a large hybrid fills a few thousand


def _memo(chip: ChipSpec) -> dict:
    """Blocks already costed on this chip (the entry keeps the chip alive, so its id is not
    reused while it is in use)."""
    entry = _MEMOS.get(id(chip))
    if entry is None or entry[0] is not chip:
        entry = _MEMOS[id(chip)] = (chip, {})
    if len(entry[1]) > MEMO_ENTRIES:
        entry[1].clear()
    return entry[1]


def _fused_block_once(memo: dict, keys: dict, block: Block, ctx: _Ctx, looped: bool,
                      head: bool) -> tuple[Ledger, float]:
    """_fused_block, costed once per distinct block: a hybrid's layers repeat a few blocks
    dozens of times, and the plans of a search share most blocks. A block's cost depends only
    on its ops, its repeat, its place in a looped call, the options, the batch and what the
    interconnect charges for its collectives, which is the key. Returns the block's own ledger
    and kernel calls; the step books each distinct block once, times its count, whether or not
    it was costed before, so the sums do not depend on what the memo holds. `keys`: the step's
    key of each op tuple (a hybrid's layers of one kind share theirs)."""
    if id(block.ops) not in keys:
        keys[id(block.ops)] = _ops_key(block, ctx)
    base = keys[id(block.ops)]
    key = None if base is None else (base, block.repeat, looped, head)
    hit = memo.get(key) if key is not None else None
    if hit is None:
        sub = Ledger()
        hit = (sub, _fused_block(sub, block, ctx, looped, head))
        if key is not None:
            memo[key] = hit
    return hit


def _ops_key(block: Block, ctx: _Ctx) -> tuple | None:
    if ctx.batch.ndim:
        return None  # a grid of design points: costed as a whole, once
    comm = []
    known = _COMM.setdefault(ctx.comm_time, {})
    for op in block.ops:
        if op.cls is OpClass.COLLECTIVE:
            c = op.collective
            if np.ndim(c.bytes):
                return None
            if c not in known:
                known[c] = (float(ctx.comm_time(c)), float(_latency(c, ctx)),
                            float(_barrier(c, ctx)))
            comm.append(known[c])
    ops = _hashable(block.ops)
    if ops is None or (ctx.sram is not None and np.ndim(ctx.sram.resident_bytes)):
        return None
    sram = ctx.sram.key() if ctx.sram is not None else None
    if np.ndim(ctx.new_tokens):
        return None
    return (ops, ctx.opts, float(ctx.batch), float(ctx.new_tokens), tuple(comm), sram)


_OPS: dict[int, tuple] = {}
# What each comm_time function charges for a collective (its time, latency and barrier).
_COMM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _OpsKey:
    """An op tuple as a memo key: hashed once (an op has a dozen fields), equal by content."""

    __slots__ = ("hash", "ops")

    def __init__(self, ops: tuple) -> None:
        self.ops, self.hash = ops, hash(ops)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _OpsKey) and (self.ops is other.ops or self.ops == other.ops)


def _hashable(ops: tuple) -> _OpsKey | None:
    """The tuple's key, made once per tuple object (the entry keeps it alive); None for
    array-valued ops."""
    hit = _OPS.get(id(ops))
    if hit is not None and hit[0] is ops:
        return hit[1]
    try:
        key = _OpsKey(ops)
    except TypeError:
        return None
    if len(_OPS) > MEMO_ENTRIES:
        _OPS.clear()
    _OPS[id(ops)] = (ops, key)
    return key


def _fused_block(ledger: Ledger, block: Block, ctx: _Ctx, looped: bool, head: bool) -> float:
    """One block of layer kernels. `looped`: part of a kernel-looping call; `head`: its first
    block (which pays the call's launch, program load and first pipeline fill)."""
    p, r = ctx.p, block.repeat
    ops = [op for op in block.ops if op.cls is not OpClass.COLLECTIVE]
    colls = [op.collective for op in block.ops if op.cls is OpClass.COLLECTIVE]
    assert ctx.sram is not None  # fused: step_cost planned the SRAM
    m = tile_array.layer_map(ops, ctx.chip, p, ctx.batch, ctx.opts.batch_streaming, ctx.sram)
    phases = _phases(block.ops) if not ctx.opts.batch_streaming else [list(block.ops)]
    spill = _spill(ops, ctx, m)
    act_total = sum((op.act_out_bytes for op in ops), 0.0)
    chain = _chain(ops, colls, ctx)
    total = sum(chain.values(), np.zeros(()))
    pipe, hbm, data = np.zeros(()), np.zeros(()), np.zeros(())
    for phase in phases:
        share = _share(
            sum((op.act_out_bytes for op in phase if op.cls is not OpClass.COLLECTIVE), 0.0),
            act_total,
        )
        res = _resources(phase, ctx, spill * share, m, total, stages=ops)
        pipe = pipe + _book_pipe(ledger, phase, res, r) / r
        hbm = hbm + res.hbm
        data = data + res.compute
    exposed, stall = chain, {k: np.zeros(()) for k in chain}
    if looped:
        # The looped kernel decouples the HBM stream from the data path: the next layer's
        # (data-independent) weights stream during this layer's dependency chain (its stages'
        # latency, its collectives: a layer's all-reduce waits for its last stage, and the next
        # layer's prefetch runs under it), as far ahead as the SRAM kept for prefetch holds
        # (tile_array: prefetch_fraction of the SRAM the stages and resident data leave). A
        # layer then costs the longer of its HBM stream and its data path (compute plus the
        # chain), and no less than its stream plus the chain the prefetch cannot cover; that
        # part is the prefetch stall (SRAM-bound: a deeper buffer would hide it). The first
        # layer pays the full chain.
        buffer_s = m.prefetch_bytes / (p.hbm_efficiency * ctx.bw)
        unbounded = np.maximum(np.maximum(hbm, data + total), pipe)
        steady = np.maximum(unbounded, pipe + total - buffer_s)
        full = 1 if head else 0  # the loop's first layer pays its whole chain
        hidden = _share(unbounded - pipe, total)
        stalled = _share(steady - unbounded, total)
        exposed = {k: (full * v + (r - full) * v * hidden) / r for k, v in chain.items()}
        stall = {k: (r - full) * v * stalled / r for k, v in chain.items()}
        # MoE: the routed experts' weights cannot be prefetched (the router picks them), so
        # the data path waits for their stream after the router; shared experts and attention
        # weights still prefetch. The experts' own compute consumes that stream as it arrives
        # (a pipeline, like every other stream here), so it overlaps the stream rather than
        # following it: the path is the data path with the expert compute replaced by the
        # longer of the two. (Added in full, a large batch's expert compute was counted twice:
        # Mixtral at batch 1024 ran 45% slower with kernel looping on than off.)
        stream = _routed_stream(ops, ctx)
        path = data + stream - np.minimum(stream, _routed_compute(ops, ctx))
        wait = np.maximum(0.0, path + total - steady)
        ledger.add("router_wait", OpClass.EXPERT.value, (r - full) * wait)
    _book_chain(ledger, ops, colls, chain, exposed, stall, r)
    ncalls = (1 if head else 0) if looped else r
    reload = head or not looped
    barrier = max((_barrier(c, ctx) for c in colls), key=np.max, default=np.zeros(()))
    ledger.add("pipeline_fill", OVERHEAD, ncalls * p.hbm_latency_s)
    ledger.add("synchronization", OVERHEAD, ncalls * (p.call_sync_s + barrier))
    # Commands per call: argument load and execute, and a program load: a layer kernel fills the
    # chip, so a call of another kernel (the prologue, the epilogue, the other layer type of a
    # hybrid) evicts it, and each step's first layer call reloads it. Consecutive calls of one
    # layer kernel keep it.
    launch = ncalls * (p.argument_load_s + 2 * ctx.command_s)
    if reload and ncalls:
        launch = launch + p.program_load_s + ctx.command_s
    ledger.add("launch", OVERHEAD, launch)
    return float(ncalls)


def _chain(ops: list[Op], colls: list[Collective], ctx: _Ctx) -> dict[str, Any]:
    """A layer's dependency chain by cause: each op's stage latency (pipeline fill and drain),
    each collective's fixed latency, and the part of its size-dependent time the last row waits
    for: the op after an all-reduce (the residual add and the norm, a reduction over one token's
    row) starts when that row's last byte has arrived, while the message streams row by row
    under the producer. With BatchStreaming one token of one sequence is the unit (the others'
    bytes stream while later rows compute); without it, one token of every sequence of the
    batch, which moves as one."""
    rows = np.maximum(ctx.new_tokens, 1.0) * (np.maximum(ctx.batch, 1.0)
                                              if ctx.opts.batch_streaming else 1.0)
    per = 1.0 / rows
    return {
        "pipeline_fill": len(ops) * ctx.p.op_latency_s + np.zeros(()),
        "collective_latency": sum((_latency(c, ctx) for c in colls), np.zeros(())),
        "communication": per * sum((_bandwidth_part(c, ctx) for c in colls), np.zeros(())),
    }


def _routed_stream(ops: list[Op], ctx: _Ctx):
    """Seconds from the router's result to the last routed-expert weight byte: a fresh HBM
    request (its latency) and the routed experts' weights at the sustained rate. Zero for a
    layer without a router."""
    if not any(op.cls is OpClass.ROUTER for op in ops):
        return np.zeros(())
    routed = sum((op.weight_bytes for op in ops if op.cls is OpClass.EXPERT), 0.0)
    return ctx.p.hbm_latency_s + efficiency.stream_time(routed, ctx.bw, ctx.p.hbm_efficiency)


def _routed_compute(ops: list[Op], ctx: _Ctx):
    """Seconds of the experts' compute (what consumes the routed stream); zero without a
    router."""
    if not any(op.cls is OpClass.ROUTER for op in ops):
        return np.zeros(())
    p = ctx.p
    return sum((efficiency.stream_time(op.flops, ctx.chip.flops(op.flop_dtype),
                                       p.compute_efficiency)
                for op in ops if op.cls is OpClass.EXPERT), np.zeros(()))


def _phases(ops: tuple[Op, ...]) -> list[list[Op]]:
    """Without batch streaming, the batch moves through the layer as one unit: its matrix phases
    and its attention phase run one after the other. A phase is a maximal run of attention-like
    ops, or of the ops between them."""
    phases: list[list[Op]] = []
    for op in ops:
        kind = op.cls in ATTENTION_LIKE
        if phases and (phases[-1][0].cls in ATTENTION_LIKE) == kind:
            phases[-1].append(op)
        else:
            phases.append([op])
    return phases


def _spill(ops: list[Op], ctx: _Ctx, m: tile_array.LayerMap):
    """HBM bytes for intermediates that do not fit SRAM (written and read back once), group by
    group: BatchStreaming's groups (tile_array), or without it the whole batch as one."""
    act = sum((op.act_out_bytes for op in ops), 0.0)
    per_seq = np.asarray(act) / np.maximum(ctx.batch, 1.0)
    return tile_array.spill_bytes(m.restream, np.maximum(ctx.batch, 1.0), per_seq,
                                  ctx.sram_budget)


def _resources(ops, ctx: _Ctx, spill, m: tile_array.LayerMap | None = None,
               chain: Any = 0.0, stages: list[Op] | None = None) -> _Res:
    """A region's demands. With a layer map (fused): resident weights and KV are read from SRAM
    at its rate, the rest streamed from HBM (re-streamed for each BatchStreaming group), and the
    compute runs at the stages' balanced rate (where it can bind: with the layer's `chain` it
    could outlast the stream)."""
    p = ctx.p
    compute_ops = [op for op in ops if op.cls is not OpClass.COLLECTIVE]
    weights = sum((op.weight_bytes for op in compute_ops), 0.0)
    kv = sum((op.kv_read_bytes + op.kv_write_bytes for op in compute_ops), 0.0)
    rate: Any = 1.0
    sram_s = np.zeros(())
    streamed_w, streamed_kv = weights, kv
    if m is not None and ctx.sram is not None:
        if np.any(m.restream > 1):
            streamed_w = weights = weights * m.restream
        if np.any(ctx.sram.resident_weights):  # (scalars stay scalars where nothing is held)
            held = sum((op.weight_bytes for op in compute_ops
                        if op.cls in tile_array.STREAMED), 0.0)
            held = np.where(ctx.sram.resident_weights, held, 0.0)
            held_kv = np.where(ctx.sram.resident_kv, kv, 0.0)
            streamed_w = (weights - held * m.restream)
            streamed_kv = kv - held_kv
            sram_bw = ctx.chip.tier("sram").bandwidth_bytes_per_s
            sram_s = (held + held_kv) / sram_bw
            # the booking splits the memory time by bytes: resident bytes at the SRAM's rate
            equiv = p.hbm_efficiency * ctx.bw / sram_bw
            weights, kv = streamed_w + held * equiv, streamed_kv + held_kv * equiv
    hbm = efficiency.stream_time(streamed_w + streamed_kv + spill, ctx.bw, p.hbm_efficiency)
    compute = sum(
        (
            efficiency.stream_time(op.flops, ctx.chip.flops(op.flop_dtype),
                                   p.compute_efficiency)
            for op in compute_ops
        ),
        np.zeros(()),
    )
    # The PCUs are shared by the whole layer's stages (`stages`: one mapping of the fused layer,
    # whether its phases run pipelined together or, without BatchStreaming, one after another)
    stages = compute_ops if stages is None else stages
    if m is not None:
        # elementwise, so a point of a grid costs what it costs alone (bit for bit)
        binds = compute / tile_array.rate_floor(stages, p) + chain > hbm + sram_s
        if np.any(binds):
            rate = tile_array.compute_rate(stages, ctx.chip, p, binds)
    compute = compute / rate
    p2p = sum(
        (_bandwidth_part(op.collective, ctx) for op in ops if op.cls is OpClass.COLLECTIVE),
        np.zeros(()),
    )
    return _Res(hbm + sram_s, compute, p2p, weights, kv, spill)


def _book_pipe(ledger: Ledger, ops, res: _Res, r: int):
    """Book r x max(resources) of one pipelined region: to the binding resource by cause, and to
    op classes in proportion to each op's own demand on that resource."""
    t = r * np.maximum(np.maximum(res.hbm, res.compute), res.p2p)
    hbm_bound = (res.hbm >= res.compute) & (res.hbm >= res.p2p)
    comp_bound = ~hbm_bound & (res.compute >= res.p2p)
    p2p_bound = ~hbm_bound & ~comp_bound
    by_cls: dict[str, Any] = {}
    all_hbm = bool(np.all(hbm_bound))  # (a decode grid's usual case: the wheres select mem)
    for op in ops:
        if op.cls is OpClass.COLLECTIVE:
            demand = 0.0 if all_hbm else np.where(p2p_bound, 1.0, 0.0)
        else:
            mem = op.weight_bytes + op.kv_read_bytes + op.kv_write_bytes + op.act_out_bytes
            demand = mem if all_hbm else np.where(hbm_bound, mem, np.where(comp_bound, op.flops,
                                                                           0.0))
        by_cls[op.cls.value] = by_cls.get(op.cls.value, 0.0) + np.asarray(demand, dtype=float)
    total = sum(by_cls.values(), np.zeros(()))
    zero = np.zeros(np.shape(t))
    # a weight 0 at every point is given as a scalar 0: its cause is booked nothing
    # (breakdown.fractions), where a decode table's points are all HBM-bound without a spill
    no_spill = np.ndim(res.spill) == 0 and res.spill == 0
    causes = fractions({  # the same split for every class (worked out once)
        "weight_streaming": np.where(hbm_bound, res.weights, zero),
        "kv_streaming": np.where(hbm_bound, res.kv, zero),
        "activations": 0.0 if no_spill else np.where(hbm_bound, res.spill, zero),
        "compute": 0.0 if all_hbm else np.where(comp_bound, 1.0, zero),
        "communication": 0.0 if all_hbm else np.where(p2p_bound, 1.0, zero),
    })
    for cls, demand in by_cls.items():
        frac = np.divide(
            demand, total, out=np.zeros(np.broadcast(demand, total).shape), where=total > 0
        )
        if cls == next(iter(by_cls)):
            frac = np.where(total > 0, frac, 1.0)
        ledger.book(cls, t * frac, causes)
    return t


def _book_chain(ledger: Ledger, ops, colls, chain: dict, exposed: dict, stall: dict,
                r: int) -> None:
    """The exposed part of each layer's chain (times its r layers), each op's stage latency to
    its class and each collective's to the collective class: by its own cause where no prefetch
    could hide it, as prefetch_stall where the SRAM kept for prefetch was too small to."""
    n_ops = max(len(ops), 1)
    for cause, seconds in exposed.items():
        if cause == "pipeline_fill":
            each, stalled = r * seconds / n_ops, r * stall[cause] / n_ops  # (the same per op)
            if np.any(stalled):  # each op's latency and stall, in turn
                for op in ops:
                    ledger.add(cause, op.cls.value, each)
                    ledger.add("prefetch_stall", op.cls.value, stalled)
            elif ops:  # no stall: its entry made, where the first op's add made it
                ledger.add_each(cause, [op.cls.value for op in ops], each)
                ledger.add("prefetch_stall", ops[0].cls.value, 0.0)
        elif colls:
            ledger.add(cause, OpClass.COLLECTIVE.value, r * seconds)
            ledger.add("prefetch_stall", OpClass.COLLECTIVE.value, r * stall[cause])


# ---- unfused baseline: one op a kernel --------------------------------------------------------


def _unfused_block(ledger: Ledger, block: Block, ctx: _Ctx) -> float:
    """[MICRO24]'s unfused baseline: every op is a kernel call with its own program; its inputs
    come from and its outputs go to HBM; a collective is a kernel that moves its data P2P."""
    p, r = ctx.p, block.repeat
    for op in block.ops:
        cls = op.cls.value
        if op.cls is OpClass.COLLECTIVE:
            ledger.add("communication", cls, r * _bandwidth_part(op.collective, ctx))
            ledger.add("collective_latency", cls, r * _latency(op.collective, ctx))
        else:
            act = op.act_in_bytes + op.act_out_bytes
            res = _Res(
                efficiency.stream_time(
                    op.weight_bytes + op.kv_read_bytes + op.kv_write_bytes + act,
                    ctx.bw,
                    p.hbm_efficiency,
                ),
                efficiency.stream_time(
                    op.flops, ctx.chip.flops(op.flop_dtype), p.compute_efficiency
                ),
                np.zeros(()),
                op.weight_bytes,
                op.kv_read_bytes + op.kv_write_bytes,
                act,
            )
            _book_pipe(ledger, [op], res, r)
            ledger.add("pipeline_fill", cls, r * (p.hbm_latency_s + p.op_latency_s))
        ledger.add("synchronization", cls, r * p.call_sync_s)
        launch = p.program_load_s + p.argument_load_s + 3 * ctx.command_s
        ledger.add("launch", cls, r * launch)
    return float(r * len(block.ops))


# ---- collectives: latency (alpha) and bandwidth (beta) parts ---------------------------------


def _latency(c: Collective, ctx: _Ctx):
    """The part of a collective's time that does not depend on its size: on the critical path of
    a pipelined kernel. The interconnect's own cost of an empty message (hops) plus the
    protocol's fixed cost per collective (`collective_latency_s`: handshakes, flag polling,
    the reduction's pipeline depth; unpublished, see docs/calibration.md)."""
    return _hops(c, ctx) + (ctx.p.collective_latency_s if c.size > 1 else 0.0)


def _hops(c: Collective, ctx: _Ctx):
    """The interconnect's cost of the collective with an empty message."""
    return np.asarray(ctx.comm_time(Collective(c.kind, 0.0, c.group, c.size)), dtype=float)


def _bandwidth_part(c: Collective, ctx: _Ctx):
    """The size-dependent part: the interconnect's time beyond its empty-message cost (the
    protocol's fixed cost is not the interconnect's, so it is not subtracted)."""
    hit = ctx.parts.get(id(c))
    if hit is None or hit[0] is not c:
        part = np.maximum(0.0, np.asarray(ctx.comm_time(c), dtype=float) - _hops(c, ctx))
        hit = ctx.parts[id(c)] = (c, part)
    return hit[1]


def _barrier(c: Collective, ctx: _Ctx):
    """A kernel call's end is a barrier across the sockets of its group: an empty all-reduce."""
    return _latency(Collective(CollectiveKind.ALL_REDUCE, 0.0, c.group, c.size), ctx)


def _share(part, total):
    part, total = np.asarray(part, dtype=float), np.asarray(total, dtype=float)
    return np.divide(part, total, out=np.zeros(np.broadcast(part, total).shape), where=total > 0)


register(Dataflow())
