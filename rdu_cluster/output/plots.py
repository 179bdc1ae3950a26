"""Plots of a sweep dataset (matplotlib, the optional `plot` extra), as PNG bytes.

Each function takes the dataset as a dict of numpy columns (`columns(table)`) and returns
(png bytes, caption). Figures are drawn with the non-interactive Agg backend, so no display is
needed. Where a sweep varies more than the plotted axes, a plot shows one slice: every other
varying column at its most common value, named in the caption.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa

from chip.cost import CAUSES
from workloads.errors import ConfigError

Cols = Mapping[str, np.ndarray]
# Columns that are results or bookkeeping, never a sweep axis to slice on.
_NOT_AXES = {
    "point_id",
    "chip",
    "execution_model",
    "bound",
    "sockets",
    "replicas",
    "cluster_ref",
    "model_ref",
    "chip_peak_flops_per_s",
    "chip_hbm_bandwidth_bytes_per_s",
}


def require_matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(
            "report: plots need matplotlib, which is not installed; "
            "install the plot extra: pip install 'rdu-cluster[plot]'"
        ) from None
    return plt


def columns(table: pa.Table) -> dict[str, np.ndarray]:
    out = {}
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        out[name] = col.to_numpy(zero_copy_only=False)
    return out


def axis_columns(cols: Cols) -> list[str]:
    """Scenario axes: the input columns that take more than one value in the dataset."""
    from rdu_cluster.output.results import SCHEMA

    inputs = {"batch", "prompt_len", "gen_len", "tp", "cluster", "model"}
    outputs = {f.name for f in SCHEMA} - inputs
    names = [n for n in cols if n not in outputs and n not in _NOT_AXES]
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


def roofline(cols: Cols) -> tuple[bytes, str]:
    """Achieved FLOP/s per socket against arithmetic intensity, under each chip's roof."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    intensity = cols["flops_per_token"] / cols["bytes_per_token"]
    achieved = cols["flops_per_token"] * cols["tokens_per_s_total"] / cols["sockets"]
    for color, cluster in _palette(cols["cluster"]):
        m = cols["cluster"] == cluster
        ax.scatter(intensity[m], achieved[m], s=8, alpha=0.5, color=color, label=cluster)
    x = np.logspace(np.log10(max(intensity.min() / 2, 1e-3)), np.log10(intensity.max() * 4), 200)
    roofs = sorted(
        set(
            zip(cols["chip"], cols["chip_peak_flops_per_s"], cols["chip_hbm_bandwidth_bytes_per_s"])
        )
    )
    for chip, peak, bw in roofs:
        ax.plot(x, np.minimum(peak, x * bw), lw=1, ls="--", color="gray")
        ax.annotate(
            f"{chip} {bw / 1e12:.2f} TB/s",
            (x[-1], min(peak, x[-1] * bw)),
            fontsize=7,
            ha="right",
            va="bottom",
            color="gray",
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOP / HBM byte)",
        ylabel="achieved FLOP/s per socket",
        title="Roofline of the decode points",
    )
    ax.legend(fontsize=8, markerscale=2)
    return _png(fig, plt), (
        "Each point: one design point's decode step (FLOPs per token over HBM bytes per token; "
        "FLOP/s per socket). Dashed: min(peak, intensity x HBM bandwidth) of each chip."
    )


def tokens_vs_batch(cols: Cols) -> tuple[bytes, str]:
    plt = require_matplotlib()
    mask, fixed = slice_mask(cols, ["batch"])
    models = list(_unique(cols["model"][mask]))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        for color, cluster in _palette(cols["cluster"]):
            m = mask & (cols["model"] == model) & (cols["cluster"] == cluster)
            if not m.any():
                continue
            order = np.argsort(cols["batch"][m])
            ax.plot(
                cols["batch"][m][order],
                cols["tokens_per_s_total"][m][order],
                "o-",
                ms=3,
                color=color,
                label=cluster,
            )
        ax.set(
            xscale="log", yscale="log", xlabel="batch", ylabel="tokens/s (total)", title=str(model)
        )
        ax.legend(fontsize=8)
    return _png(fig, plt), f"Total decode tokens/s against batch, per cluster. Slice: {fixed}."


def ablation(cols: Cols) -> tuple[bytes | None, str]:
    """Tokens/s per request for each combination of the swept optimization toggles."""
    toggles = [n for n in cols if n.startswith("options_") and len(_unique(cols[n])) > 1]
    if not toggles:
        return None, "No optimization toggle (options.*) varies in this sweep: no ablation."
    plt = require_matplotlib()
    mask, fixed = slice_mask(cols, toggles)
    labels = np.array(
        [
            ", ".join(f"{t[8:]}={'on' if v else 'off'}" for t, v in zip(toggles, row))
            for row in zip(*(cols[t] for t in toggles))
        ]
    )
    groups = [(c, m) for c in _unique(cols["cluster"][mask]) for m in _unique(cols["model"][mask])]
    combos = sorted(set(labels[mask]), reverse=True)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) * len(combos) / 2), 4.5))
    width = 0.8 / max(1, len(combos))
    for j, combo in enumerate(combos):
        heights = []
        for cluster, model in groups:
            m = mask & (labels == combo) & (cols["cluster"] == cluster) & (cols["model"] == model)
            heights.append(float(np.mean(cols["tokens_per_s_per_request"][m])) if m.any() else 0)
        ax.bar(np.arange(len(groups)) + j * width, heights, width, label=combo)
    ax.set_xticks(np.arange(len(groups)) + width * (len(combos) - 1) / 2)
    ax.set_xticklabels([f"{c}\n{m}" for c, m in groups], fontsize=8)
    ax.set(ylabel="tokens/s per request", title="Ablation of the optimization toggles")
    ax.legend(fontsize=7)
    return _png(fig, plt), (
        f"Tokens/s per request by toggle combination. A toggle applies to its chip kind only "
        f"(DataflowOptions on RDUs, GpuOptions on GPUs). Slice: {fixed}."
    )


def breakdown(cols: Cols) -> tuple[bytes, str]:
    """Decode time per token by cause, per cluster and model, at the base slice."""
    plt = require_matplotlib()
    mask, fixed = slice_mask(cols, [])
    groups = [(c, m) for c in _unique(cols["cluster"][mask]) for m in _unique(cols["model"][mask])]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(groups)), 4.5))
    bottom = np.zeros(len(groups))
    for cause in CAUSES:
        vals = []
        for cluster, model in groups:
            m = mask & (cols["cluster"] == cluster) & (cols["model"] == model)
            vals.append(float(np.mean(cols[f"decode_{cause}_s"][m])) * 1e3 if m.any() else 0)
        if any(vals):
            ax.bar(range(len(groups)), vals, bottom=bottom, label=cause)
            bottom += np.array(vals)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{c}\n{m}" for c, m in groups], fontsize=8)
    ax.set(ylabel="ms per decode step", title="Decode time by cause")
    ax.legend(fontsize=7)
    return _png(fig, plt), f"Decode step time split by cause. Slice: {fixed}."


def pareto(cols: Cols) -> tuple[bytes, str]:
    """Tokens/s per request against tokens/s per socket; the line joins each cluster's front."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    per_socket = cols["tokens_per_s_total"] / cols["sockets"]
    per_request = cols["tokens_per_s_per_request"]
    for color, cluster in _palette(cols["cluster"]):
        m = cols["cluster"] == cluster
        ax.scatter(per_socket[m], per_request[m], s=6, alpha=0.25, color=color)
        front = pareto_front(per_socket[m], per_request[m])
        ax.plot(per_socket[m][front], per_request[m][front], "o-", ms=3, color=color, label=cluster)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="tokens/s per socket",
        ylabel="tokens/s per request",
        title="Pareto front: interactivity vs throughput",
    )
    ax.legend(fontsize=8)
    return _png(fig, plt), (
        "All points (faint) and each cluster's Pareto front (no other point of that cluster is "
        "better on both axes)."
    )


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both x and y (maximizing), by x."""
    order = np.lexsort((-y, -x))  # x descending, then y descending
    front, best = [], -np.inf
    for i in order:
        if y[i] > best:
            front.append(i)
            best = y[i]
    return np.array(sorted(front, key=lambda i: x[i]), dtype=int)


def _mode(values: np.ndarray, counts: np.ndarray):
    """The most common value; on a tie, True for a toggle (the optimizations' default is on),
    else the smallest."""
    tied = [v for v, c in zip(values, counts) if c == counts.max()]
    if all(isinstance(v, bool) for v in tied) and True in tied:
        return True
    return tied[0]


def _palette(values: np.ndarray):
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return [(cmap(i % 10), v) for i, v in enumerate(_unique(values))]


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
    return f"{value:g}" if isinstance(value, float) else str(value)


def _png(fig, plt) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
