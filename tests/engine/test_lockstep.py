"""engine/lockstep.py: a lockstep batch's context sum, least remaining output and KV growth
from aggregates give what a pass over the batch gives."""

from __future__ import annotations

import random

import pytest

from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.config import load_fabric
from rdu_cluster.engine import disagg
from rdu_cluster.engine import lockstep as lockstep_module
from rdu_cluster.engine import replica as replica_module
from rdu_cluster.engine.lockstep import Lockstep
from rdu_cluster.engine.prefix_cache import PrefixConfig
from rdu_cluster.engine.requests import Request
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.engine.simulation import ServeConfig
from workloads import traces
from workloads.catalog import load_model

BT = 16


def _batch(rng: random.Random, n: int, at: int) -> tuple[Lockstep, list[tuple[int, int]]]:
    """A Lockstep of n sequences joined at decode steps up to `at`, and each one's (cached,
    held) at `at` as a pass over the batch reads them."""
    agg, rows = Lockstep(BT), []
    for i in range(n):
        since = rng.randrange(0, at + 1)
        c0 = rng.randrange(1, 3000)
        spare = rng.choice([0, 0, 0, 1, 5, 40])  # blocks beyond its cached tokens'
        held = -(-c0 // BT) + spare
        r = Request(i, 0.0, c0, 10_000)
        r.cached = c0
        agg.join(r, since, held)
        cached = c0 + at - since
        rows.append((cached, max(held, -(-cached // BT))))
    agg.settle(at)
    return agg, rows


@pytest.mark.parametrize("seed", range(20))
def test_growth_is_the_sum_over_the_batch(seed):
    rng = random.Random(seed)
    at = rng.randrange(0, 500)
    agg, rows = _batch(rng, rng.randrange(1, 40), at)
    for n in (1, 2, 7, 15, 16, 17, 33, 250):
        want = sum(max(0, -(-(c + n) // BT) - h) for c, h in rows)
        assert agg.growth(at, n) == want, n
    assert agg.context(at) == sum(c for c, _ in rows)
    # as a span opens (replica._kv_per_step): those kept apart one by one, the rest by phase
    cached, held, phases = agg.at_open(at)
    for k in range(40):
        want = sum(max(0, -(-(c + k + 1) // BT) - h) for c, h in rows)
        apart = sum(max(0, -(-(c + k + 1) // BT) - h) for c, h in zip(cached, held))
        assert apart + sum(phases[-(at + j) % BT] for j in range(k + 1)) == want, k


def test_least_remaining_skips_those_that_left():
    agg = Lockstep(BT)
    reqs = [Request(i, 0.0, 100, out) for i, out in enumerate((50, 20, 80))]
    for r in reqs:
        r.cached = 100
        agg.join(r, 0, -(-100 // BT))
    assert agg.least_remaining(5) == 15
    reqs[1].cached += 5
    agg.leave(reqs[1], 5)
    assert agg.least_remaining(5) == 45 and agg.count == 2
    reqs[1].cached, reqs[1].generated = 105, 5  # back, at the same step: a new run
    agg.join(reqs[1], 5, -(-105 // BT))
    assert agg.least_remaining(5) == 15


def _tables(run):
    _, t = run()
    return [t.requests.to_pydict(), t.steps.to_pydict(), dict(t.summary, windows=0)]


def _disagg():
    trace = traces.synthetic(40, 20.0, "poisson", traces.LengthDist("uniform", 64, 2048),
                             traces.LengthDist("uniform", 2, 120), seed=7)
    d = disagg.Disaggregated(load_model("llama-3.1-8b"),
                             disagg.Pool.parse("dgx-h100:tp8:1", "--prefill-pool"),
                             disagg.Pool.parse("sn40l-8:tp8:1", "--decode-pool"),
                             load_fabric("ib-ndr"), trace, ServeConfig(), LocalBackend)
    return d, d.run()


# KV pressure that preempts (tests/engine/test_engine.py): ~1.2 GB of KV a GPU
PRESSURE = {mode: {"model": "llama-3.1-70b", "cluster": "dgx-h100", "n": 48, "rate": 1000.0,
                   "prompt": traces.LengthDist("fixed", 2048),
                   "output": traces.LengthDist("fixed", 256), "kv_memory_fraction": 0.02,
                   "limits": Limits(max_batch=64, preemption=mode)}
            for mode in ("swap", "recompute")}
CASES = {
    "light": {"cluster": "sn40l-16", "plan": "tp4", "n": 80, "rate": 40.0},
    "static": {"cluster": "sn40l-8", "n": 40, "rate": 40.0, "scheduler": "static"},
    "pressure-swap": PRESSURE["swap"],
    "pressure-recompute": PRESSURE["recompute"],
    "chunked-prefix": {"n": 50, "rate": 40.0, "prefix": PrefixConfig("tiered"),
                       "limits": Limits(max_batch=8, chunked_prefill=True)},
    "disaggregated": None,
}


@pytest.mark.parametrize("case", CASES)
def test_the_aggregate_gives_the_tables_of_a_pass_over_the_batch(serve, case, monkeypatch):
    """Each case with Lockstep and with the pass over the batch it replaces (the path a policy
    that is not lockstep, or speculation, takes): the same tables. Static batching's reserved
    output and a disaggregated hand-over's spare block exercise the sequences kept apart; the
    pass moves every decode's counts a span, the aggregate only as they are read
    (Lockstep.bring) and those completing from its heap (Lockstep.due)."""
    kw = CASES[case]
    run = _disagg if kw is None else (lambda: serve(**kw))
    joined, apart = [], []
    join = Lockstep.join

    def spy(self, r, since, held):
        join(self, r, since, held)
        joined.append(r.id)
        apart.extend([r.id] if r.id in self.apart else [])

    monkeypatch.setattr(lockstep_module.Lockstep, "join", spy)
    with_aggregate = _tables(run)
    assert joined
    if case.startswith("pressure"):  # the KV cache runs out: sequences preempted
        assert with_aggregate[2]["preemptions"] + with_aggregate[2]["swaps"] > 0
    if case in ("static", "disaggregated"):
        assert apart
    monkeypatch.setattr(replica_module, "Lockstep", lambda block_tokens: None)
    assert _tables(run) == with_aggregate


@pytest.mark.parametrize("case", CASES)
def test_a_views_growth_is_what_the_policy_counts_over_its_batch(serve, case, monkeypatch):
    """Where every running sequence decodes under a lockstep policy, the view carries the
    aggregates (View.together), whose KV growth of one decode step (View.growth) the policy
    reads instead of its pass over the batch (continuous._growth) and from which it takes
    every running sequence as decoding (continuous._decoding): each view's growth is that
    pass's count, and every sequence it runs is past its prefill, with the KV cache running
    out and sequences preempted too (the pressure cases)."""
    from rdu_cluster.engine.schedulers import continuous

    kw = CASES[case]
    run = _disagg if kw is None else (lambda: serve(**kw))
    asked = []
    step = continuous.Continuous.step

    def spy(self, view):
        if view.together is not None:
            view.fresh()  # (engine/lockstep.py: the counts stand where last read)
            running = list(view.running)
            assert all(r.cached >= r.target for r in running)
            want = continuous._growth(running, view.kv, view.lookahead)
            assert view.growth() == (want if view.lookahead == 1 else None)
            asked.append(want)
        return step(self, view)

    monkeypatch.setattr(continuous.Continuous, "step", spy)
    run()
    if case != "static":  # static batching is not this policy
        assert any(asked)  # some step grew the KV cache: a count that could differ


@pytest.mark.parametrize("case", ["static", "light", "pressure-recompute"])
def test_a_policy_sees_a_decodes_counts_where_they_stand_only_where_it_says_so(
        serve, case, monkeypatch):
    """Lockstep.bring: a decoding sequence's cached and generated tokens stand where they were
    last read. A policy that does not say it reads them only after View.fresh (static
    batching) gets every one up to date at each step; one that does (continuous batching:
    stale_decodes) gets them up to date from View.fresh, and the run's tables are the same
    whichever it reads (test_the_aggregate_gives_the_tables_of_a_pass_over_the_batch)."""
    from rdu_cluster.engine.schedulers import continuous, static

    policy = static.Static if case == "static" else continuous.Continuous
    stale, step = [], policy.step

    def spy(self, view):
        behind = [r for r in view.running if 0 <= r.synced_at != view.at]
        stale.append(len(behind))
        if behind:
            view.fresh()
            assert all(r.synced_at == view.at for r in view.running if r.synced_at >= 0)
        return step(self, view)

    monkeypatch.setattr(policy, "step", spy)
    serve(**CASES[case])
    assert stale
    assert (max(stale) == 0) == (case == "static")


@pytest.mark.parametrize("case", ["pressure-swap", "pressure-recompute"])
def test_continuous_batching_reads_a_decodes_counts_only_brought_up_to_date(
        serve, case, monkeypatch):
    """Continuous batching reads a decoding sequence's cached tokens to preempt (the blocks a
    victim frees, KVManager.blocks; the growth it takes out, continuous._growth): each such
    read within its step is of counts brought to the replica's decode step (View.fresh)."""
    from rdu_cluster.engine.kv import KVManager
    from rdu_cluster.engine.schedulers import continuous

    at: list[int] = []
    reads = []
    step, growth, blocks = continuous.Continuous.step, continuous._growth, KVManager.blocks

    def in_step(self, view):
        at.append(view.at)
        try:
            return step(self, view)
        finally:
            at.pop()

    def check(rs) -> None:
        if at:
            reads.append(len(rs))
            assert all(r.synced_at in (-1, at[-1]) for r in rs)

    monkeypatch.setattr(continuous.Continuous, "step", in_step)
    monkeypatch.setattr(continuous, "_growth",
                        lambda running, kv, la: check(running) or growth(running, kv, la))
    monkeypatch.setattr(KVManager, "blocks", lambda self, r: check([r]) or blocks(self, r))
    _, t = serve(**CASES[case])
    assert reads and t.summary["preemptions"] + t.summary["swaps"] > 0
