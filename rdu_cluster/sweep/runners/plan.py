"""`plan`: the best plan of a model on a cluster (partitioning.evaluate.search_plans), one row
per point: what `rdu-cluster plan` prints first, for every point of a grid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from rdu_cluster.sweep.fields import FieldDef, boolean, text
from rdu_cluster.sweep.registry import Point, Runner, RunOutput, register
from rdu_cluster.sweep.runners.common import (
    cached_model,
    check_simulate,
    infeasible_row,
    make_options,
    option_values,
    point_cluster,
    point_profile,
    simulate_fields,
    simulate_namespaces,
)
from workloads.errors import ConfigError
from workloads.spec import check_context

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
            rows.append(infeasible_row(who, bad[p.id]))
            continue
        if not result.ranked:
            worst = result.rejected[-1][1] if result.rejected else "no valid plan"
            bad[p.id] = f"no plan of {result.evaluated} fits; the widest: {worst}"
            rows.append(infeasible_row({**who, "plans_evaluated": result.evaluated,
                                        "plans_feasible": 0}, bad[p.id]))
            continue
        with point_profile(f):
            row = plan_row(result.ranked[0], cluster.chip)
        row["mixer_tp"] = ",".join(f"{k}:{v}" for k, v in sorted(row["mixer_tp"].items()))
        row.update(who, plans_evaluated=result.evaluated, plans_feasible=len(result.ranked),
                   feasible=True)
        rows.append(row)
    return RunOutput(pa.Table.from_pylist(rows, schema=PLAN_SCHEMA) if rows else None, bad)


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
