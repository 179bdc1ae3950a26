"""`rdu-cluster models` and `rdu-cluster clusters`: what is bundled, with the key figures."""

from __future__ import annotations

import json
from typing import Any

import click

import cluster_configs
from rdu_cluster.config import load_cluster
from rdu_cluster.output.report import text_table, weights_text
from workloads import catalog, params


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per model.")
def models(as_json: bool) -> None:
    """List the model catalog: shapes, parameters computed beside the published figures."""
    rows = [_model_row(name) for name in catalog.list_models()]
    if as_json:
        click.echo("\n".join(json.dumps(r) for r in rows))
        return
    header = ["model", "family", "layers", "hidden", "attn", "moe k/E", "params", "published",
              "active", "published", "weights"]
    body = [[r["model"], r["family"], r["layers"], r["hidden_size"], r["attention"], r["moe"],
             _b(r["total_params"]), _b(r["published_total_params"]), _b(r["active_params"]),
             _b(r["published_active_params"]), r["weights_dtype"]] for r in rows]
    click.echo(text_table(header, body))
    click.echo("active: as each publisher counts it (with or without the embedding tables); "
               "weights: the checkpoint's quantization_config, else bf16; sources in "
               "workloads/catalog/*.json")


def _model_row(name: str) -> dict:
    spec = catalog.load_model(name)
    pub = catalog.published(name)
    with_embedding = pub.get("active_counts_input_embedding", True)
    with_head = pub.get("active_counts_output_embedding", True)
    return {
        "model": name,
        "family": spec.family,
        "layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "attention": spec.attention.kind if spec.attention else "none",
        "moe": f"{spec.moe.top_k}/{spec.moe.num_experts}" if spec.moe else "",
        "total_params": params.total_params(spec),
        "published_total_params": pub["total_params"],
        "active_params": params.active_params(spec, input_embedding=with_embedding,
                                              output_embedding=with_head),
        "published_active_params": pub["active_params"],
        "weights_dtype": weights_text(spec.precision),
        "source": pub["source"],
    }


def _b(n: float) -> str:
    return f"{n / 1e9:.2f}B"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per cluster.")
def clusters(as_json: bool) -> None:
    """List the bundled clusters: chip, sockets, per-socket HBM and peak compute."""
    rows: list[dict[str, Any]] = []
    for name in cluster_configs.bundled("clusters"):
        c = load_cluster(name)
        rows.append(
            {
                "cluster": name,
                "chip": c.chip.name,
                "sockets": c.sockets,
                "nodes": c.nodes,
                "execution_model": c.chip.execution_model,
                "bf16_flops_per_s": c.chip.flops("bf16"),
                "hbm_bytes": c.chip.hbm.capacity_bytes,
                "hbm_bytes_per_s": c.chip.hbm.bandwidth_bytes_per_s,
                "topology": c.topology.kind,
            }
        )
    if as_json:
        click.echo("\n".join(json.dumps(r) for r in rows))
        return
    header = [
        "cluster",
        "chip",
        "sockets",
        "nodes",
        "execution",
        "BF16 TFLOP/s",
        "HBM GB",
        "HBM TB/s",
        "topology",
    ]
    body = [
        [
            r["cluster"],
            r["chip"],
            r["sockets"],
            r["nodes"],
            r["execution_model"],
            f"{r['bf16_flops_per_s'] / 1e12:.0f}",
            f"{r['hbm_bytes'] / 1e9:.1f}",
            f"{r['hbm_bytes_per_s'] / 1e12:.2f}",
            r["topology"],
        ]
        for r in rows
    ]
    click.echo(text_table(header, body))
