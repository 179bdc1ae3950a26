"""`rdu-cluster report DIR --out report.html`: the interactive HTML report of a sweep dataset or
of one `serve --out` folder (rdu_cluster/output/report_page.py)."""

from __future__ import annotations

from pathlib import Path

import click

from rdu_cluster.output import atomic, plots
from rdu_cluster.output.report_page import load, page, render, rows
from workloads.errors import ConfigError


@click.command()
@click.argument("data_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--out", "out_path", default="report.html", show_default=True, help="HTML file.")
def report(data_dir, out_path) -> None:
    """Write an interactive HTML report of DIR: a sweep dataset (simulate: roofline, tokens/s
    vs batch, ablation, breakdown, Pareto; serve: latency vs throughput, TTFT and TPOT vs rate,
    latency quantiles, Pareto) or one `serve --out` folder (latency CDFs, batch over time, time
    by cause, socket and link use). Needs the `plot` extra (plotly)."""
    plots.require_plotly()
    out = Path(out_path)
    if out.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(f"--out {out}: expected an .html file name")
    if atomic.within(out, data_dir):
        raise ConfigError(f"--out {out}: inside DIR {data_dir}, which holds only its tables; "
                          "give a file outside it")
    atomic.check_destination(out)  # before any work
    data = load(Path(data_dir))
    figures = render(data)
    atomic.atomic_write(out, page(data, figures).encode())
    drawn = sum(1 for f in figures if f.html)
    click.echo(f"{out}: {data.kind} dataset, {rows(data):,} rows, {drawn} plots"
               + (f", {len(figures) - drawn} skipped (reasons on the page)"
                  if drawn < len(figures) else ""))
