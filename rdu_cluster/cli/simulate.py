"""`rdu-cluster simulate`: decode and prefill estimates of one model on one or more clusters."""

from __future__ import annotations

import click

from chip import serving_stacks
from partitioning.estimate import best_plan, estimate
from partitioning.plan import Plan
from partitioning.scenario import Scenario, tensor_plan
from rdu_cluster.cli import options as o
from rdu_cluster.cli.options import calibration_option, hardware_options
from rdu_cluster.cli.plan import parse_routing
from rdu_cluster.config import load_cluster
from rdu_cluster.output import atomic, results
from rdu_cluster.output.report import model_summary, overrides_line, side_by_side, stacks_text
from rdu_cluster.scenarios import speculative
from workloads.catalog import load_model
from workloads.errors import ConfigError
from workloads.spec import check_context, with_dtypes

DEFAULT_MODEL = "llama-3.1-70b"
DEFAULT_CLUSTERS = ("sn40l-16", "dgx-h100")


@click.command()
@calibration_option
@click.option(
    "--model",
    "model_ref",
    default=DEFAULT_MODEL,
    show_default=True,
    help="Catalog name or path to a HuggingFace config.json.",
)
@click.option(
    "--cluster",
    "cluster_refs",
    multiple=True,
    help="Cluster name or TOML path; repeat to compare side by side. "
    f"[default: {', '.join(DEFAULT_CLUSTERS)}]",
)
@click.option("--batch", default=1, show_default=True, type=o.BATCH, help="Sequences decoded together.")
@click.option("--prompt-len", default=1024, show_default=True, type=o.LENGTH)
@click.option("--gen-len", default=256, show_default=True, type=o.LENGTH)
@click.option(
    "--tp",
    default=None,
    type=o.SOCKETS,
    help="Tensor parallelism over this many sockets, replicated over the rest of each "
    "cluster (--plan tpNdpM with N x M its sockets; --plan tpN is one replica on N).",
)
@click.option(
    "--plan",
    "plan_text",
    default=None,
    help="Partitioning plan: tp16, tp4pp2, ep16, tp8ep2, tp2pp2dp4, tp16@mamba2=8 "
    "[default: the best plan for --objective].",
)
@click.option(
    "--objective",
    type=click.Choice(["latency", "throughput", "sockets"]),
    default="latency",
    show_default=True,
    help="How the default plan is chosen (not with --plan or --tp).",
)
@o.dtype_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per result line.")
@click.option("--out", "out_path", default=None, help="Write the results (.parquet or .arrow).")
@click.option(
    "--ablate",
    is_flag=True,
    help="RDU clusters: each dataflow optimization off in turn, all off, and the "
    "unfused host-orchestrated baseline (a GPU --cluster is refused; by default sn40l-16).",
)
@click.option(
    "--draft",
    default=None,
    help="Speculative decoding: draft model (catalog name or config.json), or 'mtp' "
    "for the model's own multi-token-prediction module.",
)
@click.option(
    "--spec-k",
    default=None,
    type=o.SPEC_K,
    help="Draft tokens a step (tree: its depth) [default: the fastest in 1..16].",
)
@click.option(
    "--acceptance",
    default=None,
    help="Acceptance: a rate (0.8), per-position conditional rates (0.9,0.8,0.7) or "
    "beta:MEAN[:CONCENTRATION[:SEED]] [default: the pair's published basis].",
)
@click.option("--tree", default=None, help="Tree speculation: candidates per depth (4,2,1).")
@click.option(
    "--placement",
    "--draft-placement",
    "placement",
    default="shared",
    show_default=True,
    type=click.Choice(speculative.PLACEMENTS),
    help="Draft on the target's sockets, or on --draft-sockets sockets of its own.",
)
@click.option("--draft-sockets", default=1, show_default=True, type=o.SOCKETS)
@click.option(
    "--coe",
    "coe_flag",
    is_flag=True,
    help="Composition of Experts, MICRO24 Table V setting: router at --batch (8), then "
    "each (prompt, expert) pair; --model is the expert (default llama-2-7b).",
)
@click.option("--experts", default=150, show_default=True, type=o.EXPERTS, help="With --coe.")
@hardware_options
@click.option(
    "--routing",
    default=None,
    help="How an MoE's tokens choose experts: uniform, zipf:S, or identical (every sequence the "
    "same prompt decoded greedily, as benchmark scripts that replicate one prompt) "
    "[default: uniform]. Not with --draft, --coe or --ablate.",
)
@click.option(
    "--stack",
    "stack_name",
    default=None,
    help=f"GPU clusters: the serving stack ({', '.join(serving_stacks.STACKS)}; "
    f"chip/serving_stacks.py) [default: {serving_stacks.DEFAULT_STACK}]. RDU clusters take "
    "none (refused when no --cluster is a GPU); not with --coe or --ablate.",
)
def simulate(
    model_ref,
    cluster_refs,
    batch,
    prompt_len,
    gen_len,
    tp,
    plan_text,
    objective,
    weights_dtype,
    kv_dtype,
    as_json,
    out_path,
    ablate,
    draft,
    spec_k,
    acceptance,
    tree,
    placement,
    draft_sockets,
    coe_flag,
    experts,
    overrides,
    routing,
    stack_name,
) -> None:
    """Estimate decode and prefill of MODEL on each CLUSTER (--set and --sockets apply to each)."""
    if out_path is not None:  # "" too: a name that names nothing is refused
        atomic.check_table_path(out_path)  # before any work: nothing runs for nowhere
        o.check_not_inputs(out_path, "--out", [("--model", model_ref), ("--draft", draft),
                                               *(("--cluster", c) for c in cluster_refs)])
    _check_modes(click.get_current_context(), draft, coe_flag, ablate)
    if coe_flag:
        click.echo(_coe_table(model_ref, cluster_refs, batch, prompt_len, gen_len, experts,
                              overrides))
        return
    spec = with_dtypes(load_model(model_ref), weights_dtype, kv_dtype)
    check_context(spec, prompt_len, gen_len)
    clusters = [load_cluster(c, overrides) for c in (cluster_refs or DEFAULT_CLUSTERS)]
    if ablate:
        click.echo(_ablation_tables(spec, clusters, batch, prompt_len, gen_len, tp,
                                    given=bool(cluster_refs)))
        return
    if draft:
        rows, text = speculative.simulate(
            spec,
            clusters,
            draft,
            spec_k,
            acceptance,
            tree,
            placement=placement,
            draft_sockets=draft_sockets,
            options=[_options(c, stack_name, clusters) for c in clusters],
            batch=batch,
            prompt_len=prompt_len,
            gen_len=gen_len,
            tp=tp,
            plan=plan_text,
        )
        _write(rows, out_path, as_json)
        if not as_json:
            click.echo(text)
        return
    rows, estimates = [], []
    routing_model = parse_routing(routing or "uniform", 0)
    for cluster in clusters:
        options = _options(cluster, stack_name, clusters)
        # plan None: tp over every socket (Scenario.__post_init__; its field is typed as after)
        scenario = Scenario(spec, cluster, None,  # type: ignore[arg-type]
                            batch, prompt_len, gen_len, options, routing_model)
        est = estimate(scenario.but(plan=plan_of(scenario, tp, plan_text, objective)))
        estimates.append(est)
        rows += results.records(est, cluster.chip.name, cluster.chip.execution_model, cluster)
    _write(rows, out_path, as_json)
    if not as_json:
        if overrides:
            click.echo(overrides_line(overrides))
        click.echo(model_summary(spec) + "; " + stacks_text(estimates) + "\n"
                   + side_by_side(estimates, clusters, rows))


def _write(rows: list[dict], out_path: str | None, as_json: bool) -> None:
    """--out and --json. The Arrow table is built only for them: pyarrow loads pandas (half a
    second) on its first conversion of Python lists, which the text table does not need."""
    if not (out_path or as_json):
        return
    tbl = results.table(rows)
    if out_path:
        atomic.write_table(tbl, out_path)
    if as_json:
        click.echo(results.json_lines(tbl))


def _options(cluster, stack_name: str | None, clusters: list):
    """The cluster's execution options: its stack (--stack, or the default) on a GPU. --stack
    with no GPU among the clusters is refused; beside a GPU, an RDU cluster runs its own."""
    if stack_name is not None and all(c.chip.kind != "gpu" for c in clusters):
        serving_stacks.options_for(cluster.chip, stack_name, system=cluster.name)  # refuses
    return serving_stacks.options_for(cluster.chip, None if cluster.chip.kind != "gpu"
                                      else stack_name, system=cluster.name)


def plan_of(scenario: Scenario, tp: int | None, plan_text: str | None, objective: str) -> Plan:
    """--tp, --plan, or the best plan for --objective (searched at the execution model's
    defaults and uniform routing, as it always was)."""
    if tp:
        return tensor_plan(scenario.cluster, tp, "--tp")
    if plan_text:
        return Plan.parse(plan_text)
    return best_plan(scenario.but(options=None, routing=None), objective)


def _check_modes(ctx: click.Context, draft: str | None, coe: bool, ablate: bool) -> None:
    """An option of a mode not run is refused, not ignored (serve refuses the same ones)."""
    if draft is None and (spec := o.given(ctx, "spec_k", "acceptance", "tree", "placement",
                                          "draft_sockets")):
        raise ConfigError(f"{'/'.join(spec)}: only with --draft")
    if not coe and (only := o.given(ctx, "experts")):
        raise ConfigError(f"{only[0]}: only with --coe")
    if coe and (unused := o.given(ctx, "tp", "plan_text", "objective", "weights_dtype",
                                  "kv_dtype", "stack_name", "routing", "out_path", "as_json")):
        raise ConfigError(f"{'/'.join(unused)}: not with --coe (its table takes --model, "
                          "--cluster, --batch, the lengths and --experts)")
    modes = [flag for flag, on in (("--draft", draft is not None), ("--coe", coe),
                                   ("--ablate", ablate)) if on]
    if len(modes) > 1:
        raise ConfigError(f"{' and '.join(modes)}: give one of them (each is its own table)")
    if ablate and (unused := o.given(ctx, "plan_text", "objective", "stack_name", "routing",
                                     "out_path", "as_json")):
        raise ConfigError(f"{'/'.join(unused)}: not with --ablate (its text tables take "
                          "--model, --cluster, --batch, the lengths, --tp, the dtypes and --set)")
    if draft is not None and (unused := o.given(ctx, "routing")):
        raise ConfigError(f"{unused[0]}: not with --draft (the speculative table costs uniform "
                          "routing)")
    if ctx.params["tp"] and ctx.params["plan_text"]:
        raise ConfigError("--tp and --plan: give one of them")
    if o.given(ctx, "objective"):
        skips = o.given(ctx, "tp", "plan_text") or (["--draft"] if draft is not None else [])
        if skips:
            raise ConfigError(f"--objective: not with {skips[0]} (it ranks the default plan "
                              f"search, which {skips[0]} skips)")


def _coe_table(model_ref, cluster_refs, batch, prompt_len, gen_len, experts, overrides) -> str:
    """MICRO24 Table V's setting; options left at simulate's defaults take the table's values."""
    from rdu_cluster.scenarios import coe  # imported when used: start-up (bench_startup.py)

    ctx = click.get_current_context()
    given = lambda name: bool(o.given(ctx, name))
    expert = model_ref if given("model_ref") else coe.DEFAULT_EXPERT
    refs = cluster_refs or ("sn40l-8", "dgx-h100", "dgx-a100")
    prompt_len = prompt_len if given("prompt_len") else 512
    gen_len = gen_len if given("gen_len") else 20
    check_context(load_model(expert), prompt_len, gen_len)  # each pair: a prompt and its answer
    check_context(load_model(coe.DEFAULT_ROUTER), prompt_len, 1)  # the router reads the prompt
    tvs = [
        coe.table_v(load_cluster(c, overrides), experts, batch if given("batch") else 8,
                    prompt_len, gen_len, expert)
        for c in refs
    ]
    return coe.table_v_report(tvs)


def _ablation_tables(spec, clusters, batch, prompt_len, gen_len, tp, given: bool) -> str:
    """The ablation of each RDU cluster; a GPU cluster given with --cluster is refused, not
    skipped unseen (of the default pair, dgx-h100 is left out: the help says RDU clusters)."""
    from rdu_cluster.scenarios.ablate import ablate as run_ablation
    from rdu_cluster.scenarios.ablate import format_ablation

    rdu = [c for c in clusters if c.chip.execution_model == "dataflow"]
    if not rdu or (given and len(rdu) < len(clusters)):
        names = ", ".join(c.name for c in clusters if c not in rdu)
        raise ConfigError(f"--ablate: needs RDU (dataflow) clusters only; got {names} "
                          "(kernel-by-kernel: no dataflow optimization to turn off)")
    tables = []
    for c in rdu:
        title = f"{spec.name} on {c.name}: batch {batch}, prompt {prompt_len}, gen {gen_len}"
        rows = run_ablation(Scenario(spec, c, tensor_plan(c, tp), batch, prompt_len, gen_len))
        tables.append(format_ablation(rows, title))
    return "\n\n".join(tables)


