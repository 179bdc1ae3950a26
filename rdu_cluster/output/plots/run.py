"""The figures of one `serve --out` folder, its tables' columns with the table name in front
(`run_columns`): latency CDFs, latency by arrival time, batch over time, step time by cause,
socket busy fractions and link utilization."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from chip.cost import CAUSES
from rdu_cluster.output.plots.common import (
    MAX_POINTS,
    Cols,
    axes,
    color,
    columns,
    panels,
    part_color,
    require_plotly,
    scatter,
    unique,
)

# Latency metrics and utilizations of one run: shades of grey, which name no cluster or cause
METRIC_COLORS = {"ttft_s": "#222222", "tpot_s": "#666666", "e2e_s": "#999999",
                 "busy": "#444444"}


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
    fig, where = panels([t for _, t in metrics], cols_max=3)
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
    axes(fig, where, "ms", "fraction of served requests")
    return fig, (f"Empirical CDF over the {int(served.sum()):,} served requests (unserved ones "
                 "have no latency).")


def latency_over_time(cols: Cols):
    """Each request's TTFT and end-to-end latency at its arrival time."""
    go = require_plotly()
    served = cols["requests.state"] == "done"
    fig, where = panels(["latency by arrival time"], cols_max=1)
    t = cols["requests.arrival_s"][served].astype(float)
    for metric, name in (("ttft_s", "TTFT"), ("e2e_s", "end-to-end")):
        y = cols[f"requests.{metric}"][served].astype(float) * 1e3
        fig.add_trace(scatter(go, len(t))(
            x=t, y=y, mode="markers", name=name,
            marker={"size": 4, "color": METRIC_COLORS[metric], "opacity": 0.6}))
    axes(fig, where, "arrival s", "ms")
    return fig, "Queueing shows as latency rising with arrival time."


def batch_over_time(cols: Cols):
    """Running batch per replica over simulated time (binned to MAX_POINTS points)."""
    go = require_plotly()
    fig, where = panels(["batch over time"], cols_max=1)
    rep = cols["steps.replica"]
    for i, r in enumerate(unique(rep)):
        m = rep == r
        t, b = _binned(cols["steps.start_s"][m].astype(float), cols["steps.batch"][m].astype(float))
        fig.add_trace(go.Scatter(x=t, y=b, mode="lines", name=f"replica {r}",
                                   line={"color": color(i), "shape": "hv"}))
    axes(fig, where, "simulated time s", "sequences in the step")
    return fig, (f"Sequences in each step (prefill and decode), per replica; means over at most "
                 f"{MAX_POINTS:,} time bins.")


def time_by_cause(cols: Cols):
    """Where the steps' time went: seconds per cause, per phase."""
    go = require_plotly()
    phase = cols["steps.phase"]
    phases = list(unique(phase))
    fig, where = panels(["step time by cause and phase"], cols_max=1)
    extra = [c for c in ("kv_swap_s", "switch_s") if f"steps.{c}" in cols]
    for j, cause in enumerate([f"{c}_s" for c in CAUSES] + extra):
        vals = [float(np.sum(cols[f"steps.{cause}"][phase == p])) for p in phases]
        if any(vals):
            fig.add_trace(go.Bar(x=phases, y=vals, name=cause[:-2], marker_color=part_color(j)))
    fig.update_layout(barmode="stack")
    axes(fig, where, "phase", "seconds (summed over steps)")
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
    ids = list(unique(sock))
    busy = np.array([float(np.sum(cols["sockets.busy_s"][sock == s])) for s in ids])
    frac = np.minimum(busy / elapsed, 1.0) if elapsed > 0 else np.zeros(len(ids))
    return ids, frac, elapsed


def socket_busy(cols: Cols):
    go = require_plotly()
    ids, frac, elapsed = busy_fractions(cols)
    fig, where = panels(["busy fraction per socket"], cols_max=1)
    fig.add_trace(go.Bar(x=[f"socket {s}" for s in ids], y=frac, name="busy fraction",
                         marker_color=METRIC_COLORS["busy"]))
    axes(fig, where, "socket", "busy time / elapsed time", yscale={"range": [0, 1.05]})
    return fig, (f"Share of the run's {elapsed:.3g} s (its start to the last step's end) each "
                 "socket computed or communicated; idle for want of requests and waiting on "
                 "other stages count as not busy.")


def link_use(cols: Cols):
    if not len(cols["links.src"]):
        why = ("a single-socket plan" if len(cols["steps.time_s"])
               else "no step ran")
        return None, f"The run has no link traffic ({why}): no link plot."
    go = require_plotly()
    fig, where = panels(["utilization per link"], cols_max=1)
    names = [f"{a}->{b}" for a, b in zip(cols["links.src"].tolist(), cols["links.dst"].tolist())]
    fig.add_trace(go.Bar(x=names, y=cols["links.utilization"], name="utilization",
                         text=[f"{b / 1e9:.2f} GB" for b in cols["links.bytes"].tolist()],
                         marker_color=METRIC_COLORS["busy"]))
    # upright labels, off the axis: a full mesh has n(n-1) links (56 on sn40l-8, 240 on sn40l-16)
    fig.update_xaxes(tickangle=-90, ticks="outside")
    axes(fig, where, "link (src->dst socket)", "bytes / (bandwidth x run time)")
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
