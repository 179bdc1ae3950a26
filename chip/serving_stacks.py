"""Named GPU serving-stack profiles: what a kernel-by-kernel step pays besides its kernels.

A profile fixes three choices of the stack (interpretation: docs/execution_models.md):
- `cuda_graphs`: a decode step replayed as one CUDA graph (one launch, shorter kernel gaps);
- `host`: which per-step host time the chip TOML's [execution] gives it -- "cpp" (`host_step_s`:
  a C++ runtime) or "python" (`python_host_step_s`: a Python engine that schedules, prepares
  inputs, samples and detokenizes between steps); `overlap_host`: that work is done while the
  GPU runs the previous step, so only what outlasts the step is exposed;
- `allreduce`: "nccl" (`nccl_overhead_s` on top of the interconnect's alpha-beta time) or
  "custom" (a one-shot NVLink all-reduce kernel of the stack: `custom_allreduce_s`);
- `split_kv`: decode attention splits each sequence's context over thread blocks; off, one
  block streams each (sequence, KV head) at `sm_stream_bytes_per_s`;
- `gqa_packing`: a GQA group's query heads share one read of their KV head; off, each query
  head's block reads it (a group's worth of SM-side traffic).
Which stack uses what is public documentation of each project (cited per entry); the seconds are
parameters of the chip, each with its basis and calibration status (docs/calibration.md).

A GPU always runs a named stack: `--stack`, or DEFAULT_STACK (why that one:
docs/execution_models.md, "GPU serving stacks"); the execution model's bare GpuOptions()
is never what a command runs. A profile is one GpuOptions; what a stack adds beyond its
execution options (kernel efficiencies, the memory its runtime reserves) belongs on it as
fields, so that every path that names the stack carries them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from chip.kernel_by_kernel import GpuOptions
from chip.kernel_efficiency import VERSIONS
from chip.spec import ChipSpec
from workloads.errors import ConfigError

STACKS: dict[str, GpuOptions] = {
    # TensorRT-LLM: C++ runtime (in-flight batching in C++), CUDA graphs for generation. It ships
    # a custom all-reduce plugin, but [DF]'s Fig. 1 run does not say which one was used; NCCL is
    # taken (the library's default path, and the only one with public latency measurements).
    "tensorrt-llm": GpuOptions(cuda_graphs=True, host="cpp", allreduce="nccl",
                               stack="tensorrt-llm"),
    # TensorRT-LLM 0.11 as Argonne's LLM-Inference-Bench ran it (argonne-lcf/LLM-Inference-Bench
    # TensorRT-LLM/H100: requirements.txt pins tensorrt_llm==0.11.0; run.py drives
    # ModelRunnerCpp without CUDA graphs, and its --multi_block_mode flag, off unless given, was
    # not given): the engine's kernels issued per step, one thread block per context in the
    # generation attention kernel, and trtllm-build's custom all-reduce plugin (its
    # --use_custom_all_reduce defaulted to enable up to 0.11). GQA groups unpacked: a block per
    # query head, as the masked MHA kernel runs; whether XQA (which packs them) ran is not in
    # the scripts, and the measurements say not: Llama-3-8B (GQA, 4 query heads a KV head) at
    # batch 16-64 is as slow as that reading predicts, Llama-2-7B (MHA) indifferent to it.
    "tensorrt-llm-0.11": GpuOptions(cuda_graphs=False, host="cpp", allreduce="custom",
                                    split_kv=False, gqa_packing=False,
                                    stack="tensorrt-llm-0.11"),
    # vLLM (v0.x, as profiled by Vidur): Python scheduler and input preparation between steps,
    # CUDA graphs for decode, its custom all-reduce for TP <= 8 on NVLink (vLLM docs,
    # `disable_custom_all_reduce=False` by default). Decode attention: its PagedAttention kernel
    # (vllm/attention/backends/flash_attn.py of v0.4-0.5: flash-attn for prefill, PagedAttention
    # for decode), whose grid has a block per query head and sequence (v2: and 512-token
    # partition): contexts split, GQA groups not packed.
    "vllm": GpuOptions(cuda_graphs=True, host="python", allreduce="custom", gqa_packing=False,
                       stack="vllm"),
    # SGLang: CUDA graphs for decode, custom all-reduce (from vLLM), and an overlap scheduler
    # that prepares the next batch while the GPU runs (SGLang v0.4 release notes): its Python
    # host work shows only where it outlasts the GPU's step.
    "sglang": GpuOptions(cuda_graphs=True, host="python", overlap_host=True, allreduce="custom",
                         stack="sglang"),
    # A plain eager PyTorch loop (no graphs), NCCL: the stack behind Vidur's profiles, Sarathi-Serve
    # (a research fork of vLLM 0.2-0.3; microsoft/vidur's profiling imports `sarathi`), whose
    # operators Vidur times eagerly. Its host loop was measured apart (Vidur's CPU-overhead
    # profile), so it carries host figures of its own (chip/kernel_efficiency.py HOST).
    "eager": GpuOptions(cuda_graphs=False, host="python", allreduce="nccl", stack="eager"),
}

# Releases of a stack whose kernels were measured apart (chip/kernel_efficiency.py VERSIONS): the
# base's host, graph and all-reduce choices, but for those the release changes (with sources).
STACKS.update({v: replace(STACKS[base], stack=v, **changes)
               for v, (base, changes) in VERSIONS.items()})


# Stacks whose scheduler chunks prefills beside the decodes by default (the serving engine's
# --chunked-prefill where none is given: rdu_cluster/engine/schedulers chunked_prefill_for), a
# release as its family: vLLM, always in V1 (vLLM docs, "Optimization and Tuning": chunked
# prefill is always enabled by default in V1) and in V0 from 0.5 for a model whose context
# exceeds 32K tokens; Sarathi-Serve (`eager`), whose point is its chunked, stall-free batching.
# SGLang chunks a long prompt into prefill-only steps (no decodes mixed in unless
# --enable-mixed-chunk) and TensorRT-LLM leaves chunked context off: neither mixes.
CHUNKED_PREFILL = frozenset({"vllm", "eager"})


# A stack's scheduling policy where it differs from the engine's default (continuous batching
# as vLLM and SGLang run it), a release as its family: TensorRT-LLM's capacity scheduler
# admits only what can run to completion without eviction (GUARANTEED_NO_EVICT, its default:
# TensorRT-LLM docs, "Useful Runtime Options"; SchedulerConfig.capacity_scheduler_policy).
SCHEDULERS = {"tensorrt-llm": "guaranteed-no-evict"}


def scheduler_of(options: Any) -> str | None:
    """The scheduling policy the stack `options` name runs by default (None: the engine's)."""
    return SCHEDULERS.get(_family(getattr(options, "stack", "") or ""))


FAMILIES = ("tensorrt-llm", "vllm", "sglang", "eager")


def _family(name: str) -> str:
    """A stack's family, the profile a release or version extends ("sglang-0.5.10" ->
    "sglang", "tensorrt-llm-0.11" -> "tensorrt-llm"), as chip/runtime_memory.py's for_stack
    reads its name."""
    return next((b for b in FAMILIES if name == b or name.startswith(b + "-")), name)


def chunks_prefill(options: Any) -> bool:
    """Whether the stack `options` name mixes prefill chunks into decode steps by default."""
    return _family(getattr(options, "stack", "") or "") in CHUNKED_PREFILL


def spills_prefix_cache(chip: ChipSpec) -> bool:
    """Whether the runtime serving `chip` keeps its prefix cache in the tier below HBM too by
    default (the serving engine's --prefix-cache where none is given). An RDU's does: its DDR
    holds prompt caches beside other models (seed 002). No GPU stack does: SGLang's radix
    cache stays in GPU memory unless --enable-hierarchical-cache (HiCache, off by default:
    server_args.py), vLLM's automatic prefix caching offloads to the CPU only through a KV
    connector it is given (LMCache, OffloadingConnector), TensorRT-LLM's block reuse only to a
    host_cache_size it is given (KvCacheConfig: 0 by default)."""
    return chip.kind != "gpu"


# The stack a GPU runs when none is named. SGLang: a current engine whose defaults are public
# (python/sglang/srt/server_args.py: disable_cuda_graph, disable_custom_all_reduce and
# disable_overlap_schedule all False; FlashInfer / FA3 decode attention, which split the context
# and pack GQA groups), the engine DeepSeek-V3's model card lists first for serving it, and the
# profile that measured current-engine figures on Hopper agree with (docs/execution_models.md).
DEFAULT_STACK = "sglang"


def stack(name: str, where: str = "--stack") -> GpuOptions:
    try:
        return STACKS[name]
    except KeyError:
        raise ConfigError(
            f"{where}: {name!r} unknown; accepted: {', '.join(sorted(STACKS))}"
        ) from None


def default_stack(chip: ChipSpec) -> str | None:
    """The stack `chip` runs when none is named: DEFAULT_STACK on a GPU; None elsewhere (an
    RDU socket's runtime is its execution model, not a serving engine)."""
    return DEFAULT_STACK if chip.kind == "gpu" else None


def options_for(chip: ChipSpec, name: str | None, where: str = "--stack",
                system: str = "") -> GpuOptions | None:
    """The execution options of stack `name` (default: default_stack) on `chip`. A stack named
    for a chip that is not a GPU is refused (`system`: the cluster, for the message)."""
    profile = stack(DEFAULT_STACK if name is None else name, where)  # known, or refused
    if chip.kind != "gpu":
        if name is not None:
            raise ConfigError(
                f"{where}: {name!r} is a GPU serving stack; {system or chip.name} runs "
                f"{chip.name} sockets ({chip.execution_model}), which take none")
        return None
    return profile


def pool_options(chips: Sequence[tuple[ChipSpec, str]], name: str | None,
                 where: str = "--stack") -> list[GpuOptions | None]:
    """Each pool's options under stack `name` (default: default_stack) of a disaggregated
    deployment, `chips`: each pool's chip and name, prefill first. The stack runs the GPU pools;
    a pool of another chip takes none (it runs its own execution model). A stack named where no
    pool is a GPU is refused, as options_for refuses it."""
    if name is not None and all(c.kind != "gpu" for c, _ in chips):
        options_for(chips[0][0], name, where, chips[0][1])  # refuses
    return [options_for(c, pool_stack(c, name), where, s) for c, s in chips]


def pool_stack(chip: ChipSpec, name: str | None) -> str | None:
    """The stack a pool of a disaggregated deployment takes of the deployment's `name`: the
    stack on a GPU pool; none on another chip (pool_options)."""
    return name if chip.kind == "gpu" else None


def stack_of(chip: ChipSpec, options: Any) -> str | None:
    """The stack a run on `chip` with `options` used (the `stack` field of results): the
    profile's name, DEFAULT_STACK where none was given, "custom" for GpuOptions no profile
    named; None off a GPU."""
    if chip.kind != "gpu":
        return None
    if options is None:
        return DEFAULT_STACK
    return getattr(options, "stack", "") or "custom"


def default_options() -> GpuOptions:
    """What the GPU execution model runs when given no options: the default stack."""
    return STACKS[DEFAULT_STACK]
