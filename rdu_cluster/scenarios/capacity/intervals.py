"""A row's interval: the node count and $/Mtok at the optimistic and pessimistic ends of the
uncertainty model's factors (validation/uncertainty.py), each end's boundary searched again on
the same runs, and whether the row still meets at the pessimistic end (robust)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

from rdu_cluster.config import load_cluster
from rdu_cluster.engine import bench
from rdu_cluster.scenarios.capacity.deployment import Deployment
from rdu_cluster.scenarios.capacity.result import Result, judged
from rdu_cluster.scenarios.capacity.search import search
from rdu_cluster.scenarios.capacity.slo import SLO


@dataclass(frozen=True)
class Bands:
    """The interval factors (low, high) of a row's pP TTFT and pP TPOT (the chips that set
    them: the prefill pool's and the decode pool's) and of its output throughput, in the
    serving regime (uncertainty.band), and their basis; None outside every measured regime."""

    ttft: tuple[float, float] | None
    tpot: tuple[float, float] | None
    throughput: tuple[float, float] | None
    basis: str

    def slo(self, slo: SLO, end: int) -> SLO | None:
        """The bounds a simulated run must keep for the deployment to meet `slo` at the
        optimistic (0) or pessimistic (1) end of the intervals; None without the bands."""
        if (slo.ttft_ms is not None and self.ttft is None) or (
                slo.tpot_ms is not None and self.tpot is None):
            return None
        scale = lambda b, f: None if b is None else b / f[end]
        return replace(slo, ttft_ms=scale(slo.ttft_ms, self.ttft),
                       tpot_ms=scale(slo.tpot_ms, self.tpot))


def bands(dep: Deployment, slo: SLO, level: float = 0.8) -> Bands:
    """The row's interval factors from the uncertainty model of the active calibration
    (rdu_cluster/validation/uncertainty.py: held-out errors of the serving regime, or its
    parts), a pair's each from the pool that sets it (uncertainty.pool_of: TTFT the prefill
    pool's, TPOT and the throughput the decode pool's)."""
    try:
        from rdu_cluster.validation import uncertainty
    except ImportError:  # a build without the uncertainty model
        return Bands(None, None, None, "no uncertainty model (rdu_cluster.validation."
                     "uncertainty)")
    pw = bench.p_word(slo.percentile)

    def chip(metric: str):  # a pair's figure: the pool that sets it (uncertainty.pool_of)
        pool = dep.pools[min(cast(int, uncertainty.pool_of(metric)), len(dep.pools) - 1)]
        return load_cluster(pool.cluster, dict(pool.overrides)).chip

    got = {key: uncertainty.band(metric=metric, chip=chip(metric), stack=None,
                                 regime="serving", level=level)
           for key, metric in (("ttft", f"p{pw}_ttft_ms"), ("tpot", f"p{pw}_tpot_ms"),
                               ("throughput", "output_throughput"))}
    basis = "; ".join(dict.fromkeys(f"{k}: {b.basis}" for k, b in got.items()))
    return Bands(got["ttft"].bounds, got["tpot"].bounds, got["throughput"].bounds,
                 f"{level:.0%} intervals; {basis}")


def loosest(dep: Deployment, slo: SLO) -> SLO:
    """The largest bound of each metric that a judge of dep's runs uses: the SLO's and its
    interval ends' (bands; the optimistic end's are looser). A run that certainly misses these
    misses every judge's."""
    out = slo
    b = bands(dep, slo)
    for end in (0, 1):
        e = b.slo(slo, end)
        if e is not None:
            out = replace(out, ttft_ms=_larger(out.ttft_ms, e.ttft_ms),
                          tpot_ms=_larger(out.tpot_ms, e.tpot_ms))
    return out


def _larger(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else max(a, b)


def with_ends(res: Result, serve: Callable[[Deployment], Result], slo: SLO,
               max_nodes: int, first: Callable[[Deployment], Result] | None = None) -> Result:
    """The row with its interval: the boundary searched again (the same runs, judged) with
    the SLO's bounds divided by the times' low factors (nodes_low: the simulator as slow as it
    may be) and by their high factors (nodes_high), $/Mtok at each end from that end's price
    and its throughput at its factor, and `robust`: the row still meets at the pessimistic
    end. No interval (None) where a band is missing: the basis says why. With `first` (the
    runs at the search's first, shorter count, most of them made already), each end is
    found there first and then searched at `serve`'s count from it: the same boundary (one
    fewer verified to miss at that count), in a run or two there instead of a bisection."""
    b = bands(res.deployment, slo)
    ends = [b.slo(slo, end) for end in (0, 1)]
    if None in ends or (b.throughput is None):
        return replace(res, interval={"basis": b.basis})
    high = cast(SLO, ends[1])  # neither end is None (above)
    out: dict = {"basis": b.basis, "robust": res.meets_slo and judged(res, high) <= 0}
    for end, name in ((0, "low"), (1, "high")):
        start = res.deployment if first is None else search(
            res.deployment, first, max_nodes, ends[end]).deployment
        found = search(start, serve, max_nodes, ends[end])
        ok = judged(found, cast(SLO, ends[end])) <= 0
        thr = found.summary["bench"]["output_throughput"] * b.throughput[1 - end]
        price = found.deployment.price_per_hour
        out[f"nodes_{name}"] = found.deployment.nodes if ok else None
        out[f"plan_{name}"] = " + ".join(map(str, found.deployment.pools)) if ok else None
        out[f"usd_per_million_tokens_{name}"] = (price * 1e6 / 3600 / thr
                                                 if ok and price and thr else None)
    return replace(res, interval=out)
