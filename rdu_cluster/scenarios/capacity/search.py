"""The boundary of a deployment: the fewest replicas that meet the SLO with one fewer verified
to miss (scenarios/boundary.py), pool by pool for a pair of pools."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rdu_cluster.scenarios.boundary import boundary
from rdu_cluster.scenarios.capacity.deployment import Deployment
from rdu_cluster.scenarios.capacity.result import Result, judged
from rdu_cluster.scenarios.capacity.sizing import PrefillLoad, prefill_replicas
from rdu_cluster.scenarios.capacity.slo import SLO

PAIR_PASSES = 3  # search: a pair's pools searched in turn at most this many times


def search(dep: Deployment, serve: Callable[..., Result], max_nodes: int,
           slo: SLO | None = None, doubled: bool = False) -> Result:
    """The deployment at the boundary (engine-verified): the fewest replicas that meet the SLO
    within --max-nodes (boundary). A disaggregated one (its prefill pool first sized again at
    the share of prompt tokens its first run prefilled: resized), pool by pool on the bound
    each sets (SLO.part): the fewest decode replicas that meet TPOT (and, fewer than the count
    it starts from, the whole SLO: TTFT holds the decode queue), then the fewest prefill
    replicas that meet TTFT at that decode pool (in the first pass, down from a count that
    meets, the count its measured throughput saturates is asked next: saturated; a later
    pass starts at the last one's boundary), again while the pair misses or a
    pool met at no size (at most PAIR_PASSES passes: more prefill replicas send the decode
    pool more work, so its TPOT may then miss). With `doubled` (served again at twice the
    count: settle) a pair missing in the ramp's transient is left at its start (_in_transient).
    Judged on the whole SLO more decode replicas may only lengthen TTFT in a closed loop (a
    faster decode pool sends prompts faster to the same prefill pool), and more prefill ones
    never mend a TPOT. Nothing meets: the largest tried (the closest). `serve` is asked once
    per deployment; a run is judged on `slo` (default: its own SLO)."""
    seen: dict[tuple, Result] = {}

    def served(d: Deployment, part: str | None = None) -> Result:
        """d's run: the first asked of it may stop once certain to miss the bound it is
        judged on (`slo`, None: the caller's; on `part`, None: either)."""
        if d.pools not in seen:
            seen[d.pools] = serve(d, stop=(slo, part))
        return seen[d.pools]

    def whole(d: Deployment) -> Result:  # a run stopped early, served again to its end
        if served(d).decided:
            seen[d.pools] = serve(d, stop=None)
        return seen[d.pools]

    judge = _judge(slo)

    def miss(d: Deployment, part: str | None) -> float:
        """d's miss on `part` (a run stopped on a metric the part leaves out: served whole)."""
        r = served(d, part)
        bound = slo or r.slo
        if bound is not None and not r.answers((part and bound.part(part)) or bound):
            r = whole(d)
        return judge(r, part)

    def margin(d: Deployment, part: str | None, other: bool) -> float | bool:
        """d's miss for the boundary's line; its verdict alone where the miss is a lower bound
        (a run stopped once certain to miss) or on a bound other than its neighbours' (below
        a pool's start, the whole SLO where the part is asked above it)."""
        m = miss(d, part)
        return m <= 0 if other and part is not None or served(d).decided else m

    def fewest(base: Deployment, pool: int, part: str | None, hint: bool = False
               ) -> tuple[Result, bool]:
        """The boundary of `pool` judged on `part` from base's count (`hint`: down from a
        count that meets, the count its run saturates asked next), and whether it is past
        the top (the largest is then returned, served to its end)."""
        at = lambda n: base.with_replicas(pool, n)
        start, top = base.pools[pool].replicas, base.most_replicas(pool, max_nodes)
        # below the count it starts from, judged on the whole SLO (which a part meets where
        # the whole does), so that its run stops on either bound: a decode pool too small
        # for the TTFT the prompts queue into would otherwise run to its end for its TPOT
        n = boundary(lambda n: margin(at(n), None if n < start else part, n < start), start,
                     top, (lambda n: saturated(served(at(n)))) if hint else None)
        if n is None:
            return whole(at(top)), True
        below = miss(at(n - 1), None) if n > 1 else None
        return replace(served(at(n)), below=below, below_at_least=n > 1 and bool(
            served(at(n - 1)).decided)), False

    if not dep.disaggregated:
        return fewest(dep, 0, None)[0]
    dep = resized(dep, served(dep, "tpot"), max_nodes, slo)  # the decode search's first run
    for k in range(PAIR_PASSES):
        res, decode_topped = fewest(dep, 1, "tpot")
        if k == 0 and doubled and _in_transient(res, judge):
            return replace(res, transient=True)  # searched at twice the count (settle)
        # a later pass's prefill pool starts at the last pass's boundary, a decode pool's
        # change away: a nearer guess than the saturation count
        res, prefill_topped = fewest(res.deployment, 0, "ttft", hint=k == 0)
        dep = res.deployment
        if judge(res, None) <= 0 and not (decode_topped or prefill_topped):
            break  # again only while it misses, or a pool met at no size (its largest kept)
    return res


def _in_transient(r: Result, judge: Callable[[Result, str | None], float]) -> bool:
    """Whether r, a pair at its prefill pool's start, misses its TTFT while its run leaves
    that pool unsaturated (the saturation count two or more below its count): the miss is
    the ramp's transient queue, not the pool's size, and a pool near saturation leaves that
    queue over thousands of requests, so a search at this count follows the transient, not
    the boundary (Result.transient: settle searches it at twice the count). Question 2's FP8
    `hgx-h200:tp1 + sn40l-16:tp4` pair asked 17, 18, 22, 19 and 20 prefill replicas at 2,000
    requests where its boundary at 4,000 was 15; searched there, 14 with 5 decode replicas
    where 6 (docs/capacity.md)."""
    least = saturated(r)
    return (least is not None and least <= r.deployment.pools[0].replicas - 2
            and judge(r, "tpot") <= 0 < judge(r, None))


def saturated(r: Result) -> int | None:
    """The prefill pool's count at which the request throughput r's run carried saturates it
    (x a prompt's analytic prefill service time, at the share of prompt tokens the run
    prefilled where a prefix cache served the rest), rounded, and no fewer than hold the
    sessions' histories (the analytic pass's history_replicas): the Llama 3.1 70B question's eight
    pairs had boundaries 0.92-1.03 times it at the analytic throughput, but for one whose
    TTFT the decode queue bounds. None without the service time or the run's figures (a run
    stopped as certain to miss)."""
    each = r.deployment.analytic.get("prefill_service_s")
    if each is None or r.decided or "bench" not in r.summary:
        return None
    each *= _share_scale(r.deployment.analytic, r) or 1.0
    # fewer than hold the sessions' histories thrash their caches (Traffic.history_replicas)
    fit = r.deployment.analytic.get("history_replicas", 0)
    return max(1, round(r.summary["bench"]["request_throughput"] * each), fit)


def _share_scale(an: dict, r: Result) -> float | None:
    """The share of prompt tokens r's run prefilled over the analytic pass's (which keeps
    every cached prefix: a lower bound), None where either is unknown."""
    hit = None if r.decided else r.summary.get("prefix_cache_hit_rate")
    share = an.get("prefill_share")
    return None if hit is None or not share else (1.0 - hit) / share


def _judge(slo: SLO | None) -> Callable[[Result, str | None], float]:
    """A run's miss on `slo` (None: the run's own, Result.slo), or on its bound on `part`
    alone ('ttft', 'tpot': SLO.part)."""
    def judge(r: Result, part: str | None) -> float:
        whole = slo or r.slo
        if whole is None:
            return r.miss  # a run without its SLO (tests): the whole
        return judged(r, (whole.part(part) if part else None) or whole)
    return judge


def resized(dep: Deployment, first: Result, max_nodes: int, slo: SLO | None = None
            ) -> Deployment:
    """A pair whose prefill pool the analytic pass sized on a prefix cache that holds every
    prompt's cached prefix (sizing: Traffic.prefill_share, a lower bound on its work), sized
    again (sizing.prefill_replicas) at the share of prompt tokens its first run (`first`)
    prefilled, where that is more; never smaller. The decode pool is searched first at this
    count, and a prefill pool that starves the closed loop sends it too little work (its TPOT
    verdict too kind, searched again in another pass): the sessions question's H100 pairs, an
    HBM-only prefix cache, held 19% of their prompt tokens at 8 prefill replicas where 65% was
    assumed; from 18 (the boundary 19) the FP8 tp8 one took 4 runs instead of 15."""
    an = dep.analytic
    scale = _share_scale(an, first)  # the prefill a prompt brings, over the analytic pass's
    if scale is None or scale <= 1.0:
        return dep
    load = PrefillLoad(an["arrivals_per_s"], an["prefill_service_s"], an["prefill_s"],
                       an["kv_transfer_s"], an["cycle_s"], an.get("sessions", False))
    got = prefill_replicas(load.scaled(scale), slo or first.slo or SLO(),
                           dep.most_replicas(0, max_nodes))
    return dep if got is None or got <= dep.pools[0].replicas else dep.with_replicas(0, got)
