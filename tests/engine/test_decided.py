"""A run that stops once its verdict is certain (engine/decided.py): it stops only where the
pP the full run would report exceeds the bound, and no later than that is certain."""

from __future__ import annotations

import numpy as np
import pytest

from rdu_cluster.engine import bench
from rdu_cluster.engine.decided import Decided, Watch


def _counted(send, values, warmup, cut):
    """The values bench counts: after the first `warmup` sent (ties by index), then `cut`."""
    order = np.argsort(send, kind="stable")[warmup + cut:]
    return values[order]


def _replay(watch, send, values, finish):
    """Sends in time order, completions in finish order (each after its send): the stop
    (None: none)."""
    events = sorted([(s, 0, i) for i, s in enumerate(send)] + [(f, 1, i) for i, f in
                                                               enumerate(finish)])
    for _, kind, i in events:
        if kind == 0:
            watch.sent(send[i])
            continue
        try:
            watch.done(send[i], values[i], None)
        except Decided as d:
            return d
    return None


N, WARMUP, BOUND_S = 400, 50, 1.0


def _random_run(rng, queue: bool = False):
    """Sends (with ties), TTFTs around the bound (a share over it; with `queue`, growing with
    the send as a queue's do) and completions after them."""
    send = np.sort(rng.uniform(0, 100, N))
    send[rng.integers(0, N, 20)] = send[0]  # ties
    if queue:
        ttft = rng.uniform(0, 0.5, N) + rng.uniform(0, 0.08) * np.arange(N) / 4
    else:
        share = rng.choice([0.0, 0.005, 0.02, 0.3])
        ttft = np.where(rng.random(N) < share, rng.uniform(1.01, 3, N), rng.uniform(0, 0.99, N))
    return send, ttft, send + ttft + rng.uniform(0, 5, N)


def _a_miss_for_every_cut(send, ttft, mser: bool, d, trial: int) -> None:
    """bench's p99 exceeds the bound for each cut MSER may choose, and is at least d's."""
    cuts = range(0, (N - WARMUP) // 2 + 1, bench.MSER_BATCH) if mser else [0]
    for cut in cuts:
        p = np.percentile(_counted(send, ttft, WARMUP, cut) * 1e3, 99)
        assert p > BOUND_S * 1e3 and p >= d.at_least_ms - 1e-9, (trial, cut)


@pytest.mark.parametrize("mser", [False, True])
def test_a_run_stops_only_where_every_measured_p99_exceeds_the_bound(mser):
    """Random closed-loop-like runs (sends, TTFTs around the bound, completions out of order):
    where the watch stops, the p99 that bench computes exceeds the bound for the warm-up's
    requests left out and for every MSER cut it may choose, and is at least the value the
    watch reports; where it runs to the end without stopping, the exceedances it counted were
    fewer than the rank that decides."""
    rng = np.random.default_rng(7)
    stopped = 0
    for trial in range(60):
        send, ttft, finish = _random_run(rng)
        watch = Watch({"ttft": BOUND_S * 1e3, "tpot": None}, 99.0, N, WARMUP, mser)
        d = _replay(watch, send, ttft, finish)
        if d is None:  # never certain: fewer counted values over the bound than decide
            counted = np.searchsorted(np.sort(send), send, side="left") >= watch.first
            assert np.sum(counted & (ttft * 1e3 > BOUND_S * 1e3)) < watch.need, trial
            continue
        stopped += 1
        _a_miss_for_every_cut(send, ttft, mser, d, trial)
        assert d.metric == "ttft" and d.completed <= N
    assert stopped >= 10  # the heavy misses stop


def test_a_heavy_miss_stops_as_soon_as_enough_measured_requests_exceed():
    """Without MSER, requests past the warm-up are measured from the start: with every one of
    them over the bound, the run stops at the need-th of them (p99 of 100: 2 values over),
    and the warm-up's own never count."""
    n, warmup = 150, 50
    watch = Watch({"ttft": 500.0, "tpot": None}, 99.0, n, warmup)
    assert watch.need == 2 and watch.first == warmup
    for i in range(n):
        watch.sent(float(i))
    for i in range(warmup):
        watch.done(float(i), 9.0, None)  # the warm-up: over the bound, never counted
    watch.done(float(warmup), 0.7, None)
    with pytest.raises(Decided) as got:
        watch.done(float(warmup + 1), 0.6, None)
    assert got.value.at_least_ms == pytest.approx(600.0) and got.value.completed == warmup + 2


def test_with_mser_only_the_requests_past_the_largest_cut_count():
    """MSER may leave out up to half of what follows the warm-up (a multiple of 5): requests
    sent before that point never decide; where some request has one output token its TPOT
    cut is counted in all requests, so nothing is certain before the end."""
    watch = Watch({"ttft": 500.0, "tpot": 20.0}, 99.0, 2000, 500, mser=True)
    assert watch.first == 500 + 750
    for i in range(2000):
        watch.sent(float(i))
    for i in range(1250):
        watch.done(float(i), 9.0, 9.0)  # none counted yet
    with pytest.raises(Decided) as got:
        for i in range(1250, 2000):
            watch.done(float(i), 0.1, 0.05)  # TPOT 50 ms: over 20
    assert got.value.metric == "tpot" and got.value.completed == 1250 + watch.need
    single = Watch({"ttft": 500.0, "tpot": None}, 99.0, 2000, 500, mser=True, several=False)
    assert single.first == 2000


def _replay_waiting(watch, send, ttft, finish):
    """As _replay, with each first token told as it comes (send + ttft: `through`) and the
    watch checked at every event's time, first tokens before the rest at equal times (a
    window tells its ends as it starts: every first token up to the loop's time is known)."""
    first = send + ttft
    events = sorted([(f, 0, i) for i, f in enumerate(first)]
                    + [(s, 1, i) for i, s in enumerate(send)]
                    + [(f, 2, i) for i, f in enumerate(finish)])
    for t, kind, i in events:
        try:
            if kind == 0:
                watch.through(i)
            elif kind == 1:
                watch.sent(send[i], i)
            else:
                watch.through(i)
                watch.done(send[i], ttft[i], None)
            watch.check(t)
        except Decided as d:
            return d, t
    return None, None


@pytest.mark.parametrize("mser", [False, True])
def test_waiting_requests_decide_no_later_and_only_where_the_p99_exceeds(mser):
    """A request still waiting for its first token at t has a TTFT over t - s: counting those
    stops a run only where bench's p99 exceeds the bound (for every cut it may choose) and is
    at least the value reported, never later than counting completions alone, and earlier
    where requests queue (a run whose TTFTs grow as a queue does)."""
    rng = np.random.default_rng(11)
    earlier = 0
    for trial in range(60):
        send, ttft, finish = _random_run(rng, queue=bool(trial % 2))
        waits = Watch({"ttft": BOUND_S * 1e3, "tpot": None}, 99.0, N, WARMUP, mser, waits=True)
        d, at = _replay_waiting(waits, send, ttft, finish)
        plain = Watch({"ttft": BOUND_S * 1e3, "tpot": None}, 99.0, N, WARMUP, mser)
        d0 = _replay(plain, send, ttft, finish)
        assert (d is None) == (d0 is None), trial  # the same verdict
        if d is None:
            continue
        _a_miss_for_every_cut(send, ttft, mser, d, trial)
        stop0 = np.sort(finish)[d0.completed - 1]  # the completion that decided it
        assert at <= stop0, trial
        earlier += at < stop0
    assert earlier >= 10
