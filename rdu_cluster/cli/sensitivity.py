"""`rdu-cluster sensitivity`: the elasticity of TPOT, TTFT and tokens/s to each hardware figure
of a cluster (partitioning/sensitivity.py), ranked, with the mechanism that carries it."""

from __future__ import annotations

import html
import json

import click

from chip import serving_stacks
from partitioning import sensitivity as sens
from partitioning.scenario import Scenario
from rdu_cluster.cli import options as o
from rdu_cluster.cli.options import calibration_option, hardware_options
from rdu_cluster.cli.simulate import plan_of
from rdu_cluster.config import load_cluster
from rdu_cluster.output import atomic
from rdu_cluster.output.report import overrides_line, text_table, weights_text
from workloads.catalog import load_model
from workloads.spec import check_context, with_dtypes


@click.command()
@calibration_option
@click.option("--model", "model_ref", default="llama-3.1-70b", show_default=True,
              help="Catalog name or path to a HuggingFace config.json.")
@click.option("--cluster", "cluster_ref", default="sn40l-16", show_default=True,
              help="Cluster name or TOML path.")
@click.option("--plan", "plan_text", default=None,
              help="Partitioning plan (tp16, tp8ep2, ...) [default: the best for latency].")
@click.option("--batch", default=1, show_default=True, type=o.BATCH)
@click.option("--prompt-len", default=1024, show_default=True, type=o.LENGTH)
@click.option("--gen-len", default=256, show_default=True, type=o.LENGTH)
@o.dtype_options
@o.stack_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per hardware figure.")
@click.option("--plot", "plot_path", default=None, metavar="FILE.html",
              help="Write a tornado chart (a self-contained HTML page, no scripts).")
@hardware_options
def sensitivity(model_ref: str, cluster_ref: str, plan_text: str | None, batch: int,
                prompt_len: int, gen_len: int, weights_dtype: str | None,
                kv_dtype: str | None, stack_name: str | None, as_json: bool,
                plot_path: str | None, overrides: dict) -> None:
    """Elasticity of TPOT, TTFT and tokens/s to each hardware figure (peak FLOP/s, SRAM, HBM and
    DDR bandwidth and capacity, link bandwidth and latency, PCU / PMU counts): each figure scaled
    by 1/1.25 and 1.25, d ln(metric) / d ln(figure), ranked by |TPOT elasticity|, with the decode
    cause that moves most (the mechanism)."""
    if plot_path is not None:
        if not plot_path.endswith(".html"):
            raise click.BadParameter(f"{plot_path}: expected a .html file name",
                                     param_hint="--plot")
        atomic.check_destination(plot_path, "--plot")
    spec = with_dtypes(load_model(model_ref), weights_dtype, kv_dtype)
    check_context(spec, prompt_len, gen_len, "--prompt-len/--gen-len")
    cluster = load_cluster(cluster_ref, overrides)
    options = serving_stacks.options_for(cluster.chip, stack_name, system=cluster.name)
    stack = serving_stacks.stack_of(cluster.chip, options)
    scenario = Scenario(spec, cluster, batch=batch, prompt_len=prompt_len, gen_len=gen_len,
                        options=options)
    plan = plan_of(scenario, None, plan_text, "latency")
    rows = sens.hardware_sensitivity(scenario.but(plan=plan))
    weights = spec.quantization or weights_text(spec.precision)
    head = {"model": spec.name, "cluster": cluster.name, "plan": plan.name, "batch": batch,
            "prompt_len": prompt_len, "gen_len": gen_len, "weights": weights,
            "kv_dtype": spec.precision.kv_cache.value, "stack": stack,
            "calibration": cluster.chip.calibration}
    records = [head | _record(i + 1, r) for i, r in enumerate(rows)]
    title = (f"{spec.name} on {cluster.name}" + (f", stack {stack}" if stack else "")
             + f", plan {plan.name}, weights {weights}, batch {batch}, prompt {prompt_len}, "
             f"gen {gen_len} (calibration: {cluster.chip.calibration})")
    if plot_path is not None:
        atomic.atomic_write(plot_path, tornado_html(title, rows).encode(), "--plot")
    if as_json:
        click.echo("\n".join(json.dumps(r) for r in records))
        return
    if overrides:
        click.echo(overrides_line(overrides))
    click.echo(f"elasticity d ln(metric) / d ln(figure), figures scaled 1/{sens.STEP:g}x and "
               f"{sens.STEP:g}x, ranked by |TPOT elasticity|: {title}")
    body = [[i + 1, r.figure, *(_e(r.elasticity[m]) for m in sens.METRICS), r.mechanism,
             r.note.split(":")[0]] for i, r in enumerate(rows)]
    click.echo(text_table(["#", "hardware figure", "TPOT", "TTFT", "tokens/s", "mechanism",
                           "note"], body))


def _record(rank: int, r: sens.Elasticity) -> dict:
    return {"rank": rank, "figure": r.figure, "key": r.key,
            **{f"elasticity_{m}": r.elasticity[m] for m in sens.METRICS},
            **{f"{m}_ratio_low": r.change[m][0] for m in sens.METRICS},
            **{f"{m}_ratio_high": r.change[m][1] for m in sens.METRICS},
            "mechanism": r.mechanism, "note": r.note or None}


def _e(v: float | None) -> str:
    return "-" if v is None else f"{v:+.3f}"


def tornado_html(title: str, rows: list[sens.Elasticity]) -> str:
    """A tornado of tokens/s: per figure, the change at 1/STEP (left of centre when it slows) and
    at STEP, largest first; inline SVG, so the page needs nothing else."""
    width, bar_h, left, mid = 900, 26, 190, 545
    scale = 330.0 / max([abs(v - 1.0) for r in rows for v in r.change["tokens_per_s_total"]
                         if v is not None] + [0.01])
    parts = []
    for i, r in enumerate(rows):
        y = 40 + i * bar_h
        parts.append(f'<text x="{left - 8}" y="{y + 17}" text-anchor="end">'
                     f'{html.escape(r.figure)}</text>')
        for v, colour, label in zip(r.change["tokens_per_s_total"], ("#d62728", "#1f77b4"),
                                    (f"1/{sens.STEP:g}x", f"{sens.STEP:g}x")):
            if v is None:
                continue
            d = (v - 1.0) * scale
            x, w = (mid + d, -d) if d < 0 else (mid, d)
            parts.append(f'<rect x="{x:.1f}" y="{y + 4}" width="{max(w, 0.5):.1f}" height="18" '
                         f'fill="{colour}"><title>{html.escape(r.figure)} {label}: '
                         f'{(v - 1) * 100:+.2f}% tokens/s ({html.escape(r.mechanism)})</title>'
                         '</rect>')
        parts.append(f'<text x="{width - 5}" y="{y + 17}" text-anchor="end" fill="#555">'
                     f'{html.escape(r.mechanism)}</text>')
    height = 60 + bar_h * len(rows)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="13">'
           f'<line x1="{mid}" y1="30" x2="{mid}" y2="{height - 10}" stroke="#333"/>'
           f'<text x="{mid}" y="22" text-anchor="middle">tokens/s change (red: figure '
           f'/{sens.STEP:g}, blue: x{sens.STEP:g}); right: the mechanism</text>'
           + "".join(parts) + "</svg>")
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>"
            f"{html.escape(title)}</title></head><body><h3>{html.escape(title)}</h3>{svg}"
            "</body></html>\n")
