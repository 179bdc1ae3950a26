"""The HTML report: one self-contained, interactive page (Plotly: tooltips, zoom, legend
toggles) of a sweep dataset (simulate, plan or serve) or of one `serve --out` folder. plotly.js
is embedded in the page, so it opens offline (`rdu-cluster report`, cli/report.py)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rdu_cluster.engine import metrics
from rdu_cluster.output import plots
from rdu_cluster.sweep import dataset
from workloads.errors import ConfigError

RUN_TABLES = ("requests", "steps", "sockets", "links")  # what `serve --out` writes (cli/serve.py)
_SCHEMAS = {"requests": metrics.REQUESTS, "steps": metrics.STEPS, "sockets": metrics.SOCKETS,
            "links": metrics.LINKS}


@dataclass(frozen=True)
class Dataset:
    kind: str  # a sweep kind (simulate, plan, serve, ...) or "run" (one serve folder)
    title: str
    meta: list[tuple[str, object]]
    cols: plots.Cols


@dataclass(frozen=True)
class Figure:
    name: str
    title: str
    html: str | None  # the figure's <div> and script; None: skipped
    caption: str


def load(root: Path) -> Dataset:
    if not root.is_dir():
        raise ConfigError(f"{root}: no such folder")
    info = dataset.sweep_info(root)
    if info is not None:
        manifest = dataset.read_manifest(root)
        cols = plots.with_variants(plots.columns(dataset.read_dataset(root)))
        meta = [("sweep", info.get("name")), ("kind", info.get("kind")),
                ("spec hash", info.get("spec_hash")), ("code version", info.get("code_version")),
                ("seed", info.get("seed")), ("points in the spec", f"{info.get('points', 0):,}"),
                ("finished points", f"{len(manifest.finished):,}"),
                ("infeasible points (dropped)", f"{len(manifest.infeasible):,}")]
        return Dataset(str(info.get("kind")), f"Sweep {info.get('name')}", meta, cols)
    if (root / "requests.parquet").is_file():
        return _load_run(root)
    raise ConfigError(f"{root}: neither a sweep dataset (no "
                      f"{dataset.meta_dir(root) / dataset.SWEEP_FILE}) nor a `serve --out` "
                      "folder (no requests.parquet)")


def _read_table(path: Path):
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise ConfigError(f"damaged table {path} ({str(e).splitlines()[0][:80]}); rerun the "
                          "serve command that wrote it") from None
    # its first columns, the same in every schema version: another table is refused, an
    # earlier version's (fewer columns after these) still read
    missing = [n for n in _SCHEMAS[path.stem].names[:3] if n not in table.column_names]
    if missing:
        raise ConfigError(f"damaged table {path} (not a {path.stem} table: no column "
                          f"{missing[0]!r}); rerun the serve command that wrote it")
    return table


def _load_run(root: Path) -> Dataset:
    # serve writes the four tables or none: one missing is a result set someone cut short
    lacking = [n for n in RUN_TABLES if not (root / f"{n}.parquet").is_file()]
    if lacking:
        raise ConfigError(f"{root}: not a whole `serve --out` folder (no {lacking[0]}.parquet, "
                          f"one of {', '.join(RUN_TABLES)}); rerun the serve command that "
                          "wrote it")
    tables = {n: _read_table(root / f"{n}.parquet") for n in RUN_TABLES}
    raw = tables["requests"].schema.metadata or {}
    meta = {k.decode().removeprefix("rdu_cluster."): v.decode() for k, v in raw.items()}
    shown = [(k.replace("_", " "), meta[k]) for k in ("model", "cluster", "plan", "scheduler",
                                                        "seed", "trace", "schema_version",
                                                        "code_version", "config_hash")
             if k in meta]
    shown.append(("tables", ", ".join(f"{n} ({t.num_rows:,} rows)" for n, t in tables.items())))
    title = f"Serving run: {meta.get('model', '?')} on {meta.get('cluster', '?')}"
    return Dataset("run", title, shown, plots.run_columns(tables))


def render(data: Dataset) -> list[Figure]:
    """Each plot of the dataset's kind, or the sentence that says why it is not drawn."""
    known = plots.PLOTS.get(data.kind)
    if known is None:
        return [Figure("plots", "Plots", None,
                       f"No plots for a {data.kind!r} dataset (plots exist for "
                       f"{', '.join(sorted(plots.PLOTS))}); the table above has its rows.")]
    out = []
    for i, plot in enumerate(known):
        lacking = plots.missing(plot, data.cols)
        if lacking:
            out.append(Figure(plot.name, plot.title, None,
                              f"Skipped: this dataset has no column {', '.join(lacking)}, which "
                              f"this plot needs."))
            continue
        fig, caption = plot.draw(data.cols)
        div = None if fig is None else fig.to_html(
            full_html=False, include_plotlyjs=False, div_id=f"plot-{i}-{plot.name}",
            config={"displaylogo": False, "responsive": True, "scrollZoom": True})
        out.append(Figure(plot.name, plot.title, div, caption))
    return out


def page(data: Dataset, figures: list[Figure]) -> str:
    from plotly.offline import get_plotlyjs

    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{e(data.title)}: rdu-cluster report</title>",
        f"<script type='text/javascript'>{get_plotlyjs()}</script>",  # offline: no CDN
        _STYLE,
        f"<h1>{e(data.title)}</h1>",
        "<table>" + "".join(f"<tr><th>{e(str(k))}</th><td>{e(str(v))}</td></tr>"
                            for k, v in [*data.meta, ("rows", f"{rows(data):,}")]) + "</table>",
        _summary(data),
        ("<p class='hint'>Hover a point for its values; drag to zoom, double-click to reset; "
        "click a legend entry to hide or show it.</p>"),
    ]
    for f in figures:
        parts.append(f"<h2>{e(f.title)}</h2><figure class='{'plot' if f.html else 'skipped'}'>")
        if f.html:
            parts.append(f.html)
        parts.append(f"<figcaption>{e(f.caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


_STYLE = (
    "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
    "padding:3px 8px;text-align:right}th{background:#f3f3f3}"
    "figcaption{color:#555;font-size:90%}.skipped figcaption{color:#a40}"
    ".hint{color:#555;font-size:90%}</style></head><body>"
)


def rows(data: Dataset) -> int:
    key = "requests.request_id" if data.kind == "run" else "point_id"
    col = data.cols.get(key)
    return 0 if col is None else len(col)


# (header, column, reduce, format) of the summary table per kind; a missing column shows "-".
_SUMMARY: dict[str, list[tuple[Any, ...]]] = {
    "serve": [("best output tokens/s", "throughput_tokens_per_s", np.max, "{:,.0f}"),
              ("lowest TTFT p50 ms", "ttft_p50_s", np.min, "{:.1f}", 1e3),
              ("lowest TPOT p50 ms", "tpot_p50_s", np.min, "{:.2f}", 1e3),
              ("most requests unserved", "requests_unserved", np.max, "{:,.0f}")],
    "default": [("best tokens/s per request", "tokens_per_s_per_request", np.max, "{:,.1f}"),
                ("best tokens/s total", "tokens_per_s_total", np.max, "{:,.1f}"),
                ("best HBM BW utilization", "hbm_bw_utilization", np.max, "{:.1%}")],
}


def _summary(data: Dataset) -> str:
    """A row per cluster and model with the best figures of a sweep (a run has its own tables)."""
    cols = data.cols
    if data.kind == "run" or "cluster" not in cols or "model" not in cols:
        return ""
    spec = _SUMMARY.get(data.kind, _SUMMARY["default"])
    e = html.escape
    head = ["cluster", "model", "rows", *(s[0] for s in spec)]
    rows = []
    for cluster in plots.unique(cols["cluster"]):
        for model in plots.unique(cols["model"]):
            m = (cols["cluster"] == cluster) & (cols["model"] == model)
            if m.any():
                rows.append([cluster, model, f"{int(m.sum()):,}", *(_cell(cols, s, m)
                                                                   for s in spec)])
    return ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>"
                      for r in rows) + "</table>")


def _cell(cols, spec, mask) -> str:
    _, name, reduce, fmt, *scale = spec
    if name not in cols:
        return "-"
    v = np.asarray([x for x in cols[name][mask].tolist() if x is not None], dtype=float)
    v = v[np.isfinite(v)]
    return fmt.format(reduce(v) * (scale[0] if scale else 1)) if len(v) else "-"
