"""The boundary at steady state (settle): the search's row served again with twice the requests
until it moves less than the tolerance, the search going on where the verdict changes, several
seeds where lengths are drawn, and the row's interval."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

from rdu_cluster.scenarios.capacity import intervals, verification
from rdu_cluster.scenarios.capacity.deployment import Deployment
from rdu_cluster.scenarios.capacity.result import Result
from rdu_cluster.scenarios.capacity.search import saturated, search
from rdu_cluster.scenarios.capacity.slo import SLO
from rdu_cluster.scenarios.capacity.traffic import Traffic

# The boundary row is doubled at most STEADY_DOUBLINGS times (traffic.STEADY_TOL: the move it
# must fall under); lengths drawn from a distribution are served with SEEDS seeds, the worst
# deciding.
STEADY_DOUBLINGS = 3
SEEDS = 3


def settle(dep: Deployment, serve: Callable[[Deployment, Traffic, SLO | None], Result],
           traffic: Traffic, max_nodes: int, slo: SLO | None = None) -> Result:
    """The boundary at steady state. Searched (search) at the traffic's request count; then,
    for synthetic traffic (a trace or the sessions are the question's own workload), the
    boundary row is served with twice the requests until its pP TTFT, pP TPOT and output
    throughput move less than STEADY_TOL (_moved: a pP under its bound on the bound's scale),
    the search going on at the longer count wherever the verdict changed or the search left a
    pair at its start, missing in the ramp's transient (search's `doubled`), and one fewer
    asked there; a row found at that count is measured on its own run at half it, and doubled
    on while it moves and STEADY_DOUBLINGS last; lengths drawn from a distribution are
    served with SEEDS seeds, the worst deciding the verdict (the search going on with all of
    them if one misses), and the spread reported. With the `slo`, the row's interval
    (intervals.with_ends), its ends searched on the same runs."""
    verification.forget_runs()
    try:
        return _settle(dep, serve, traffic, max_nodes, slo)
    finally:
        verification.forget_runs()


def _settle(dep: Deployment, serve: Callable[[Deployment, Traffic, SLO | None], Result],
            traffic: Traffic, max_nodes: int, slo: SLO | None = None) -> Result:
    runs = _Runs(serve, slo, None if slo is None else intervals.loosest(dep, slo))
    left = STEADY_DOUBLINGS if traffic.steadies else 0
    res = search(dep, runs.at(traffic), max_nodes, doubled=left > 0)
    moved, t = None, traffic
    tol = cast(float, traffic.steady_tol)  # (doubled only where it steadies: a tolerance)
    while True:
        while left and (moved is None or moved > tol):
            t, left = replace(t, requests=2 * _count(t)), left - 1
            again = runs.get(res.deployment, t, None)
            kept = again.meets_slo == res.meets_slo and not res.transient
            res = again if kept else search(again.deployment, runs.at(t), max_nodes)
            moved = runs.own(res, t)
        seeds = [t.seed + k for k in range(SEEDS)] if t.drawn else [t.seed]
        # the runs at the search's first count (traffic's), and at the steady one (t's)
        final = runs.at(t, seeds)
        if len(seeds) > 1:
            again = final(res.deployment, stop=None)
            res = again if again.meets_slo or not res.meets_slo else search(
                again.deployment, final, max_nodes)
        # a pair's saturation count asked first only where the count doubled: at the search's
        # own count one fewer was served already (the question's sessions: 5 runs more, each a
        # miss)
        doubled = _count(t) != _count(traffic)
        row = _one_fewer(res, final, max_nodes, doubled and res.deployment.disaggregated)
        changed, res = row.deployment != res.deployment, row
        if not (changed and doubled):
            break
        # one fewer met at the steady count: the new row's own doubling, and more while it
        # moves and the doublings last (a row at its prefill pool's saturation moved 15-35%
        # from half its count where the row it replaced had settled)
        moved = runs.own(res, t)
        if moved <= tol or not left:
            break
    res = _with_steady(res, t, moved, traffic.steady_tol, seeds)
    if slo is None:
        return res
    return intervals.with_ends(res, final, slo, max_nodes, runs.at(traffic, seeds))


def _count(t: Traffic) -> int:
    return t.n_requests(t.rate or 0.0)


class _Runs:
    """The runs of one candidate's settle, each deployment, request count and seed served once
    (`serve`); `slo`: the row's (its moves are on its bounds' scale); `bounds`: the loosest any
    judge of the row's own runs uses (intervals.loosest), which a run stops on by default."""

    def __init__(self, serve: Callable[[Deployment, Traffic, SLO | None], Result],
                 slo: SLO | None, bounds: SLO | None) -> None:
        self.serve, self.slo, self.bounds = serve, slo, bounds
        self.runs: dict[tuple, Result] = {}

    def get(self, d: Deployment, t: Traffic, stop: tuple | None = (None, None)) -> Result:
        """d served at t: to its end (stop None), or stopped once certain to miss `stop` = (an
        SLO, None: `bounds`; a part of it, None: both bounds). An interval end's search stops
        its runs on its own bounds: the pessimistic end's runs, above the row, are judged on
        nothing else."""
        key = (d.pools, _count(t), t.seed)
        runs = self.runs
        if key not in runs or (stop is None and runs[key].decided):
            judged, part = stop or (None, None)
            whole: SLO | None = None if stop is None else judged or self.bounds
            on = None if whole is None else (part and whole.part(part)) or whole
            runs[key] = self.serve(d, t, on)
        return runs[key]

    def at(self, tr: Traffic, seeds: Sequence[int] = ()) -> Callable[..., Result]:
        """search's serve at tr's count: its seed, or the worst of `seeds` (drawn lengths);
        `stop` as get's."""
        def serve_at(d: Deployment, stop: tuple | None = (None, None)) -> Result:
            if len(seeds) <= 1:
                return self.get(d, tr, stop)
            return _worst([self.get(d, replace(tr, seed=k), stop) for k in seeds])
        return serve_at

    def own(self, row: Result, t: Traffic) -> float:
        """The row's move over its own last doubling: its deployment's run at half t's count
        against the row (a row found at t, by a verdict that changed there or one fewer that
        met, was not the one doubled)."""
        half = replace(t, requests=_count(t) // 2)
        return _moved(self.get(row.deployment, half, None), row, self.slo)


def _with_steady(res: Result, t: Traffic, moved: float | None, tol: float | None,
                 seeds: list[int]) -> Result:
    """The row with how its steady state was checked. settled: the row's own last doubling
    moved it less than the tolerance (None: not doubled); False is a row still moving after
    STEADY_DOUBLINGS doublings, printed as such."""
    settled = None if moved is None else bool(moved <= cast(float, tol))
    return replace(res, steady={
        "requests": _count(t),
        "warmup_requests": res.summary.get("bench", {}).get("warmup_requests", t.warmup),
        "moved_on_doubling": moved, "tolerance": tol, "settled": settled, "seeds": seeds,
        **res.steady})


def _one_fewer(res: Result, serve: Callable[[Deployment], Result], max_nodes: int,
               hint: bool = False) -> Result:
    """The boundary's other side at the steady count: one replica fewer of the pool searched
    last (the first) served there too; where it meets at that count, the search goes on there
    (the runs at the shorter count had found the boundary). With `hint` (a pair's prefill
    pool) it is first asked at the count the row's own run saturates (saturated), where that
    lies two or more below: the start-up transient of a shorter run can hold the boundary
    above it (the Llama 3.1 70B question's `hgx-h200:tp2 + sn40l-16:tp16` BF16 pair: 21
    replicas at 2,000 requests, 16 at 16,000, where one fewer, 20, met and ran to its end
    there first)."""
    n = res.deployment.pools[0].replicas
    if not res.meets_slo or n == 1:
        return res
    least = saturated(res) if hint else None
    for k in ([least] if least is not None and least < n - 1 else []) + [n - 1]:
        fewer = serve(res.deployment.with_replicas(0, k))
        if fewer.meets_slo:
            return search(fewer.deployment, serve, max_nodes)
    return replace(res, below=fewer.miss, below_at_least=bool(fewer.decided))


def _moved(a: Result, b: Result, slo: SLO | None = None) -> float:
    """The largest change of pP TTFT, pP TPOT and output throughput from a to b, each over
    its scale: the throughput's own value (it sets $/Mtok); a pP's own value or its SLO bound,
    the larger (the verdict is the pP against its bound: a p99 TTFT of 279 ms under a 1,500 ms
    bound that falls 8.6% a doubling as the ramp's transient thins moves the verdict 1.6% of
    the way to its bound, and was served twice and then eight times as long for it). Never
    stricter than the relative change; the same where a pP is at or over its bound."""
    bounds = (None, None) if slo is None else (slo.ttft_ms, slo.tpot_ms)
    pairs = [(a.ttft_ms, b.ttft_ms, bounds[0]), (a.tpot_ms, b.tpot_ms, bounds[1]),
             (a.summary["bench"]["output_throughput"], b.summary["bench"]["output_throughput"],
              None)]
    return max(abs(y - x) / max(x, bound or 0.0) if x and math.isfinite(x) and math.isfinite(y)
               else (0.0 if x == y else math.inf) for x, y, bound in pairs)


def _worst(results: list[Result]) -> Result:
    """The first seed's run with the worst seed's miss, and the spread over the seeds; a run
    stopped as certain to miss (Result.decided) where one was."""
    stopped = next((r for r in results if r.decided), None)
    if stopped is not None:
        return stopped
    spread = lambda f: [min(map(f, results)), max(map(f, results))]
    first = results[0]
    return replace(first, miss=max(r.miss for r in results), steady={
        "runs": [(r.ttft_ms, r.tpot_ms) for r in results],
        "ttft_ms_range": spread(lambda r: r.ttft_ms), "tpot_ms_range": spread(lambda r: r.tpot_ms),
        "output_throughput_range": spread(lambda r: r.summary["bench"]["output_throughput"])})
