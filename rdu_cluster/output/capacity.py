"""`capacity`'s rows as they are shown (cli/capacity.py calls them; the search:
scenarios/capacity/): one JSON object a row (`record`, with --json), the text table with its
head and the rows' serve_args (`table`), the closest candidate when nothing meets the SLO
(`closest`), and each system's analytic Pareto front as an interactive page (`plot`, --plot)."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import cast

import numpy as np

from rdu_cluster.config import load_cluster
from rdu_cluster.output import atomic
from rdu_cluster.scenarios import capacity as cap
from rdu_cluster.validation import calibration
from workloads.errors import ConfigError
from workloads.speculative import Speculation


def record(r: cap.Result, slo: cap.SLO) -> dict:
    d, s, b = r.deployment, r.summary, r.summary["bench"]
    spec = cast(Speculation, d.speculation)  # read only with a draft, which comes with it
    return {
        "system": d.label, "weights": _weights(r), "kv_dtype": _arg(r, "--kv-dtype"),
        "stack": d.stack, "sockets": d.sockets,
        "nodes": d.nodes,
        "plan": " + ".join(str(p) for p in d.pools)
        + (f" +{d.draft} k{spec.k}" if d.draft else ""),
        "speculative": ({"draft": d.draft, "k": spec.k} if d.draft else None),
        "disaggregated": d.disaggregated, "max_batch": d.max_batch,
        "tokens_per_s_per_user": 1e3 / b["mean_tpot_ms"] if b["mean_tpot_ms"] else None,
        "tokens_per_s_per_socket": b["output_throughput"] / d.sockets,
        # the sockets' price over the tokens they stream at steady state (bench's steady
        # window: --warmup-requests)
        "usd_per_million_tokens": (d.price_per_hour * 1e6 / 3600 / b["output_throughput"]
                                   if d.price_per_hour and b["output_throughput"] else None),
        "joules_per_token": s.get("joules_per_token"),
        "usd_per_hour": d.price_per_hour,
        f"p{_pw(slo)}_ttft_ms": _finite(r.ttft_ms), f"p{_pw(slo)}_tpot_ms": _finite(r.tpot_ms),
        "meets_slo": r.meets_slo, "miss": _finite(r.miss), "unserved": r.summary["unserved"],
        # the boundary: one replica fewer (of the pool searched last) misses by this much
        "miss_one_fewer": None if r.below is None else _finite(r.below),
        # true where that run stopped once certain to miss (engine/decided.py): at least that
        "miss_one_fewer_at_least": r.below_at_least,
        "ramp_up_s": _ramp_arg(r.serve_args),
        # the interval (cap.with_ends): null bounds and the reason outside every regime
        **{k: r.interval.get(k) for k in ("nodes_low", "nodes_high", "plan_low", "plan_high",
                                          "usd_per_million_tokens_low",
                                          "usd_per_million_tokens_high", "robust")},
        "interval_note": r.interval.get("basis"),
        "steady": _steady(r.steady, slo),
        "verified": ("sessions (a closed loop each)" if "--sessions" in r.serve_args
                     else "trace replayed" if "--trace" in r.serve_args
                     else "closed loop" if r.serve_args.count("--concurrency") else "open loop"),
        "serve_args": r.serve_args,
        "calibration": calibration.label([load_cluster(p.cluster) for p in d.pools]),
    }


def _steady(st: dict, slo: cap.SLO) -> dict:
    """How the row's steady state was checked, with the seeds' spread (pP as the row's)."""
    pw = _pw(slo)
    names = {"ttft_ms_range": f"p{pw}_ttft_ms_range", "tpot_ms_range": f"p{pw}_tpot_ms_range"}
    return {names.get(k, k): v for k, v in st.items() if k != "runs"}


def _ramp_arg(args: list[str]) -> float:
    return float(args[args.index("--ramp-up") + 1]) if "--ramp-up" in args else 0.0


def _finite(v: float) -> float | None:
    """null for a run that served no request (inf internally, to rank last): JSON has no
    Infinity."""
    return v if math.isfinite(v) else None


def _weights(r: cap.Result) -> str | None:
    return _arg(r, "--weights")


def _arg(r: cap.Result, flag: str) -> str | None:
    """The value of `flag` in the row's serve_args (None: not given, the model's own)."""
    args = r.serve_args
    return args[args.index(flag) + 1] if flag in args else None


def _pw(slo: cap.SLO) -> str:
    from rdu_cluster.engine.bench import p_word

    return p_word(slo.percentile)


def table(results, slo, traffic, wall) -> str:
    pw = _pw(slo)
    load = (f"{traffic.concurrency} users" if traffic.concurrency else f"{traffic.rate:g} req/s")
    if traffic.workload_args:
        load = f"{shlex.join(traffic.workload_args)} ({load})"
    bounds = ", ".join(f"{k} <= {v:g} ms" for k, v in (("TTFT", slo.ttft_ms),
                                                         ("TPOT", slo.tpot_ms)) if v)
    head = (f"{'#':>2} {'system':<24} {'sockets':>7} {'nodes':>11} {'plan':<34} {'batch':>5} "
            f"{'tok/s/user':>10} {'tok/s/sock':>10} {'$/Mtok':>19} {'J/tok':>6} "
            f"{f'p{pw} TTFT':>10} {f'p{pw} TPOT':>10}  SLO")
    title = (f"capacity: {load}, {bounds} at p{pw}; {len(results)} deployments verified "
             f"by the serving engine in {wall:.1f} s")
    lines = [title]
    if traffic.ramps:
        lines.append("closed loops start one after another over "
                     + ("one estimated cycle (E2E and think time) of each deployment"
                        if traffic.ramp_s is None else f"{traffic.ramp_s:g} s")
                     + " (--ramp-up; serve_args carry it); each row is the fewest replicas "
                     "that meet, one fewer verified to miss (bisection within --max-nodes)")
    notes = {r.interval.get("basis") for r in results} - {None}
    lines.append("nodes and $/Mtok: (low-high) where the uncertainty model covers the row "
                 "(each end the boundary searched again at the simulator's optimistic and "
                 "pessimistic ends); robust: meets at the pessimistic end; "
                 + " | ".join(sorted(notes)) if notes else "")
    records = [record(r, slo) for r in results]
    labels = sorted({rec["calibration"] for rec in records})
    lines += [*([f"calibration: {'; '.join(labels)}"] if labels else []), head]
    for i, (r, rec) in enumerate(zip(results, records), 1):
        nodes = _span(rec['nodes'], rec['nodes_low'], rec['nodes_high'], 'd')
        usd = _span(rec['usd_per_million_tokens'], rec['usd_per_million_tokens_low'],
                    rec['usd_per_million_tokens_high'], '.2f')
        lines.append(
            f"{i:>2} {' '.join(x for x in (rec['system'], rec['weights'], rec['stack']) if x):<24} "
            f"{rec['sockets']:>7} {nodes:>11} "
            f"{rec['plan']:<34} {rec['max_batch']:>5} "
            f"{_f(rec['tokens_per_s_per_user'], '.1f'):>10} "
            f"{_f(rec['tokens_per_s_per_socket'], '.1f'):>10} "
            f"{usd:>19} "
            f"{_f(rec['joules_per_token'], '.2f'):>6} {r.ttft_ms:>10.1f} {r.tpot_ms:>10.2f}  "
            f"{'meets' if r.meets_slo else _misses(r)}{_robust(rec['robust'])}"
            f"{', not settled' if r.steady.get('settled') is False else ''}")
    lines.append("serve_args (rdu-cluster serve ...):")
    lines += [f"{i:>2} {shlex.join(r.serve_args)}" for i, r in enumerate(results, 1)]
    return "\n".join(lines)


def _span(v, lo, hi, fmt: str) -> str:
    """`v (lo-hi)`, or `v` where the interval is unknown (or an end past --max-nodes: ?)."""
    if v is None:
        return "-"
    if lo is None and hi is None:
        return format(v, fmt)
    end = lambda x: "?" if x is None else format(x, fmt)
    return f"{format(v, fmt)} ({end(lo)}-{end(hi)})"


def _robust(robust) -> str:
    return "" if robust is None else ", robust" if robust else ", not robust"


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def closest(results, slo) -> str:
    if not results:
        return "nothing meets the SLO: no candidate passed the analytic pre-filter (raise " \
               "--max-nodes, add --cluster or relax --slo)"
    best = min(results, key=lambda r: r.miss)
    return (f"nothing meets the SLO; closest: {best.deployment.label} "
            f"{' + '.join(str(p) for p in best.deployment.pools)}, p{_pw(slo)} TTFT "
            f"{best.ttft_ms:.1f} ms, TPOT {best.tpot_ms:.2f} ms: {_misses(best)}")


def _misses(r: cap.Result) -> str:
    s = r.summary
    if s["unserved"] and s["bench"]["completed"]:
        return f"refuses {s['unserved']} of {s['requests']} requests"
    return f"misses by {r.miss:.0%}" if math.isfinite(r.miss) else "serves no request"


def plot(costs, path: Path) -> None:
    """Each system's analytic front as an interactive page (Plotly, as `report` draws): a
    replica of each plan at each batch (tokens/s per user = 1 / TPOT, per socket = batch /
    TPOT / sockets), faint points, the front as a line, plan and batch on hover."""
    from rdu_cluster.output.plots import pareto_front, require_plotly

    go = require_plotly()
    if not costs:
        raise ConfigError("--plot: no plan fits, nothing to plot")
    if not path.parent.exists():
        raise ConfigError(f"--plot {path}: folder {path.parent} does not exist")
    systems: dict[str, list] = {}
    for w, c in costs:
        pts = systems.setdefault(" ".join(x for x in (c.cluster, w, c.stack) if x), [[], [], []])
        pts[0] += list(c.batches / c.tpot_s / c.group)
        pts[1] += list(1 / c.tpot_s)
        pts[2] += [f"{c.plan}, batch {b}" for b in c.batches]
    fig = go.Figure()
    for name, (x, y, text) in systems.items():
        x, y, text = np.array(x), np.array(y), np.array(text)
        front = pareto_front(x, y)
        fig.add_trace(go.Scatter(x=x, y=y, text=text, mode="markers", opacity=0.3,
                                 name=f"{name} (all)", legendgroup=name))
        fig.add_trace(go.Scatter(x=x[front], y=y[front], text=text[front],
                                 mode="lines+markers", name=name, legendgroup=name))
    fig.update_layout(title="Pareto front per system (analytic step costs)",
                      xaxis={"type": "log", "title": "tokens/s per socket"},
                      yaxis={"type": "log", "title": "tokens/s per user"},
                      template="plotly_white")
    # plotly.js embedded (as `report` does), so the page renders offline: no CDN
    atomic.atomic_write(path, fig.to_html(include_plotlyjs=True, full_html=True).encode(),
                         "--plot")
