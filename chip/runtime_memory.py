"""Memory a serving runtime keeps from a socket besides the weights and the KV cache.

An engine starts only if the weights, what it reserves and the KV cache of at least one sequence
fit; it then sizes its KV pool from what is left. What it reserves, per socket:
- `cuda_context`: the CUDA context with the engine's libraries (cuBLAS/cuDNN handles, kernels);
- `comm_buffers`: NCCL's channel buffers and the stack's custom all-reduce buffers, on a socket
  of a group of more than one;
- `cuda_graphs`: the pools of the captured decode graphs;
- `engine_headroom`: the rest of what the engine's memory fraction leaves unused. The fraction
  means one of three things (`rule`):
  "total"  (vLLM `gpu_memory_utilization`): the engine allocates at most fraction x HBM for
           weights, the profiled activation peak, non-torch memory and the KV cache; CUDA graphs
           are captured afterwards, out of the (1 - fraction) left over;
  "static" (SGLang `mem_fraction_static`): weights and KV pool take fraction x HBM less what the
           process already holds (context, communicators); the (1 - fraction) x HBM left holds
           activations and CUDA graphs. Its default is SGLang's own estimate of them
           (`sglang_reserved_bytes`), so it depends on the GPU's memory and the TP degree;
  "free"   (TensorRT-LLM `free_gpu_memory_fraction`): the KV cache takes fraction of the memory
           free once the engine (weights, activation workspace, context) is loaded;
- on an RDU: the program's configuration images in HBM (its PMU buffers in SRAM are the
  execution model's layer map, chip/tile_array.py); no fraction (rule "free" with none: a
  serving run's --kv-fraction may set one).
The activation workspace is the footprint's own region (partitioning/footprint.py): the largest
op working set of a forward pass over `token_budget` tokens (an engine profiles or plans it at
its batched-token budget; the RDU runtime at one prompt). `max_running` is the most requests the
engine runs at once, the count its request pools and buffers are sized for (SGLang's request
pool, vLLM's max_num_seqs, TensorRT-LLM's max_batch_size): a serving run's --max-batch where
none is given (rdu_cluster/engine/schedulers: max_batch_for).

Figures the engines publish are cited where they are defined; the rest are declared with a range
and its basis (`RANGES`): no measurement set fixes them, so nothing fits them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from workloads.errors import ConfigError

MiB = 2**20
GiB = 2**30

RULES = ("total", "static", "free")
# The parts a reservation is shown by (output columns reserved_<part>_bytes_per_socket).
PARTS = ("cuda_context", "comm_buffers", "cuda_graphs", "program_images", "engine_headroom")

# Declared figures (no source fixes them): point value, range, basis. Bytes per socket.
RANGES: dict[str, tuple[float, tuple[float, float], str]] = {
    "cuda_context": (
        0.5e9, (0.3e9, 1.0e9),
        ("a CUDA 12 context with PyTorch's kernels and cuBLAS workspaces as nvidia-smi shows an "
        "idle engine process (lazy module loading); vLLM's own log counts only what grows after "
        "it (non_torch_memory 0.10 GiB at TP1, vllm-project/vllm issue #12330)")),
    "comm_buffers": (
        1.0e9, (0.2e9, 3.0e9),
        ("NCCL's per-channel buffers (NCCL_BUFFSIZE 4 MiB a channel and peer, NCCL docs) over "
        "the channels an 8-GPU NVLink communicator opens, plus the stack's custom all-reduce "
        "IPC buffers (vLLM CustomAllreduce max_size 8 MiB, and the buffers registered for its "
        "CUDA graphs); none on a one-socket group")),
    "cuda_graphs": (
        1.0e9, (0.2e9, 4.0e9),
        ("vLLM logs 'Graph capturing finished ... took 0.3-2 GiB' for its padded decode batch "
        "sizes (up to 512); TensorRT-LLM's graphs cover the same padded batch sizes")),
    "rdu_program_images": (
        0.5e9, (0.05e9, 2.0e9),
        ("a compiled program's configuration bitstreams (PCU, PMU, switch and address-generator "
        "configuration of every graph section: a few MB a section) with its argument tables and "
        "runtime buffers in HBM; SambaNova publishes no figure")),
}


def declared(name: str) -> float:
    return RANGES[name][0]


@dataclass(frozen=True)
class RuntimeMemory:
    """What one runtime reserves per socket; `fraction` None: the engine's own default (SGLang:
    derived from the GPU's memory and TP)."""

    runtime: str
    rule: str
    fraction: float | None
    context_bytes: float = 0.0
    comm_bytes: float = 0.0  # per socket of a group of more than one
    graph_bytes: float = 0.0
    image_bytes: float = 0.0  # RDU program and configuration images (HBM)
    sram_bytes: float = 0.0  # RDU PMU buffers the runtime keeps (SRAM)
    token_budget: int | None = None  # activations at this many tokens (None: one prompt)
    max_running: int | None = None  # requests run at once (None: no engine default, an RDU)
    source: str = ""

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ConfigError(f"runtime memory rule: {self.rule!r}; accepted: {', '.join(RULES)}")
        if self.fraction is not None and not 0.0 < self.fraction <= 1.0:
            raise ConfigError(f"memory fraction: expected a value in (0, 1], got {self.fraction}")
        if self.rule == "total" and self.fraction is None:
            raise ConfigError("runtime memory rule 'total' (vLLM gpu_memory_utilization): "
                              "needs a fraction in (0, 1]")

    def with_fraction(self, fraction: float | None) -> RuntimeMemory:
        """The runtime with the KV cache's share set explicitly (a serving run's --kv-fraction):
        `fraction` of what the weights, the activation workspace and the fixed parts leave, as
        TensorRT-LLM's free_gpu_memory_fraction means it, whatever the stack (None: the
        runtime's own rule and fraction)."""
        return self if fraction is None else replace(self, rule="free", fraction=fraction)

    def parts(self, capacity: float, weights: Any, activations: Any,
              group: int, tp: int | None = None) -> dict[str, Any]:
        """HBM bytes reserved per socket, by part, for a socket of `capacity` holding `weights`
        and an activation workspace of `activations` in a step group of `group` sockets (tp:
        the tensor-parallel degree SGLang's estimate reads, default the group's). Broadcasts
        over arrays."""
        tp = group if tp is None else tp
        out: dict[str, Any] = {}
        if self.context_bytes:
            out["cuda_context"] = self.context_bytes
        if self.comm_bytes and group > 1:
            out["comm_buffers"] = self.comm_bytes
        if self.image_bytes:
            out["program_images"] = self.image_bytes
        graphs = self.graph_bytes
        if self.rule == "static":
            graphs = self._sglang_graph_bytes(capacity, tp)
        if graphs:
            out["cuda_graphs"] = graphs
        fixed = sum(out.values())
        f = self.fraction
        if self.rule == "total" and f is not None:  # graphs come out of the (1 - fraction) left over
            out["engine_headroom"] = _pos((1.0 - f) * capacity - graphs)
        elif self.rule == "static":  # (1 - fraction) x HBM holds activations and graphs
            left = ((1.0 - f) * capacity if f is not None
                    else sglang_reserved_bytes(capacity, tp, self.token_budget or 8192))
            out["engine_headroom"] = _pos(left - activations - graphs)
        elif f is not None and f < 1.0:  # of the memory free once the engine is loaded
            out["engine_headroom"] = _pos((1.0 - f) * (capacity - weights - activations - fixed))
        return out

    def _sglang_graph_bytes(self, capacity: float, tp: int) -> float:
        return sglang_graph_max_bs(capacity, tp) * 2 * MiB


def _pos(x: Any) -> Any:
    import numpy as np

    return float(max(0.0, x)) if np.ndim(x) == 0 else np.maximum(0.0, x)


# ---- SGLang's default (python/sglang/srt/server_args.py, ServerArgs._handle_gpu_memory_settings,
# sgl-project/sglang at 469c63e): chunked_prefill_size and cuda_graph_max_bs by GPU memory, then
# reserved_mem (MiB) = 512 (metadata) + max(chunked_prefill_size, 2048) x 1.5 (activations)
# + cuda_graph_max_bs x 2 (graphs) + tp x pp / 8 x 1024, at least 10 GiB on a GPU over 60 GiB,
# and mem_fraction_static = (gpu_mem - reserved_mem) / gpu_mem.


def sglang_chunk(capacity: float) -> int:
    mib = capacity / MiB
    if mib < 35 * 1024:
        return 2048
    if mib < 60 * 1024:
        return 4096
    return 8192 if mib < 160 * 1024 else 16384


def sglang_graph_max_bs(capacity: float, tp: int) -> int:
    mib = capacity / MiB
    if mib < 20 * 1024:
        return 8
    if mib < 35 * 1024:
        return 24 if tp < 4 else 80
    if mib < 60 * 1024:
        return 32 if tp < 4 else 160
    if mib < 160 * 1024:
        return 256 if tp < 4 else 512
    return 512


def sglang_reserved_bytes(capacity: float, tp: int, chunk: int | None = None,
                          pp: int = 1) -> float:
    """(1 - mem_fraction_static) x GPU memory at SGLang's default: its reserved_mem."""
    chunk = sglang_chunk(capacity) if chunk is None else chunk
    mib = 512 + max(chunk, 2048) * 1.5 + sglang_graph_max_bs(capacity, tp) * 2
    mib += tp * pp / 8 * 1024
    if capacity / MiB > 60 * 1024:
        mib = max(mib, 10 * 1024)
    return mib * MiB


def sglang_fraction(capacity: float, tp: int) -> float:
    """SGLang's default mem_fraction_static on a GPU of `capacity` bytes at `tp`."""
    return round((capacity - sglang_reserved_bytes(capacity, tp)) / capacity, 3)


def vllm_token_budget(capacity: float, chip_name: str) -> int:
    """vLLM's default max_num_batched_tokens for its OpenAI server (vllm/engine/arg_utils.py,
    EngineArgs.get_batch_defaults): 8192 on a GPU of 70 GiB or more that is not an A100, 2048
    otherwise."""
    return 8192 if _vllm_large(capacity, chip_name) else 2048


def vllm_max_num_seqs(capacity: float, chip_name: str) -> int:
    """vLLM's default max_num_seqs for its OpenAI server, by the same rule as its token budget
    (EngineArgs.get_batch_defaults): 1024 on a GPU of 70 GiB or more that is not an A100, 256
    otherwise."""
    return 1024 if _vllm_large(capacity, chip_name) else 256


def _vllm_large(capacity: float, chip_name: str) -> bool:
    return capacity >= 70 * GiB and "a100" not in chip_name


# SGLang's request pool (python/sglang/srt/model_executor/model_runner.py, init_memory_pool):
# min(max(KV tokens / context length x 512, 2048), 4096) requests. Its cap is taken: the KV
# cache admits fewer than the formula wherever a request averages context / 512 tokens or more
# (256 on a 128K-context model), so the two part only for shorter requests.
SGLANG_MAX_RUNNING = 4096


_CONTEXT, _COMM, _GRAPHS = (declared(k) for k in ("cuda_context", "comm_buffers", "cuda_graphs"))

# Per stack family: the engine's fraction (cited), its rule and its token budget.
VLLM = RuntimeMemory(
    "vllm", "total", 0.9, _CONTEXT, _COMM, _GRAPHS, token_budget=8192,
    source="vLLM CacheConfig.gpu_memory_utilization = 0.9 (docs.vllm.ai v0.10.2 "
    "api/vllm/config/cache; later releases' docs read 0.92); the worker sizes the KV cache as "
    "fraction x total - weights - activation peak - non-torch memory (its start-up log, "
    "vllm-project/vllm issue #12330); max_num_batched_tokens 8192 (vllm_token_budget) and "
    "max_num_seqs 1024 (vllm_max_num_seqs) on an H100 or H200")
SGLANG = RuntimeMemory(
    "sglang", "static", None, _CONTEXT, _COMM, token_budget=None,
    max_running=SGLANG_MAX_RUNNING,
    source="SGLang mem_fraction_static, default derived from GPU memory and TP "
    "(server_args.py _handle_gpu_memory_settings, sgl-project/sglang 469c63e): 80 GiB TP8 "
    "0.819, 141 GiB TP8 0.897; KV pool = memory free after loading - (1 - fraction) x total "
    "(model_runner.profile_max_num_token); at most 4096 requests (SGLANG_MAX_RUNNING)")
TENSORRT_LLM = RuntimeMemory(
    "tensorrt-llm", "free", 0.9, _CONTEXT, _COMM, _GRAPHS, token_budget=8192,
    max_running=2048,
    source="TensorRT-LLM KvCacheConfig.free_gpu_memory_fraction = 0.9 of the memory free "
    "after the engine loads (nvidia.github.io/TensorRT-LLM llm-api KvCacheConfig; 'How to Change "
    "KV Cache Behavior'); activation workspace planned at build time for max_num_tokens 8192 "
    "(TensorRT-LLM reference/memory.md); max_batch_size 2048 (BuildConfig, "
    "tensorrt_llm/builder.py; trtllm-build's default since NVIDIA/TensorRT-LLM#2253)")
TENSORRT_LLM_STATIC = replace(
    TENSORRT_LLM, runtime="tensorrt-llm-0.11", fraction=None, graph_bytes=0.0,
    max_running=256,
    source="TensorRT-LLM as NVIDIA's v0.6 performance tables ran it (gptSessionBenchmark: static "
    "batching, the KV cache allocated for the batch at its lengths, no fraction held back) and "
    "Argonne's 0.11 runs (no CUDA graphs; their ModelRunnerCpp's paged cache takes 0.9 of what "
    "is left, which their batches of 1-64 at 1-2K tokens fit either way); max_batch_size 256, "
    "trtllm-build's default before NVIDIA/TensorRT-LLM#2253 (2024-09) set it to 2048")
EAGER = replace(VLLM, runtime="eager", graph_bytes=0.0, max_running=128,
                source="a PyTorch loop as vLLM runs it without CUDA graphs (enforce_eager): "
                "vLLM's fraction and rule; 128 requests at once, the batch_size_cap of Vidur's "
                "replica schedulers (microsoft/vidur vidur/config/config.py), which runs it")
SN40L = RuntimeMemory(
    "sn40l-runtime", "free", None, image_bytes=declared("rdu_program_images"),
    source="the program images (declared, RANGES); the PMU buffers are the layer map's "
    "(chip/tile_array.py: stream and activation buffers, and the prefetch the SRAM left over "
    "allows), planned per layer by the execution model, not a fixed reservation; no engine "
    "fraction: the compiler places every buffer statically and SambaNova publishes none (a "
    "serving run's --kv-fraction sets one)")
NONE = RuntimeMemory("none", "free", 1.0, source="nothing reserved (a what-if)")

STACK_MEMORY: dict[str, RuntimeMemory] = {
    "vllm": VLLM,
    "sglang": SGLANG,
    "tensorrt-llm": TENSORRT_LLM,
    "tensorrt-llm-0.11": TENSORRT_LLM_STATIC,
    "eager": EAGER,
}
DEFAULT_GPU = "vllm"  # a GPU whose default stack has no profile here


def for_stack(name: str) -> RuntimeMemory:
    """A stack's reservation: its own entry, or its family's ("tensorrt-llm-0.11" ->
    "tensorrt-llm", "sglang-0.4" -> "sglang")."""
    if name in STACK_MEMORY:
        return STACK_MEMORY[name]
    family = max((k for k in STACK_MEMORY if name.startswith(k + "-")), key=len, default=None)
    if family is None:
        raise ConfigError(f"stack {name!r}: no runtime memory profile; families: "
                          f"{', '.join(sorted(STACK_MEMORY))} (chip/runtime_memory.py)")
    return STACK_MEMORY[family]


_OF: dict = {}


def of(chip: Any, options: Any = None) -> RuntimeMemory:
    """The runtime a chip is served by: a GPU's stack (its options' `stack`, else the default
    stack's), an RDU's runtime. The token budget and the PMU buffers follow the chip. Memoised
    by the chip's identity (a plan search asks thousands of times)."""
    key = (id(chip), getattr(options, "stack", ""))
    hit = _OF.get(key)
    if hit is not None and hit[0] is chip:
        return hit[1]
    if len(_OF) > 1024:
        _OF.clear()
    _OF[key] = (chip, _of(chip, options))
    return _OF[key][1]


def _of(chip: Any, options: Any) -> RuntimeMemory:
    if chip.kind != "gpu":
        return SN40L
    name = getattr(options, "stack", "") or _default_stack(chip)
    rm = for_stack(name)
    if rm.rule == "total" and rm.token_budget is not None:
        rm = replace(rm, token_budget=vllm_token_budget(chip.hbm.capacity_bytes, chip.name))
    if rm.rule == "total" and rm.max_running is None:
        rm = replace(rm, max_running=vllm_max_num_seqs(chip.hbm.capacity_bytes, chip.name))
    if rm.rule == "static":
        rm = replace(rm, token_budget=sglang_chunk(chip.hbm.capacity_bytes))
    return rm


def _default_stack(chip: Any) -> str:
    """The stack a GPU runs when none is named (chip/serving_stacks.py default_stack)."""
    from chip import serving_stacks  # it imports the execution model, which imports this

    return serving_stacks.default_stack(chip) or DEFAULT_GPU
