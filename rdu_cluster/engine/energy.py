"""Energy and cost columns of the serving tables.

Basis: the chip's power model (chip/power.py). Each socket reports its dynamic energy per step
(joules above idle draw, the `dynamic_j` row of chip/cost_tables.py). Every socket of a replica
draws idle power for the whole of each of the replica's steps, including the KV swaps and CoE expert
copies that the step's time holds (their energy beyond idle is not modelled), and for a
recovery's weight reload. The summary adds the idle draw of every socket of the cluster over
the makespan whenever it is in no step (between steps, on no replica, failed). Cost: the
cluster's [cost] price per socket-hour (rdu_cluster/scenarios/economics.py) times socket-seconds; a step
charges its replica's sockets for its time, the summary the whole cluster for the makespan (the
machine is rented throughout). Left out: host CPUs, switches, fans, facility overhead (PUE).

Missing figures are None (null in the Arrow tables), as in rdu_cluster/scenarios/economics.py: energy
without a [power] table in the chip TOML, cost without a [cost] table in the cluster TOML.

Per request, each step's energy and cost are split over the requests in it by their share of
the step's tokens: a prefill request's new prompt tokens, 1 for each decode. A speculative
decode also counts 1 (one sequence verified per step, whatever it accepts), so a request pays
for its rejected draft tokens. Recovery rows (a reload, no request in them) are not split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chip import power
from chip.cost_tables import DYNAMIC_ROW
from partitioning.cluster import ClusterSpec
from rdu_cluster.engine.replica import Span
from rdu_cluster.scenarios import economics

HOUR_S = 3600.0


@dataclass(frozen=True)
class Rates:
    """Idle draw per socket (W) and price per socket-hour (USD); None where not configured."""

    idle_w: float | None
    socket_hour_usd: float | None

    @classmethod
    def of(cls, cluster: ClusterSpec) -> Rates:
        return cls(power.idle_power_w(cluster.chip), economics.socket_hour_usd(cluster))


def _column(values: np.ndarray | None, n: int) -> np.ndarray:
    """A float column, or n nulls (None) when the figure is not configured."""
    return np.full(n, None, dtype=object) if values is None else values


def split_columns(rates: Rates) -> dict[str, dict[int, float]]:
    """The per-request totals to keep: {column: {request id: total}}, configured columns only."""
    out: dict[str, dict[int, float]] = {}
    if rates.idle_w is not None:
        out["energy_j"] = {}
    if rates.socket_hour_usd is not None:
        out["cost_usd"] = {}
    return out


def dynamic_j(res: dict, sockets: list[int], m: int) -> np.ndarray:
    """Per-step dynamic joules summed over `sockets`, for the first m steps of a window. Added
    one socket after another: np.sum over a stack would sum pairwise or not depending on m, so
    a step's figure would depend on how the steps were grouped into windows."""
    total = np.zeros(m)
    last = None
    for s in sockets:
        if res[s][0] is not last:  # a symmetric group's sockets share one reply: one view
            last = res[s][0]
            row = last[DYNAMIC_ROW, :m]
        total += row
    return total


def step_columns(rates: Rates, dynamic: np.ndarray | None, sockets: int,
                 time_s: np.ndarray) -> dict[str, np.ndarray]:
    """energy_j and cost_usd of steps of a replica of `sockets` sockets lasting `time_s`:
    dynamic joules (None: none, as in a reload) plus idle draw of every socket for the step."""
    cost = (None if rates.socket_hour_usd is None
            else rates.socket_hour_usd * sockets * time_s / HOUR_S)
    return {"energy_j": step_energy(rates, dynamic, sockets, time_s),
            "cost_usd": _column(cost, len(time_s))}


def step_energy(rates: Rates, dynamic: np.ndarray | None, sockets: int,
                time_s: np.ndarray) -> np.ndarray:
    """step_columns' energy_j alone (a summary-only run keeps no cost column)."""
    energy = None
    if rates.idle_w is not None:
        energy = rates.idle_w * sockets * time_s + (0.0 if dynamic is None else dynamic)
    return _column(energy, len(time_s))


def socket_columns(rates: Rates, rows: np.ndarray, m: int, window_s: float) -> dict:
    """energy_j and cost_usd of sockets over one window of `window_s` seconds: `rows` is
    (sockets, ROWS, steps), one array (None: no [power] / [cost] table) a socket."""
    k = len(rows)
    energy = (None if rates.idle_w is None
              else rows[:, DYNAMIC_ROW, :m].sum(axis=1) + rates.idle_w * window_s)
    cost = (None if rates.socket_hour_usd is None
            else np.full(k, rates.socket_hour_usd * window_s / HOUR_S))
    return {"energy_j": energy, "cost_usd": cost}


def split_over_requests(spans: list[Span], cols: dict[str, np.ndarray],
                        into: dict[str, dict[int, float]]) -> None:
    """Add each span's energy_j / cost_usd to its requests by token share (module docstring).
    `cols` holds the window's step columns (one row per step of the spans); `into` maps a
    column name to {request id: running total}, and holds only the configured columns.
    A request's shares are added one span after another (np.add.at adds in order), so its
    total does not depend on how the spans were grouped into windows."""
    if not into:
        return
    firsts = np.concatenate([[0], np.cumsum([sp.steps for sp in spans])[:-1]]).astype(np.int64)
    ids = [r.id for sp in spans for r in sp.decode]  # each decode's one token
    at = 2 * np.repeat(np.arange(len(spans)), [len(sp.decode) for sp in spans]) + 1
    tokens = np.ones(len(ids))
    pre = [(i, r.id, t) for i, sp in enumerate(spans) if sp.prefill for r, t in sp.prefill]
    if pre:
        i, r, t = zip(*pre)
        ids += r
        at = np.concatenate([at, 2 * np.array(i, dtype=np.int64)])
        tokens = np.concatenate([tokens, np.array(t, dtype=float)])
    order = np.argsort(at, kind="stable")  # span by span, a span's prefills first
    span = at[order] // 2
    tokens = tokens[order]
    weight = np.array([float(sp.pre_tokens) + len(sp.decode) for sp in spans])[span]
    keys, slot = np.unique(np.array(ids, dtype=np.int64)[order], return_inverse=True)
    keys = keys.tolist()
    for name, totals in into.items():
        per_span = np.add.reduceat(np.asarray(cols[name], dtype=float), firsts)
        acc = np.array([totals.get(k, 0.0) for k in keys])
        np.add.at(acc, slot, per_span[span] * tokens / weight)
        totals.update(zip(keys, acc.tolist()))


def summary(rates: Rates, totals: dict, cluster_sockets: int, makespan_s: float,
            tokens: int) -> dict:
    """Energy and cost of the whole run: steps' energy plus idle draw of every socket whenever
    it is in no step (the socket-seconds in steps: metrics.step_totals); the price of every
    socket over the makespan."""
    energy = None
    if rates.idle_w is not None:
        energy = totals["energy_j"] + rates.idle_w * (cluster_sockets * makespan_s
                                                      - totals["socket_s"])
    cost = (None if rates.socket_hour_usd is None
            else rates.socket_hour_usd * cluster_sockets * makespan_s / HOUR_S)
    return {
        "energy_j": energy,
        "power_w": ratio(energy, makespan_s),
        "joules_per_token": ratio(energy, tokens),
        "cost_usd": cost,
        "cost_per_million_tokens_usd": ratio(None if cost is None else cost * 1e6, tokens),
    }


def ratio(value: float | None, by: float) -> float | None:
    """value / by; None when value is unknown or by is 0 (no time, no tokens)."""
    return None if value is None or not by else value / by
