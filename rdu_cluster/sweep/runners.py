"""Built-in sweep runners. `simulate`: the plan evaluator (partitioning.evaluate, through
partitioning.estimate) of decode and prefill, one row per point, with points that differ only in
batch / prompt / generation length costed by one vectorized call. In every kind a point that
does not fit (or cannot run) is a row with feasible = false and the reason, and is listed in the
manifest as well. `plan`: the best plan of a plan search per point. `serve`: one
serving simulation (the engine's Simulation on its local backend) per point, its summary a row.

Nested fields: `options.<toggle>` (DataflowOptions on RDU clusters, GpuOptions on GPU clusters;
a toggle of the other chip kind is ignored there), `chip.<path>`, `topology.<path>` and
`cost.<path>` (overrides of the cluster config, e.g. chip.tiers.hbm.bandwidth_bytes_per_s, the
same paths as `--set`: rdu_cluster.config), `sockets`, `sockets_per_node`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa

from rdu_cluster.config import DEFAULT_FABRIC, MAX_SOCKETS, OVERRIDE_PREFIXES, is_override
from rdu_cluster.engine import evictions, prefix_cache, replica_routing, schedulers
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.sweep.fields import (
    FieldDef,
    Namespace,
    boolean,
    choice,
    dtype,
    float_in,
    fraction,
    int_in,
    length_dist,
    nonnegative_int,
    positive_int,
    scalar,
    text,
)
from rdu_cluster.sweep.registry import Point, Runner, RunOutput, register
from workloads import checks, sessions, traces
from workloads.checks import MAX_BATCH
from workloads.errors import ConfigError
from workloads.spec import check_context
from workloads.traces import MAX_LENGTH, MAX_REQUESTS

if TYPE_CHECKING:
    from rdu_cluster.engine.disagg import Pool

VECTOR = ("batch", "prompt_len", "gen_len")
# The cluster-config override fields (OVERRIDE_SCALARS, OVERRIDE_PREFIXES): a point's value goes
# to load_cluster(overrides=...) as is, as --set's do.
_OVERRIDE_DOCS = {
    "chip.": "chip config override, e.g. chip.tiers.hbm.*",
    "topology.": "topology override, e.g. topology.link_latency_s",
    "cost.": "cost override, e.g. cost.socket_hour_usd",
}
# The toggles the contract names, used where chip/ does not define its options classes yet.
FALLBACK_TOGGLES = {
    "rdu": ("kernel_looping", "batch_streaming", "schedule_offloading", "fused"),
    "gpu": ("cuda_graphs", "overlap_comm"),
}
OPTION_CLASSES = {
    "rdu": (("chip.dataflow", "DataflowOptions"),),
    "gpu": (("chip.dataflow", "GpuOptions"), ("chip.kernel_by_kernel", "GpuOptions")),
}


@functools.cache
def option_classes() -> dict[str, type]:
    """Chip kind -> its options dataclass, where chip/ defines one."""
    out: dict[str, type] = {}
    for kind, places in OPTION_CLASSES.items():
        for module, name in places:
            try:
                out[kind] = getattr(importlib.import_module(module), name)
                break
            except (ImportError, AttributeError):
                continue
    return out


def toggles(kind: str) -> tuple[str, ...]:
    cls = option_classes().get(kind)
    if cls is None or not dataclasses.is_dataclass(cls):
        return FALLBACK_TOGGLES[kind]
    return tuple(f.name for f in dataclasses.fields(cls))


def simulate_fields() -> dict[str, FieldDef]:
    i64, s = pa.int64(), pa.string()
    fields = [
        FieldDef("model", text, s, column="model_ref", doc="catalog name or config.json path"),
        FieldDef("cluster", text, s, column="cluster_ref", doc="cluster name or TOML path"),
        FieldDef("batch", int_in(1, MAX_BATCH), i64, default=1),
        FieldDef("prompt_len", int_in(1, MAX_LENGTH), i64, default=1024),
        FieldDef("gen_len", int_in(1, MAX_LENGTH), i64, default=256),
        FieldDef("tp", int_in(1, MAX_SOCKETS), i64, doc="tensor-parallel degree [all sockets]"),
        FieldDef("weights", dtype, s, column="weights_dtype"),
        FieldDef("kv_dtype", dtype, s, column="kv_dtype"),
        FieldDef("execution_model", text, s, doc="[the chip's]"),
        FieldDef("stack", text, s, doc="GPU serving stack (chip/serving_stacks.py) [the "
                 "default stack]; refused on a chip that takes none (RDU)"),
        FieldDef("sockets", int_in(1, MAX_SOCKETS), i64, doc="override of the cluster's socket count"),
        FieldDef("sockets_per_node", int_in(1, MAX_SOCKETS), i64, column="sockets_per_node"),
        FieldDef("plan", text, s, doc="e.g. tp4pp2 [tp over all sockets]; the row says its name"),
        FieldDef("calibration", text, s, default="default",
                 doc="calibration profile name or path, or none (as --calibration)"),
    ]
    return {f.name: f for f in fields}


def simulate_namespaces() -> tuple[Namespace, ...]:
    names = frozenset(toggles("rdu")) | frozenset(toggles("gpu"))
    return (
        Namespace("options.", boolean, names, doc="optimization toggles"),
        *(Namespace(p, scalar, doc=_OVERRIDE_DOCS[p]) for p in OVERRIDE_PREFIXES),
    )


def cluster_overrides(fields: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, v) for k, v in fields.items() if is_override(k)))


def option_values(fields: Mapping[str, Any]) -> tuple[tuple[str, bool], ...]:
    return tuple(sorted((k[8:], v) for k, v in fields.items() if k.startswith("options.")))


# Workers build each cluster and model once per process; a sweep reuses a few of them a lot.
# The calibration profile is a field of the point (its name or path), not the driver's active
# profile, so a Ray worker applies the same values as a local run and the rows are the same.
@functools.lru_cache(maxsize=256)
def cached_cluster(ref: str, overrides: tuple[tuple[str, Any], ...],
                   profile: str = "default"):
    from rdu_cluster.config import load_cluster
    from rdu_cluster.validation import calibration

    with calibration.use(cached_profile(profile)):
        return load_cluster(ref, dict(overrides))


@functools.lru_cache(maxsize=16)
def cached_profile(profile: str):
    from rdu_cluster.validation import calibration

    return calibration.load(profile)


def point_cluster(f: Mapping[str, Any]):
    """The cluster of a point: its reference, overrides and calibration profile."""
    return cached_cluster(f["cluster"], cluster_overrides(f), f.get("calibration") or "default")


def point_profile(f: Mapping[str, Any]):
    """The point's calibration profile made active: its intervals are that profile's
    (rdu_cluster/validation/uncertainty.py reads the active one)."""
    from rdu_cluster.validation import calibration

    return calibration.use(cached_profile(f.get("calibration") or "default"))


@functools.lru_cache(maxsize=256)
def cached_model(ref: str, weights: str | None, kv: str | None):
    from workloads.catalog import load_model
    from workloads.dtypes import DType

    spec = load_model(ref)
    p = spec.precision
    if weights:  # one weight dtype for all: as `simulate --weights` does
        p = dataclasses.replace(p, weights=DType(weights), expert_weights=None)
    if kv:
        p = dataclasses.replace(p, kv_cache=DType(kv))
    return spec.with_precision(p)


def make_options(chip, values: tuple[tuple[str, bool], ...], stack: str | None = None) -> Any:
    """A point's execution options: on a GPU its serving stack (`stack`, or the default;
    chip/serving_stacks.py) with the toggles the point sets applied over it, the stack's name
    then saying so ("sglang (cuda_graphs=False)"); elsewhere the toggles. None where it sets
    neither (the execution model's default: on a GPU, the default stack). A stack on a chip
    that takes none is refused."""
    from chip import serving_stacks

    base = serving_stacks.options_for(chip, stack, where="--stack")
    mine = {k: v for k, v in values if k in toggles(chip.kind)}
    if not mine:  # None: the execution model's own default (the default stack on a GPU)
        return base if stack else None
    if base is not None:
        changed = ", ".join(f"{k}={v}" for k, v in sorted(mine.items()))
        # mypy matches **mine to every field, the str `stack` too; mine holds bool toggles only
        return dataclasses.replace(base, **mine,  # type: ignore[arg-type]
                                   stack=f"{base.stack} ({changed})")
    cls = option_classes().get(chip.kind)
    if cls is None:
        raise ConfigError(
            f"options.{min(mine)}: this build has no {chip.kind} options (chip.dataflow) yet"
        )
    return cls(**mine)


def check_simulate(points: Sequence[Point], origin: Mapping[str, str]) -> None:
    """Load every distinct cluster and model once, so that a bad name or override fails before
    anything runs, naming where in the spec it came from."""
    clusters, models = set(), set()
    engines: dict[tuple[str, tuple], Point] = {}  # (execution model, cluster key) -> a point
    for p in points:
        key = (p.fields["cluster"], cluster_overrides(p.fields),
               p.fields.get("calibration") or "default")
        clusters.add(key)
        models.add((p.fields["model"], p.get("weights"), p.get("kv_dtype")))
        if p.get("execution_model"):
            engines.setdefault((p.get("execution_model"), key), p)
    for ref, over, profile in sorted(clusters, key=repr):
        _blame(functools.partial(cached_cluster, ref, over, profile),
               ["cluster", "calibration", *dict(over)], origin)
    for ref, w, kv in sorted(models, key=repr):
        _blame(
            functools.partial(cached_model, ref, w, kv), ["model", "weights", "kv_dtype"], origin
        )
    _check_stacks(points, origin)
    if engines:
        from chip import execution

        for name in sorted({name for name, _ in engines}):
            _blame(functools.partial(execution.get, name), ["execution_model"], origin)
        for (name, key), p in engines.items():
            chip = cached_cluster(*key).chip
            try:
                execution.check_runs_on(name, chip)
            except ConfigError as e:
                raise ConfigError(f"{origin.get('execution_model', 'base')}.{e} (the point "
                                  f"with cluster {p.fields['cluster']!r}: a filter can drop "
                                  "such points)") from None


def _check_stacks(points: Sequence[Point], origin: Mapping[str, str]) -> None:
    """A stack that is no stack, or named for a chip that takes none, as `--stack` refuses it."""
    from chip import serving_stacks

    seen = set()
    for p in points:
        name = p.fields.get("stack")
        key = (name, p.fields["cluster"], cluster_overrides(p.fields))
        if name is None or key in seen:
            continue
        seen.add(key)
        cluster = point_cluster(p.fields)
        try:
            serving_stacks.options_for(cluster.chip, name, system=cluster.name)
        except ConfigError as e:
            raise ConfigError(f"{origin.get('stack', 'base')}.stack: {_unflag(str(e))}") from None


def check_simulate_plans(points: Sequence[Point], origin: Mapping[str, str]) -> None:
    """check_simulate, and a plan that is no plan at all, beside tp, or whose sockets do not
    divide its cluster's (as `simulate --tp/--plan` and a serve sweep refuse it): spec errors,
    where a plan whose model does not fit in memory is an infeasible point."""
    from partitioning.plan import Plan

    check_simulate(points, origin)
    for ref in sorted({p.fields["plan"] for p in points if "plan" in p.fields}):
        try:
            Plan.parse(ref)
        except ConfigError as e:
            raise ConfigError(f"{origin.get('plan', 'base')}.plan: {_unflag(str(e))}") from None
    if any("plan" in p.fields and "tp" in p.fields for p in points):
        raise ConfigError(f"{origin.get('plan', 'base')}.plan: not with tp (give one of them)")
    _check_divides(points, origin)


def _check_divides(points: Sequence[Point], origin: Mapping[str, str]) -> None:
    """Each point's tp or plan uses a number of sockets that divides its cluster's."""
    from partitioning.plan import Plan

    seen = set()
    for p in points:
        f = p.fields
        field = "tp" if "tp" in f else "plan" if "plan" in f else None
        key = (field, None if field is None else f.get(field), f["cluster"],
               cluster_overrides(f), f.get("calibration"))
        if field is None or key in seen:
            continue
        seen.add(key)
        cluster = point_cluster(f)
        used = f["tp"] if field == "tp" else Plan.parse(f["plan"]).sockets
        if cluster.sockets % used:  # a plan wider than the cluster too
            uses = "" if field == "tp" else f" uses {used} sockets, which"
            raise ConfigError(f"{origin.get(field, 'base')}.{field}: {checks.show(f[field])}"
                              f"{uses} does not divide the {cluster.sockets} sockets of "
                              f"{cluster.name}")


def _blame(load, fields: Sequence[str], origin: Mapping[str, str]) -> None:
    """Run `load`; a ConfigError is prefixed with the spec field it most likely comes from: an
    override whose name the message mentions, else the first field (the cluster or model)."""
    try:
        load()
    except ConfigError as e:
        text = str(e)
        named = [f for f in fields[1:] if f.rsplit(".", 1)[-1] in text]
        field = (named or list(fields))[0]
        raise ConfigError(f"{origin.get(field, 'base')}.{field}: {text}") from None


def run_simulate(points: Sequence[Point], seed: int) -> RunOutput:
    """Deterministic and seed-free: the analytic estimate has no randomness."""
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        key = tuple(sorted((k, v) for k, v in p.fields.items() if k not in VECTOR))
        groups.setdefault(key, []).append(p)
    tables, infeasible = [], {}
    for pts in groups.values():
        tbl, bad = _run_group(pts)
        infeasible.update(bad)
        if tbl is not None:
            tables.append(tbl)
    return RunOutput(pa.concat_tables(tables) if tables else None, infeasible)


def _run_group(points: list[Point]) -> tuple[pa.Table | None, dict[str, str]]:
    """One vectorized evaluation of every point of the group. A point that does not fit is a
    row all the same: feasible = false, its reason (the footprint check's one message), its
    footprint columns, and null speed columns."""
    from partitioning.estimate import estimate
    from partitioning.scenario import Scenario, tensor_plan
    from rdu_cluster.output import results

    f = points[0].fields
    cluster = point_cluster(f)
    model = cached_model(f["model"], f.get("weights"), f.get("kv_dtype"))
    options = make_options(cluster.chip, option_values(f), f.get("stack"))
    engine = f.get("execution_model")
    arr: dict[str, Any] = {k: np.array([p.fields[k] for p in points], dtype=float)
                           for k in VECTOR}  # Any: mypy matches **arr to all of Scenario's
    try:
        plan = f["plan"] if "plan" in f else tensor_plan(cluster, f.get("tp"))
        est = estimate(Scenario(model, cluster, plan, options=options, **arr), check=False,
                       execution_model=engine)
    except ConfigError as e:  # the plan cannot run this model here at all: every point says so
        bad = {p.id: str(e) for p in points}
        tbl = results.table([{"model": model.name, "cluster": cluster.name, **p.fields,
                              "feasible": False, "infeasible_reason": str(e)} for p in points])
    else:
        est = _context_misfit(model, points, est)
        misfit = np.broadcast_to(np.asarray(est.misfit, dtype=object), (len(points),))
        bad = {p.id: str(why) for p, why in zip(points, misfit) if why}
        # with the cluster, as `simulate` gives records(): its energy and cost columns
        with point_profile(f):
            tbl = results.estimate_table(est, cluster.chip.name,
                                         engine or cluster.chip.execution_model,
                                         cluster=cluster)
        if bad:
            tbl = _null_speed(tbl, pa.array(misfit == ""))
    n = len(points)
    tbl = tbl.append_column("point_id", pa.array([p.id for p in points], pa.string()))
    chip = cluster.chip
    # the peak the estimate costed every op at: its activations' (workloads.graph flop_dtype),
    # not the weights' (fp8 weights still multiply in bf16), so the roofline's roof is its own
    peak = chip.flops(model.precision.activations.value)
    tbl = tbl.append_column("chip_peak_flops_per_s", pa.array(np.full(n, peak)))
    hbm_bw = chip.hbm.bandwidth_bytes_per_s
    tbl = tbl.append_column("chip_hbm_bandwidth_bytes_per_s", pa.array(np.full(n, hbm_bw)))
    return tbl, bad


def _context_misfit(model, points: Sequence[Point], est):
    """The estimate with each point longer than the model's context window (as `simulate`
    refuses it) marked as not fitting, with that reason before the footprint's."""
    reasons = {}
    for i, p in enumerate(points):
        try:
            check_context(model, p.fields["prompt_len"], p.fields["gen_len"], "prompt_len")
        except ConfigError as e:
            reasons[i] = str(e)
    if not reasons:
        return est
    misfit = np.array(np.broadcast_to(np.asarray(est.misfit, dtype=object), (len(points),)))
    misfit[list(reasons)] = list(reasons.values())
    return dataclasses.replace(est, misfit=misfit)


# What a point that does not fit keeps: who it is and what it would hold.
KEPT_WHEN_INFEASIBLE = frozenset({
    "model", "cluster", "sockets", "batch", "prompt_len", "gen_len", "weight_bytes",
    "kv_cache_bytes", "plan", "tp", "replicas", "chip", "execution_model",
    "hbm_used_bytes_per_socket", "kv_cache_bytes_per_socket", "feasible", "infeasible_reason",
})


def _null_speed(tbl: pa.Table, feasible: pa.Array) -> pa.Table:
    import pyarrow.compute as pc

    for i, name in enumerate(tbl.column_names):
        if name not in KEPT_WHEN_INFEASIBLE:
            col = tbl.column(i)
            tbl = tbl.set_column(i, name, pc.if_else(feasible, col, pa.nulls(len(col), col.type)))
    return tbl


SIMULATE = register(
    Runner(
        kind="simulate",
        fields=simulate_fields(),
        namespaces=simulate_namespaces(),
        run=run_simulate,
        check=check_simulate_plans,
        vector_fields=VECTOR,
        points_per_task=4096,
        required=("model", "cluster"),
        doc="analytic decode + prefill estimate, one row per point",
    )
)


# --- plan: the best plan of a model on a cluster (partitioning.evaluate.search_plans), one row
# per point: what `rdu-cluster plan` prints first, for every point of a grid.

PLAN_OBJECTIVES = ("latency", "throughput", "sockets")


def _objective(value: Any) -> str:
    if value not in PLAN_OBJECTIVES:
        raise ValueError(f"{value!r}; accepted: {', '.join(PLAN_OBJECTIVES)}")
    return value


def plan_fields() -> dict[str, FieldDef]:
    base = simulate_fields()
    keep = ("model", "cluster", "batch", "prompt_len", "gen_len", "weights", "sockets",
            "sockets_per_node", "stack")
    fields = {k: base[k] for k in keep}
    for k in ("batch", "prompt_len", "gen_len"):  # not among the plan row's columns: add them
        fields[k] = dataclasses.replace(fields[k], column=k)
    s = pa.string()
    for f in (
        FieldDef("objective", _objective, s, default="latency", column="objective"),
        FieldDef("spill", boolean, pa.bool_(), default=False, column="spill"),
        FieldDef("routing", text, s, default="uniform", column="routing"),
    ):
        fields[f.name] = f
    return fields


def run_plan(points: Sequence[Point], seed: int) -> RunOutput:
    from partitioning.evaluate import search_plans
    from partitioning.footprint import Placement
    from partitioning.scenario import Scenario
    from rdu_cluster.cli.plan import parse_routing, plan_row

    rows, bad = [], {}
    for p in points:
        f = p.fields
        cluster = point_cluster(f)
        model = cached_model(f["model"], f.get("weights"), None)
        placement = Placement(weights="auto", kv_cache="auto") if f["spill"] else Placement()
        options = make_options(cluster.chip, option_values(f), f.get("stack"))
        who = {"point_id": p.id, "cluster": cluster.name, "model": model.name}
        try:
            check_context(model, f["prompt_len"], f["gen_len"], "prompt_len")
            # plan None: tp over every socket (Scenario.__post_init__; its field is typed as after)
            scenario = Scenario(model, cluster, None,  # type: ignore[arg-type]
                                f["batch"], f["prompt_len"], f["gen_len"], options,
                                parse_routing(f["routing"], seed), placement)
            result = search_plans(scenario, f["objective"])
        except ConfigError as e:
            bad[p.id] = str(e)
            rows.append(_infeasible_row(who, bad[p.id]))
            continue
        if not result.ranked:
            worst = result.rejected[-1][1] if result.rejected else "no valid plan"
            bad[p.id] = f"no plan of {result.evaluated} fits; the widest: {worst}"
            rows.append(_infeasible_row({**who, "plans_evaluated": result.evaluated,
                                         "plans_feasible": 0}, bad[p.id]))
            continue
        with point_profile(f):
            row = plan_row(result.ranked[0], cluster.chip)
        row["mixer_tp"] = ",".join(f"{k}:{v}" for k, v in sorted(row["mixer_tp"].items()))
        row.update(who, plans_evaluated=result.evaluated, plans_feasible=len(result.ranked),
                   feasible=True)
        rows.append(row)
    return RunOutput(pa.Table.from_pylist(rows, schema=PLAN_SCHEMA) if rows else None, bad)


def _infeasible_row(known: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """A point that cannot run is a row too: who it is, feasible = false and why; the figures
    it has none of stay null."""
    return {**known, "feasible": False, "infeasible_reason": reason}


PLAN_SCHEMA = pa.schema(
    [("plan", pa.string()), ("stack", pa.string()), ("sockets", pa.int64()),
     ("tp", pa.int64()), ("pp", pa.int64()),
     ("ep", pa.int64()), ("dp", pa.int64()), ("mixer_tp", pa.string()),
     ("tokens_per_s_per_request", pa.float64()), ("tokens_per_s_total", pa.float64()),
     ("tpot_s", pa.float64()), ("hbm_used_bytes", pa.float64()), ("ddr_used_bytes", pa.float64()),
     ("bubble_fraction", pa.float64()), ("expert_load", pa.float64()), ("bound", pa.string()),
     *((f"{k}_{end}", pa.float64()) for k in ("tokens_per_s_per_request",
                                                 "tokens_per_s_total", "tpot_s")
       for end in ("low", "high")), ("interval_note", pa.string()),
     ("plans_evaluated", pa.int64()), ("plans_feasible", pa.int64()),
     ("point_id", pa.string()), ("cluster", pa.string()), ("model", pa.string()),
     ("feasible", pa.bool_()), ("infeasible_reason", pa.string())]
)


def check_plan(points: Sequence[Point], origin: Mapping[str, str]) -> None:
    check_simulate(points, origin)
    for p in points:
        try:
            from rdu_cluster.cli.plan import parse_routing

            parse_routing(p.fields["routing"], 0)
        except ConfigError as e:
            raise ConfigError(f"{origin.get('routing', 'base')}.routing: {e}") from None


PLAN = register(
    Runner(
        kind="plan",
        fields=plan_fields(),
        namespaces=simulate_namespaces(),
        run=run_plan,
        check=check_plan,
        points_per_task=32,  # a plan search costs tens of plans: a few dozen points a task
        required=("model", "cluster"),
        doc="plan search: the best plan per point, one row per point",
    )
)


# --- serve: a serving scenario (a synthetic request trace on a cluster under a plan and a
# scheduler), run by the engine's Simulation on its local backend, one row per point: the
# summary `rdu-cluster serve` prints, as columns.



def think_time(value: Any) -> str:
    """A think time as `serve --think-time` takes it (workloads.sessions.ThinkTime)."""
    from workloads.sessions import ThinkTime

    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"expected S or 'exponential:MEAN' / 'uniform:LO:HI', got {value!r}")
    try:
        ThinkTime.parse(str(value), "")
    except ConfigError as e:
        raise ValueError(str(e).lstrip(": ")) from None
    return str(value)


def serve_fields() -> dict[str, FieldDef]:
    base = simulate_fields()
    i64, f64, s, b = pa.int64(), pa.float64(), pa.string(), pa.bool_()
    fields = {k: base[k] for k in ("model", "cluster", "weights", "kv_dtype", "sockets",
                                    "sockets_per_node", "calibration", "stack")}
    for f in (
        FieldDef("plan", text, s, column="plan", doc="tp16, tp2ep8, tp4pp4 [tp over all sockets]"),
        FieldDef("execution_model", text, s, column="execution_model", doc="[the chip's]"),
        FieldDef("requests", int_in(1, MAX_REQUESTS), i64, doc="synthetic trace: number of requests"),
        # at least one request in checks.MAX_SECONDS: below, no two fit in a run (traces.py)
        FieldDef("rate", float_in(1 / checks.MAX_SECONDS, sys.float_info.max), f64,
                 column="rate_requests_per_s", doc="synthetic trace: requests per second"),
        FieldDef("arrival", choice(*traces.ARRIVALS), s, default=traces.ARRIVAL,
                 column="arrival"),
        FieldDef("burstiness", float_in(0.0, 1e3), f64, default=traces.BURSTINESS,
                 column="burstiness", doc="coefficient of variation of bursty gaps"),
        FieldDef("prompt_len", length_dist, s, default=traces.PROMPT_LEN,
                 column="prompt_len_dist", doc="N, uniform:LO:HI or lognormal:MEAN:SIGMA"),
        FieldDef("output_len", length_dist, s, default=traces.OUTPUT_LEN,
                 column="output_len_dist"),
        FieldDef("seed", nonnegative_int, i64, doc="trace and routing seed [sweep.seed]"),
        FieldDef("scheduler", text, s, default=schedulers.DEFAULT, column="scheduler"),
        FieldDef("max_batch", int_in(1, MAX_BATCH), i64, default=Limits.max_batch,
                 column="max_batch"),
        FieldDef("token_budget", int_in(1, MAX_BATCH * 64), i64, default=Limits.token_budget,
                 column="token_budget"),
        FieldDef("chunked_prefill", boolean, b, default=Limits.chunked_prefill,
                 column="chunked_prefill"),
        FieldDef("preemption", choice(*schedulers.PREEMPTION), s, default=Limits.preemption,
                 column="preemption"),
        FieldDef("kv_fraction", fraction, f64, column="kv_fraction",
                 doc="KV share of what weights, activations and the runtime leave [stack rule]"),
        FieldDef("fault", text, s, column="fault", doc="one simulated fault: socket:N@T[...]"),
        FieldDef("concurrency", positive_int, i64, column="concurrency",
                 doc="closed loop: clients (vLLM --max-concurrency); rate then paces sends"),
        FieldDef("routing", text, s, default=replica_routing.DEFAULT, column="routing",
                 doc="replica routing policy (engine/replica_routing/)"),
        FieldDef("prefill_pool", text, s, column="prefill_pool",
                 doc="disaggregated: CLUSTER:PLAN:N prefill replicas (with decode_pool)"),
        FieldDef("decode_pool", text, s, column="decode_pool",
                 doc="disaggregated: CLUSTER:PLAN:M decode replicas (with prefill_pool)"),
        FieldDef("fabric", text, s, default=DEFAULT_FABRIC, column="fabric",
                 doc="disaggregated: inter-node fabric of the KV hand-over"),
        FieldDef("trace", text, s, column="trace",
                 doc="a trace file instead of requests/rate (CSV/Parquet/Arrow, Azure, Mooncake)"),
        FieldDef("sessions", positive_int, i64, column="sessions",
                 doc="multi-turn workload instead of requests: sessions (prompt_len: each "
                 "turn's user message; rate: session starts per second [inf])"),
        FieldDef("turns", positive_int, i64, column="turns", doc="with sessions: turns each"),
        FieldDef("system_prompt", nonnegative_int, i64, column="system_prompt",
                 doc=f"with sessions: shared system prompt tokens [{sessions.SYSTEM_TOKENS}]"),
        FieldDef("think_time", think_time, s, column="think_time",
                 doc="with sessions: S, exponential:MEAN or uniform:LO:HI seconds "
                 f"[{sessions.THINK_TIME}]"),
        FieldDef("prefix_cache", choice(*prefix_cache.MODES), s, column="prefix_cache",
                 doc="off, hbm or tiered [tiered where the chip has a tier below HBM]"),
        FieldDef("prefix_block", positive_int, i64, column="prefix_block",
                 doc="tokens per prefix-cache block [the KV block]"),
        FieldDef("prefix_eviction", text, s, column="prefix_eviction",
                 doc=f"[{evictions.DEFAULT}]"),
    ):
        fields[f.name] = f
    return fields


# The engine's energy and cost figures (rdu_cluster/engine/energy.py); null where the chip has no
# [power] or the cluster no [cost] table.
ENERGY_COLUMNS = ("energy_j", "power_w", "joules_per_token", "cost_usd",
                  "cost_per_million_tokens_usd")
# A serve point's figures that carry an interval.
SERVE_BANDED = ("throughput_tokens_per_s", "request_throughput",
                *(f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e") for q in (50, 90, 99)),
                "mean_itl_ms", "p99_itl_ms", "joules_per_token", "cost_per_million_tokens_usd")
SERVE_SCHEMA = pa.schema(
    [("point_id", pa.string()), ("cluster", pa.string()), ("model", pa.string()),
     ("stack", pa.string()), ("seed", pa.int64()), ("sockets", pa.int64()), ("tp", pa.int64()), ("ep", pa.int64()),
     ("pp", pa.int64()), ("replicas", pa.int64()), ("requests", pa.int64()),
     ("requests_served", pa.int64()), ("requests_unserved", pa.int64()),
     ("preemptions", pa.int64()), ("swaps", pa.int64()), ("output_tokens", pa.int64()),
     ("makespan_s", pa.float64()), ("throughput_tokens_per_s", pa.float64()),
     *((f"{m}_p{q}_s", pa.float64()) for m in ("ttft", "tpot", "e2e") for q in (50, 90, 99)),
     ("steps", pa.int64()), ("decode_steps", pa.int64()), ("windows", pa.int64()),
     *((k, pa.float64()) for k in ENERGY_COLUMNS),
     # vllm bench serve's names (engine/bench.py); the KV hand-over of a disaggregated run
     ("request_throughput", pa.float64()), ("mean_itl_ms", pa.float64()),
     ("p99_itl_ms", pa.float64()), ("max_concurrent_requests", pa.int64()),
     ("kv_transfer_p50_s", pa.float64()),
     ("feasible", pa.bool_()), ("infeasible_reason", pa.string()),
     ("prefix_cache_mode", pa.string()), ("prefix_cache_hit_rate", pa.float64()),
     *((f"prefix_cache_hit_rate_{t}", pa.float64()) for t in ("hbm", "ddr", "host")),
     ("prefix_copy_s", pa.float64()),
     # intervals (rdu_cluster/validation/uncertainty.py serving_columns)
     *((f"{k}_{end}", pa.float64()) for k in SERVE_BANDED for end in ("low", "high")),
     ("interval_note", pa.string())]
)


def _seed(f: Mapping[str, Any], seed: int) -> int:
    return f.get("seed", seed)


def _serve_config(f: Mapping[str, Any], chip, seed: int):
    from rdu_cluster.engine import schedulers
    from rdu_cluster.engine.prefix_cache import PrefixConfig
    from rdu_cluster.engine.simulation import ServeConfig

    limits = schedulers.Limits(f["max_batch"], f["token_budget"], f["chunked_prefill"],
                               f["preemption"])
    return ServeConfig(plan=f.get("plan"), scheduler=f["scheduler"], limits=limits,
                       seed=_seed(f, seed), kv_memory_fraction=f.get("kv_fraction"),
                       execution_model=f.get("execution_model"),
                       options=make_options(chip, option_values(f), f.get("stack")),
                       faults=(f["fault"],) if "fault" in f else (),
                       concurrency=f.get("concurrency"), routing=f["routing"],
                       prefix=PrefixConfig(f.get("prefix_cache"), f.get("prefix_block"),
                                           f.get("prefix_eviction", evictions.DEFAULT)))


def _serve_sim(f: Mapping[str, Any], model, cluster, trace, config):
    """A Simulation, or a Disaggregated pair of pools when the point names them."""
    from rdu_cluster.backends import make as make_backend
    from rdu_cluster.config import load_fabric
    from rdu_cluster.engine import disagg
    from rdu_cluster.engine.simulation import Simulation

    pools = _pools(f)
    if pools is None:
        return Simulation(model, cluster, trace, config, make_backend("local"))
    return disagg.Disaggregated(model, *pools, load_fabric(f["fabric"]), trace, config,
                                lambda: make_backend("local"))


POOLS = ("prefill_pool", "decode_pool")


def _pools(f: Mapping[str, Any]) -> tuple[Pool, Pool] | None:
    """The point's (prefill, decode) pools; None: aggregated serving."""
    from rdu_cluster.engine import disagg

    given = [disagg.Pool.parse(f[k], "--" + k.replace("_", "-")) for k in POOLS if k in f]
    if len(given) == 1:
        raise ConfigError("give both prefill_pool and decode_pool (or neither: aggregated)")
    return cast("tuple[Pool, Pool] | None", tuple(given) or None)  # both or neither (above)


def _shape(sim) -> dict:
    """Sockets, plan and replicas of a run (a disaggregated run: its decode pool's plan)."""
    if hasattr(sim, "clusters"):
        pre, dec = sim.sims
        return {"cluster": "+".join(c.name for c in sim.clusters),
                "sockets": sum(c.sockets for c in sim.clusters), "tp": dec.plan.tp,
                "ep": dec.plan.ep, "pp": dec.plan.pp,
                "replicas": len(pre.replicas) + len(dec.replicas)}
    return {"cluster": sim.cluster.name, "sockets": sim.cluster.sockets, "tp": sim.plan.tp,
            "ep": sim.plan.ep, "pp": sim.plan.pp, "replicas": len(sim.replicas)}


def _trace(f: Mapping[str, Any], seed: int):
    """The point's workload: a trace file, sessions, or a synthetic trace (one of the three:
    check_serve)."""
    if "trace" in f:
        return traces.read_trace(f["trace"])
    if "sessions" in f:
        spec = sessions.SessionSpec(
            f["sessions"], f["turns"], f.get("system_prompt", sessions.SYSTEM_TOKENS),
            traces.LengthDist.parse(f["prompt_len"], "prompt_len"),
            traces.LengthDist.parse(f["output_len"], "output_len"),
            sessions.ThinkTime.parse(f.get("think_time", sessions.THINK_TIME), "think_time"),
            f.get("rate", math.inf), f["arrival"])
        return sessions.sessions(spec, _seed(f, seed))
    return traces.synthetic(
        f["requests"], f["rate"], f["arrival"],
        traces.LengthDist.parse(f["prompt_len"], "prompt_len"),
        traces.LengthDist.parse(f["output_len"], "output_len"),
        seed=_seed(f, seed), burstiness=f["burstiness"],
    )


def run_serve(points: Sequence[Point], seed: int) -> RunOutput:
    """Each point is one Simulation on a fresh local backend: deterministic given the point and
    the seed (a point's `seed` field, else the sweep's). A point the engine refuses (the weights
    do not fit at its plan) is infeasible, with the engine's message."""
    from chip import serving_stacks
    from rdu_cluster.engine import metrics
    from rdu_cluster.engine.requests import DONE

    rows, bad = [], {}
    for p in points:
        f = p.fields
        cluster = point_cluster(f)
        model = cached_model(f["model"], f.get("weights"), f.get("kv_dtype"))
        config = _serve_config(f, cluster.chip, seed)
        try:
            sim = _serve_sim(f, model, cluster, _trace(f, seed), config)
            tables = sim.run()
        except ConfigError as e:
            bad[p.id] = str(e)
            rows.append(_infeasible_row({"point_id": p.id, "cluster": cluster.name,
                                         "model": model.name, "seed": config.seed,
                                         "sockets": cluster.sockets}, bad[p.id]))
            continue
        s = tables.summary  # the engine's own summary: what `rdu-cluster serve` prints
        req = tables.requests
        done = [st == DONE for st in req.column("state").to_pylist()]
        e2e = metrics.percentiles([v for v, ok in zip(req.column("e2e_s").to_pylist(), done)
                                   if ok])
        b = s["bench"]
        row = {"point_id": p.id, "model": model.name, "seed": config.seed, **_shape(sim),
               "stack": serving_stacks.stack_of(cluster.chip, config.options),
               "request_throughput": b["request_throughput"],
               "mean_itl_ms": b["mean_itl_ms"], "p99_itl_ms": b.get("p99_itl_ms"),
               "max_concurrent_requests": b["max_concurrent_requests"],
               "kv_transfer_p50_s": (s["kv_transfer_ms"][50] / 1e3 if "kv_transfer_ms" in s
                                     else 0.0),
               "requests": s["requests"], "requests_served": s["served"],
               "requests_unserved": s["unserved"], "preemptions": s["preemptions"],
               "swaps": int(sum(v or 0 for v in req.column("swaps").to_pylist())),
               "output_tokens": s["output_tokens"], "makespan_s": s["makespan_s"],
               "throughput_tokens_per_s": s["tokens_per_s"], "steps": s["steps"],
               "decode_steps": s["decode_steps"], "windows": s["windows"],
               **{k: s[k] for k in ENERGY_COLUMNS}, "feasible": True,
               "prefix_cache_mode": s["prefix_cache"],
               "prefix_cache_hit_rate": s["prefix_cache_hit_rate"],
               **{f"prefix_cache_hit_rate_{t}": s["prefix_cache_hit_rate_by_tier"].get(t)
                  for t in ("hbm", "ddr", "host")},
               "prefix_copy_s": s["prefix_copy_s"]}
        for name, values in (("ttft", s["ttft_s"]), ("tpot", s["tpot_s"]), ("e2e", e2e)):
            row.update({f"{name}_p{q}_s": v for q, v in values.items()})
        with point_profile(f):
            row.update(_serve_intervals(row, sim, cluster, config))
        rows.append(row)
    return RunOutput(pa.Table.from_pylist(rows, schema=SERVE_SCHEMA) if rows else None, bad)


def _serve_intervals(row: Mapping[str, Any], sim, cluster, config) -> dict[str, Any]:
    """The point's SERVE_BANDED figures' intervals (none for two pools: a disaggregated run)."""
    from chip import serving_stacks
    from rdu_cluster.validation import uncertainty

    figures = {k: row[k] for k in SERVE_BANDED
               if isinstance(row.get(k), (int, float)) and not math.isnan(row[k])}
    why = ("a disaggregated run's figures mix two pools; no interval model for them"
           if hasattr(sim, "clusters") else "")
    stack = serving_stacks.stack_of(cluster.chip, config.options)
    return uncertainty.serving_columns(figures, chip=cluster.chip, stack=stack, why_not=why,
                                       keys=figures)


def _check_workload(f: Mapping[str, Any], origin: Mapping[str, str]) -> None:
    """One workload a point: requests and rate, sessions and turns, or a trace file."""
    given = [k for k in ("trace", "sessions") if k in f]
    if len(given) > 1 or (given and "requests" in f):
        field = given[-1]
        raise ConfigError(f"{origin.get(field, 'base')}.{field}: give one workload: requests "
                          "and rate, sessions and turns, or trace")
    if "sessions" in f and "turns" not in f:
        raise ConfigError(f"{origin.get('sessions', 'base')}.turns: missing field (sessions "
                          "need turns)")
    if not given:
        for name in ("requests", "rate"):
            if name not in f:
                raise ConfigError(f"{name}: missing field (set it in [base] or in an axis; or "
                                  "give sessions and turns, or trace)")
    if f["burstiness"] != 1.0 and f["arrival"] != "bursty":  # as `serve --burstiness` refuses
        raise ConfigError(f"{origin.get('burstiness', 'base')}.burstiness: "
                          f"{checks.show(f['burstiness'])} needs arrival = 'bursty' (it is the "
                          "coefficient of variation of bursty gaps); this point's arrival is "
                          f"{checks.show(f['arrival'])}")
    if "trace" in f:
        from workloads import traces

        traces.read_trace(f["trace"])  # a bad file fails before anything runs


def _unflag(message: str) -> str:
    """An engine message names its CLI flag ("--plan: ..."); a spec error names the field."""
    return re.sub(r"^--[a-z-]+(/--[a-z-]+)*:?\s*", "", message)


def check_serve(points: Sequence[Point], origin: Mapping[str, str]) -> None:
    """Clusters and models as `simulate` checks them; then every distinct plan (on its cluster
    and model), scheduler, fault and options set, so that a bad one fails before anything runs,
    naming its field."""
    from rdu_cluster.engine import plan as plans
    from rdu_cluster.engine import replica_routing, schedulers
    from rdu_cluster.engine.faults import Fault
    from rdu_cluster.engine.prefix_cache import PrefixConfig

    check_simulate(points, origin)
    checks: dict[tuple, tuple[str | None, str, Any]] = {}  # key -> (field, context, load)
    for p in points:
        f = p.fields
        _check_workload(f, origin)
        over = cluster_overrides(f)
        cluster = point_cluster(f)
        model = cached_model(f["model"], f.get("weights"), f.get("kv_dtype"))
        if "plan" in f:
            checks.setdefault(
                ("plan", f["plan"], f["cluster"], over, model.name),
                ("plan", f"{f['plan']!r} on {cluster.name} with {model.name}: ",
                 functools.partial(plans.PlanSpec.parse, f["plan"], cluster, model)))
        limits = schedulers.Limits(f["max_batch"], f["token_budget"], f["chunked_prefill"],
                                   f["preemption"])
        checks.setdefault(("scheduler", f["scheduler"], limits),
                          (None, "", functools.partial(schedulers.get, f["scheduler"],
                                                       limits)))  # the field its flag names
        if "fault" in f:
            checks.setdefault(("fault", f["fault"], cluster.name, cluster.sockets),
                              ("fault", f"on {cluster.name}: ",
                               functools.partial(Fault.parse, f["fault"], cluster)))
        checks.setdefault(("routing", f["routing"]), ("routing", "", functools.partial(
            replica_routing.get, f["routing"])))
        _pool_checks(f, model, cluster.chip, origin, checks)
        prefix = PrefixConfig(f.get("prefix_cache"), f.get("prefix_block"),
                              f.get("prefix_eviction", evictions.DEFAULT))
        checks.setdefault(("prefix", prefix), (None, "", prefix.check))
        opts = option_values(f)
        if opts:
            checks.setdefault(("options", cluster.chip.kind, opts),
                              (f"options.{opts[0][0]}", "",
                               functools.partial(make_options, cluster.chip, opts)))
    for field, context, load in checks.values():
        try:
            load()
        except ConfigError as e:
            field = field or _flag_field(str(e))
            where = origin.get(field, "base")
            raise ConfigError(f"{where}.{field}: {context}{_unflag(str(e))}") from None


def _pool_checks(f: Mapping[str, Any], model, chip, origin: Mapping[str, str],
                 checks: dict) -> None:
    """A disaggregated point's spec errors, whatever its numbers: one pool without the other,
    a pool's cluster or plan, the fabric, and the fields the engine refuses beside pools (its
    own check, on a one-request stand-in of the workload: the trace is not built twice)."""
    from rdu_cluster.config import load_fabric
    from rdu_cluster.engine import disagg
    from workloads.traces import Trace

    try:
        pools = _pools(f)
    except ConfigError as e:
        field = _flag_field(str(e), next(k for k in POOLS if k in f))
        raise ConfigError(f"{origin.get(field, 'base')}.{field}: {_unflag(str(e))}") from None
    if pools is None:
        return
    if "plan" in f:
        raise ConfigError(f"{origin.get('plan', 'base')}.plan: not with prefill_pool/decode_pool "
                          "(each pool names its plan)")
    checks.setdefault(("fabric", f["fabric"]), ("fabric", "", functools.partial(
        load_fabric, f["fabric"])))
    for key, pool in zip(POOLS, pools):
        checks.setdefault((key, str(pool), f["fabric"], model.name), (key, "", functools.partial(
            _pool_plan, pool, model, f["fabric"])))
    one = np.ones(1, dtype=np.int64)
    stand_in = Trace(np.zeros(1), one, one, after=-one if "sessions" in f else None)
    config = _serve_config(f, chip, 0)
    # the stand-in is only checked (Disaggregated.__post_init__), never run: it needs no backend
    no_backend = cast("Callable[[], object]", None)
    checks.setdefault(("disagg", "sessions" in f, config.concurrency, config.faults), (
        None, "", lambda: disagg.Disaggregated(model, *pools, load_fabric(f["fabric"]),
                                               stand_in, config, no_backend)))


def _pool_plan(pool, model, fabric: str) -> None:
    """The pool's cluster loads and its plan fits it, as the plan of an aggregated point."""
    from rdu_cluster.config import load_fabric
    from rdu_cluster.engine import plan as plans

    plans.PlanSpec.parse(pool.plan, pool.spec(model, load_fabric(fabric)), model)


def _flag_field(message: str, default: str = "prefill_pool") -> str:
    """The field of the CLI flag an engine message starts with (--prefix-eviction:
    prefix_eviction; --prefill-pool/--decode-pool: prefill_pool), else `default`."""
    m = re.match(r"--([a-z-]+)", message)
    return m.group(1).replace("-", "_") if m else default


SERVE = register(
    Runner(
        kind="serve",
        fields=serve_fields(),
        namespaces=simulate_namespaces(),
        run=run_serve,
        check=check_serve,
        points_per_task=4,  # a point is a whole serving simulation: tenths of a second to seconds
        # a workload: requests (and rate), sessions (and turns) or a trace (_check_workload)
        required=("model", "cluster", ("requests", "sessions", "trace")),
        doc="serving simulation (engine, local backend): the summary of a trace, one row per point",
    )
)
