"""`rdu-cluster report DIR --out report.html`: one self-contained HTML page of a sweep dataset,
its plots embedded as PNG (base64), no external file or script."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import click
import numpy as np

from rdu_cluster.output import plots
from rdu_cluster.sweep import dataset
from workloads.errors import ConfigError


@click.command()
@click.argument("data_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--out", "out_path", default="report.html", show_default=True, help="HTML file.")
@click.option("--png-dir", default=None, help="Also save each plot as a PNG file here.")
def report(data_dir, out_path, png_dir) -> None:
    """Write an HTML report (roofline, tokens/s vs batch, ablation, breakdown, Pareto front) of
    the sweep dataset in DIR. Needs the `plot` extra (matplotlib)."""
    plots.require_matplotlib()
    root = Path(data_dir)
    info = dataset.sweep_info(root) if root.is_dir() else None
    if info is None:
        raise ConfigError(f"{root}: not a sweep dataset (no {dataset.SWEEP_FILE})")
    out = Path(out_path)
    if out.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(f"--out {out}: expected an .html file name")
    cols = plots.columns(dataset.read_dataset(root))
    manifest = dataset.read_manifest(root)
    figures = _figures(cols)
    if png_dir:
        folder = Path(png_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for name, png, _ in figures:
            if png:
                (folder / f"{name}.png").write_bytes(png)
    page = _page(info, manifest, cols, figures)
    if not out.parent.exists():
        raise ConfigError(f"--out {out}: folder {out.parent} does not exist")
    dataset.atomic_write(out, page.encode())
    click.echo(f"{out}: {len(cols['point_id']):,} rows, {sum(1 for f in figures if f[1])} plots")


def _figures(cols) -> list[tuple[str, bytes | None, str]]:
    out = []
    for name, fn in (
        ("roofline", plots.roofline),
        ("tokens_vs_batch", plots.tokens_vs_batch),
        ("ablation", plots.ablation),
        ("breakdown", plots.breakdown),
        ("pareto", plots.pareto),
    ):
        try:
            png, caption = fn(cols)
        except KeyError as e:  # a kind without that column (a plan sweep has no roofline)
            png, caption = None, f"Not available for this dataset: it has no column {e}."
        out.append((name, png, caption))
    return out


def _page(info, manifest, cols, figures) -> str:
    e = html.escape
    meta = [
        ("sweep", info.get("name")),
        ("kind", info.get("kind")),
        ("spec hash", info.get("spec_hash")),
        ("code version", info.get("code_version")),
        ("seed", info.get("seed")),
        ("points in the spec", f"{info.get('points', 0):,}"),
        ("finished points", f"{len(manifest.finished):,}"),
        ("rows", f"{len(cols['point_id']):,}"),
        ("infeasible points (dropped)", f"{len(manifest.infeasible):,}"),
    ]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{e(str(info.get('name')))}: rdu-cluster sweep report</title>",
        _STYLE,
        f"<h1>Sweep {e(str(info.get('name')))}</h1>",
        "<table>"
        + "".join(f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in meta)
        + "</table>",
        _summary_table(cols),
    ]
    for name, png, caption in figures:
        parts.append(f"<h2>{e(name.replace('_', ' '))}</h2><figure>")
        if png:
            data = base64.b64encode(png).decode()
            parts.append(f"<img alt='{e(name)}' src='data:image/png;base64,{data}'>")
        parts.append(f"<figcaption>{e(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


_STYLE = (
    "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
    "padding:3px 8px;text-align:right}th{background:#f3f3f3}img{max-width:100%}"
    "figcaption{color:#555;font-size:90%}</style></head><body>"
)


def _best(cols, name: str, mask, fmt: str) -> str:
    return fmt.format(np.max(cols[name][mask])) if name in cols else "-"


def _summary_table(cols) -> str:
    e = html.escape
    head = [
        "cluster",
        "model",
        "rows",
        "best tokens/s per request",
        "best tokens/s per socket",
        "best HBM BW utilization",
    ]
    rows = []
    per_socket = cols["tokens_per_s_total"] / cols["sockets"]
    for cluster in plots._unique(cols["cluster"]):
        for model in plots._unique(cols["model"]):
            m = (cols["cluster"] == cluster) & (cols["model"] == model)
            if m.any():
                rows.append(
                    [
                        cluster,
                        model,
                        f"{int(m.sum()):,}",
                        f"{np.max(cols['tokens_per_s_per_request'][m]):,.1f}",
                        f"{np.max(per_socket[m]):,.1f}",
                        _best(cols, "hbm_bw_utilization", m, "{:.1%}"),
                    ]
                )
    return (
        "<table><tr>"
        + "".join(f"<th>{e(h)}</th>" for h in head)
        + "</tr>"
        + "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in rows)
        + "</table>"
    )
