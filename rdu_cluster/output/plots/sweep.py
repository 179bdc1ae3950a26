"""The figures of a sweep dataset: of simulate and plan sweeps (roofline, tokens against
batch, ablation, decode time by cause, hardware variants against the baseline, Pareto front)
and of serve sweeps (TTFT and TPOT against rate, latency against throughput, latency quantiles,
Pareto front)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chip.cost import CAUSES
from rdu_cluster.output.plots.common import (
    Cols,
    axes,
    axis_scale,
    color,
    fmt,
    hover_text,
    looks,
    panels,
    part_color,
    require_plotly,
    scatter,
    unique,
)
from rdu_cluster.output.plots.slicing import (
    KNOBS,
    axis_columns,
    groups,
    order_key,
    settings_slice,
    slice_mask,
)

QUANTILES = (50, 90, 99)  # the percentiles a serve row carries (engine/metrics.percentiles)


# --- simulate / plan sweeps ----------------------------------------------------------------
def roofline(cols: Cols):
    """Achieved FLOP/s per socket against arithmetic intensity, under each chip's roof."""
    go = require_plotly()
    fig, where = panels(["Roofline of the decode points"], cols_max=1)
    intensity = cols["flops_per_token"] / cols["bytes_per_token"]
    achieved = cols["flops_per_token"] * cols["tokens_per_s_total"] / cols["sockets"]
    for i, cluster in enumerate(unique(cols["cluster"])):
        m = cols["cluster"] == cluster
        fig.add_trace(scatter(go, int(m.sum()))(
            x=intensity[m], y=achieved[m], mode="markers", name=cluster,
            marker={"size": 5, "opacity": 0.6, "color": color(i)},
            text=hover_text(cols, m, ["model", "batch", "prompt_len", "tp"])))
    x = np.logspace(np.log10(max(intensity.min() / 2, 1e-3)), np.log10(intensity.max() * 4), 200)
    roofs = sorted(set(zip(cols["chip"].tolist(), cols["chip_peak_flops_per_s"].tolist(),
                           cols["chip_hbm_bandwidth_bytes_per_s"].tolist())))
    for chip, peak, bw in roofs:
        fig.add_trace(go.Scatter(x=x, y=np.minimum(peak, x * bw), mode="lines",
                                 name=f"roof: {chip} ({bw / 1e12:.2f} TB/s)",
                                 line={"dash": "dash", "width": 1, "color": "gray"}))
    axes(fig, where, "arithmetic intensity (FLOP / HBM byte)", "achieved FLOP/s per socket",
         axis_scale(intensity, True, "FLOP/B"), axis_scale(achieved, True, "FLOP/s"))
    return fig, ("Each point: one design point's decode step (FLOPs per token over HBM bytes per "
                 "token; FLOP/s per socket). Dashed: min(peak, intensity x HBM bandwidth) of each "
                 "chip.")


def tokens_vs_batch(cols: Cols):
    go = require_plotly()
    mask, fixed = slice_mask(cols, ["batch"])
    models = list(unique(cols["model"][mask]))
    fig, where = panels(models)
    for (row, col), model in zip(where, models):
        for i, cluster in enumerate(unique(cols["cluster"])):
            m = mask & (cols["model"] == model) & (cols["cluster"] == cluster)
            if not m.any():
                continue
            order = np.argsort(cols["batch"][m])
            fig.add_trace(go.Scatter(
                x=cols["batch"][m][order], y=cols["tokens_per_s_total"][m][order],
                mode="lines+markers", name=cluster, legendgroup=cluster,
                showlegend=bool(model == models[0]), line={"color": color(i)}), row=row, col=col)
    axes(fig, where, "batch (sequences)", "tokens/s (total)", axis_scale(cols["batch"][mask], True),
         axis_scale(cols["tokens_per_s_total"][mask], True, "tok/s"))
    return fig, f"Total decode tokens/s against batch, per cluster and model. Slice: {fixed}."


def ablation(cols: Cols):
    """Tokens/s per request for each combination of the swept optimization toggles."""
    toggles = [n for n in cols if n.startswith("options_") and len(unique(cols[n])) > 1]
    if not toggles:
        return None, "No optimization toggle (options.*) varies in this sweep: no ablation."
    go = require_plotly()
    mask, fixed = slice_mask(cols, toggles)
    labels = np.array([
        ", ".join(f"{t[8:]}={'on' if v else 'off'}" for t, v in zip(toggles, row))
        for row in zip(*(cols[t] for t in toggles))
    ])
    pairs = [(c, m) for c in unique(cols["cluster"][mask]) for m in unique(cols["model"][mask])]
    fig, where = panels(["Ablation of the optimization toggles"], cols_max=1)
    for j, combo in enumerate(sorted(set(labels[mask]), reverse=True)):
        heights = []
        for cluster, model in pairs:
            m = mask & (labels == combo) & (cols["cluster"] == cluster) & (cols["model"] == model)
            heights.append(float(np.mean(cols["tokens_per_s_per_request"][m])) if m.any() else 0)
        fig.add_trace(go.Bar(x=[f"{c}<br>{m}" for c, m in pairs], y=heights, name=combo,
                             marker_color=part_color(j)))
    fig.update_layout(barmode="group")
    axes(fig, where, "cluster / model", "tokens/s per request")
    return fig, (f"Tokens/s per request by toggle combination. A toggle applies to its chip kind "
                 f"only (DataflowOptions on RDUs, GpuOptions on GPUs). Slice: {fixed}.")


def breakdown(cols: Cols):
    """Decode time per token by cause, per cluster and model, at the base slice."""
    go = require_plotly()
    mask, fixed = slice_mask(cols, [])
    pairs = [(c, m) for c in unique(cols["cluster"][mask]) for m in unique(cols["model"][mask])]
    fig, where = panels(["Decode time by cause"], cols_max=1)
    for j, cause in enumerate(CAUSES):
        vals = []
        for cluster, model in pairs:
            m = mask & (cols["cluster"] == cluster) & (cols["model"] == model)
            vals.append(float(np.mean(cols[f"decode_{cause}_s"][m])) * 1e3 if m.any() else 0)
        if any(vals):
            fig.add_trace(go.Bar(x=[f"{c}<br>{m}" for c, m in pairs], y=vals, name=cause,
                                 marker_color=part_color(j)))
    fig.update_layout(barmode="stack")
    axes(fig, where, "cluster / model", "ms per decode step")
    return fig, f"Decode step time split by cause. Slice: {fixed}."


def variant_ratio(cols: Cols):
    """Each hardware variant's decode tokens/s and TPOT over the baseline variant's at the same
    cluster, model and workload point: a panel per metric, a trace per variant and model."""
    if "variant" not in cols:
        return None, ("No sweep axis varies the hardware (chip.* or topology.*): no variant "
                      "to compare.")
    go = require_plotly()
    variants = sorted(unique(cols["variant"]), key=lambda v: tuple(
        order_key(x) for x in _variant_values(cols, v)))
    baseline = variants[0]
    others = [a for a in axis_columns(cols) if a not in ("cluster", "model", "batch")]
    key_cols = [cols["cluster_base"], cols["model"], cols["batch"]] + [cols[a] for a in others]
    keys = [tuple(fmt(k[i]) for k in key_cols) for i in range(len(cols["cluster"]))]
    metrics = (("tokens_per_s_total", "tokens/s (total)"), ("tpot_s", "TPOT"))
    fig, where = panels([f"{label}: variant / baseline" for _, label in metrics])
    for (row, col), (metric, _) in zip(where, metrics):
        base = {k: v for k, v, b in zip(keys, cols[metric], cols["variant"] == baseline) if b}
        ratio = np.array([v / base[k] if base.get(k) else np.nan
                          for k, v in zip(keys, cols[metric])], dtype=float)
        j = 0
        for variant in variants:
            for model in unique(cols["model"]):
                for cluster in unique(cols["cluster_base"]):
                    m = ((cols["variant"] == variant) & (cols["model"] == model)
                         & (cols["cluster_base"] == cluster) & np.isfinite(ratio))
                    if not m.any():
                        continue
                    order = np.argsort(cols["batch"][m])
                    name = f"{cluster} [{variant}], {model}"
                    fig.add_trace(go.Scatter(
                        x=cols["batch"][m][order], y=ratio[m][order], mode="lines+markers",
                        name=name, legendgroup=name, showlegend=bool(row == 1 and col == 1),
                        line={"color": color(j), "dash": "dot" if variant == baseline
                              else "solid"}), row=row, col=col)
                    j += 1
    axes(fig, where, "batch", "ratio to the baseline", axis_scale(cols["batch"], True))
    return fig, (f"Each hardware variant over the baseline [{baseline}] (dotted, 1.0) at the same "
                 "cluster, model, batch and other settings; above 1 on tokens/s and below 1 on "
                 "TPOT is faster.")


def _variant_values(cols: Cols, variant: str) -> tuple:
    i = int(np.flatnonzero(cols["variant"] == variant)[0])
    return tuple(cols[n][i] for n in np.ravel(cols["variant_axes"]).tolist())


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both x and y (maximizing), by x."""
    order = np.lexsort((-y, -x))  # x descending, then y descending
    front, best = [], -np.inf
    for i in order:
        if y[i] > best:
            front.append(i)
            best = y[i]
    return np.array(sorted(front, key=lambda i: x[i]), dtype=int)


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
    models = list(unique(cols["model"][ok]))
    fig, where = panels(models)
    labels = groups(cols, ok, by)
    for (row, col), model in zip(where, models):
        for (label, m), look in zip(labels, looks(cols, labels)):
            m = m & (cols["model"] == model)
            if not m.any():
                continue
            idx = np.flatnonzero(m)
            front = idx[pareto_front(x[m], y[m])]
            text = hover_text(cols, m, hover)
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
    axes(fig, where, xlabel, ylabel, axis_scale(x[ok], unit="tok/s"),
         axis_scale(y[ok], unit="tok/s"))
    return fig, ("All points (faint) and the Pareto front (no other point of the same model, "
                 "cluster and setting is better on both axes), one panel per model, one trace per "
                 "cluster and setting (colour: the cluster; marker and dash: the setting); hover "
                 f"a point for its knobs.{fixed}")


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
            hover = ["<br>".join(f"{h}: {fmt(cols[h][k])}" for h in SERVE_HOVER if h in cols)
                     for k in order]
            yield row, col, model, look, name, order, hover


def _vs_rate(cols: Cols, metric: str, label: str, scale: float = 1e3):
    """A metric's p50 (solid) and p99 (dotted) against the request rate: a panel per model, a
    curve per cluster and setting."""
    go = require_plotly()
    mask, by, fixed = settings_slice(cols, ["rate_requests_per_s"])
    models = list(unique(cols["model"][mask]))
    fig, where = panels(models)
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
    axes(fig, where, "request rate (requests/s)", f"{label} (ms)",
         axis_scale(rate[mask], unit="req/s"), axis_scale(ms, unit="ms"))
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
    models = list(unique(cols["model"][mask]))
    fig, where = panels(models)
    thr = cols["throughput_tokens_per_s"].astype(float)
    for row, col, model, look, name, order, hover in _rate_curves(cols, mask, by, models, where):
        fig.add_trace(go.Scatter(
            x=thr[order], y=cols["e2e_p50_s"][order].astype(float), mode="lines+markers",
            name=name, legendgroup=name, showlegend=bool(model == models[0]), text=hover,
            line={"color": look["color"], "dash": look["dash"]},
            marker={"symbol": look["symbol"]}), row=row, col=col)
    axes(fig, where, "output tokens/s (whole cluster)", "end-to-end latency p50 (s)",
         axis_scale(thr[mask], unit="tok/s"), axis_scale(cols["e2e_p50_s"][mask], unit="s"))
    return fig, ("Median end-to-end latency against throughput, a point per arrival rate (in "
                 "rising order along each curve; hover for the rate, TTFT and TPOT), one panel "
                 f"per model, one curve per cluster (colour) and setting (marker and dash).{fixed}")


def quantiles_cdf(cols: Cols):
    """The latency quantiles a serve sweep stores (p50, p90, p99), drawn as points of each
    point's CDF: a panel per metric, a trace per cluster, setting and rate."""
    go = require_plotly()
    mask, by, fixed = settings_slice(cols, [])
    metrics = [("ttft", "TTFT ms"), ("tpot", "TPOT ms"), ("e2e", "end-to-end ms")]
    fig, where = panels([t for _, t in metrics], cols_max=1)
    models = ["model"] if len(unique(cols["model"][mask])) > 1 else []
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
        axes(fig, [panel], "latency (ms)", "fraction of requests", axis_scale(ms, True, "ms"))
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
