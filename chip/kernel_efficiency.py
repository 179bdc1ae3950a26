"""Kernel efficiency per serving stack: how a stack's own kernels for an op class run.

Stacks differ most where kernels are young: a fused MoE (token sort, activation quantization,
two grouped GEMMs, the weighted sum), MLA's latent-cache decode attention and block-scaled FP8
GEMMs are each a different kernel in SGLang, TensorRT-LLM and vLLM, and a different one again in
each release. A stack profile (chip/serving_stacks.py) may carry figures measured on that stack;
a kernel of a class it has none for keeps the chip's generic kernel model (chip/kernel_by_kernel.py
kernel_times), which is what every stack ran before.

The figures, each a physical parameter of the stack on a chip family:
- `<class>_latency_s` (moe, mla, attention, fp8_gemm): the class's fixed time before its stream
  runs at the sustained rate, in place of the chip's `kernel_latency_s`: for a fused MoE the
  fixed part of each grouped GEMM's chain (the routing sort, the activation quantization, the
  launch), for decode attention the split-KV combine and the scheduler's metadata.
- `hbm_efficiency`: the share of the HBM peak the stack's class kernels sustain with every SM
  busy (in place of the chip's STREAM-class figure): a grouped GEMM or an attention kernel
  that reads its operands in 128-wide tiles with scales reaches less than a copy kernel.
- `moe_expert_s`: a grouped GEMM's time per expert group it holds, routed to or not (the
  problem setup, offsets and empty tiles a CUTLASS grouped GEMM or a Triton block schedule
  walks per expert): why TensorRT-LLM's MoE at TP 8 with all 256 of DeepSeek-V3's experts on
  every GPU costs ~0.1 ms even for one token.
- `block_bytes_per_s`: a small-M GEMM of the stack's FP8 block-scaled or grouped-MoE kernel
  gives each thread block one band of `SCALE_BLOCK` output columns and no split over K
  (DeepGEMM, the Triton fused MoE with block_shape [128, 128], TensorRT-LLM's FP8 block-scale
  GEMM), so a matrix of N columns runs on ceil(N / 128) blocks per expert, each streaming its
  K x 128 slab at this rate (Little's law: the block's pipelined loads in flight over the DRAM
  latency). Few columns leave most SMs idle: DeepSeek-V3's shared-expert gate/up at TP 8
  (N = 512) is 4 blocks. It binds in decode steps only (a prefill's many rows give every band
  many blocks).
- `python_host_step_s`, `python_host_seq_s`: the stack's own host loop between steps (a fixed
  part and each sequence's share), in place of the chip's figures of the same name for a stack
  whose loop was measured apart (`eager`: Sarathi-Serve as Vidur drives it, whose per-sequence
  Python work is about 2.5 times what the vLLM rows fit). Not a kernel, but a figure of one
  stack's code fitted on that stack's rows alone, like the kernels'.

The values are unknown parameters (rdu_cluster/validation/parameters.toml), fitted only by
`rdu-cluster calibrate` on rows of that stack (AIConfigurator's per-kernel tables,
measurements.toml), and carried like every fitted value: the calibration profile puts them into
the chip's [execution] table under `<stack>.<name>` keys when the chip is loaded.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from workloads.ops import Op, OpClass, Work

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

P = TypeVar("P", bound="DataclassInstance")  # a chip's params dataclass (GpuParams)

# The kernel classes a stack may carry figures for: what the class is and how an op is one.
KERNEL_CLASSES = {
    "moe": "fused MoE: the routed experts' grouped GEMMs (op class expert)",
    "mla": "MLA decode attention over the latent cache (op family mla)",
    "attention": "GQA / MHA attention (op class attention, not MLA)",
    "fp8_gemm": "FP8 (block-scaled) dense GEMMs (op class matmul with FP8 weights)",
}
# Per-stack parameter names.
LATENCY = {c: f"{c}_latency_s" for c in KERNEL_CLASSES}
EFFICIENCY = "hbm_efficiency"
EXPERT = "moe_expert_s"
BLOCK_RATE = "block_bytes_per_s"
# A stack's own host loop (GpuParams' fields of the same names, which it replaces).
HOST = ("python_host_step_s", "python_host_seq_s")
PARAMS = (*LATENCY.values(), EFFICIENCY, EXPERT, BLOCK_RATE, *HOST)
# The most a stack's host figure may be, and a kernel figure's (a per-step loop of a Python
# engine is milliseconds; a kernel's fixed part is microseconds).
MAX_HOST_S = 0.1
MAX_KERNEL_S = 1e-3
# Classes whose kernels own bands of output columns (the block bound applies).
BANDED = ("moe", "fp8_gemm")
# Output columns a thread block owns: the FP8 block-scale granularity along N (DeepSeek-V3's and
# Qwen3-FP8's quantization_config weight_block_size = [128, 128]; DeepGEMM and the Triton fused
# MoE tile N by it so that one scale covers a tile).
SCALE_BLOCK = 128

# Releases of a stack whose kernels were measured apart: a profile under the release's name
# (chip/serving_stacks.py) runs its base stack's host, graph and all-reduce choices but for the
# options it names, and takes the base's kernel figures for a parameter it has no rows for.
VERSIONS: dict[str, tuple[str, dict[str, Any]]] = {
    # SGLang 0.5.10: AIConfigurator 0.12.0 ships its fused-MoE table beside 0.5.14's
    # (systems/data/{h100,h200}_sxm/moe/sglang/0.5.10/moe_perf.parquet); `sglang` is 0.5.14.
    "sglang-0.5.10": ("sglang", {}),
    # TensorRT-LLM 1.3 (AIConfigurator 0.12.0's 1.3.0rc20 tables): the PyTorch backend, the
    # default since 1.0, whose PyExecutor is a Python loop per rank (TensorRT-LLM architecture
    # overview) with the overlap scheduler on by default (llm_args: disable_overlap_scheduler
    # = False), CUDA graphs for generation and its own one-shot all-reduce kernels; the
    # `tensorrt-llm` profile is the C++ runtime of the TensorRT engines ([DF], v0.17 rows).
    "tensorrt-llm-1.3": ("tensorrt-llm", {"host": "python", "overlap_host": True,
                                          "allreduce": "custom"}),
}


def key(stack: str, name: str) -> str:
    """The [execution] key of a stack's parameter: `<stack>.<name>`."""
    return f"{stack}.{name}"


def is_stack_key(name: str) -> bool:
    """A per-stack kernel parameter (it lives beside the chip's own [execution] keys)."""
    stack, _, param = name.rpartition(".")
    return bool(stack) and param in PARAMS


def first_principles(execution: Mapping[str, Any], name: str) -> float:
    """A stack parameter's value without measurements of the stack: the chip's generic figure it
    stands in for (kernel_latency_s, hbm_efficiency, sm_stream_bytes_per_s, the host figure of
    the same name), or no cost per expert group."""
    param = name.rpartition(".")[2]
    if param == EXPERT:
        return 0.0
    if param in HOST:
        return float(execution[param])
    generic = {EFFICIENCY: "hbm_efficiency", BLOCK_RATE: "sm_stream_bytes_per_s"}
    return float(execution[generic.get(param, "kernel_latency_s")])


def kernel_class(op: Op) -> str | None:
    """The kernel class of a kernel's anchor op, or None (the chip's generic model)."""
    if op.cls is OpClass.EXPERT:
        return "moe"
    if op.cls is OpClass.ATTENTION:
        return "mla" if op.family == "mla" else "attention"
    if op.cls is OpClass.MATMUL and op.flop_dtype == "fp8":
        return "fp8_gemm"
    return None


@dataclass(frozen=True)
class StackKernels:
    """A stack's figures on one chip (each None where the stack has none)."""

    stack: str
    latency: Mapping[str, float]
    hbm_efficiency: float | None = None
    expert_s: float | None = None
    block_bytes_per_s: float | None = None
    host: Mapping[str, float] = field(default_factory=dict)  # HOST name -> seconds

    def with_host(self, params: P) -> P:
        """The chip's parameters with the stack's own host figures in place of the chip's."""
        return dataclasses.replace(params, **self.host) if self.host else params

    def latency_s(self, cls: str | None, default: float) -> float:
        return self.latency.get(cls, default) if cls is not None else default

    def efficiency(self, cls: str | None, default: float) -> float:
        if cls is None or self.hbm_efficiency is None:
            return default
        return self.hbm_efficiency

    def expert_time(self, cls: str | None, op: Op) -> float:
        """Seconds a grouped GEMM spends on the expert groups it holds."""
        if cls != "moe" or self.expert_s is None:
            return 0.0
        return self.expert_s * op.experts

    def block_time(self, cls: str | None, ops: tuple[Op, ...], sm_count: float) -> Work | None:
        """Seconds the kernel's column bands take to stream through their thread blocks, or None
        where the bound does not apply (another class, or no rate for the stack): each band is
        SCALE_BLOCK columns of one matrix (of one expert), the bands run in waves of
        `sm_count` blocks, and fused sibling GEMMs (gate and up) add their bands."""
        if cls not in BANDED or self.block_bytes_per_s is None:
            return None
        bands: Work = 0.0
        slab: Work = 0.0
        for op in ops:
            if op.cls not in (OpClass.MATMUL, OpClass.EXPERT):
                continue
            width = SCALE_BLOCK * np.asarray(op.column_bytes, dtype=float)
            bands = bands + np.asarray(op.weight_bytes, dtype=float) / np.where(
                width > 0, width, np.inf)
            slab = np.maximum(slab, width)
        if not np.any(np.asarray(bands) > 0):
            return None
        return np.ceil(bands / sm_count) * slab / self.block_bytes_per_s


def for_stack(execution: Mapping[str, Any], stack: str) -> StackKernels | None:
    """The stack's figures from a chip's [execution] table (a calibration profile's values),
    falling back to its base stack for a version; None where the table has none (today's
    generic kernel model)."""
    if not stack:
        return None
    chain = [stack] + ([VERSIONS[stack][0]] if stack in VERSIONS else [])

    def value(name: str) -> float | None:
        for s in chain:
            v = execution.get(key(s, name))
            if v is not None:
                return float(v)
        return None

    latency = {c: v for c, name in LATENCY.items() if (v := value(name)) is not None}
    host = {name: v for name in HOST if (v := value(name)) is not None}
    fig = StackKernels(stack, latency, value(EFFICIENCY), value(EXPERT), value(BLOCK_RATE), host)
    if not latency and fig.hbm_efficiency is None and fig.expert_s is None and \
            fig.block_bytes_per_s is None and not host:
        return None
    return fig


def check_value(name: str, value: Any) -> str | None:
    """Why a stack parameter's value is refused, or None: an efficiency in (0, 1], a kernel's
    seconds under 1 ms, a host loop's under 0.1 s, a rate in positive bytes/s."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value)
                                       and value > 0):
        return "expected a positive number"
    if name.endswith(EFFICIENCY) and value > 1:
        return "expected a fraction in (0, 1]"
    if name.endswith("_s") and not name.endswith("_per_s"):
        limit = MAX_HOST_S if name.rpartition(".")[2] in HOST else MAX_KERNEL_S
        if value > limit:
            return f"expected seconds under {limit:g}"
    return None
