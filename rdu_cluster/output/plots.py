"""Interactive plots of a dataset (Plotly, the optional `plot` extra) for the HTML report.

A dataset is a flat mapping of numpy columns: a sweep's rows (`columns(table)`), or a `serve`
output folder's tables with the table name in front ("requests.ttft_s", `run_columns`). Each
plot is a `Plot`: the columns it needs and a function returning (figure or None, caption). The
report checks the columns first, so a dataset without one gets a sentence, not a traceback.

Where a sweep varies more than a plot shows, it shows one slice (every other varying column at
its most common value, chosen per cluster and model; named in the caption). Fronts and curves
are drawn per model (one panel each) and per setting (one trace per cluster and workload
setting), never over points of different models or settings. Legends and panel titles carry
the labels (no free-floating annotations), so labels cannot overlap the data or each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from chip.cost import CAUSES
from workloads.errors import ConfigError

Cols = Mapping[str, np.ndarray]
# Columns that are results or bookkeeping, never a sweep axis to slice on.
_NOT_AXES = {
    "point_id", "chip", "execution_model", "bound", "sockets", "replicas", "cluster_ref",
    "model_ref", "chip_peak_flops_per_s", "chip_hbm_bandwidth_bytes_per_s", "seed", "tp", "ep",
    "pp", "dp", "plan", "mixer_tp", "requests", "plans_evaluated", "plans_feasible",
    "variant", "variant_axes", "cluster_base", "calibration",
}
# Sweep axes that change the hardware (a --set path of the chip or the topology): each
# combination is a variant of its cluster, drawn as a system of its own (`with_variants`).
HARDWARE_PREFIXES = ("chip_", "topology_")
# Axes an operator chooses (batch limits, plan, load): a Pareto front runs over them; every
# other varying axis (prompt and output lengths, dtypes, ...) is a setting with its own front.
KNOBS = {"batch", "tp", "plan", "rate_requests_per_s", "max_batch", "token_budget",
         "chunked_prefill", "preemption", "scheduler", "kv_fraction", "objective", "spill"}
MAX_GROUPS = 20  # traces per panel (one colour each) before a plot slices the settings
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#e7ba52",
           "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363")
# D3's category10, then darker picks of category20b/c: 20 traces a panel before a colour repeats
# Latency metrics and utilizations of one run: shades of grey, which name no cluster or cause
METRIC_COLORS = {"ttft_s": "#222222", "tpot_s": "#666666", "e2e_s": "#999999",
                 "busy": "#444444"}
PARTS_PALETTE = ("#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#ffd92f", "#e5c494",
                 "#b3b3b3", "#fbb4ae", "#b3cde3", "#ccebc5", "#decbe4", "#fed9a6", "#ffffcc")
QUANTILES = (50, 90, 99)  # the percentiles a serve row carries (engine/metrics.percentiles)
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


def with_variants(cols: Cols) -> Cols:
    """A sweep whose axes vary the hardware: every plot draws each variant as a system of its
    own. The cluster column becomes "CLUSTER [variant]" (a colour, a bar, a trace each), the
    original is kept as `cluster_base`, the variant's label as `variant`, and the hardware
    axes stop being axes to slice on. A dataset without such axes is returned as it is."""
    hw = [n for n in axis_columns(cols) if n.startswith(HARDWARE_PREFIXES)]
    if not hw:
        return cols
    label = np.array([", ".join(f"{_short(n)}={_fmt(v)}" for n, v in zip(hw, row))
                      for row in zip(*(cols[n] for n in hw))], dtype=object)
    base = np.asarray(cols["cluster"], dtype=object)
    return {**cols, "cluster_base": base, "variant": label, "variant_axes": np.array(hw),
            "cluster": np.array([f"{c} [{v}]" for c, v in zip(base, label)], dtype=object)}


def _short(column: str) -> str:
    """chip_tiers_hbm_bandwidth_bytes_per_s -> hbm_bandwidth_bytes_per_s"""
    for prefix in ("chip_tiers_", "chip_execution_", "chip_peak_flops_", "topology_", "chip_"):
        if column.startswith(prefix):
            return column[len(prefix):]
    return column


def missing(plot: Plot, cols: Cols) -> list[str]:
    return [c for c in plot.needs if c not in cols]


# --- slicing and grouping ------------------------------------------------------------------
def axis_columns(cols: Cols) -> list[str]:
    """Scenario axes: the input columns that take more than one value in the dataset."""
    from rdu_cluster.output.results import schema
    from rdu_cluster.sweep.runners import SERVE_SCHEMA

    inputs = {"batch", "prompt_len", "gen_len", "cluster", "model"}
    outputs = ({f.name for f in schema()} | {f.name for f in SERVE_SCHEMA}) - inputs
    variant = set(np.ravel(cols.get("variant_axes", [])).tolist())  # with_variants
    names = [n for n in cols if n not in outputs and n not in _NOT_AXES and "." not in n
             and n not in variant]
    return [n for n in names if len(_unique(cols[n])) > 1]


def slice_mask(cols: Cols, keep: Sequence[str]) -> tuple[np.ndarray, str]:
    """Rows where every varying axis not in `keep` is at its most common value, chosen within
    each (cluster, model) group (so an axis zipped with the cluster, like tp, keeps them all)."""
    n = len(cols["cluster"])
    mask = np.zeros(n, dtype=bool)
    fixed: dict[str, set[str]] = {}
    names = [a for a in axis_columns(cols) if a not in keep and a not in ("cluster", "model")]
    for cluster in _unique(cols["cluster"]):
        for model in _unique(cols["model"]):
            group = (cols["cluster"] == cluster) & (cols["model"] == model)
            for name in names:
                values, counts = _unique(cols[name][group], counts=True)
                if len(values):
                    value = _mode(values, counts)
                    group &= _equal(cols[name], value)
                    fixed.setdefault(name, set()).add(_fmt(value))
            mask |= group
    text = "; ".join(f"{k}={'/'.join(sorted(v))}" for k, v in fixed.items())
    return mask, text or "all points"


def groups(cols: Cols, mask: np.ndarray, by: Sequence[str]) -> list[tuple[str, np.ndarray]]:
    """(label, rows) per combination of the cluster and the `by` columns within `mask`: the
    label names the cluster and each `by` value, e.g. "sn40l-8, max_batch=4"."""
    keys = [cols["cluster"]] + [cols[b] for b in by]
    raw = {tuple(k[i] for k in keys) for i in np.flatnonzero(mask)}
    out = []
    for combo in sorted(raw, key=lambda c: tuple(_order(v) for v in c)):  # 4 < 16 < 160
        m = mask.copy()
        for k, v in zip(keys, combo):
            m &= _equal(k, v)
        label = ", ".join([_fmt(combo[0]), *(f"{b}={_fmt(v)}" for b, v in zip(by, combo[1:]))])
        out.append((label, m))
    return out


def _order(value) -> tuple:
    """Numbers by value, before anything else by text."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def settings_slice(cols: Cols, x_axes: Sequence[str]) -> tuple[np.ndarray, list[str], str]:
    """Rows and the varying axes to draw one trace per value of: every varying axis not on the
    x axis (`x_axes`); if that makes more than MAX_GROUPS traces a panel, the settings (not
    knobs) are fixed at their most common value instead, named in the returned text."""
    varying = [a for a in axis_columns(cols) if a not in ("cluster", "model", *x_axes)]
    mask = np.ones(len(cols["cluster"]), dtype=bool)
    if len(groups(cols, mask, varying)) <= MAX_GROUPS * max(1, len(_unique(cols["model"]))):
        return mask, varying, ""
    mask, fixed = slice_mask(cols, [*x_axes, *(a for a in varying if a in KNOBS)])
    return mask, [a for a in varying if a in KNOBS], f" Slice: {fixed}."


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both x and y (maximizing), by x."""
    order = np.lexsort((-y, -x))  # x descending, then y descending
    front, best = [], -np.inf
    for i in order:
        if y[i] > best:
            front.append(i)
            best = y[i]
    return np.array(sorted(front, key=lambda i: x[i]), dtype=int)


# --- figure helpers ------------------------------------------------------------------------
def _panels(titles: Sequence[str], shared_y: bool = False, cols_max: int = 2):
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


def _scale(values, log: bool | None = None, unit: str = "") -> dict:
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


def _color(i: int) -> str:
    """The i-th cluster's colour (the dataset's clusters in order, `looks`)."""
    return PALETTE[i % len(PALETTE)]


def _part_color(j: int) -> str:
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
    clusters = {c: i for i, c in enumerate(_unique(cols["cluster"]))}
    seen: dict[object, int] = {}
    out = []
    for _, m in labelled:
        rows = np.flatnonzero(m)
        cluster = cols["cluster"][rows[0]] if len(rows) else None
        k = seen[cluster] = seen.get(cluster, -1) + 1
        out.append({"color": _color(clusters.get(cluster, 0)),
                    "symbol": SYMBOLS[k % len(SYMBOLS)],
                    "dash": DASHES[(k // len(SYMBOLS)) % len(DASHES)]})
    return out


def _hover(cols: Cols, m: np.ndarray, names: Sequence[str]) -> list[str]:
    """Per-point hover text: each named column's value."""
    present = [n for n in names if n in cols]
    return ["<br>".join(f"{n}: {_fmt(cols[n][i])}" for n in present) for i in np.flatnonzero(m)]


def _axes(fig, where, x: str, y: str, xscale: dict | None = None,
          yscale: dict | None = None) -> None:
    """Titles and scales (`_scale`) of each panel; a scale left None is Plotly's guess
    (category for bar labels)."""
    for row, col in where:
        fig.update_xaxes(title_text=x, automargin=True, row=row, col=col, **(xscale or {}))
        fig.update_yaxes(title_text=y, automargin=True, row=row, col=col, **(yscale or {}))


def _scatter(go, n: int):
    """SVG scatter, WebGL beyond MAX_POINTS points (SVG slows down there)."""
    return go.Scattergl if n > MAX_POINTS else go.Scatter


# --- simulate / plan sweeps ----------------------------------------------------------------
def roofline(cols: Cols):
    """Achieved FLOP/s per socket against arithmetic intensity, under each chip's roof."""
    go = require_plotly()
    fig, where = _panels(["Roofline of the decode points"], cols_max=1)
    intensity = cols["flops_per_token"] / cols["bytes_per_token"]
    achieved = cols["flops_per_token"] * cols["tokens_per_s_total"] / cols["sockets"]
    for i, cluster in enumerate(_unique(cols["cluster"])):
        m = cols["cluster"] == cluster
        fig.add_trace(_scatter(go, int(m.sum()))(
            x=intensity[m], y=achieved[m], mode="markers", name=cluster,
                                   marker={"size": 5, "opacity": 0.6, "color": _color(i)},
                                   text=_hover(cols, m, ["model", "batch", "prompt_len", "tp"])))
    x = np.logspace(np.log10(max(intensity.min() / 2, 1e-3)), np.log10(intensity.max() * 4), 200)
    roofs = sorted(set(zip(cols["chip"].tolist(), cols["chip_peak_flops_per_s"].tolist(),
                           cols["chip_hbm_bandwidth_bytes_per_s"].tolist())))
    for chip, peak, bw in roofs:
        fig.add_trace(go.Scatter(x=x, y=np.minimum(peak, x * bw), mode="lines",
                                 name=f"roof: {chip} ({bw / 1e12:.2f} TB/s)",
                                 line={"dash": "dash", "width": 1, "color": "gray"}))
    _axes(fig, where, "arithmetic intensity (FLOP / HBM byte)", "achieved FLOP/s per socket",
          _scale(intensity, True, "FLOP/B"), _scale(achieved, True, "FLOP/s"))
    return fig, ("Each point: one design point's decode step (FLOPs per token over HBM bytes per "
                 "token; FLOP/s per socket). Dashed: min(peak, intensity x HBM bandwidth) of each "
                 "chip.")


def tokens_vs_batch(cols: Cols):
    go = require_plotly()
    mask, fixed = slice_mask(cols, ["batch"])
    models = list(_unique(cols["model"][mask]))
    fig, where = _panels(models)
    for (row, col), model in zip(where, models):
        for i, cluster in enumerate(_unique(cols["cluster"])):
            m = mask & (cols["model"] == model) & (cols["cluster"] == cluster)
            if not m.any():
                continue
            order = np.argsort(cols["batch"][m])
            fig.add_trace(go.Scatter(
                x=cols["batch"][m][order], y=cols["tokens_per_s_total"][m][order],
                mode="lines+markers", name=cluster, legendgroup=cluster,
                showlegend=bool(model == models[0]), line={"color": _color(i)}), row=row, col=col)
    _axes(fig, where, "batch (sequences)", "tokens/s (total)", _scale(cols["batch"][mask], True),
          _scale(cols["tokens_per_s_total"][mask], True, "tok/s"))
    return fig, f"Total decode tokens/s against batch, per cluster and model. Slice: {fixed}."


def ablation(cols: Cols):
    """Tokens/s per request for each combination of the swept optimization toggles."""
    toggles = [n for n in cols if n.startswith("options_") and len(_unique(cols[n])) > 1]
    if not toggles:
        return None, "No optimization toggle (options.*) varies in this sweep: no ablation."
    go = require_plotly()
    mask, fixed = slice_mask(cols, toggles)
    labels = np.array([
        ", ".join(f"{t[8:]}={'on' if v else 'off'}" for t, v in zip(toggles, row))
        for row in zip(*(cols[t] for t in toggles))
    ])
    pairs = [(c, m) for c in _unique(cols["cluster"][mask]) for m in _unique(cols["model"][mask])]
    fig, where = _panels(["Ablation of the optimization toggles"], cols_max=1)
    for j, combo in enumerate(sorted(set(labels[mask]), reverse=True)):
        heights = []
        for cluster, model in pairs:
            m = mask & (labels == combo) & (cols["cluster"] == cluster) & (cols["model"] == model)
            heights.append(float(np.mean(cols["tokens_per_s_per_request"][m])) if m.any() else 0)
        fig.add_trace(go.Bar(x=[f"{c}<br>{m}" for c, m in pairs], y=heights, name=combo,
                             marker_color=_part_color(j)))
    fig.update_layout(barmode="group")
    _axes(fig, where, "cluster / model", "tokens/s per request")
    return fig, (f"Tokens/s per request by toggle combination. A toggle applies to its chip kind "
                 f"only (DataflowOptions on RDUs, GpuOptions on GPUs). Slice: {fixed}.")


def breakdown(cols: Cols):
    """Decode time per token by cause, per cluster and model, at the base slice."""
    go = require_plotly()
    mask, fixed = slice_mask(cols, [])
    pairs = [(c, m) for c in _unique(cols["cluster"][mask]) for m in _unique(cols["model"][mask])]
    fig, where = _panels(["Decode time by cause"], cols_max=1)
    for j, cause in enumerate(CAUSES):
        vals = []
        for cluster, model in pairs:
            m = mask & (cols["cluster"] == cluster) & (cols["model"] == model)
            vals.append(float(np.mean(cols[f"decode_{cause}_s"][m])) * 1e3 if m.any() else 0)
        if any(vals):
            fig.add_trace(go.Bar(x=[f"{c}<br>{m}" for c, m in pairs], y=vals, name=cause,
                                 marker_color=_part_color(j)))
    fig.update_layout(barmode="stack")
    _axes(fig, where, "cluster / model", "ms per decode step")
    return fig, f"Decode step time split by cause. Slice: {fixed}."


def variant_ratio(cols: Cols):
    """Each hardware variant's decode tokens/s and TPOT over the baseline variant's at the same
    cluster, model and workload point: a panel per metric, a trace per variant and model."""
    if "variant" not in cols:
        return None, ("No sweep axis varies the hardware (chip.* or topology.*): no variant "
                      "to compare.")
    go = require_plotly()
    variants = sorted(_unique(cols["variant"]), key=lambda v: tuple(
        _order(x) for x in _variant_values(cols, v)))
    baseline = variants[0]
    others = [a for a in axis_columns(cols) if a not in ("cluster", "model", "batch")]
    key_cols = [cols["cluster_base"], cols["model"], cols["batch"]] + [cols[a] for a in others]
    keys = [tuple(_fmt(k[i]) for k in key_cols) for i in range(len(cols["cluster"]))]
    metrics = (("tokens_per_s_total", "tokens/s (total)"), ("tpot_s", "TPOT"))
    fig, where = _panels([f"{label}: variant / baseline" for _, label in metrics])
    for (row, col), (metric, _) in zip(where, metrics):
        base = {k: v for k, v, b in zip(keys, cols[metric], cols["variant"] == baseline) if b}
        ratio = np.array([v / base[k] if base.get(k) else np.nan
                          for k, v in zip(keys, cols[metric])], dtype=float)
        j = 0
        for variant in variants:
            for model in _unique(cols["model"]):
                for cluster in _unique(cols["cluster_base"]):
                    m = ((cols["variant"] == variant) & (cols["model"] == model)
                         & (cols["cluster_base"] == cluster) & np.isfinite(ratio))
                    if not m.any():
                        continue
                    order = np.argsort(cols["batch"][m])
                    name = f"{cluster} [{variant}], {model}"
                    fig.add_trace(go.Scatter(
                        x=cols["batch"][m][order], y=ratio[m][order], mode="lines+markers",
                        name=name, legendgroup=name, showlegend=bool(row == 1 and col == 1),
                        line={"color": _color(j), "dash": "dot" if variant == baseline
                              else "solid"}), row=row, col=col)
                    j += 1
    _axes(fig, where, "batch", "ratio to the baseline", _scale(cols["batch"], True))
    return fig, (f"Each hardware variant over the baseline [{baseline}] (dotted, 1.0) at the same "
                 "cluster, model, batch and other settings; above 1 on tokens/s and below 1 on "
                 "TPOT is faster.")


def _variant_values(cols: Cols, variant: str) -> tuple:
    i = int(np.flatnonzero(cols["variant"] == variant)[0])
    return tuple(cols[n][i] for n in np.ravel(cols["variant_axes"]).tolist())


def pareto(cols: Cols):
    """Tokens/s per request against tokens/s per socket: a front per model (panel) and per
    cluster and setting (trace), over the knobs (batch, plan)."""
    return _pareto(cols, cols["tokens_per_s_total"] / cols["sockets"],
                   cols["tokens_per_s_per_request"], "tokens/s per socket",
                   "tokens/s per request", ["batch", "tp", "plan", "prompt_len", "gen_len"])


def _pareto(cols: Cols, x: np.ndarray, y: np.ndarray, xlabel: str, ylabel: str,
            hover: Sequence[str]):
    go = require_plotly()
    knobs = [a for a in axis_columns(cols) if a in KNOBS or a.startswith("options_")]
    mask, by, fixed = settings_slice(cols, knobs)
    ok = mask & np.isfinite(x) & np.isfinite(y)
    models = list(_unique(cols["model"][ok]))
    fig, where = _panels(models)
    labels = groups(cols, ok, by)
    for (row, col), model in zip(where, models):
        for (label, m), look in zip(labels, looks(cols, labels)):
            m = m & (cols["model"] == model)
            if not m.any():
                continue
            idx = np.flatnonzero(m)
            front = idx[pareto_front(x[m], y[m])]
            text = _hover(cols, m, hover)
            fig.add_trace(go.Scatter(x=x[m], y=y[m], mode="markers", name=label,
                                     legendgroup=label, showlegend=False, text=text,
                                     marker={"color": look["color"], "opacity": 0.3, "size": 6,
                                             "symbol": look["symbol"]}),
                          row=row, col=col)
            fig.add_trace(go.Scatter(
                x=x[front], y=y[front], mode="lines+markers", name=label, legendgroup=label,
                showlegend=bool(model == models[0]),
                line={"color": look["color"], "dash": look["dash"]},
                marker={"symbol": look["symbol"]},
                text=[text[list(idx).index(k)] for k in front]), row=row, col=col)
    _axes(fig, where, xlabel, ylabel, _scale(x[ok], unit="tok/s"), _scale(y[ok], unit="tok/s"))
    return fig, ("All points (faint) and the Pareto front (no other point of the same model, "
                 "cluster and setting is better on both axes), one panel per model, one trace per "
                 f"cluster and setting (colour: the cluster; marker and dash: the setting); hover a point "
                 f"for its knobs.{fixed}")


# --- serve sweeps --------------------------------------------------------------------------
SERVE_HOVER = ["rate_requests_per_s", "max_batch", "throughput_tokens_per_s", "ttft_p50_s",
               "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "requests_unserved"]


def _rate_curves(cols: Cols, mask, by, models: list, where: list):
    """One curve per (model panel, cluster and setting), its rows in rising request rate, with
    their hover text: (row, col, model, look (`looks`), name, row order, hover)."""
    rate = cols["rate_requests_per_s"].astype(float)
    labelled = groups(cols, mask, by)
    for (row, col), model in zip(where, models):
        for (name, m), look in zip(labelled, looks(cols, labelled)):
            m = m & (cols["model"] == model)
            if not m.any():
                continue
            order = np.flatnonzero(m)[np.argsort(rate[m])]
            hover = ["<br>".join(f"{h}: {_fmt(cols[h][k])}" for h in SERVE_HOVER if h in cols)
                     for k in order]
            yield row, col, model, look, name, order, hover


def _vs_rate(cols: Cols, metric: str, label: str, scale: float = 1e3):
    """A metric's p50 (solid) and p99 (dotted) against the request rate: a panel per model, a
    curve per cluster and setting."""
    go = require_plotly()
    mask, by, fixed = settings_slice(cols, ["rate_requests_per_s"])
    models = list(_unique(cols["model"][mask]))
    fig, where = _panels(models)
    rate = cols["rate_requests_per_s"].astype(float)
    for row, col, model, look, name, order, hover in _rate_curves(cols, mask, by, models, where):
        for q, dash in ((50, "solid"), (99, "dot")):
            fig.add_trace(go.Scatter(
                x=rate[order], y=cols[f"{metric}_p{q}_s"][order].astype(float) * scale,
                mode="lines+markers", name=f"{name} p{q}", legendgroup=name,
                showlegend=bool(model == models[0]), text=hover,
                line={"color": look["color"], "dash": dash}, marker={"symbol": look["symbol"]}),
                row=row, col=col)
    ms = np.concatenate([cols[f"{metric}_p{q}_s"][mask] for q in (50, 99)]).astype(float) * scale
    _axes(fig, where, "request rate (requests/s)", f"{label} (ms)",
          _scale(rate[mask], unit="req/s"), _scale(ms, unit="ms"))
    return fig, (f"{label} p50 (solid) and p99 (dotted) against the arrival rate, one panel per "
                 "model and one curve per cluster (colour) and setting (marker)."
                 f"{fixed}")


def ttft_vs_rate(cols: Cols):
    return _vs_rate(cols, "ttft", "time to first token")


def tpot_vs_rate(cols: Cols):
    return _vs_rate(cols, "tpot", "time per output token")


def latency_vs_throughput(cols: Cols):
    """p50 end-to-end latency (and TPOT) against output tokens/s, a point per rate."""
    go = require_plotly()
    mask, by, fixed = settings_slice(cols, ["rate_requests_per_s"])
    models = list(_unique(cols["model"][mask]))
    fig, where = _panels(models)
    thr = cols["throughput_tokens_per_s"].astype(float)
    for row, col, model, look, name, order, hover in _rate_curves(cols, mask, by, models, where):
        fig.add_trace(go.Scatter(
            x=thr[order], y=cols["e2e_p50_s"][order].astype(float), mode="lines+markers",
            name=name, legendgroup=name, showlegend=bool(model == models[0]), text=hover,
            line={"color": look["color"], "dash": look["dash"]},
            marker={"symbol": look["symbol"]}), row=row, col=col)
    _axes(fig, where, "output tokens/s (whole cluster)", "end-to-end latency p50 (s)",
          _scale(thr[mask], unit="tok/s"), _scale(cols["e2e_p50_s"][mask], unit="s"))
    return fig, ("Median end-to-end latency against throughput, a point per arrival rate (in "
                 "rising order along each curve; hover for the rate, TTFT and TPOT), one panel "
                 f"per model, one curve per cluster (colour) and setting (marker and dash).{fixed}")


def quantiles_cdf(cols: Cols):
    """The latency quantiles a serve sweep stores (p50, p90, p99), drawn as points of each
    point's CDF: a panel per metric, a trace per cluster, setting and rate."""
    go = require_plotly()
    mask, by, fixed = settings_slice(cols, [])
    metrics = [("ttft", "TTFT ms"), ("tpot", "TPOT ms"), ("e2e", "end-to-end ms")]
    fig, where = _panels([t for _, t in metrics], cols_max=1)
    models = ["model"] if len(_unique(cols["model"][mask])) > 1 else []
    labelled = groups(cols, mask, [*models, *by])
    for (row, col), (metric, _) in zip(where, metrics):
        for (name, m), look in zip(labelled, looks(cols, labelled)):
            for j, k in enumerate(np.flatnonzero(m)):
                x = [float(cols[f"{metric}_p{q}_s"][k]) * 1e3 for q in QUANTILES]
                fig.add_trace(go.Scatter(
                    x=x, y=[q / 100 for q in QUANTILES], mode="lines+markers", name=name,
                    legendgroup=name, showlegend=metric == "ttft" and j == 0,
                    line={"color": look["color"], "dash": look["dash"]},
                    marker={"symbol": look["symbol"]},
                    hovertemplate="%{x:.2f} ms at p%{customdata}",
                    customdata=list(QUANTILES)), row=row, col=col)
    for panel, (metric, _) in zip(where, metrics):
        ms = np.concatenate([cols[f"{metric}_p{q}_s"][mask] for q in QUANTILES]) * 1e3
        _axes(fig, [panel], "latency (ms)", "fraction of requests", _scale(ms, True, "ms"))
    return fig, ("The latency distribution of each point, as far as a sweep row holds it: its "
                 "p50, p90 and p99 (a sweep keeps these three; `rdu-cluster report` on one "
                 "`serve --out` folder draws the full CDF from every request). A curve per "
                 f"point, coloured by cluster (marker and dash: model and setting).{fixed}")


def serve_pareto(cols: Cols):
    """Interactivity (1 / TPOT p50) against output tokens/s per socket, over rate and limits."""
    per_socket = cols["throughput_tokens_per_s"] / cols["sockets"]
    with np.errstate(divide="ignore"):
        interactive = 1.0 / cols["tpot_p50_s"].astype(float)
    return _pareto(cols, per_socket.astype(float), interactive, "output tokens/s per socket",
                   "tokens/s per request (1 / TPOT p50)", SERVE_HOVER)


# --- one `serve --out` folder --------------------------------------------------------------
def run_columns(tables: Mapping[str, pa.Table]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, table in tables.items():
        out.update(columns(table, f"{name}."))
    return out


def latency_cdf(cols: Cols):
    """The empirical CDF of TTFT, TPOT and end-to-end latency over the served requests."""
    go = require_plotly()
    served = cols["requests.state"] == "done"
    metrics = [("ttft_s", "TTFT ms"), ("tpot_s", "TPOT ms"), ("e2e_s", "end-to-end ms")]
    fig, where = _panels([t for _, t in metrics], cols_max=3)
    for (row, col), (metric, title) in zip(where, metrics):
        v = np.sort(np.asarray([x for x in cols[f"requests.{metric}"][served].tolist()
                                if x is not None], dtype=float)) * 1e3
        v = v[np.isfinite(v)]
        if not len(v):
            continue
        frac = np.arange(1, len(v) + 1) / len(v)
        keep = _thin(len(v))
        fig.add_trace(go.Scatter(x=v[keep], y=frac[keep], mode="lines", name=title,
                                 line={"shape": "hv", "color": METRIC_COLORS[metric]}),
                      row=row, col=col)
    _axes(fig, where, "ms", "fraction of served requests")
    return fig, (f"Empirical CDF over the {int(served.sum()):,} served requests (unserved ones "
                 "have no latency).")


def latency_over_time(cols: Cols):
    """Each request's TTFT and end-to-end latency at its arrival time."""
    go = require_plotly()
    served = cols["requests.state"] == "done"
    fig, where = _panels(["latency by arrival time"], cols_max=1)
    t = cols["requests.arrival_s"][served].astype(float)
    for metric, name in (("ttft_s", "TTFT"), ("e2e_s", "end-to-end")):
        y = cols[f"requests.{metric}"][served].astype(float) * 1e3
        fig.add_trace(_scatter(go, len(t))(
            x=t, y=y, mode="markers", name=name,
            marker={"size": 4, "color": METRIC_COLORS[metric], "opacity": 0.6}))
    _axes(fig, where, "arrival s", "ms")
    return fig, "Queueing shows as latency rising with arrival time."


def batch_over_time(cols: Cols):
    """Running batch per replica over simulated time (binned to MAX_POINTS points)."""
    go = require_plotly()
    fig, where = _panels(["batch over time"], cols_max=1)
    rep = cols["steps.replica"]
    for i, r in enumerate(_unique(rep)):
        m = rep == r
        t, b = _binned(cols["steps.start_s"][m].astype(float), cols["steps.batch"][m].astype(float))
        fig.add_trace(go.Scatter(x=t, y=b, mode="lines", name=f"replica {r}",
                                   line={"color": _color(i), "shape": "hv"}))
    _axes(fig, where, "simulated time s", "sequences in the step")
    return fig, (f"Sequences in each step (prefill and decode), per replica; means over at most "
                 f"{MAX_POINTS:,} time bins.")


def time_by_cause(cols: Cols):
    """Where the steps' time went: seconds per cause, per phase."""
    go = require_plotly()
    phase = cols["steps.phase"]
    phases = list(_unique(phase))
    fig, where = _panels(["step time by cause and phase"], cols_max=1)
    extra = [c for c in ("kv_swap_s", "switch_s") if f"steps.{c}" in cols]
    for j, cause in enumerate([f"{c}_s" for c in CAUSES] + extra):
        vals = [float(np.sum(cols[f"steps.{cause}"][phase == p])) for p in phases]
        if any(vals):
            fig.add_trace(go.Bar(x=phases, y=vals, name=cause[:-2], marker_color=_part_color(j)))
    fig.update_layout(barmode="stack")
    _axes(fig, where, "phase", "seconds (summed over steps)")
    return fig, ("Step time summed by cause within each phase (kv_swap and switch: copies before "
                 "a step).")


def busy_fractions(cols: Cols) -> tuple[list, np.ndarray, float]:
    """Each socket's busy time over the run's elapsed time (the simulated clock from the run's
    start, 0, to the last window's end: vllm bench's `duration`, the same for every socket):
    a socket idle for want of requests or waiting for another stage counts as not busy. The
    sockets table's own busy_fraction divides by its window's span, from which idle waits
    are left out, so a one-stage replica reads 1.0 under any load. Returns (sockets,
    fractions, elapsed seconds)."""
    sock = cols["sockets.socket"]
    elapsed = float(np.max(cols["sockets.time_s"])) if len(sock) else 0.0
    ids = list(_unique(sock))
    busy = np.array([float(np.sum(cols["sockets.busy_s"][sock == s])) for s in ids])
    frac = np.minimum(busy / elapsed, 1.0) if elapsed > 0 else np.zeros(len(ids))
    return ids, frac, elapsed


def socket_busy(cols: Cols):
    go = require_plotly()
    ids, frac, elapsed = busy_fractions(cols)
    fig, where = _panels(["busy fraction per socket"], cols_max=1)
    fig.add_trace(go.Bar(x=[f"socket {s}" for s in ids], y=frac, name="busy fraction",
                         marker_color=METRIC_COLORS["busy"]))
    _axes(fig, where, "socket", "busy time / elapsed time", yscale={"range": [0, 1.05]})
    return fig, (f"Share of the run's {elapsed:.3g} s (its start to the last step's end) each "
                 "socket computed or communicated; idle for want of requests and waiting on "
                 "other stages count as not busy.")


def link_use(cols: Cols):
    if not len(cols["links.src"]):
        why = ("a single-socket plan" if len(cols["steps.time_s"])
               else "no step ran")
        return None, f"The run has no link traffic ({why}): no link plot."
    go = require_plotly()
    fig, where = _panels(["utilization per link"], cols_max=1)
    names = [f"{a}->{b}" for a, b in zip(cols["links.src"].tolist(), cols["links.dst"].tolist())]
    fig.add_trace(go.Bar(x=names, y=cols["links.utilization"], name="utilization",
                         text=[f"{b / 1e9:.2f} GB" for b in cols["links.bytes"].tolist()],
                         marker_color=METRIC_COLORS["busy"]))
    # upright labels, off the axis: a full mesh has n(n-1) links (56 on sn40l-8, 240 on sn40l-16)
    fig.update_xaxes(tickangle=-90, ticks="outside")
    _axes(fig, where, "link (src->dst socket)", "bytes / (bandwidth x run time)")
    return fig, "Bytes each link carried over the run, as a share of its capacity."


def _thin(n: int) -> np.ndarray:
    return np.unique(np.linspace(0, n - 1, min(n, MAX_POINTS)).astype(int)) if n else np.zeros(
        0, dtype=int)


def _binned(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(t) <= MAX_POINTS:
        return t, v
    edges = np.linspace(t.min(), t.max(), MAX_POINTS + 1)
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, MAX_POINTS - 1)
    count = np.bincount(idx, minlength=MAX_POINTS)
    total = np.bincount(idx, weights=v, minlength=MAX_POINTS)
    keep = count > 0
    return edges[:-1][keep], total[keep] / count[keep]


# --- the plots of each dataset kind --------------------------------------------------------
_RATE, _THR = "rate_requests_per_s", "throughput_tokens_per_s"
_Q = lambda m: tuple(f"{m}_p{q}_s" for q in QUANTILES)
PLOTS: dict[str, tuple[Plot, ...]] = {
    "simulate": (
        Plot("roofline", "Roofline", ("cluster", "chip", "flops_per_token", "bytes_per_token",
             "tokens_per_s_total", "sockets", "chip_peak_flops_per_s",
             "chip_hbm_bandwidth_bytes_per_s"), roofline),
        Plot("tokens_vs_batch", "Tokens/s against batch",
             ("cluster", "model", "batch", "tokens_per_s_total"), tokens_vs_batch),
        Plot("ablation", "Ablation", ("cluster", "model", "tokens_per_s_per_request"), ablation),
        Plot("breakdown", "Decode time by cause",
             ("cluster", "model", *(f"decode_{c}_s" for c in CAUSES)), breakdown),
        Plot("variant_ratio", "Hardware variants against the baseline",
             ("cluster", "model", "batch", "tokens_per_s_total", "tpot_s"), variant_ratio),
        Plot("pareto", "Pareto front", ("cluster", "model", "sockets", "tokens_per_s_total",
             "tokens_per_s_per_request"), pareto),
    ),
    "serve": (
        Plot("latency_vs_throughput", "Latency against throughput",
             ("cluster", "model", _RATE, _THR, "e2e_p50_s"), latency_vs_throughput),
        Plot("ttft_vs_rate", "TTFT against rate", ("cluster", "model", _RATE, *_Q("ttft")),
             ttft_vs_rate),
        Plot("tpot_vs_rate", "TPOT against rate", ("cluster", "model", _RATE, *_Q("tpot")),
             tpot_vs_rate),
        Plot("latency_cdf", "Latency quantiles (CDF points)",
             ("cluster", "model", *_Q("ttft"), *_Q("tpot"), *_Q("e2e")), quantiles_cdf),
        Plot("pareto", "Pareto front", ("cluster", "model", "sockets", _THR, "tpot_p50_s"),
             serve_pareto),
    ),
    "run": (
        Plot("latency_cdf", "Latency CDFs", ("requests.state", "requests.ttft_s",
             "requests.tpot_s", "requests.e2e_s"), latency_cdf),
        Plot("latency_over_time", "Latency by arrival time",
             ("requests.state", "requests.arrival_s", "requests.ttft_s", "requests.e2e_s"),
             latency_over_time),
        Plot("batch_over_time", "Batch over time",
             ("steps.replica", "steps.start_s", "steps.batch"), batch_over_time),
        Plot("time_by_cause", "Where the time went",
             ("steps.phase", *(f"steps.{c}_s" for c in CAUSES)), time_by_cause),
        Plot("socket_busy", "Socket busy fraction",
             ("sockets.socket", "sockets.busy_s", "sockets.time_s"),
             socket_busy),
        Plot("link_use", "Link utilization",
             ("links.src", "links.dst", "links.bytes", "links.utilization"), link_use),
    ),
}
PLOTS["plan"] = PLOTS["simulate"]  # a plan row has what it has; missing columns are named


# --- small helpers -------------------------------------------------------------------------
def _mode(values: np.ndarray, counts: np.ndarray):
    """The most common value; on a tie, True for a toggle (the optimizations' default is on),
    else the smallest."""
    tied = [v for v, c in zip(values, counts) if c == counts.max()]
    if all(isinstance(v, bool) for v in tied) and True in tied:
        return True
    return tied[0]


def _unique(values: np.ndarray, counts: bool = False):
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


def _equal(column: np.ndarray, value) -> np.ndarray:
    return np.array([v == value for v in column.tolist()], dtype=bool)


def _fmt(value) -> str:
    if isinstance(value, (float, np.floating)):
        return f"{value:.4g}"
    return str(value)
