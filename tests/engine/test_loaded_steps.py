"""chip/loaded_steps.py: decode steps under drawn expert loads kept by (batch, context) at every
load drawn at the batch; a window is the points evaluated alone, bit for bit, and a window
whose entries hold its loads costs no evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from chip import loaded_steps
from chip.cost_tables import DECODE, CostTables, Spans
from rdu_cluster.backends import local
from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.config import load_cluster
from rdu_cluster.engine.expert_loads import ExpertLoadSampler
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from workloads import group_loads, traces
from workloads.catalog import load_model


@pytest.fixture(scope="module")
def moe() -> tuple:
    """An expert-parallel socket's chip and program setup (Mixtral 8x7B, tp2ep8 on
    sn40l-16)."""
    trace = traces.synthetic(1, 1.0, "poisson", traces.LengthDist("fixed", 16),
                             traces.LengthDist("fixed", 4))
    sim = Simulation(load_model("mixtral-8x7b"), load_cluster("sn40l-16"), trace,
                     ServeConfig(plan="tp2ep8"), LocalBackend())
    sim.run()  # lays the replicas out
    setup = next(iter(sim.build.setups(sim.layouts[0], sim.plan).values()))
    return sim.cluster.chip, setup


def _fresh(moe: tuple) -> CostTables:
    chip, setup = moe
    return CostTables(chip, setup.program, setup.comm_time)


def _decode(batch: list[int], steps: list[int], ctx_sum: list[int]) -> Spans:
    m = len(batch)
    return Spans(kind=np.full(m, DECODE), steps=np.array(steps), batch=np.array(batch),
                 ctx_sum=np.array(ctx_sum), pre_seqs=np.zeros(m, dtype=int),
                 pre_tokens=np.zeros(m, dtype=int), pre_prefix=np.zeros(m, dtype=int))


def _alone(t: CostTables, b: int, s0: int, n: int, load: np.ndarray) -> np.ndarray:
    """(rows, n) of a span's steps, each point evaluated on its own and blended as
    CostTables blends (lo + (hi - lo) w)."""
    c0, r = divmod(s0, b)
    point = lambda c, ld: t._decode_rows(float(b), np.array([float(c)]), 1, np.array([ld]))
    lo = np.concatenate([point(c0 + k, load[k]) for k in range(n)], axis=1)
    if not r:
        return lo
    hi = np.concatenate([point(c0 + k + 1, load[k]) for k in range(n)], axis=1)
    return lo + (hi - lo) * (r / b)


def _drawn(sampler: ExpertLoadSampler, batch: int, first: int, steps: int) -> list[np.ndarray]:
    """Each group's loads over the steps (as the engine's WindowExecutor._loads gives them)."""
    loads = sampler.loads(0, first, batch, steps)
    return [np.ascontiguousarray(loads[:, g]) for g in range(loads.shape[1])]


def test_a_windows_drawn_steps_are_each_point_evaluated_alone(moe):
    """Three windows of a pool whose batch moves by one (a hand-over in, a request out): the
    steps under each group's drawn load are the points costed alone, bit for bit, whether an
    entry was filled by this window or an earlier one."""
    t = _fresh(moe)
    sampler = ExpertLoadSampler(8, 2, 8, seed=3)
    for first, (batch, steps, s0) in enumerate([([40, 41], [3, 2], [40 * 900 + 7, 41 * 903]),
                                                ([41], [4], [41 * 905 + 40]),
                                                ([40, 41, 40], [1, 2, 2], [40 * 909, 41 * 910 + 1,
                                                                           40 * 912 + 39])]):
        spans = _decode(batch, steps, s0)
        loads = [np.concatenate(parts) for parts in zip(*[
            _drawn(sampler, b, 10 * first + i, n) for i, (b, n) in enumerate(zip(batch, steps))])]
        got = t.windows(spans, loads)
        for g, rows in enumerate(got):
            at = np.cumsum([0, *steps])
            want = np.concatenate([_alone(_fresh(moe), b, s, n, loads[g][at[i] : at[i + 1]])
                                   for i, (b, n, s) in enumerate(zip(batch, steps, s0))], axis=1)
            assert np.array_equal(rows, want)


def test_a_window_whose_entries_hold_its_loads_costs_no_evaluation(moe):
    """An entry is filled at every load its batch's group counts can give (the support:
    Mixtral's top-2 of 16 tokens over 8 groups, counts 0-16 over a mean of 4) and every load
    drawn at its batch so far: a later window at those contexts under loads drawn before, or
    under others of the support, is a lookup; a load off the support (not a count over the
    mean) is one evaluation, after which the entries it filled hold it too."""
    t = _fresh(moe)
    ones, other = np.array([1.25, 0.75, 1.0, 1.0]), np.array([0.5, 1.5, 1.25, 0.75])
    t.windows(_decode([16], [4], [16 * 300]), [ones, other])
    support = group_loads.support(16, 2, 8)
    assert support.tolist() == [c / 4 for c in range(17)]
    before = t.evaluations
    again = t.windows(_decode([16], [2], [16 * 301]), [other[2:], np.array([3.5, 0.25])])
    assert t.evaluations == before
    assert np.array_equal(again[1], _alone(_fresh(moe), 16, 16 * 301, 2, np.array([3.5, 0.25])))
    t.windows(_decode([16], [1], [16 * 302]), [np.array([1.1])])
    assert t.evaluations == before + 1
    have, rows = t.loaded.entries[(16, 302)]
    assert have.tolist() == sorted([*support.tolist(), 1.1]) and rows.shape[1] == 18


def test_a_groups_drawn_loads_are_each_in_its_support():
    """The sampler's loads (DeepSeek-V3's top-8 of 256 experts over 32 groups, batch 500)
    are, to the bit, among the loads the support gives (a count over the mean within six
    standard deviations: 135 values), whatever the step."""
    sampler = ExpertLoadSampler(256, 8, 32, seed=1)
    drawn = sampler.loads(0, 0, 500, 300)
    support = group_loads.support(500, 8, 32)
    assert np.isin(drawn, support).all() and len(support) == 135
    assert np.array_equal(support, np.arange(58, 193) / 125.0)


def test_loads_of_many_values_fill_only_what_a_window_asks(moe, monkeypatch):
    """Past LOADS_A_BATCH loads at a batch (not a count over a mean: uniform draws) an entry
    holds only the loads asked of it, and evicted entries (ENTRIES) are evaluated again with
    the same rows."""
    monkeypatch.setattr(loaded_steps, "LOADS_A_BATCH", 8)
    monkeypatch.setattr(loaded_steps, "ENTRIES", 3)
    t = _fresh(moe)
    rng = np.random.default_rng(1)
    loads = [rng.uniform(0.5, 2.0, 6) for _ in range(3)]
    spans = _decode([24], [6], [24 * 500 + 5])
    first = t.windows(spans, loads)
    assert t.loaded.seen[24] is None and len(t.loaded.entries) == 3
    assert all(len(have) <= 6 for have, _ in t.loaded.entries.values())
    again = t.windows(spans, loads)
    for a, b, ld in zip(first, again, loads):
        assert np.array_equal(a, b)
        assert np.array_equal(a, _alone(_fresh(moe), 24, 24 * 500 + 5, 6, ld))


def test_a_prefill_or_mixed_step_under_drawn_loads_is_each_socket_costed_alone(moe):
    """CostTables.windows: a prefill step's and a mixed step's prefill part under each group's
    drawn load are the points of one evaluation, each the step costed alone at its socket's
    load (a scalar load, the draft's and router's rows added), a socket at the mean load its
    table's column; a mixed step adds its decode part, as span_rows adds them."""
    from chip.cost_tables import MIXED, PREFILL
    from workloads.ops import StepShape

    t = _fresh(moe)
    spans = Spans(kind=np.array([PREFILL, DECODE, MIXED]), steps=np.array([1, 2, 1]),
                  batch=np.array([0, 12, 12]), ctx_sum=np.array([0, 12 * 700 + 5, 12 * 702]),
                  pre_seqs=np.array([3, 0, 1]), pre_tokens=np.array([1500, 0, 300]),
                  pre_prefix=np.array([200, 0, 64]))
    loads = [np.array([1.25, 0.5, 1.5, 0.75]), np.array([1.0, 1.0, 1.0, 1.0]),
             np.array([0.75, 1.5, 0.5, 1.25])]
    got = t.windows(spans, loads)
    ref = _fresh(moe)

    def prefill(k: int, tokens: int, prefix: int, load: float) -> np.ndarray:
        if load == 1.0:
            return ref._prefill_column(ref.prefill, ref._prefill_rows, k, tokens, prefix)
        shape = StepShape("prefill", float(k), tokens / k, prefix / k)
        return (ref._rows(ref.program.graph(shape, load), 1)
                + ref._prefill_column(ref.extra, ref._extra_rows, k, tokens, prefix))

    for rows, ld in zip(got, loads):
        want = [prefill(3, 1500, 200, ld[0]),
                _alone(ref, 12, 12 * 700 + 5, 2, ld[1:3]) if np.any(ld[1:3] != 1.0)
                else ref.decode_span(12, 12 * 700 + 5, 2, None),
                prefill(1, 300, 64, ld[3]) + _alone(ref, 12, 12 * 702, 1, ld[3:])]
        assert np.array_equal(rows, np.concatenate(want, axis=1))


def _prefill_span(kind: int, batch: int, tokens: int) -> Spans:
    """One prefill (batch 0) or mixed step: 2 sequences of `tokens` new tokens over 32 cached,
    beside `batch` decodes at context 700."""
    return Spans(kind=np.array([kind]), steps=np.array([1]), batch=np.array([batch]),
                 ctx_sum=np.array([batch * 700]), pre_seqs=np.array([2]),
                 pre_tokens=np.array([tokens]), pre_prefix=np.array([32]))


@pytest.mark.parametrize("decodes", [0, 12])
def test_a_prefill_shape_asked_again_is_filled_over_its_support_and_then_looked_up(moe,
                                                                                  decodes):
    """LoadedPrefills: a prefill step's shape asked the first time evaluates only its sockets'
    drawn loads; asked again at a load it lacks, every load its step's routing can give (the
    support of the step's routed tokens: a mixed step's decodes' and its prompt tokens', 64
    of Mixtral's top-2 over 8 groups), after which a step of that shape under any drawn
    loads costs no evaluation. Every step is each socket's load costed alone, bit for bit."""
    from chip.cost_tables import MIXED, PREFILL
    from workloads.ops import StepShape

    t, ref = _fresh(moe), _fresh(moe)
    spans = _prefill_span(MIXED if decodes else PREFILL, decodes, 64 - decodes)
    sampler = ExpertLoadSampler(8, 2, 8, seed=16)  # a seed that draws no mean load (1.0: the
    draws = [sampler.loads(0, step, 64, 1)[0] for step in range(8)]  # table's column)
    assert not any(1.0 in d for d in draws)
    support = group_loads.support(64, 2, 8)
    shape = StepShape("prefill", 2.0, (64 - decodes) / 2, 16.0)
    evaluations = []
    for i, drawn in enumerate(draws):
        before = t.evaluations
        got = t.windows(spans, [np.array([x]) for x in drawn])
        evaluations.append(t.evaluations - before)
        have = t.loaded_prefills.entries[(2, 64 - decodes, 32)][0]
        assert have.tolist() == (sorted(set(drawn.tolist())) if i == 0 else
                                 sorted({*support.tolist(), *draws[0].tolist()}))
        for rows, x in zip(got, drawn):
            want = ref._rows(ref.program.graph(shape, x), 1)
            if decodes:
                want = want + _alone(ref, decodes, decodes * 700, 1, np.array([x]))
            assert np.array_equal(rows, want)
    if not decodes:  # (a mixed step's decode part is LoadedSteps', evaluated apart)
        assert evaluations[:2] == [1, 1] and not any(evaluations[2:])
        # the process's bound on its cost tables' memory counts these (backends/local.py)
        total, held = local._nbytes(t), t.loaded_prefills.entries.copy()
        t.loaded_prefills.entries.clear()
        assert total - local._nbytes(t) == sum(a.nbytes + r.nbytes for a, r in held.values())


def test_prefill_loads_off_the_support_are_evaluated_alone_and_shapes_evicted(moe,
                                                                             monkeypatch):
    """Loads that are no count over a mean (uniform draws) fill only what is asked, a shape
    asked again included; evicted shapes (PREFILL_SHAPES) are evaluated again, the same."""
    from chip.cost_tables import PREFILL

    monkeypatch.setattr(loaded_steps, "PREFILL_SHAPES", 2)
    t = _fresh(moe)
    rng = np.random.default_rng(2)
    loads = [rng.uniform(0.5, 2.0, 1) for _ in range(4)]
    first = [t.windows(_prefill_span(PREFILL, 0, n), loads) for n in (64, 96, 128)]
    assert len(t.loaded_prefills.entries) == 2 and (2, 64, 32) not in t.loaded_prefills.entries
    again = [t.windows(_prefill_span(PREFILL, 0, n), loads) for n in (64, 96, 128)]
    assert all(len(have) == 4 for have, _ in t.loaded_prefills.entries.values())
    for a, b in zip(first, again):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
