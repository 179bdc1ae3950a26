"""Run the measurement reference set (rdu_cluster/validation/measurements.toml): each measured or
published figure, the simulated one, the error and whether it is within the row's stated
tolerance.

A row's configuration is complete in the table; this module only maps a metric name to how it
is computed from `estimate` (or the interconnect, for a collective). Nothing here adjusts a model
to a measured value: rdu_cluster/validation/fit.py fits the unknown parameters to the rows whose
role is "calibrate", and only through a calibration profile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from chip.dataflow import DataflowOptions
from chip.execution import params_for
from chip.kernel_by_kernel import GpuOptions, GpuParams
from chip.serving_stacks import STACKS, default_options
from partitioning.estimate import Estimate, estimate, tp_comm_time
from partitioning.expert_routing import RoutingModel
from partitioning.plan import Plan
from partitioning.scenario import Scenario, tensor_plan
from rdu_cluster.config import MAX_SOCKETS, load_cluster
from rdu_cluster.engine import loop
from workloads import catalog, checks
from workloads.checks import MAX_BATCH
from workloads.dtypes import DType
from workloads.errors import ConfigError
from workloads.files import read_toml
from workloads.ops import Collective, CollectiveKind
from workloads.spec import with_dtypes
from workloads.traces import MAX_LENGTH

GIB = 2.0**30
# Options by name: what a case's `options` field may say.
OPTIONS: dict[str, Any] = {
    "default": None,
    "cuda_graphs": GpuOptions(cuda_graphs=True),
    "eager": GpuOptions(cuda_graphs=False),
    # [MICRO24]-era dataflow: fused layers, no KernelLooping / BatchStreaming.
    "micro24_fused_host": DataflowOptions(False, False, False, True),
    "micro24_fused_hw": DataflowOptions(False, False, True, True),
    "micro24_unfused_host": DataflowOptions(False, False, False, False),
    **STACKS,  # GPU serving-stack profiles: tensorrt-llm, vllm, sglang, eager
}
ROLES = ("calibrate", "check")
TIERS = ("primary", "vendor", "third-party")
# How a value row is summarized: a single system's speed (or time), or a ratio or fraction.
SPEED_METRICS = {
    "tokens_per_s", "spec_tokens_per_s", "e2e_tokens_per_s", "allreduce_time_us", "host_step_ms",
    "linear_time_us", "ttft_ms", "serve_output_tokens_per_s", "layer_kernel_us",
}
# The kernel classes a `layer_kernel_us` row may time (chip/kernel_efficiency.py).
LAYER_KERNELS = ("moe", "mla", "attention")
# Those whose rows are costed with a warm L2 where the replay's working set fits (_layer_kernel_us).
WARM_L2_KERNELS = ("mla", "attention")
# A kernel collector's "balanced" routing (StepShape.spread), and the same logits through the
# model's group-limited router ("balanced-grouped": StepShape.spread_grouped).
SPREAD_ROUTINGS = ("balanced", "balanced-grouped")


@dataclass(frozen=True)
class Result:
    id: str
    claim: str
    source: str
    role: str
    tier: str
    group: str  # "speed", "ratio" or "other" (accounting rows, bounds, ranges, categories)
    kind: str
    published: Any
    simulated: Any
    error: float | None  # relative error (value, range ends) or margin past a bound (negative)
    passed: bool
    tolerance: str
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def load_table(path: str | None = None) -> dict[str, Any]:
    """The bundled reference set, or a file of rows (`validate --cases`): every row checked
    (check_row) before any runs."""
    if path is None:
        text = resources.files("rdu_cluster").joinpath("validation/measurements.toml").read_text()
        table, where = tomllib.loads(text), "measurements.toml"
    else:
        table, where = read_toml(path, "--cases"), f"--cases {path}"
    checks.exact_keys(table, {"row"}, where, {"version"})
    rows = table["row"]
    if not isinstance(rows, list) or not rows or len(rows) > MAX_ROWS:
        raise ConfigError(f"{where}: row: expected 1 to {MAX_ROWS:,} [[row]] tables")
    ids: dict[str, int] = {}
    for i, row in enumerate(rows):
        check_row(row, f"{where}: row[{i}]")
        _check_row(row, f"{where}: row[{i}]")
        if ids.setdefault(row["id"], i) != i:  # results, LOO and --json are keyed by it
            raise ConfigError(f"{where}: row[{i}].id: {row['id']!r} is row[{ids[row['id']]}]'s "
                              "too; expected each id once")
    _check_refs(rows, where)
    return table


def _check_refs(rows: list[dict[str, Any]], where: str) -> None:
    """Every model and cluster a row names loads (each distinct one once): a row that cannot
    run is refused with the file, not met halfway through a run (or never, by `calibrate`,
    which runs only its calibrate rows)."""
    loaders: dict[str, Callable[[str], object]] = {
        "model": catalog.load_model, "draft": catalog.load_model, "models": catalog.load_model,
        "cluster": load_cluster, "baseline_cluster": load_cluster}
    seen: set[tuple[str, str]] = set()
    for i, row in enumerate(rows):
        for key, load in loaders.items():
            refs = row.get(key, [])
            for ref in refs if isinstance(refs, list) else [refs]:
                if (key, ref) in seen:
                    continue
                seen.add((key, ref))
                try:
                    load(ref)
                except ConfigError as e:
                    raise ConfigError(f"{where}: row[{i}].{key}: {e}") from None


# The kinds of a row's fields (the header of measurements.toml describes them); a field of the
# wrong type or out of range is refused before any row runs.
_TEXT = ("id", "source", "tier", "role", "system", "ambiguity", "claim", "metric", "model",
         "cluster", "kind", "tolerance_basis", "options", "draft", "baseline_cluster",
         "baseline_stack", "switch_model", "placement", "weights", "kv_dtype", "parallel",
         "routing", "plan", "kernel")
_COUNTS = {"tp": MAX_SOCKETS, "baseline_tp": MAX_SOCKETS, "ranks": MAX_SOCKETS,
           "batch": MAX_BATCH, "prompt_len": MAX_LENGTH, "gen_len": MAX_LENGTH,
           "experts": 2**16, "collective_bytes": 2**50, "spec_k": 64,
           "linear_in": 2**20, "linear_out": 2**20,
           # an offline throughput run (serve_output_tokens_per_s): requests and engine limits
           "requests": 100_000, "max_batch": MAX_BATCH, "token_budget": 2**26}
# Positive numbers: the HBM peak per socket a paper computes its fraction of roofline against.
_AMOUNTS = {"peak_hbm_bytes_per_s": 1e15}
_KINDS = ("value", "min", "max", "range", "argmax")
SERVE_FIELDS = ("tp", "prompt_len", "gen_len", "requests", "max_batch", "token_budget",
                "kv_fraction")
# A measured figure is a positive quantity (errors are relative to it); 10^15 is past every one
# a row can name (tokens/s, ms, GiB, ratios, fractions: the set's largest is ~10^3).
MAX_VALUE = 1e15
MAX_ROWS = 10_000


def check_row(row: Any, where: str) -> None:
    checks.exact_keys(row, ("id", "metric", "kind", "value"), where,
                      (*_TEXT, *_COUNTS, *_AMOUNTS, "rtol", "models", "kv_fraction"))
    for key in _TEXT:
        if key in row and not (isinstance(row[key], str) and row[key]):
            raise ConfigError(f"{where}.{key}: expected a non-empty string, got "
                              f"{checks.show(row[key])}")
    if not row["id"].isprintable():  # it heads a line of the validate table
        raise ConfigError(f"{where}.id: expected an id on one line (printable characters), got "
                          f"{checks.show(row['id'])}")
    for key, hi in _COUNTS.items():
        if key in row:
            checks.integer(row[key], f"{where}.{key}", 1, hi)
    for key, most in _AMOUNTS.items():
        if key in row:
            checks.number(row[key], f"{where}.{key}", 1.0, most)
    if "kv_fraction" in row:
        checks.number(row["kv_fraction"], f"{where}.kv_fraction", 0.0, 1.0, lo_open=True)
    if row.get("metric") == "serve_output_tokens_per_s" and (missing := [
            k for k in SERVE_FIELDS if k not in row]):
        raise ConfigError(f"{where}: metric serve_output_tokens_per_s needs {', '.join(missing)}")
    if row.get("routing") in SPREAD_ROUTINGS and row.get("metric") != "layer_kernel_us":
        raise ConfigError(f"{where}.routing: {row['routing']!r} (a kernel collector's routing) is "
                          "for metric layer_kernel_us; accepted here: uniform, identical")
    if row.get("metric") == "layer_kernel_us" and (missing := [
            k for k in ("model", "kernel") if k not in row]):
        raise ConfigError(f"{where}: metric layer_kernel_us needs {', '.join(missing)}")
    if "weights" in row:
        DType.parse(row["weights"], f"{where}.weights")
    if "plan" in row:
        try:
            Plan.parse(row["plan"])
        except ConfigError as e:
            raise ConfigError(f"{where}.plan: {e}") from None
    for key, accepted in (("kind", _KINDS), ("metric", tuple(METRICS)),
                          ("options", tuple(OPTIONS)),
                          ("routing", ("uniform", "identical", *SPREAD_ROUTINGS)),
                          ("kernel", LAYER_KERNELS)):
        if key in row and row[key] not in accepted:
            raise ConfigError(f"{where}.{key}: {row[key]!r}; accepted: {', '.join(accepted)}")
    if row.get("parallel", "column") not in ("column", "row"):
        raise ConfigError(f"{where}.parallel: {row['parallel']!r}; accepted: column, row")
    if "models" in row and not (isinstance(row["models"], list) and 1 <= len(row["models"]) <= 64
                                and all(isinstance(m, str) for m in row["models"])):
        raise ConfigError(f"{where}.models: expected a list of 1 to 64 model names")
    _check_value(row, where)


def _check_value(row: dict, where: str) -> None:
    value, kind = row["value"], row["kind"]
    if kind == "argmax":
        if not isinstance(value, str):
            raise ConfigError(f"{where}.value: kind argmax expects a model name")
    elif kind == "range":
        if not (isinstance(value, list) and len(value) == 2):
            raise ConfigError(f"{where}.value: kind range expects [lo, hi]")
        for j, v in enumerate(value):
            checks.number(v, f"{where}.value[{j}]", 0.0, MAX_VALUE, lo_open=True)
    else:
        checks.number(value, f"{where}.value", 0.0, MAX_VALUE, lo_open=True)
    if kind in ("value", "range"):
        checks.number(row.get("rtol"), f"{where}.rtol", 0.0, 10.0)


def load_cases(path: str | None = None) -> list[dict[str, Any]]:
    """The rows of the reference set (one concept: a measured figure and how to simulate it)."""
    return load_table(path)["row"]


def _check_row(row: dict[str, Any], where: str) -> None:
    """Role and tier: named with the file and the row like every other field (they were
    "measurements row ID: role None" for a --cases file's row without a role)."""
    for key, accepted in (("role", ROLES), ("tier", TIERS)):
        if key not in row:
            raise ConfigError(f"{where}.{key}: missing field; accepted: {', '.join(accepted)}")
        if row[key] not in accepted:
            raise ConfigError(f"{where}.{key}: {row[key]!r}; accepted: {', '.join(accepted)}")
    if row["role"] == "calibrate" and row.get("kind") != "value":
        raise ConfigError(f"{where}.kind: {row.get('kind')!r}; a calibrate row must be kind = "
                          "\"value\"")


def group_of(case: dict[str, Any]) -> str:
    if case["kind"] != "value" or case["metric"] in ACCOUNTING_METRICS:
        return "other"
    return "speed" if case["metric"] in SPEED_METRICS else "ratio"


def family_of(case: dict[str, Any]) -> str | None:
    """A stack-specific row's family: its serving stack on its chip ("sglang on h200-sxm"), or
    None for a row of no named stack (a chip's defaults, dataflow options)."""
    stack = case.get("options")
    if stack not in STACKS or "cluster" not in case:
        return None
    return f"{stack} on {_bare_chip(case['cluster']).name}"


def run(cases: list[dict[str, Any]] | None = None) -> list[Result]:
    return [run_case(c) for c in (cases if cases is not None else load_cases())]


def run_case(case: dict[str, Any]) -> Result:
    kind = case["kind"]
    metric = METRICS.get(case["metric"])
    if metric is None:
        raise ConfigError(f"measurements row {case['id']}: unknown metric {case['metric']!r}")
    if kind in ("range", "argmax"):
        values = {m: metric({**case, "model": m}) for m in case["models"]}
        return _judge_set(case, values)
    result = _judge(case, metric(case))
    if "switch_model" in case:  # validate says which switching model a row uses
        result = replace(result, detail={**result.detail, "switch_model": case["switch_model"]})
    return result


# ---- metrics --------------------------------------------------------------------------------


# Models and clusters loaded once per run of many rows (`memoised`), else None.
_MEMO: list[dict | None] = [None]


@contextlib.contextmanager
def memoised() -> Iterator[None]:
    """Within it, a row's model is loaded once per (name, weights, kv_dtype) and its cluster
    once per (name, overrides, the active profile's values), and rows asking again get the
    very same objects. The cost caches downstream are keyed by a model's and a chip's
    identity (partitioning/program.py, evaluate.py): a fit re-runs each calibrate row
    hundreds of times, and each load built a new model and chip that missed them all
    (validate: 103 refits). Scoped to a run, so a file edited between runs is read anew.
    The objects alive on entry are frozen out of the garbage collector's walks for the scope
    (engine/loop.frozen): a serving row's run otherwise collects and freezes the whole process
    at its start, 0.16 s a run with a fit's caches about. Results do not depend on either."""
    if _MEMO[-1] is not None:
        yield
        return
    _MEMO.append({})
    try:
        with loop.frozen():
            yield
    finally:
        _MEMO.pop()


def _memo(key: tuple, make: Callable[[], Any]) -> Any:
    memo = _MEMO[-1]
    if memo is None:
        return make()
    try:
        hit = memo.get(key)
    except TypeError:  # an unhashable override value
        return make()
    if hit is None:
        hit = memo[key] = make()
    return hit


def _spec(case: dict[str, Any]):
    """The row's model at the row's `weights` and `kv_dtype` (default the catalog's)."""
    row = f"measurements row {case['id']}"
    weights, kv = case.get("weights"), case.get("kv_dtype")
    return _memo(("model", case["model"], weights, kv), lambda: with_dtypes(
        catalog.load_model(case["model"]), weights, kv, f"{row}: weights", f"{row}: kv_dtype"))


def _cluster(ref: str, overrides: Mapping[str, Any] | None = None):
    """load_cluster(ref, overrides) under the active calibration profile (`memoised`)."""
    from rdu_cluster.validation import calibration

    profile = calibration.active()
    values = None if profile is None else tuple(sorted(profile.values.items()))
    over = tuple(sorted((overrides or {}).items()))
    return _memo(("cluster", ref, over, values), lambda: load_cluster(ref, overrides))


def _row_options(case: dict[str, Any]) -> Any:
    """The row's execution options: its named profile (`options`), else the chip's defaults."""
    return OPTIONS[case.get("options", "default")]


def _estimate(case: dict[str, Any], options: Any = "case", overrides: dict | None = None,
              **kw) -> Estimate:
    """The row's run: its model, cluster (with `overrides`), lengths, batch, TP degree, options
    and expert routing."""
    opts = (_row_options(case) if options == "case"
            else OPTIONS[options] if isinstance(options, str) else options)
    cluster = _cluster(case["cluster"], overrides)
    plan = (Plan.parse(case["plan"]) if "plan" in case
            else tensor_plan(cluster, case.get("tp")))
    scenario = Scenario(_spec(case), cluster, plan,
                        case.get("batch", 1), case.get("prompt_len", 1024),
                        case.get("gen_len", 128), opts,
                        RoutingModel(case.get("routing", "uniform")))
    return estimate(scenario, **kw)


def _serve_output_tokens_per_s(case: dict[str, Any]) -> float:
    """Output tokens/s of an offline throughput run, as trtllm-bench's `throughput` measures it:
    `requests` of the row's lengths all queued at once on one replica (`tp` GPUs of the row's
    cluster under its `plan`, default tensor parallel), served by the engine with in-flight
    batching and chunked prefill under the row's `max_batch`, `token_budget` and `kv_fraction`
    (the KV cache's share of what the weights leave), and its stack's scheduling policy
    (schedulers.scheduler_for: TensorRT-LLM's guaranteed-no-evict)."""
    from rdu_cluster.backends import make as make_backend
    from rdu_cluster.engine.schedulers import Limits, scheduler_for
    from rdu_cluster.engine.simulation import ServeConfig, Simulation
    from workloads import traces

    tp = case["tp"]
    fixed = traces.LengthDist
    trace = traces.synthetic(case["requests"], float("inf"), "fixed",
                             fixed("fixed", case["prompt_len"]), fixed("fixed", case["gen_len"]))
    # `plan`: the replica's plan in the partitioner's syntax over its `tp` GPUs (adp8ep8)
    options = _row_options(case)
    config = ServeConfig(plan=case.get("plan", f"tp{tp}"), kv_memory_fraction=case["kv_fraction"],
                         limits=Limits(case["max_batch"], case["token_budget"], True),
                         scheduler=scheduler_for(options), options=options)
    sim = Simulation(_spec(case), _cluster(case["cluster"], {"sockets": tp}), trace, config,
                     make_backend("local"))
    sim.summary_only = True  # its summary's throughput is all a row reads (no tables kept)
    return float(sim.run().summary["bench"]["output_throughput"])


def _scalar(x) -> float:
    return float(np.ravel(np.asarray(x, dtype=float))[0])


def _roofline_fraction(case) -> float:
    """Achieved speed over the memory/compute roofline of the same step (no communication:
    the roofline of the chip, as [DF] and [KL] use it). The roofline's HBM peak is the row's
    `peak_hbm_bytes_per_s` where the paper states the figure it divides by ([DF] Table 3:
    1.6 TB/s per SN40 socket), else the chip's own."""
    est = _estimate(case)
    peak = case.get("peak_hbm_bytes_per_s")
    over = None if peak is None else {"chip.tiers.hbm.bandwidth_bytes_per_s": peak}
    roof = _estimate(case, execution_model="roofline", overrides=over).decode
    ideal = _scalar(roof.time_s) - _scalar(roof.cause("communication"))
    return ideal / _scalar(est.tpot_s)


def _speedup(slow: str, fast: str) -> Callable[[dict], float]:
    def metric(case):
        return _scalar(_estimate(case, slow).tpot_s) / _scalar(_estimate(case, fast).tpot_s)

    return metric


def _e2e_tokens_per_s(case) -> float:
    """Output tokens/s including prefill, as end-to-end benchmarks report it: gen / latency."""
    est = _estimate(case)
    gen = _scalar(est.gen_len)
    return gen / (_scalar(est.ttft_s) + gen * _scalar(est.tpot_s))


def _allreduce_time_us(case) -> float:
    """One all-reduce over `ranks` GPUs: the interconnect's alpha-beta time plus the stack's
    software cost (NCCL or a custom kernel), as the GPU execution model charges it."""
    cluster = _cluster(case["cluster"])
    ranks = int(case["ranks"])
    c = Collective(CollectiveKind.ALL_REDUCE, float(case["collective_bytes"]), "attn_tp", ranks)
    opts = _row_options(case) or default_options()
    t = params_for(GpuParams, cluster.chip).collective_time(tp_comm_time(cluster, ranks), c, opts)
    return 1e6 * _scalar(t)


def _linear_time_us(case) -> float:
    """One linear layer's kernel on one GPU of a `tp`-way split, at `batch` tokens: a
    `linear_in` x `linear_out` weight (BF16, or the row's `weights`: FP8 runs W8A8 at the FP8
    rate) split by columns (QKV, gate/up: each GPU holds out / tp) or by rows (attention
    output, down: in / tp), as the GPU execution model costs a weighted kernel of a decode step
    (chip/kernel_by_kernel.py kernel_times: bytes after kernel_latency_s, or FLOPs; with the
    row's stack, its own GEMM figures where it has them)."""
    from chip.kernel_by_kernel import Kernel, kernel_times
    from workloads.ops import Op, OpClass

    opts = _row_options(case)
    chip, kern = _kernel_chip(case, opts)
    tp, tokens = case.get("tp", 1), case.get("batch", 1)
    n_in, n_out = case["linear_in"], case["linear_out"]
    if case.get("parallel", "column") == "column":
        n_out = n_out / tp
    else:
        n_in = n_in / tp
    bf16 = 2.0
    w = DType.parse(case.get("weights", "bf16"), f"measurements row {case['id']}: weights")
    op = Op("linear", OpClass.MATMUL, flops=2.0 * tokens * n_in * n_out,
            weight_bytes=w.bytes * n_in * n_out, act_in_bytes=bf16 * tokens * n_in,
            act_out_bytes=bf16 * tokens * n_out,
            flop_dtype=DType.FP8.value if w is DType.FP8 else DType.BF16.value,
            column_bytes=w.bytes * n_in)
    *_, t_mem, t_cmp = kernel_times(Kernel((op,)), chip, params_for(GpuParams, chip),
                                    stack=kern)
    return 1e6 * _scalar(np.maximum(t_mem, t_cmp))


@lru_cache(maxsize=32)
def _bare_chip(cluster: str):
    from rdu_cluster.validation import calibration

    with calibration.use(None):
        return load_cluster(cluster).chip


@lru_cache(maxsize=256)
def _chip_with(cluster: str, own: tuple):
    return dataclasses.replace(_bare_chip(cluster),
                               execution={**_bare_chip(cluster).execution, **dict(own)})


def _kernel_chip(case: dict[str, Any], options: Any):
    """The row's chip under the active profile and its stack's kernel figures: the bundled chip
    read once and each set of the profile's own values applied once (a fit asks a kernel row
    thousands of times, each under new values, most of them a stack's figures only)."""
    from chip.kernel_by_kernel import stack_kernels
    from chip.kernel_efficiency import is_stack_key
    from rdu_cluster.validation import calibration

    bare = _bare_chip(case["cluster"])
    profile = calibration.active()
    values = {} if profile is None else {k: v for (c, k), v in profile.values.items()
                                         if c == bare.name}
    own = tuple(sorted((k, v) for k, v in values.items() if not is_stack_key(k)))
    chip = _chip_with(case["cluster"], own)
    figures = {k: v for k, v in values.items() if is_stack_key(k)}
    return chip, stack_kernels(figures, options, True)


def _layer_kernel_us(case) -> float:
    """One decoder layer's kernels of the row's `kernel` class (moe: the fused MoE's grouped
    GEMMs; mla / attention: the decode attention kernel) on one GPU of a `tp`-way tensor split,
    in a decode step of `batch` sequences at a `prompt_len`-token context, as the GPU execution
    model costs them with the row's stack (chip/kernel_efficiency.py): what a per-kernel
    profile (AIConfigurator's collectors) times for that op of that layer. The attention and
    MLA collectors replay the op in a CUDA graph on the same KV cache (collector/helper.py
    benchmark_with_power: no cache flush between replays), so where everything its kernels
    touch fits the L2 it is read from there (kernel_times' `warm_l2`). The MoE collector's
    "balanced" routing (helper.py balanced_logits) picks the same experts every iteration too,
    so its one-token working sets (16-44 MB) would be warm as well; its rows do not show it
    (docs/calibration.md, "Serving-stack kernels") and are costed cold."""
    from chip.kernel_by_kernel import kernel_times, replay_bytes

    opts = _row_options(case) or GpuOptions()
    chip, kern = _kernel_chip(case, opts)
    p = params_for(GpuParams, chip)
    kernels = _layer_kernels(case["model"], case.get("weights"), case.get("kv_dtype"),
                             case.get("batch", 1), case.get("prompt_len", 1024),
                             case.get("tp", 1), case["kernel"], int(p.max_ops_per_kernel),
                             case.get("routing"))
    if not kernels:
        raise ConfigError(f"measurements row {case['id']}.kernel: model {case['model']} has no "
                          f"{case['kernel']!r} kernel; accepted: a kernel class its layers run")
    warm = case["kernel"] in WARM_L2_KERNELS and bool(replay_bytes(kernels) <= p.l2_bytes)
    total = sum(np.maximum(*kernel_times(k, chip, p, opts.split_kv, opts.gqa_packing,
                                         kern, warm_l2=warm)[3:]) for k in kernels)
    return 1e6 * _scalar(total)


@lru_cache(maxsize=4096)
def _layer_kernels(model: str, weights: str | None, kv_dtype: str | None, batch: int,
                   context: int, tp: int, kernel: str, max_ops: int,
                   routing: str | None) -> tuple:
    """The kernels of `kernel` class in the first layer of the model that runs one (its work
    does not depend on a profile: a fit re-costs them, never rebuilds them). `routing`: the
    row's; a SPREAD_ROUTINGS one routes the tokens to disjoint experts (StepShape.spread)."""
    from chip.kernel_by_kernel import fuse
    from chip.kernel_efficiency import kernel_class
    from workloads.graph import layer_ops
    from workloads.ops import Shard, StepShape
    from workloads.spec import layer_runs

    spec = with_dtypes(catalog.load_model(model), weights, kv_dtype, "weights", "kv_dtype")
    shape = replace(StepShape.decode(batch, context), spread=routing in SPREAD_ROUTINGS,
                    spread_grouped=routing == "balanced-grouped")
    for _, _, layer in layer_runs(spec.layers):
        ops = tuple(layer_ops(spec, layer, shape, Shard.tensor(tp)))
        kernels = tuple(k for k in fuse(ops, max_ops)
                        if not k.is_collective and kernel_class(k.anchor) == kernel)
        if kernels:
            return kernels
    return ()


def _tp_speedup(case) -> float:
    slow = _estimate({**case, "tp": case["baseline_tp"]})
    return _scalar(slow.tpot_s) / _scalar(_estimate(case).tpot_s)


def _hosting_nodes(case) -> float:
    """Nodes a system needs to host `experts` copies of `model` in the row's `placement`
    ("tiered": experts in the capacity tier; "hbm": all resident in HBM)."""
    from rdu_cluster.scenarios.hosting import footprint

    fp = footprint(case["experts"], case["model"], _cluster(case["cluster"]))
    (placement,) = [p for p in fp.placements if p.name == case["placement"]]
    return float(placement.nodes) if placement.fits else float("inf")


ACCOUNTING_METRICS = {
    "weight_gib", "kv_gib", "model_gib_per_token", "gflop_per_token", "flop_per_byte",
    "hosting_nodes",
}

METRICS: dict[str, Callable[[dict], float]] = {
    "e2e_tokens_per_s": _e2e_tokens_per_s,
    "serve_output_tokens_per_s": _serve_output_tokens_per_s,
    "allreduce_time_us": _allreduce_time_us,
    "linear_time_us": _linear_time_us,
    "layer_kernel_us": _layer_kernel_us,
    "tp_speedup": _tp_speedup,
    "hosting_nodes": _hosting_nodes,
    "host_step_ms": lambda c: 1e3 * _scalar(_estimate(c).decode.cause("host")),
    # the batch's prefill and first token, as a latency benchmark with one output token times it
    "ttft_ms": lambda c: 1e3 * _scalar(_estimate(c).ttft_s),
    "weight_gib": lambda c: _estimate(c).weight_bytes / GIB,
    "kv_gib": lambda c: _scalar(_estimate(c).kv_cache_bytes) / GIB,
    "model_gib_per_token": lambda c: (
        (_estimate(c).weight_bytes + _scalar(_estimate(c).kv_cache_bytes))
        / _scalar(np.asarray(c.get("batch", 1)))
        / GIB
    ),
    "gflop_per_token": lambda c: _scalar(_estimate(c).flops_per_token) / 1e9,
    "flop_per_byte": lambda c: (
        _scalar(_estimate(c).flops_per_token) / _scalar(_estimate(c).bytes_per_token)
    ),
    "tokens_per_s": lambda c: _scalar(_estimate(c).tokens_per_s_per_request),
    "hbm_bw_utilization": lambda c: _scalar(_estimate(c).hbm_bw_utilization),
    "roofline_fraction": _roofline_fraction,
    "fusion_speedup": _speedup("micro24_unfused_host", "micro24_fused_host"),
    "orchestration_speedup": _speedup("micro24_fused_host", "micro24_fused_hw"),
}

# Speculative decoding and Composition of Experts (rdu_cluster/scenarios/speculative.py, rdu_cluster/scenarios/coe.py).
from rdu_cluster.scenarios.coe import VALIDATION_METRICS as _COE_METRICS
from rdu_cluster.scenarios.speculative import VALIDATION_METRICS as _SPEC_METRICS

METRICS.update(_SPEC_METRICS)
METRICS.update(_COE_METRICS)


# ---- judging ----------------------------------------------------------------------------------


def _judge(case: dict[str, Any], sim: float) -> Result:
    kind, pub = case["kind"], case["value"]
    if kind == "value":
        err = (sim - pub) / pub
        passed, tol = abs(err) <= case["rtol"], f"±{case['rtol']:.0%}"
    elif kind == "min":
        err, passed, tol = (sim - pub) / pub, sim >= pub, f">= {pub:g}"
    elif kind == "max":
        err, passed, tol = (pub - sim) / pub, sim <= pub, f"<= {pub:g}"
    else:
        raise ConfigError(f"measurements row {case['id']}: unknown kind {kind!r}")
    return _result(case, sim, err, passed, tol)


def _judge_set(case: dict[str, Any], values: dict[str, float]) -> Result:
    pub = case["value"]
    if case["kind"] == "argmax":
        best = max(values, key=values.__getitem__)
        return _result(case, best, None, best == pub, "categorical", values)
    lo, hi = min(values.values()), max(values.values())
    err_lo, err_hi = (lo - pub[0]) / pub[0], (hi - pub[1]) / pub[1]
    err = max(err_lo, err_hi, key=abs)
    passed = abs(err_lo) <= case["rtol"] and abs(err_hi) <= case["rtol"]
    return _result(case, [lo, hi], err, passed, f"ends ±{case['rtol']:.0%}", values)


def _result(case, sim, err, passed, tol, detail=None) -> Result:
    return Result(
        id=case["id"],
        claim=case["claim"],
        source=case["source"],
        role=case["role"],
        tier=case["tier"],
        group=group_of(case),
        kind=case["kind"],
        published=case["value"],
        simulated=sim,
        error=None if err is None else float(err),
        passed=bool(passed),
        tolerance=tol,
        detail=detail or {},
    )


def format_value(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in x) + "]"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
