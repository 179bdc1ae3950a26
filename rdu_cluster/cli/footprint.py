"""`rdu-cluster footprint`: nodes each system needs to host N experts, and where each byte lives."""

from __future__ import annotations

import json

import click

from rdu_cluster.cli import options as o
from rdu_cluster.cli.options import calibration_option
from rdu_cluster.config import load_cluster
from rdu_cluster.scenarios.coe import DEFAULT_EXPERT, DEFAULT_ROUTER
from rdu_cluster.scenarios.hosting import footprint as compute
from rdu_cluster.scenarios.hosting import report
from workloads.catalog import load_model
from workloads.spec import with_dtypes

DEFAULT_CLUSTERS = ("sn40l-8", "dgx-h100", "dgx-a100")


@click.command()
@calibration_option
@click.option("--experts", "n", required=True, type=o.EXPERTS, help="Number of experts to host.")
@click.option("--expert-model", default=DEFAULT_EXPERT, show_default=True,
              help="Catalog name or config.json of each expert.")
@click.option("--cluster", "cluster_refs", multiple=True,
              help="Cluster (its node is the unit); repeat. "
              f"[default: {', '.join(DEFAULT_CLUSTERS)}]")
@click.option("--latency-target", default=None, type=o.POSITIVE,
              help="Most seconds to first token of a request whose expert is not in HBM.")
@click.option("--router", default=DEFAULT_ROUTER, show_default=True, help="Router model.")
@click.option("--batch", default=1, show_default=True, type=o.BATCH, help="KV reserve: sequences.")
@click.option("--prompt-len", default=512, show_default=True, type=o.LENGTH)
@click.option("--gen-len", default=20, show_default=True, type=o.LENGTH)
@o.dtype_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per system.")
def footprint(n, expert_model, cluster_refs, latency_target, router, batch, prompt_len, gen_len,
              weights_dtype, kv_dtype, as_json) -> None:
    """How many nodes each system needs to host N experts at the latency target (--weights
    and --kv-dtype: each expert's)."""
    expert = with_dtypes(load_model(expert_model), weights_dtype, kv_dtype)
    fps = [
        compute(n, expert, load_cluster(c), latency_target, router, batch, prompt_len, gen_len)
        for c in (cluster_refs or DEFAULT_CLUSTERS)
    ]
    if as_json:
        for fp in fps:
            chosen = fp.chosen
            click.echo(json.dumps({
                "cluster": fp.cluster,
                "experts": fp.experts,
                "expert_model": fp.expert_model,
                "weights": fp.dtypes[0], "kv_dtype": fp.dtypes[1],
                "placement": chosen.name if chosen else None,
                "nodes": chosen.nodes if chosen else None,
                "ttft_s": chosen.ttft_s if chosen else None,
                "hbm_bytes_per_node": chosen.hbm_bytes if chosen else None,
                "tier_bytes_per_node": chosen.tier_bytes if chosen else None,
                "tier": chosen.tier_name if chosen else None,
                "infeasible_reason": fp.infeasible_reason,  # as simulate's: why the above are null
            }))
    else:
        click.echo(report(fps))
