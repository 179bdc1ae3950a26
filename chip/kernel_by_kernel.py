"""Kernel-by-kernel execution (GPU): ops fuse into kernels of 1 to `max_ops_per_kernel` ops by
the usual GPU rules, and kernels run one after another.

Per kernel: max(memory time, compute time) on the size-dependent efficiency curve of
`chip.efficiency`, where memory traffic includes the kernel's input and output activations (a
kernel's intermediates round-trip through HBM; only the ops fused inside it keep theirs on chip).
Each kernel boundary costs a device-side gap (synchronization). The host issues kernels
asynchronously; whatever issue time the GPU's own work does not cover is exposed as launch time.
A per-step host overhead (scheduling, sampling, input preparation) is paid every step. CUDA
graphs replace per-kernel host launches with one graph launch per step and shrink the gap.
Collectives are separate NCCL kernels; with `overlap_comm` each hides behind the kernel that
produces its input, as far as that kernel lasts. A decode attention kernel that does not split a sequence's context over thread
blocks (`split_kv` off) or re-reads a KV head for each query head of its GQA group
(`gqa_packing` off) runs no faster than its thread blocks stream through their SMs.
Parameters and their sources: `[execution]` of each GPU chip TOML; interpretation:
docs/execution_models.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from chip import efficiency, kernel_efficiency
from chip.breakdown import OVERHEAD, Ledger
from chip.cost import StepCost
from chip.execution import CommTime, options_of, params_for, parse_params, register
from chip.spec import ChipSpec
from workloads.errors import ConfigError
from workloads.graph import rank_shape
from workloads.ops import Block, Collective, CollectiveKind, Graph, Op, OpClass, Work

# Ops with weights: each is a GEMM (or gather) kernel of its own, never fused with another.
WEIGHTED = {OpClass.MATMUL, OpClass.EXPERT, OpClass.LM_HEAD, OpClass.EMBEDDING}
# Ops that reduce over a whole row (norms, top-k / argmax): they cannot be the epilogue of a GEMM
# or attention kernel, whose thread blocks each see only a tile of the row.
ROW_REDUCTION = {OpClass.NORM, OpClass.SAMPLING}
# Attention-like ops fuse with each other (FlashAttention / FlashDecoding: score, softmax and
# value product in one kernel; a recurrent-state scan likewise).
FUSED_FAMILIES = (frozenset({OpClass.ATTENTION}), frozenset({OpClass.LINEAR_ATTENTION}))


@dataclass(frozen=True)
class GpuOptions:
    cuda_graphs: bool = False
    overlap_comm: bool = False
    host: str = "cpp"  # per-step host time: "cpp" (host_step_s) or "python" (python_host_step_s)
    # The host prepares the next step while the GPU runs this one: only what outlasts it shows.
    overlap_host: bool = False
    allreduce: str = "nccl"  # "nccl" (nccl_overhead_s) or "custom" (custom_allreduce_s)
    # Decode attention splits each sequence's context over thread blocks (FlashDecoding,
    # PagedAttention v2, TensorRT-LLM's multi_block_mode); off: one block per KV stream.
    split_kv: bool = True
    # A GQA group's query heads share one block's read of their KV head (FlashInfer,
    # FlashAttention-3, TensorRT-LLM's XQA); off: each query head's block reads it again.
    gqa_packing: bool = True
    stack: str = ""  # the serving-stack profile these came from (chip/serving_stacks.py)

    def __post_init__(self) -> None:
        if self.host not in ("cpp", "python"):
            raise ConfigError(f"options.host: {self.host!r} unknown; accepted: cpp, python")
        if self.allreduce not in ("nccl", "custom"):
            raise ConfigError(
                f"options.allreduce: {self.allreduce!r} unknown; accepted: nccl, custom"
            )


@dataclass(frozen=True)
class GpuParams:
    max_ops_per_kernel: float
    hbm_efficiency: float
    compute_efficiency: float
    kernel_latency_s: float
    kernel_gap_s: float
    graph_kernel_gap_s: float
    launch_host_s: float
    graph_launch_s: float
    nccl_overhead_s: float
    host_step_s: float
    python_host_step_s: float
    host_seq_s: float
    python_host_seq_s: float
    python_worker_s: float
    custom_allreduce_s: float
    ep_a2a_latency_s: float
    nccl_busbw_fraction: float
    nccl_eager_launch_s: float
    sm_count: float
    sm_stream_bytes_per_s: float
    l2_bytes: float
    l2_bytes_per_s: float
    l2_latency_share: float

    def host_s(self, opts: GpuOptions, batch: Work) -> Work:
        """Host time of one step: a fixed part plus each sequence's share (its scheduling,
        sampling hand-off, stop checks and output processing)."""
        if opts.host == "python":
            return self.python_host_step_s + batch * self.python_host_seq_s
        return self.host_step_s + batch * self.host_seq_s

    def worker_sync_s(self, opts: GpuOptions, workers: int) -> float:
        """A Python engine drives one worker process per GPU of the step: each step it sends
        every further worker the step's inputs and awaits its completion."""
        return (workers - 1) * self.python_worker_s if opts.host == "python" else 0.0

    def collective_overhead_s(self, opts: GpuOptions, kind: CollectiveKind) -> float:
        """Software cost of one collective beyond the interconnect's alpha-beta time."""
        if opts.allreduce == "custom" and kind is CollectiveKind.ALL_REDUCE:
            return self.custom_allreduce_s
        return self.nccl_overhead_s

    def collective_time(self, comm_time: CommTime, c: Collective, opts: GpuOptions):
        """Seconds of one collective as the GPU runs it: the interconnect's alpha-beta time at
        the bandwidth NCCL's kernels reach, plus the software cost. NCCL moves data with a few
        SMs per channel and protocols that spend part of each line on flags, so its bus
        bandwidth is `nccl_busbw_fraction` of the link rate; the alpha-beta time is affine in
        bytes per algorithm, so costing bytes / fraction scales the per-byte term only (and the
        size where the algorithm choice switches moves with it). A custom one-shot kernel
        (vLLM / SGLang class) reads peers' buffers directly at the link rate. Outside a CUDA
        graph an NCCL call also pays its host-side issue (`nccl_eager_launch_s`: the framework's
        dispatch, stream-event handshakes, NCCL's enqueue), exposed because the collective
        starts only once the last rank has issued it; a graph replays the call without it.
        An MoE dispatch or combine (all-to-all) runs as a DeepEP-class kernel: its bytes at
        the link rate (DeepEP's normal kernels reach 153 of ~160 GB/s of NVLink, its README)
        plus `ep_a2a_latency_s`, in or out of a graph."""
        if c.kind is CollectiveKind.ALL_TO_ALL:
            return np.asarray(comm_time(c), dtype=float) + self.ep_a2a_latency_s
        if opts.allreduce == "custom" and c.kind is CollectiveKind.ALL_REDUCE:
            return np.asarray(comm_time(c), dtype=float) + self.custom_allreduce_s
        scaled = replace(c, bytes=c.bytes / self.nccl_busbw_fraction)
        eager = 0.0 if opts.cuda_graphs else self.nccl_eager_launch_s
        return np.asarray(comm_time(scaled), dtype=float) + self.nccl_overhead_s + eager


@dataclass(frozen=True)
class Kernel:
    ops: tuple[Op, ...]

    @property
    def anchor(self) -> Op:
        """The op that names the kernel: its first weighted or attention op, else its first."""
        for op in self.ops:
            if op.cls not in (OpClass.ELEMENTWISE, OpClass.NORM):
                return op
        return self.ops[0]

    @property
    def is_collective(self) -> bool:
        return self.ops[0].cls is OpClass.COLLECTIVE

    def activation_bytes(self):
        """HBM traffic for activations: the first op's inputs, the last op's outputs, any input
        of a fused op beyond what the ops before it produced on chip (a residual, a gate), and
        outputs of horizontally fused GEMMs that no later op of the kernel consumes."""
        total = np.asarray(self.ops[0].act_in_bytes) + self.ops[-1].act_out_bytes
        on_chip = np.asarray(self.ops[0].act_out_bytes)
        for prev, op in zip(self.ops, self.ops[1:]):
            if _siblings(prev, op):  # shares prev's input; both outputs stay on chip for now
                on_chip = on_chip + op.act_out_bytes
                continue
            total = total + np.maximum(0.0, op.act_in_bytes - on_chip)
            total = total + np.maximum(0.0, on_chip - op.act_in_bytes)  # unconsumed: written
            on_chip = np.asarray(op.act_out_bytes)
        return total


def _siblings(prev: Op, op: Op) -> bool:
    """Horizontal fusion: GEMMs of one class reading the same input (q/k/v, gate/up) run as one
    GEMM over their concatenated weights, as serving stacks do (fused QKV, merged gate-up)."""
    return (
        op.cls in (OpClass.MATMUL, OpClass.EXPERT)
        and prev.cls is op.cls
        and bool(np.all(np.asarray(prev.act_in_bytes) == np.asarray(op.act_in_bytes)))
    )


def fuse(ops: tuple[Op, ...], max_ops: int) -> list[Kernel]:
    """Group one block's ops, in order, into kernels by the usual GPU fusion rules."""
    kernels: list[list[Op]] = []
    for op in ops:
        cur = kernels[-1] if kernels else None
        if cur is None or not _joins(cur, op, max_ops):
            kernels.append([op])
        else:
            cur.append(op)
    return [Kernel(tuple(k)) for k in kernels]


def _joins(cur: list[Op], op: Op, max_ops: int) -> bool:
    if len(cur) >= max_ops or op.cls is OpClass.COLLECTIVE or cur[0].cls is OpClass.COLLECTIVE:
        return False
    if op.cls in WEIGHTED:
        return all(_siblings(a, b) for a, b in zip(cur, [*cur[1:], op]))
    if op.cls is OpClass.ROUTER or cur[-1].cls is OpClass.ROUTER:
        return cur[-1].cls is OpClass.ROUTER and op.cls is OpClass.ROUTER  # top-k after gate
    classes = {o.cls for o in cur}
    for family in FUSED_FAMILIES:
        if op.cls in family:
            return classes <= family | {OpClass.ELEMENTWISE, OpClass.NORM} and bool(
                classes & family
            )
    if op.cls in ROW_REDUCTION:
        heavy = WEIGHTED | {OpClass.ATTENTION, OpClass.LINEAR_ATTENTION}
        return not (classes & heavy)
    return True  # elementwise: an epilogue of whatever kernel is open


class KernelByKernel:
    name = "kernel_by_kernel"

    def check_params(self, table: Mapping[str, Any], where: str) -> None:
        params = parse_params(GpuParams, table, where)
        if params.max_ops_per_kernel < 1 or params.max_ops_per_kernel != int(
            params.max_ops_per_kernel
        ):
            raise ConfigError(f"{where}.max_ops_per_kernel: expected an integer >= 1")

    def step_cost(
        self, graph: Graph, chip: ChipSpec, comm_time: CommTime, options: Any = None
    ) -> StepCost:
        opts = _options(options)
        p = params_for(GpuParams, chip)
        # the stack's own kernel figures (a calibration profile's), banded in decode steps only
        kern = stack_kernels(chip.execution, opts, graph.shape.phase == "decode")
        if kern.figures is not None:  # and its own host loop's, where measured apart
            p = kern.figures.with_host(p)
        ledger = Ledger()
        gap = p.graph_kernel_gap_s if opts.cuda_graphs else p.kernel_gap_s
        n_kernels = 0.0
        kernels_by_class: dict[str, float] = {}
        for block in graph.blocks:
            kernels = fuse(block.ops, int(p.max_ops_per_kernel))
            _cost_block(ledger, block, kernels, chip, p, gap, comm_time, opts, kern)
            n_kernels += block.repeat * len(kernels)
            for k in kernels:
                cls = k.anchor.cls.value
                kernels_by_class[cls] = kernels_by_class.get(cls, 0.0) + block.repeat
        _host(ledger, p, opts, graph, n_kernels, kernels_by_class)
        return ledger.cost(graph, kernels=np.asarray(n_kernels, dtype=float))


def _options(options: Any) -> GpuOptions:
    """The options given, or the default serving stack's (chip/serving_stacks.py): a GPU step
    always runs as some named engine runs it."""
    if options is None:
        from chip.serving_stacks import default_options  # (it imports GpuOptions from here)

        return default_options()
    return options_of(options, GpuOptions, "kernel_by_kernel")


@dataclass(frozen=True)
class _StackKernels:
    """The serving stack's own kernel figures (chip/kernel_efficiency.py) for one step, and
    whether the step is a decode step (where small-M GEMMs are bound by their column bands)."""

    figures: kernel_efficiency.StackKernels | None = None
    banded: bool = False


_GENERIC = _StackKernels()


def stack_kernels(execution: Mapping[str, Any], options: Any, decode: bool) -> _StackKernels:
    """The options' stack's kernel figures in a chip's [execution] table (none: the generic
    model) for a decode step or not: what step_cost passes kernel_times, for a caller that
    costs one kernel on its own."""
    opts = _options(options)
    return _StackKernels(kernel_efficiency.for_stack(execution, opts.stack), decode)


def kernel_times(k: Kernel, chip: ChipSpec, p: GpuParams, split_kv: bool = True,
                 gqa_packing: bool = True, stack: _StackKernels = _GENERIC,
                 warm_l2: bool = False) -> tuple:
    """(weight, KV and activation bytes, memory time, compute time) of one non-collective
    kernel: its bytes stream at `hbm_efficiency` of peak after `kernel_latency_s`, its FLOPs
    run at `compute_efficiency` (chip/efficiency.py); the kernel takes the larger. An
    attention kernel is also bound by what its thread blocks stream through their SMs
    (`_block_time`), which binds where it does not split contexts or pack GQA groups. Where the
    stack carries figures for the kernel's class, its latency replaces `kernel_latency_s` and,
    in a decode step, a banded GEMM is bound by its column bands (chip/kernel_efficiency.py).
    `warm_l2`: the kernel's bytes are in L2 (a per-kernel profiler replays it on the same
    buffers and their whole set fits `l2_bytes`: `replay_bytes`), read at `l2_bytes_per_s`; in
    a model's step the rest of the layer passes through L2 between two calls of a kernel, so
    nothing stays."""
    weights, kv, act = _bytes(k)
    bw = chip.hbm.bandwidth_bytes_per_s
    fig = stack.figures
    if fig is None:
        lat, eta, cls = p.kernel_latency_s, p.hbm_efficiency, None
    else:
        cls = kernel_efficiency.kernel_class(k.anchor)
        lat = fig.latency_s(cls, p.kernel_latency_s) + fig.expert_time(cls, k.anchor)
        eta = fig.efficiency(cls, p.hbm_efficiency)
    t_mem = efficiency.stream_time(weights + kv + act, bw, eta, lat)
    rate = p.sm_stream_bytes_per_s
    if warm_l2:
        t_mem = efficiency.stream_time(weights + kv + act, p.l2_bytes_per_s, eta, lat)
        # a block's loads in flight return at the L2's latency, not the DRAM's
        rate = rate / p.l2_latency_share
    blocks = [_block_time(o, p, split_kv, gqa_packing, lat, rate) for o in k.ops
              if o.cls is OpClass.ATTENTION]
    if blocks:  # the other kernels have no per-block bound: skip the work on the hot path
        t_mem = np.maximum(t_mem, sum(blocks))
    if fig is not None and stack.banded:
        bands = fig.block_time(cls, k.ops, p.sm_count)
        if bands is not None:
            t_mem = np.maximum(t_mem, lat + bands)
    t_cmp = sum(
        (efficiency.stream_time(o.flops, chip.flops(o.flop_dtype), p.compute_efficiency)
         for o in k.ops),
        np.zeros(()),
    )
    return weights, kv, act, t_mem, t_cmp


def _bytes(k: Kernel) -> tuple:
    """A kernel's weight, KV (read and written) and activation bytes."""
    weights = sum((o.weight_bytes for o in k.ops), 0.0)
    kv = sum((o.kv_read_bytes + o.kv_write_bytes for o in k.ops), 0.0)
    return weights, kv, k.activation_bytes()


def replay_bytes(kernels) -> Work:
    """What a replay of these kernels touches: their bytes together (a profiler that replays
    them back to back on the same buffers keeps all of them in L2 or none)."""
    return sum((sum(_bytes(k)) for k in kernels), 0.0)


def _block_time(op: Op, p: GpuParams, split_kv: bool, gqa_packing: bool,
                latency: float, rate: Work) -> np.ndarray:
    """The SM side of an attention op: each thread block reads its KV at `rate`
    (`sm_stream_bytes_per_s`, Little's law: one block's loads in flight over the DRAM latency;
    from a warm L2, over the L2's latency: `l2_latency_share` of it).
    Blocks: one per KV stream, or per query head without GQA packing (each reads the whole KV
    head: the group's extra reads come from L2 but still pass through an SM). Unsplit, a block
    reads a whole context and the blocks run in ceil(blocks / SMs) waves; split, the pieces fill
    every SM. Streams of one step are taken as equally long (the batch's mean context)."""
    n = np.asarray(op.streams, dtype=float)
    if not np.any(n > 0):
        return np.zeros(())
    per_stream = np.divide(op.kv_read_bytes, n, out=np.zeros(np.broadcast(
        op.kv_read_bytes, n).shape), where=n > 0)
    blocks = n if gqa_packing else n * op.query_group
    if split_kv:
        return latency + blocks * per_stream / (p.sm_count * rate)
    waves = np.ceil(blocks / p.sm_count)
    return latency + waves * per_stream / rate


def _cost_block(ledger, block: Block, kernels, chip, p: GpuParams, gap, comm_time, opts,
                kern: _StackKernels) -> None:
    r = block.repeat
    comm_total, exposed = np.zeros(()), np.zeros(())
    producer = np.zeros(())  # the kernel before a collective: the one that makes its input
    for k in kernels:
        cls = k.anchor.cls.value
        ledger.add("synchronization", cls, r * gap)
        if k.is_collective:
            c = k.ops[0].comm
            t = r * p.collective_time(comm_time, c, opts)
            comm_total = comm_total + t
            # Overlap follows the schedule: a collective's input is its producer's output and
            # the next kernel (residual add and norm: a reduction over the whole row) waits for
            # all of it, so at best it runs chunk by chunk under its producer (a GEMM fused
            # with its all-reduce: TensorRT-LLM's user-buffer all-reduce, Flux); what outlasts
            # the producer is exposed. Without overlap all of it is.
            exposed = exposed + (np.maximum(0.0, t - producer) if opts.overlap_comm else t)
            producer = np.zeros(())
            continue
        weights, kv, act, t_mem, t_cmp = kernel_times(k, chip, p, opts.split_kv,
                                                      opts.gqa_packing, kern)
        t = r * np.maximum(t_mem, t_cmp)
        producer = t
        memory_bound = t_mem >= t_cmp
        if np.ndim(memory_bound) == 0:  # a kernel of scalars (most of a step's): no selects
            mb = bool(memory_bound)
            shares = {"weight_streaming": weights if mb else 0.0, "kv_streaming": kv if mb else 0.0,
                      "activations": act if mb else 0.0, "compute": 0.0 if mb else 1.0}
        else:
            zero = np.zeros(np.shape(t))
            shares = {
                "weight_streaming": np.where(memory_bound, weights, zero),
                "kv_streaming": np.where(memory_bound, kv, zero),
                "activations": np.where(memory_bound, act, zero),
                "compute": np.where(memory_bound, zero, 1.0),
            }
        ledger.split(cls, t, shares)
    if np.any(comm_total > 0):
        ledger.add("communication", OpClass.COLLECTIVE.value, exposed)


def _host(ledger, p: GpuParams, opts: GpuOptions, graph: Graph, n_kernels: float,
          by_class) -> None:
    """Host time that the GPU's own work does not cover."""
    # Under attention data parallelism each group has its own scheduler, running its own share
    # of the sequences over its own sockets, side by side with the others.
    own = rank_shape(graph.shape, graph.shard.attn_dp)
    host = p.host_s(opts, own.batch)
    sync = p.worker_sync_s(opts, graph.shard.scheduler_sockets)
    if opts.overlap_host:
        exposed = np.maximum(0.0, host + sync - ledger.total())
        share = np.divide(host, host + sync, out=np.ones(np.shape(exposed)),
                          where=(host + sync) > 0)
        host, sync = exposed * share, exposed * (1.0 - share)
    ledger.add("host", OVERHEAD, host)
    ledger.add("worker_sync", OVERHEAD, sync)
    if opts.cuda_graphs:
        ledger.add("launch", OVERHEAD, p.graph_launch_s)
        return
    # Asynchronous issue: the host runs ahead while the GPU works, so launch time is exposed
    # only where issuing all kernels takes longer than running them (plus the first launch,
    # which nothing covers).
    gpu = ledger.total() - host - sync
    exposed = p.launch_host_s + np.maximum(0.0, n_kernels * p.launch_host_s - gpu)
    for cls, count in by_class.items():
        ledger.add("launch", cls, exposed * count / n_kernels)


register(KernelByKernel())
