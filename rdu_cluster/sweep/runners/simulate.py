"""`simulate`: the plan evaluator (partitioning.evaluate, through partitioning.estimate) of
decode and prefill, one row per point, with points that differ only in batch / prompt /
generation length (VECTOR) costed by one vectorized call. A point that does not fit is a row
with feasible = false and the reason (and is listed in the manifest as well).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from rdu_cluster.sweep.registry import Point, Runner, RunOutput, register
from rdu_cluster.sweep.runners.common import (
    cached_model,
    check_simulate,
    cluster_overrides,
    make_options,
    option_values,
    point_cluster,
    point_profile,
    simulate_fields,
    simulate_namespaces,
    unflag,
)
from workloads import checks
from workloads.errors import ConfigError
from workloads.spec import check_context

VECTOR = ("batch", "prompt_len", "gen_len")


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
            raise ConfigError(f"{origin.get('plan', 'base')}.plan: {unflag(str(e))}") from None
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
