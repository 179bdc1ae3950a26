"""What more than one kind of the report's figures uses: the `Plot` record and a dataset's
columns (`Cols`, `columns`, `missing`), plotly itself (`require_plotly`), the colours (a cluster's
from PALETTE, anything else's from PARTS_PALETTE, a group's look: `looks`), the figure helpers
(panels, axis scales, hover text, axis titles, the scatter type) and the small value helpers
(unique, fmt)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from workloads.errors import ConfigError

Cols = Mapping[str, np.ndarray]
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#e7ba52",
           "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363")
# D3's category10, then darker picks of category20b/c: 20 traces a panel before a colour repeats
PARTS_PALETTE = ("#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#ffd92f", "#e5c494",
                 "#b3b3b3", "#fbb4ae", "#b3cde3", "#ccebc5", "#decbe4", "#fed9a6", "#ffffcc")
MAX_POINTS = 2000  # time series are binned to this many points (the page stays small)


@dataclass(frozen=True)
class Plot:
    name: str
    title: str
    needs: tuple[str, ...]
    draw: Callable[[Cols], tuple[Any, str]]  # a plotly Figure (untyped) or None


def require_plotly():
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise ConfigError(
            "report: plots need plotly, which is not installed; "
            "install the plot extra: pip install 'rdu-cluster[plot]'"
        ) from None
    return go


def columns(table: pa.Table, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        out[prefix + name] = col.to_numpy(zero_copy_only=False)
    return out


def missing(plot: Plot, cols: Cols) -> list[str]:
    return [c for c in plot.needs if c not in cols]


# --- figure helpers ------------------------------------------------------------------------
def panels(titles: Sequence[str], shared_y: bool = False, cols_max: int = 2):
    """One panel per title, at most `cols_max` a row; titles sit above their panel."""
    from plotly.subplots import make_subplots

    n = max(1, len(titles))
    ncols = min(cols_max, n)
    nrows = math.ceil(n / ncols)
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=[str(t) for t in titles],
                        shared_yaxes=shared_y, horizontal_spacing=0.12,
                        vertical_spacing=min(0.3, 0.5 / nrows) if nrows > 1 else 0.1)
    fig.update_layout(height=max(380, 340 * nrows), template="plotly_white",
                      hovermode="closest", legend={"title_text": "click to hide / show"},
                      margin={"l": 70, "r": 30, "t": 60, "b": 60})
    return fig, [(i // ncols + 1, i % ncols + 1) for i in range(n)]


def axis_scale(values, log: bool | None = None, unit: str = "") -> dict:
    """A numeric axis: log where asked, or (log=None) where the values span more than 20x;
    linear within one decade.
    Log ticks: a label at each decade only, written out in full with its unit ("500 ms", not
    a bare "5" between 1-2-5 ticks), unlabelled minor grid lines between; an axis spanning under
    two decades is widened to whole decades so it always carries at least two labels."""
    v = np.asarray([x for x in np.ravel(values).tolist() if x is not None], dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    decades = float(np.log10(v.max() / v.min())) if len(v) else 0.0
    if decades < 1 or not (log or (log is None and decades > np.log10(20))):
        return {"type": "linear", "ticksuffix": f" {unit}" if unit else ""}
    axis = {"type": "log", "dtick": 1, "tickformat": "~s" if v.max() >= 1e6 else ",~g",
            "ticksuffix": f" {unit}" if unit else "", "minor": {"dtick": "D1", "showgrid": True}}
    if decades < 2:
        lo, hi = np.log10(v.min()), np.log10(v.max())
        axis["range"] = [math.floor(lo), max(math.ceil(hi), math.floor(lo) + 1)]
    return axis


def color(i: int) -> str:
    """The i-th cluster's colour (the dataset's clusters in order, `looks`)."""
    return PALETTE[i % len(PALETTE)]


def part_color(j: int) -> str:
    """The j-th cause, toggle combination or series that is not a cluster: a palette of its
    own (ColorBrewer Set2, then Pastel1), so that no such colour reads as a cluster's."""
    return PARTS_PALETTE[j % len(PARTS_PALETTE)]


# Settings of one cluster (one colour) told apart by marker and dash, so that across every
# panel of a page a colour names a cluster and nothing else.
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "cross", "star", "hexagon")
DASHES = ("solid", "dash", "dashdot", "longdash")


def looks(cols: Cols, labelled: Sequence[tuple[str, np.ndarray]]) -> list[dict]:
    """Per group of `groups()`: its colour (its cluster's, by the cluster's place among all the
    dataset's clusters, the same on every panel) and, for its place among that cluster's
    groups, a marker symbol and a line dash."""
    clusters = {c: i for i, c in enumerate(unique(cols["cluster"]))}
    seen: dict[object, int] = {}
    out = []
    for _, m in labelled:
        rows = np.flatnonzero(m)
        cluster = cols["cluster"][rows[0]] if len(rows) else None
        k = seen[cluster] = seen.get(cluster, -1) + 1
        out.append({"color": color(clusters.get(cluster, 0)),
                    "symbol": SYMBOLS[k % len(SYMBOLS)],
                    "dash": DASHES[(k // len(SYMBOLS)) % len(DASHES)]})
    return out


def hover_text(cols: Cols, m: np.ndarray, names: Sequence[str]) -> list[str]:
    """Per-point hover text: each named column's value."""
    present = [n for n in names if n in cols]
    return ["<br>".join(f"{n}: {fmt(cols[n][i])}" for n in present) for i in np.flatnonzero(m)]


def axes(fig, where, x: str, y: str, xscale: dict | None = None,
         yscale: dict | None = None) -> None:
    """Titles and scales (`axis_scale`) of each panel; a scale left None is Plotly's guess
    (category for bar labels)."""
    for row, col in where:
        fig.update_xaxes(title_text=x, automargin=True, row=row, col=col, **(xscale or {}))
        fig.update_yaxes(title_text=y, automargin=True, row=row, col=col, **(yscale or {}))


def scatter(go, n: int):
    """SVG scatter, WebGL beyond MAX_POINTS points (SVG slows down there)."""
    return go.Scattergl if n > MAX_POINTS else go.Scatter


# --- small helpers -------------------------------------------------------------------------
def unique(values: np.ndarray, counts: bool = False):
    """np.unique that tolerates object columns holding None."""
    items = [v for v in values.tolist() if v is not None and not _nan(v)]
    try:
        keys = sorted(set(items))
    except TypeError:  # mixed types: any fixed order will do
        keys = sorted(set(items), key=str)
    if not counts:
        return np.array(keys, dtype=object)
    return np.array(keys, dtype=object), np.array([items.count(k) for k in keys])


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def fmt(value) -> str:
    if isinstance(value, (float, np.floating)):
        return f"{value:.4g}"
    return str(value)
