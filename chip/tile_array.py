"""The RDU's tile array and SRAM as a fused layer uses them: PCUs (compute units) and PMUs (SRAM
memory units), and what the SRAM left over allows (chip/dataflow.py applies it).

A fused layer kernel is a pipeline of stages, one per op ([MICRO24] section III: an operator is
mapped to PCUs for its math and PMUs for its buffers; SN40L pipelines hold 20+ operators). What
each stage needs:
- PMUs for its HBM stream (weights, KV cache): a double buffer (one half filled while the other
  is read: [MICRO24]'s stream buffers), each half sized so the stage's share of the HBM stream
  keeps flowing across the HBM latency (Little's law: bytes in flight = share x bandwidth x
  latency), at least one PMU a half;
- PMUs for its output activations, as far as the activation share of the SRAM
  (`sram_activation_fraction`) holds them (the rest spills to HBM: dataflow._spill); with
  BatchStreaming one sequence's, without it the whole batch's;
- PCUs in proportion to its share of the layer's FLOPs, at least one ([MICRO24]: the compiler
  balances a pipeline's stages); the slowest stage, after rounding to whole PCUs, sets the
  layer's compute rate (`compute_rate`, computed only where compute could bind).

With 1,040 PMUs of 512 KiB ([MICRO24] Table II: 520 MiB in 1,040 PMUs) a decode layer's stages
hold a few tens of MB; what is left is the SRAM a run can use otherwise:
- weights resident: when the dense weights the socket streams each step (every layer's matrices
  and its LM head; not the embedding table, a gather of a few rows) fit beside the stage
  buffers, they stay in SRAM and are read at the SRAM's rate instead of streamed from HBM (a
  small model spread over 16 sockets). Assumption: all or nothing, since a looped kernel runs
  one program for every layer; and none on a socket holding routed experts (a step reads k of
  E of them, which must stream; residency is for a shard that fits on chip whole);
- KV resident: the KV cache (short contexts) too, but only where the weights are: the whole
  decode state then stays on chip and nothing streams from HBM. Not alone: a KV cache is per
  request, written by the prefill program and paged in HBM by a server; pinning it in SRAM while
  the weights stream is not what a served model does (assumption);
- prefetch: KernelLooping streams the next layer's weights into the SRAM still free while the
  current layer's dependency chain stalls; `prefetch_fraction` (unknown, fitted) is the share of
  that free SRAM the compiler keeps for it, so the prefetch depth moves with the SRAM;
- BatchStreaming's batch: a weight tile streamed once serves the sequences whose stage inputs the
  activation buffers hold at once; a batch larger than that re-streams the layer's weights once
  per group (`restream`).

How many layers' kernels would fit on the array side by side (`layers_at_once`: a PCU a stage
at least, and their buffers) is informative: a looped kernel maps one layer over the whole array.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from workloads.ops import Graph, Op, OpClass

# Op classes whose weights a step streams in full (what residency can hold): not the embedding
# table (a step gathers a few rows) nor routed experts (a step reads k of E).
STREAMED = {OpClass.MATMUL, OpClass.LM_HEAD, OpClass.ROUTER}


@dataclass(frozen=True)
class Sram:
    """What one socket's SRAM holds across a step's layers (arrays over design points)."""

    capacity: float
    pmu_bytes: float
    resident_weights: Any  # bool: the streamed dense weights stay in SRAM
    resident_kv: Any  # bool: the KV cache stays in SRAM
    resident_bytes: Any  # what those take

    def key(self) -> tuple:
        """What a layer's cost depends on (dataflow's memo key; scalar design points only)."""
        return (bool(self.resident_weights), bool(self.resident_kv),
                float(self.resident_bytes))


@dataclass(frozen=True)
class LayerMap:
    """One fused layer on the tile array."""

    stream_pmus: Any  # weight and KV stream double buffers
    act_pmus: Any  # activation buffers held in SRAM
    buffer_bytes: Any  # PMU bytes the stages hold
    free_bytes: Any  # SRAM neither the stages nor resident weights / KV hold
    prefetch_bytes: Any  # KernelLooping's prefetch depth: prefetch_fraction of the free SRAM
    layers_at_once: Any  # layers whose stages (a PCU each at least) and buffers fit at once
    restream: Any  # times a step streams the layer's weights (BatchStreaming groups)
    in_flight: Any  # sequences whose stage inputs the activation buffers hold at once


def _streams(op: Op, sram: Sram, holds: tuple[bool, bool]) -> Any:
    """What the stage streams from HBM; `holds`: whether the SRAM holds weights, KV anywhere."""
    w: Any = op.weight_bytes
    if holds[0] and op.cls in STREAMED:
        w = np.where(sram.resident_weights, 0.0, w)
    kv: Any = op.kv_read_bytes + op.kv_write_bytes
    if holds[1]:
        kv = np.where(sram.resident_kv, 0.0, kv)
    if isinstance(w, float | int) and isinstance(kv, float | int):
        return float(w) + float(kv)  # (a Python float: the same IEEE sum, without numpy's calls)
    return np.asarray(w, dtype=float) + np.asarray(kv, dtype=float)


def sram_plan(graph: Graph, chip, p, batch_streaming: bool) -> Sram:
    """Residency for a step: the streamed dense weights kept in SRAM when they fit beside the
    largest layer's stage buffers, and then the KV cache when it fits too."""
    capacity = chip.tier("sram").capacity_bytes
    pmu_bytes = capacity / p.pmus
    none = Sram(capacity, pmu_bytes, False, False, 0.0)
    if any(op.cls is OpClass.EXPERT for block in graph.blocks for op in block.ops):
        return none
    weights = np.zeros(())
    for block in graph.blocks:
        for op in block.ops:
            if op.cls in STREAMED:
                weights = weights + block.repeat * np.asarray(op.weight_bytes, dtype=float)
    if not np.any((weights > 0) & (weights <= capacity)):
        return none  # (most models: neither the KV cache nor the stage buffers need sizing)
    kv = np.zeros(())
    for block in graph.blocks:
        for op in block.ops:
            kv = kv + block.repeat * np.asarray(op.kv_read_bytes, dtype=float)
    buffers = np.zeros(())
    for block in graph.blocks:
        ops = [op for op in block.ops if op.cls is not OpClass.COLLECTIVE]
        m = _buffers(ops, chip, p, graph.shape.batch, batch_streaming, none)
        buffers = np.maximum(buffers, m[0] + m[1])
    room = capacity - buffers * pmu_bytes
    res_w = (weights > 0) & (weights <= room)
    held = np.where(res_w, weights, 0.0)
    res_kv = res_w & (kv > 0) & (kv <= room - held)
    return Sram(capacity, pmu_bytes, res_w, res_kv, held + np.where(res_kv, kv, 0.0))


def _buffers(ops: list[Op], chip, p, batch, batch_streaming: bool, sram: Sram):
    """(stream PMUs, activation PMUs, per-sequence activation bytes, activation bytes in SRAM)
    of a layer's stages."""
    pmu = sram.pmu_bytes
    holds = (sram.resident_weights is not False and bool(np.any(sram.resident_weights)),
             sram.resident_kv is not False and bool(np.any(sram.resident_kv)))
    streams = [_streams(op, sram, holds) for op in ops]
    total = sum(streams, np.zeros(()))
    in_flight = chip.hbm.bandwidth_bytes_per_s * p.hbm_latency_s  # Little's law, whole layer
    stream_pmus = _stream_pmus(streams, total, in_flight, pmu) if streams else np.zeros(())
    act = sum((np.asarray(op.act_out_bytes, dtype=float) for op in ops), np.zeros(()))
    per_seq = act / np.maximum(np.asarray(batch, dtype=float), 1.0)
    live = per_seq if batch_streaming else act
    held = np.minimum(live, p.sram_activation_fraction * sram.capacity)
    act_pmus = np.ceil(held / pmu)
    return stream_pmus, act_pmus, per_seq, held


def _stream_pmus(streams: list, total: Any, in_flight: float, pmu: float) -> Any:
    """The stream double buffers: two halves a streaming stage, each max(1, ceil(share x
    in_flight / pmu)) PMUs. A stage that streams nothing takes none. A stage of fixed bytes
    (its weights) over a total that varies (a grid's KV cache) needs no array: its count is
    a non-increasing function of the total (each IEEE operation is monotone), so where it is
    the same at the grid's smallest and largest total it is that number everywhere. The rest
    go as one stages x points array; whole numbers of PMUs add up exactly in any order, so a
    point of a grid costs what it costs alone."""

    def half(share: Any) -> Any:
        return np.maximum(1.0, np.ceil(share * in_flight / pmu))

    fixed, rows = 0.0, []
    lo, hi = float(total.min()), float(total.max())
    for x in streams:
        if type(x) is float:  # (_streams: a stage's fixed bytes)
            if not x > 0:
                continue  # (a stage of no stream: none)
            # (total >= x > 0: a sum of non-negative streams; Python floats, the same IEEE
            # operations in the same order as half's)
            most = max(1.0, math.ceil(x / lo * in_flight / pmu))
            if most == max(1.0, math.ceil(x / hi * in_flight / pmu)):
                fixed += 2.0 * most
                continue
        rows.append(x)
    if not rows:
        return np.full(np.shape(total), fixed)
    s = np.empty((len(rows), *np.shape(total)))
    for i, x in enumerate(rows):
        s[i] = x
    share = (s / total if lo > 0  # (as the masked divide, where it divides)
             else np.divide(s, total, out=np.zeros(s.shape), where=total > 0))
    return fixed + np.where(s > 0, 2.0 * half(share), 0.0).sum(axis=0)


def layer_map(ops: list[Op], chip, p, batch, batch_streaming: bool, sram: Sram) -> LayerMap:
    """The stages of one fused layer (its non-collective ops) on the tile array."""
    stream_pmus, act_pmus, per_seq, _ = _buffers(ops, chip, p, batch, batch_streaming, sram)
    pmus = stream_pmus + act_pmus
    buffer_bytes = pmus * sram.pmu_bytes
    free = np.maximum(0.0, sram.capacity - buffer_bytes - sram.resident_bytes)
    # side by side, each stage on one PCU at least: how many layers' kernels the array could
    # hold at once (informative; a looped kernel maps one layer over the whole array)
    layers = np.floor(np.minimum(p.pcus / max(len(ops), 1), p.pmus / np.maximum(pmus, 1.0)))
    budget = p.sram_activation_fraction * sram.capacity
    batch = np.maximum(np.asarray(batch, dtype=float), 1.0)
    if batch_streaming:
        fits = np.floor(np.divide(budget, per_seq, out=np.full(np.shape(per_seq), np.inf),
                                  where=per_seq > 0))
        fits = np.minimum(np.maximum(fits, 1.0), batch)  # (np.clip, without its overhead)
        if np.all(fits >= batch):  # the buffers hold the whole batch: one group (as _groups)
            # (the shape _groups gives: fits' own, which per_seq's is part of, with the weights')
            more = [np.shape(sram.resident_weights), *(np.shape(op.weight_bytes) for op in ops)]
            groups = np.ones(np.shape(fits) if not any(more)
                             else np.broadcast_shapes(np.shape(fits), np.shape(per_seq), *more))
        else:
            weights = sum((np.where(sram.resident_weights & (op.cls in STREAMED), 0.0,
                                    op.weight_bytes) for op in ops), np.zeros(()))
            groups = _groups(fits, batch, weights, per_seq, budget)
    else:
        groups = np.ones(np.shape(batch))  # the batch is one unit (its excess spills)
    return LayerMap(stream_pmus, act_pmus, buffer_bytes, free,
                    p.prefetch_fraction * free, layers, groups, np.ceil(batch / groups))


def spill_bytes(groups: Any, batch: Any, per_seq: Any, budget: float) -> Any:
    """HBM bytes of the activations the SRAM does not hold (each written and read back once):
    `batch` sequences of `per_seq` activation bytes in `groups` groups as equal as whole
    sequences allow (batch mod groups of them one sequence larger), each with `budget` bytes of
    activation buffers."""
    q = np.floor(batch / groups)
    big = batch - q * groups
    return 2.0 * (big * np.maximum(0.0, per_seq * (q + 1) - budget)
                  + (groups - big) * np.maximum(0.0, per_seq * q - budget))


def _groups(fits: Any, batch: Any, weights: Any, per_seq: Any, budget: float) -> Any:
    """BatchStreaming's groups: a weight tile streamed once serves one group's sequences. The
    activation buffers hold `fits` at once; fewer groups spill the excess, each group re-streams
    the weights. The compiler takes the number of groups k of fewest HBM bytes, k x weights +
    spill_bytes: piecewise linear in k over three runs (every group spills: groups of more than
    `fits`; only the larger ones do: groups of exactly `fits` and one more; none does), so the
    least is at an end of a run: one group (a single stream spilling like a run without
    BatchStreaming, which it is then never worse than), the ends of the middle run, or the
    fewest groups that spill nothing. Ties keep the fewest spilled bytes."""
    f = np.maximum(fits, 1.0)
    last_all = np.floor(batch / (f + 1))
    ends = (np.ceil(batch / f), np.floor(batch / f), last_all + 1, last_all, np.ones(np.shape(f)))
    # the candidates at once (candidates x points), elementwise; the first of the fewest bytes
    shape = np.broadcast_shapes(*(np.shape(x) for x in (*ends, batch, weights, per_seq)))
    k = np.empty((len(ends), *shape))
    for i, end in enumerate(ends):
        k[i] = end
    k = np.minimum(np.maximum(k, 1.0), np.maximum(batch, 1.0))  # (np.clip, elementwise)
    cost = k * weights + spill_bytes(k, batch, per_seq, budget)
    return np.take_along_axis(k, np.argmin(cost, axis=0)[None], axis=0)[0]


def compute_rate(ops: list[Op], chip, p, where: np.ndarray) -> Any:
    """The layer's compute rate relative to the whole array's: its slowest stage's PCU share
    over its FLOP-time share (`_pcus`), at the points `where` holds (1.0 elsewhere). Each point
    is apportioned alone, so where `where` leaves some of the stages' points out only the rest
    are computed, to the same bits (a decode table's 4,097 contexts, a third where compute can
    bind: the apportionment was ~28% of an SN40L table's fill)."""
    shape = np.broadcast_shapes(np.shape(where), *(np.shape(op.flops) for op in ops))
    if np.all(where) or shape != np.shape(where):
        return np.where(where, _pcus(ops, chip, p), 1.0)
    flops = [np.broadcast_to(np.asarray(op.flops, dtype=float), shape)[where] for op in ops]
    rate = np.ones(shape)
    rate[where] = _pcus_of(flops, [op.flop_dtype for op in ops], chip, p)
    return rate


def rate_floor(ops: list[Op], p) -> float:
    """A lower bound of compute_rate without computing it: every stage holds at least one PCU,
    and a stage of `want` PCUs' share gets at least floor(want x (PCUs - stages) / PCUs), so its
    ratio is at least max(1 / want, (PCUs - stages) / PCUs - 1/2) >= this. Where the compute
    divided by it stays under the stream, the rate cannot change the step (dataflow skips it:
    a decode grid's thousands of points are stream-bound)."""
    c = max(0.0, (p.pcus - len(ops)) / p.pcus)
    return max(min(0.5, c - 0.5), 1.0 / p.pcus)


_PCUS: dict[tuple, tuple] = {}


def _pcus(ops: list[Op], chip, p) -> Any:
    """_pcus_of, once per op list and chip (a plan search and a grid reuse a layer's ops: the
    entry keeps them alive, so their ids are not reused while it is in use). Stages of scalar
    FLOPs are keyed by what _pcus_of reads of them, their FLOPs and dtypes (a grid over the
    batch rebuilds the graph, whose layers without a batch-dependent stage keep theirs)."""
    if all(np.ndim(op.flops) == 0 for op in ops):
        key: tuple = (tuple((float(op.flops), op.flop_dtype) for op in ops), id(chip), p.pcus)
        hit = _PCUS.get(key)
        if hit is not None and hit[1] is chip:
            return hit[2]
        keep: list = []
    else:
        key = (tuple(id(op) for op in ops), id(chip), p.pcus)
        hit = _PCUS.get(key)
        if hit is not None and hit[1] is chip and all(a is b for a, b in zip(hit[0], ops)):
            return hit[2]
        keep = list(ops)
    out = _pcus_of([op.flops for op in ops], [op.flop_dtype for op in ops], chip, p)
    if len(_PCUS) > 4096:
        _PCUS.clear()
    _PCUS[key] = (keep, chip, out)
    return out


def _pcus_of(flops: list, dtypes: list, chip, p) -> Any:
    """The layer's compute rate relative to the whole array's, from its stages' PCUs. A stage
    whose FLOP-time share is under one PCU takes one; the others share the rest in proportion,
    rounded down; the PCUs left over go one by
    one to the stage that is slowest for its share (largest-remainder apportionment: the
    compiler balances the pipeline as far as whole units allow). The pipeline runs at its
    slowest stage's rate."""
    times = [np.asarray(f, dtype=float) / chip.flops(d) for f, d in zip(flops, dtypes)]
    if not times:
        return np.ones(())
    shape = np.broadcast_shapes(*(np.shape(x) for x in times))
    t = np.empty((len(times), *shape))
    for i, x in enumerate(times):
        t[i] = x
    t = t.reshape(len(times), -1)  # stages x points
    # row by row (not ndarray.sum: its pairwise order differs between one point and many, and a
    # grid's point must cost what it costs alone, bit for bit)
    total = sum(t, np.zeros(t.shape[1:]))
    if not np.any(total > 0):
        return np.ones(())
    share = t / np.where(total > 0, total, 1.0)
    want = p.pcus * share
    tiny = want < 1.0  # a stage of next to no math (a norm, a gather) takes one PCU
    rest = p.pcus - tiny.sum(axis=0)
    big = np.where(tiny, 0.0, share)
    n = np.where(tiny, 1.0, np.maximum(1.0, np.floor(rest * big
                                                      / np.maximum(sum(big, np.zeros(big.shape[1:])), 1e-300))))
    # the floors leave fewer units than stages: one more each to the slowest stages
    left = p.pcus - n.sum(axis=0)
    ratio = np.divide(n, want, out=np.full(n.shape, np.inf), where=want > 0)
    rank = np.argsort(np.argsort(ratio, axis=0, kind="stable"), axis=0, kind="stable")
    n = n + (rank < left)
    ratio = np.divide(n, want, out=np.full(n.shape, np.inf), where=want > 0)
    return np.minimum(ratio.min(axis=0), 1.0).reshape(shape)

