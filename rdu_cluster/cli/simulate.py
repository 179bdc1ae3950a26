"""`rdu-cluster simulate`: decode and prefill estimates of one model on one or more clusters."""

from __future__ import annotations

import click

from rdu_cluster import results
from rdu_cluster.ablate import ablate as run_ablation
from rdu_cluster.ablate import format_ablation
from rdu_cluster.config import load_cluster
from rdu_cluster.estimate import estimate
from rdu_cluster.report import side_by_side
from workloads.catalog import load_model
from workloads.dtypes import DType, Precision
from workloads.errors import ConfigError

DEFAULT_MODEL = "llama-3.1-70b"
DEFAULT_CLUSTERS = ("sn40l-16", "dgx-h100")


@click.command()
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
@click.option("--batch", default=1, show_default=True, type=int, help="Sequences decoded together.")
@click.option("--prompt-len", default=1024, show_default=True, type=int)
@click.option("--gen-len", default=256, show_default=True, type=int)
@click.option("--tp", default=None, type=int, help="Tensor-parallel degree [default: all sockets].")
@click.option(
    "--weights",
    "weights_dtype",
    default=None,
    help="Weight dtype (bf16, fp8, int4, mxfp4) [default: the model's].",
)
@click.option("--kv-dtype", default=None, help="KV-cache dtype [default: the model's].")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per result line.")
@click.option("--out", "out_path", default=None, help="Write the results (.parquet or .arrow).")
@click.option(
    "--ablate",
    is_flag=True,
    help="RDU clusters: each dataflow optimization off in turn, all off, and the "
    "unfused host-orchestrated baseline.",
)
def simulate(
    model_ref,
    cluster_refs,
    batch,
    prompt_len,
    gen_len,
    tp,
    weights_dtype,
    kv_dtype,
    as_json,
    out_path,
    ablate,
) -> None:
    """Estimate decode and prefill of MODEL on each CLUSTER."""
    spec = _with_dtypes(load_model(model_ref), weights_dtype, kv_dtype)
    clusters = [load_cluster(c) for c in (cluster_refs or DEFAULT_CLUSTERS)]
    if ablate:
        click.echo(_ablation_tables(spec, clusters, batch, prompt_len, gen_len, tp))
        return
    rows, estimates = [], []
    for cluster in clusters:
        est = estimate(spec, cluster, batch=batch, prompt_len=prompt_len, gen_len=gen_len, tp=tp)
        estimates.append(est)
        rows += results.records(est, cluster.chip.name, cluster.chip.execution_model)
    tbl = results.table(rows)
    if out_path:
        results.write_table(tbl, out_path)
    click.echo(results.json_lines(tbl) if as_json else side_by_side(estimates, clusters))


def _ablation_tables(spec, clusters, batch, prompt_len, gen_len, tp) -> str:
    rdu = [c for c in clusters if c.chip.execution_model == "dataflow"]
    if not rdu:
        names = ", ".join(c.name for c in clusters)
        raise ConfigError(f"--ablate: needs an RDU (dataflow) cluster; got {names}")
    tables = []
    for c in rdu:
        title = f"{spec.name} on {c.name}: batch {batch}, prompt {prompt_len}, gen {gen_len}"
        rows = run_ablation(spec, c, batch, prompt_len, gen_len, tp)
        tables.append(format_ablation(rows, title))
    return "\n\n".join(tables)


def _with_dtypes(spec, weights: str | None, kv: str | None):
    p = spec.precision
    if weights:
        w = DType.parse(weights, "--weights")
        p = Precision(w, p.kv_cache, p.activations, None)
    if kv:
        p = Precision(p.weights, DType.parse(kv, "--kv-dtype"), p.activations, p.expert_weights)
    return spec.with_precision(p)
