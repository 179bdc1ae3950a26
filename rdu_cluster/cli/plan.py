"""`rdu-cluster plan`: every feasible plan of a model on a cluster, ranked by an objective."""

from __future__ import annotations

import json

import click

from chip import serving_stacks
from partitioning.evaluate import PlanEstimate, evaluate_plan, search_plans
from partitioning.expert_routing import RoutingModel
from partitioning.footprint import Placement, PlanDoesNotFit
from partitioning.plan import Plan
from partitioning.scenario import Scenario
from partitioning.search import SearchResult
from rdu_cluster.cli import options as o
from rdu_cluster.cli.options import calibration_option, hardware_options
from rdu_cluster.config import load_cluster
from rdu_cluster.output.report import banded, overrides_line, text_table, weights_text
from rdu_cluster.validation import uncertainty
from workloads.catalog import load_model
from workloads.errors import ConfigError
from workloads.spec import check_context, with_dtypes

CONTEXT = 8192  # prompt tokens a plan is sized for, unless --context or the model says fewer


@click.command()
@calibration_option
@click.option("--model", "model_ref", required=True, help="Catalog name or config.json path.")
@click.option("--cluster", "cluster_ref", required=True, help="Cluster name or TOML path.")
@click.option("--objective", default="latency", show_default=True,
              type=click.Choice(["latency", "throughput", "sockets"]),
              help="How the plans are ranked (not with --plan).")
@click.option("--batch", default=1, show_default=True, type=o.BATCH, help="Sequences per replica.")
@click.option("--context", "--prompt-len", "context", default=None, type=o.LENGTH,
              help=f"Prompt tokens (--prompt-len, as the other commands name it) [default: "
                   f"{CONTEXT:,}, or the model's context less --gen-len where that is shorter].")
@click.option("--gen-len", default=256, show_default=True, type=o.LENGTH)
@click.option("--top", default=10, show_default=True, type=click.IntRange(1, 10**6),
              help="Plans to print (not with --plan).")
@o.dtype_options
@click.option("--spill", is_flag=True, help="Let weights, then KV cache, spill to DDR.")
@click.option("--routing", default="uniform", show_default=True,
              help="Expert routing: uniform, zipf:S (popularity ~ 1/rank^S), or identical "
                   "(every sequence the same prompt, decoded greedily).")
@click.option("--seed", default=0, show_default=True, type=o.SEED, help="Routing-model seed.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per plan.")
@click.option("--plan", "plan_text", default=None,
              help="Evaluate this plan only (tp16, tp4pp2, ...) instead of searching.")
@o.stack_option
@hardware_options
def plan(model_ref, cluster_ref, objective, batch, context, gen_len, top, weights_dtype,
         kv_dtype, spill, routing, seed, as_json, plan_text, stack_name, overrides) -> None:
    """Enumerate and rank the plans (tp, pp, ep, dp, per-block degrees) of MODEL on CLUSTER."""
    if plan_text and (unused := o.given(click.get_current_context(), "objective", "top")):
        raise ConfigError(f"{'/'.join(unused)}: not with --plan (it evaluates that one plan: "
                          "there is no search to rank)")
    spec = with_dtypes(load_model(model_ref), weights_dtype, kv_dtype)
    where = "--context"
    if context is None:  # a model of a shorter context (llama-2: 4,096) plans at its own
        where, context = "--gen-len", CONTEXT
        if spec.max_context:
            context = max(1, min(CONTEXT, spec.max_context - gen_len))
    if min(batch, context, gen_len, top) < 1:
        raise ConfigError("--batch, --context, --gen-len and --top must be positive")
    check_context(spec, context, gen_len, where)
    if not spec.is_moe and (unused := o.given(click.get_current_context(), "routing", "seed")):
        raise ConfigError(f"{'/'.join(unused)}: {spec.name} has no routed experts (expert "
                          "routing applies to MoE models only)")
    cluster = load_cluster(cluster_ref, overrides)
    placement = Placement(weights="auto", kv_cache="auto") if spill else Placement()
    routing_model = parse_routing(routing, seed)
    options = serving_stacks.options_for(cluster.chip, stack_name, system=cluster.name)
    # plan None: tp over every socket (Scenario.__post_init__; its field is typed as after)
    scenario = Scenario(spec, cluster, None,  # type: ignore[arg-type]
                        batch, context, gen_len, options, routing_model, placement)
    result = _ranked(scenario, plan_text, objective)
    rows = [plan_row(e, cluster.chip) | {"calibration": cluster.chip.calibration}
            for e in result.ranked[:top]]
    if as_json:
        click.echo("\n".join(json.dumps(r) for r in rows))
    else:
        _print_table(scenario, result, rows, objective, spill, overrides)


def _ranked(scenario: Scenario, plan_text: str | None, objective: str) -> SearchResult:
    """--plan's one plan, or every plan the search ranks by the objective; none fitting is
    refused (with the widest plan's reason)."""
    if plan_text:  # one plan: refused, if it does not fit, with the message every command gives
        one = evaluate_plan(scenario.but(plan=Plan.parse(plan_text)), prefill=False)
        result = SearchResult((one,), (), 1)
    else:
        result = search_plans(scenario, objective)
    if not result.ranked:
        worst = result.rejected[-1][1] if result.rejected else "no valid plan"
        raise PlanDoesNotFit(f"no plan of {result.evaluated} fits; the widest: {worst}")
    return result


def _print_table(scenario: Scenario, result: SearchResult, rows: list[dict], objective: str,
                 spill: bool, overrides: dict) -> None:
    """The text report: --set's overrides, what was searched, the rows as a table and what
    their intervals rest on."""
    spec, cluster = scenario.spec, scenario.cluster
    if overrides:
        click.echo(overrides_line(overrides))
    click.echo(
        f"{spec.name}, weights {spec.quantization or weights_text(spec.precision)}, KV cache "
        f"{spec.precision.kv_cache.value}, on "
        f"{cluster.name}: batch {scenario.batch}, "
        f"context {scenario.prompt_len}, gen {scenario.gen_len}, objective {objective}; "
        f"{result.evaluated} plans, "
        f"{len(result.ranked)} fit{', spill to DDR allowed' if spill else ''}"
        f"{'; stack ' + result.ranked[0].stack if result.ranked[0].stack else ''}"
        f"; calibration {cluster.chip.calibration}"
    )
    header = ["#", "plan", "sockets", "tp", "pp", "ep", "dp", "tok/s/req", "tok/s total",
              "HBM GB/socket", "DDR GB/socket", "bound"]
    body = [[i + 1, r["plan"], r["sockets"], r["tp"], r["pp"], r["ep"], r["dp"],
             *(banded(r[k], r[f"{k}_low"], r[f"{k}_high"], "{:,.1f}")
               for k in ("tokens_per_s_per_request", "tokens_per_s_total")),
             f"{r['hbm_used_bytes'] / 1e9:.1f}", f"{r['ddr_used_bytes'] / 1e9:.1f}", r["bound"]]
            for i, r in enumerate(rows)]
    click.echo(text_table(header, body))
    click.echo(f"intervals: {rows[0]['interval_note']}")


def parse_routing(text: str, seed: int) -> RoutingModel:
    kind, colon, s = text.partition(":")
    if kind in ("uniform", "identical") and not colon:
        return RoutingModel(kind, seed=seed)
    if kind == "zipf" and not (colon and not s):  # zipf (S = 1) or zipf:S, not "zipf:"
        try:
            exponent = float(s or 1.0)
        except ValueError:
            exponent = None
        if exponent is not None:
            return RoutingModel("zipf", zipf_s=exponent, seed=seed)  # checks S in [0, 100]
    raise ConfigError(
        f"--routing: {text!r}; expected uniform, zipf:S (S a number) or identical"
    )


def plan_row(e: PlanEstimate, chip) -> dict:
    """A plan's figures, with the speeds' intervals (rdu_cluster/validation/uncertainty.py)."""
    p = e.plan
    row = {
        "plan": p.name, "sockets": p.sockets, "tp": p.tp, "pp": p.pp, "ep": p.ep, "dp": p.dp,
        "adp": p.adp, "mixer_tp": {m.value: d for m, d in p.mixer_tp},
        "stack": e.stack,
        "tokens_per_s_per_request": e.tokens_per_s_per_request,
        "tokens_per_s_total": e.tokens_per_s_total,
        "tpot_s": e.tpot_s,
        "hbm_used_bytes": e.hbm_used_bytes,
        "ddr_used_bytes": e.ddr_used_bytes,
        "bubble_fraction": e.bubble_fraction,
        "expert_load": e.expert_load,
        "bound": e.bound,
    }
    row.update(uncertainty.scalar_columns(uncertainty.columns(row, chip=chip, stack=e.stack,
                                                              batch=e.batch)))
    return row
