"""CostTables.window: a window of many spans is gathered a table at a time (`_grouped`); its
rows must be those of costing each span alone, column for column."""

from __future__ import annotations

import numpy as np
import pytest

from chip.cost_tables import (
    CHUNK,
    DECODE,
    GROUPED,
    MIXED,
    PREFILL,
    PREFILL_CHUNK,
    CostTables,
    Spans,
)
from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.config import load_cluster
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from workloads import traces
from workloads.catalog import load_model


def _tables() -> CostTables:
    trace = traces.synthetic(1, 1.0, "poisson", traces.LengthDist("fixed", 16),
                             traces.LengthDist("fixed", 4))
    sim = Simulation(load_model("llama-3.1-8b"), load_cluster("sn40l-8"), trace, ServeConfig(),
                     LocalBackend())
    sim.run()  # lays the replicas out
    setup = next(iter(sim.build.setups(sim.layouts[0], sim.plan).values()))
    return CostTables(sim.cluster.chip, setup.program, setup.comm_time)


def _random_spans(rng, m: int, steps: int, batches: tuple[int, int], chunks: int,
                  back: int) -> Spans:
    """m spans of mixed kinds: decode spans of 1 to steps-1 steps, batches drawn from
    `batches`, mean contexts up to `back` / batch tokens short of 1 to chunks-1 table
    boundaries (whole-token contexts, multiples of CHUNK), context sums not multiples of the
    batch as well as multiples."""
    kind = rng.choice([DECODE, DECODE, PREFILL, MIXED], m)
    batch = np.where(kind == PREFILL, 0, rng.integers(*batches, m))
    return Spans(kind=kind, steps=np.where(kind == DECODE, rng.integers(1, steps, m), 1),
                 batch=batch,
                 ctx_sum=np.where(kind == PREFILL, 0, batch * rng.integers(1, chunks, m) * CHUNK
                                  - rng.integers(0, back, m) * rng.integers(0, 2, m)),
                 pre_seqs=np.where(kind == DECODE, 0, rng.integers(1, 3, m)),
                 pre_tokens=np.where(kind == DECODE, 0, rng.choice([128, 512], m)),
                 pre_prefix=np.where(kind == DECODE, 0, rng.choice([0, 64], m)))


def _filled(t: CostTables, b: int, s0: int, n: int) -> CostTables:
    """t with the tables of the span (b, s0, n) filled."""
    for j in range(s0 // b // CHUNK, (s0 // b + n) // CHUNK + 1):
        t._fill(b, j)
    return t


def _step(t: CostTables, b: int, s: int) -> np.ndarray:
    """A decode step from its tables' columns, one by one: between whole-token contexts c and
    c + 1 (c = s // b) at weight (s % b) / b."""
    c, r = divmod(s, b)
    at = lambda x: t._fill(b, x // CHUNK)[:, x % CHUNK]
    return at(c) if not r else at(c) + (at(c + 1) - at(c)) * (r / b)


def test_a_grouped_window_has_the_rows_of_its_spans_costed_one_by_one():
    m = 3 * GROUPED
    # mean contexts on both sides of table boundaries: some spans cross one
    spans = _random_spans(np.random.default_rng(5), m, steps=40, batches=(1, 33), chunks=3,
                          back=300)
    kind, steps, batch, ctx = spans.kind, spans.steps, spans.batch, spans.ctx_sum
    last = (ctx + batch * steps) // np.maximum(batch, 1)  # the last step's upper context
    crossing = (ctx // np.maximum(batch, 1) // CHUNK) != (last // CHUNK)
    assert (crossing & (kind == DECODE)).any()
    assert ((ctx % np.maximum(batch, 1) != 0) & (kind == DECODE)).any()
    for asked in (1, 2):  # as points (a window's tables asked for once), then from tables
        t = _tables()
        for _ in range(asked):
            grouped = t.window(spans)
        assert bool(t.decode) == (asked == 2)
        one = _tables()
        alone = np.concatenate([one.span(spans, i, int(steps[i]), None) for i in range(m)],
                               axis=1)
        assert grouped.shape == alone.shape == (alone.shape[0], int(steps.sum()))
        assert np.array_equal(grouped, alone)


def test_a_draining_window_costs_its_steps_as_points_and_fills_a_table_asked_for_again():
    """A run's last window drains its batch step by step: a step or two at each batch. A
    table asked for the first time is not filled: its steps are evaluated as points, one
    evaluation for the window, bit for bit its columns; asked for again, it is filled."""
    b = np.arange(200, 0, -1)  # one step at each batch, the context sum falling with it
    dense = 300  # and 300 steps at batch 8
    spans = Spans(kind=np.full(len(b) + 1, DECODE), steps=np.r_[np.ones(len(b), int), dense],
                  batch=np.r_[b, 8], ctx_sum=np.r_[b * 2100 + 7, 8 * CHUNK + 3],
                  pre_seqs=np.zeros(len(b) + 1, int), pre_tokens=np.zeros(len(b) + 1, int),
                  pre_prefix=np.zeros(len(b) + 1, int))
    assert len(b) >= GROUPED
    t = _tables()
    rows = t.window(spans)
    assert not t.decode and t.evaluations == 1
    one = _tables()
    alone = np.concatenate([one.span(spans, i, int(spans.steps[i]), None)
                            for i in range(len(b) + 1)], axis=1)
    assert np.array_equal(rows, alone)
    dense_only = Spans(*(np.asarray(getattr(spans, f))[-1:] for f in (
        "kind", "steps", "batch", "ctx_sum", "pre_seqs", "pre_tokens", "pre_prefix")))
    again = t.window(dense_only)
    assert list(t.decode) == [(8, 1)] and np.array_equal(again, rows[:, -dense:])


def test_a_table_beside_a_held_batchs_is_filled_on_its_first_ask():
    """A batch that stays near a level visits its neighbours: a table asked for the first
    time is filled where a batch within 4 holds its table of the same contexts; further off,
    or at other contexts, its steps are points; the same rows either way."""
    t = _tables()
    t._fill(100, 0)
    spans = [(104, 104 * 50 + 1, 3), (109, 109 * 50 + 1, 3), (96, 96 * (CHUNK + 50), 3)]
    rows = [t.decode_span(b, s0, n, None) for b, s0, n in spans]
    assert sorted(t.decode) == [(100, 0), (104, 0)]
    fresh = _tables()
    assert all(np.array_equal(r, fresh.decode_span(*sp, None)) for r, sp in zip(rows, spans))


def test_a_decode_span_is_its_steps_blended_one_by_one_from_the_tables():
    """decode_span slices a table of whole-token contexts and blends each step's two
    neighbours at the span's one weight, including spans over several tables, context sums
    that are multiples of the batch (no blend), and batches past a table's width."""
    for b, s0, n in ((21, 21 * CHUNK - 50, 9), (7, 7 * (3 * CHUNK - 1) + 3, 2000),
                     (5000, 5000 * (CHUNK - 3) + 17, 4), (1, 0, 1), (32, 64 * CHUNK, 128)):
        t = _filled(_tables(), b, s0, n)
        one_by_one = np.stack([_step(t, b, s0 + b * k) for k in range(n)], axis=1)
        assert np.array_equal(t.decode_span(b, s0, n, None), one_by_one)
        assert np.array_equal(_tables().decode_span(b, s0, n, None), one_by_one)  # as points


@pytest.mark.parametrize("model, cluster", [
    ("llama-3.1-8b", "sn40l-8"), ("llama-3.1-70b", "sn40l-16"), ("llama-3.1-70b", "dgx-h100"),
    ("gpt-oss-120b", "sn40l-16"), ("nemotron-h-56b", "sn40l-16")])
def test_a_blended_step_is_the_step_at_its_fractional_mean_context(model, cluster):
    """The blend between whole-token contexts is exact for every term linear in context (as
    the mean context itself is): a step is the step evaluated at its fractional mean context
    S / b to rounding (1e-12) in most steps, and within 0.1% where a kink of the model (the
    larger of two bounds, a tile's quantization) lies between the two whole-token contexts
    (at most 1.4e-4 measured: Llama 3.1 70B on sn40l-16; 3,000 random steps each)."""
    t = _program_tables(model, cluster)
    rng = np.random.default_rng(1)
    b = rng.integers(1, 400, 3000)
    s = b * rng.integers(1, 12000, 3000) + rng.integers(0, 400, 3000) % b
    rel = np.abs(t._steps(b, s)[0] / t._decode_rows(b.astype(float), s / b, len(b))[0] - 1)
    assert np.median(rel) < 1e-12 and rel.max() < 1e-3


@pytest.mark.parametrize("model, cluster, extra", [
    ("llama-3.1-8b", "sn40l-8", None), ("llama-3.1-70b", "dgx-h100", None),
    ("gpt-oss-120b", "sn40l-16", None), ("llama-3.1-8b", "dgx-h100", "spec")])
def test_steps_evaluated_as_points_are_their_table_columns(model, cluster, extra):
    """A window's steps whose tables are asked for the first time are evaluated together as
    points (batches and contexts side by side), a mixed step's decode part with them: each is
    its tables' blend, bit for bit (RDU dataflow and GPU kernel by kernel, dense and MoE,
    speculative), and no table is kept for them."""
    spec = {"draft": load_model("llama-3.2-1b"), "spec_k": 3} if extra == "spec" else {}
    m = 12  # fewer spans than GROUPED: costed span by span
    spans = _random_spans(np.random.default_rng(7), m, steps=6, batches=(200, 3000),
                          chunks=4, back=900)
    kind, steps, batch, ctx = spans.kind, spans.steps, spans.batch, spans.ctx_sum
    pre_seqs, pre_tokens, pre_prefix = spans.pre_seqs, spans.pre_tokens, spans.pre_prefix
    assert m < GROUPED and {DECODE, PREFILL, MIXED} <= set(kind.tolist())
    t = _program_tables(model, cluster, **spec)
    rows = t.window(spans)
    assert not t.decode
    tables = _program_tables(model, cluster, **spec)
    cols = []
    for i in range(m):
        pre = None if kind[i] == DECODE else tables.prefill_step(
            int(pre_seqs[i]), int(pre_tokens[i]), int(pre_prefix[i]), None)
        for k in range(int(steps[i])):
            if kind[i] == PREFILL:
                cols.append(pre)
                continue
            col = _step(tables, int(batch[i]), int(ctx[i]) + int(batch[i]) * k)[:, None]
            cols.append(pre + col if kind[i] == MIXED else col)
    assert np.array_equal(rows, np.concatenate(cols, axis=1))
    for i in np.flatnonzero(kind == DECODE).tolist():  # a span alone, as the same points
        alone = t.decode_span(int(batch[i]), int(ctx[i]), int(steps[i]), None)
        start = int(steps[:i].sum())
        assert np.array_equal(alone, rows[:, start : start + int(steps[i])])


def test_step_times_are_the_time_row_of_span_rows():
    """What lookahead.Clock times a span with (a list, no numpy call where a table is held)
    is the same floats, at any batch, asked once (points) or again (a table)."""
    t, rng = _tables(), np.random.default_rng(11)
    for _ in range(300):
        kind = int(rng.choice([DECODE, DECODE, PREFILL, MIXED]))
        b = 0 if kind == PREFILL else int(rng.choice([rng.integers(1, 33),
                                                      rng.integers(33, 600)]))
        n = int(rng.integers(1, 80)) if kind == DECODE else 1
        ctx = 0 if kind == PREFILL else int(b * rng.integers(1, 3) * CHUNK
                                            - rng.integers(0, 300))
        pre = (0, 0, 0) if kind == DECODE else (int(rng.integers(1, 3)), 512, 64)
        expected = t.span_rows(kind, b, ctx, n, pre)[0].tolist()
        assert t.step_times(kind, b, ctx, n, pre) == expected
        assert t.step_times(kind, b, ctx, n, pre) == expected  # from its memo as well
    assert t.times and t.decode


def test_a_span_timed_as_points_is_costed_from_them():
    """A span the clock times from tables asked for the first time (step_times: its steps as
    points, kept) is costed by the window from the points kept (CostTables.points): no
    evaluation more, no table filled for the second look, the same rows as tables that never
    saw the span."""
    t, fresh = _tables(), _tables()
    b, n = 264, 6
    s0 = b * (3 * CHUNK - 500) + 5
    spans = Spans(kind=np.array([DECODE]), steps=np.array([n]), batch=np.array([b]),
                  ctx_sum=np.array([s0]), pre_seqs=np.zeros(1, np.int64),
                  pre_tokens=np.zeros(1, np.int64), pre_prefix=np.zeros(1, np.int64))
    times = t.step_times(DECODE, b, s0, n, (0, 0, 0))
    before = t.evaluations
    rows = t.window(spans)
    assert t.evaluations == before and not t.decode
    assert np.array_equal(rows, fresh.window(spans)) and rows[0].tolist() == times


def test_points_kept_and_new_in_one_call_survive_the_new_ones_eviction(monkeypatch):
    """A call whose kept points are the oldest, with new points that evict them as they are
    kept: each column is still its point's (a KeyError, 'internal error', before)."""
    from chip import cost_tables

    monkeypatch.setattr(cost_tables, "POINTS", 4)
    t = _tables()
    b = np.full(4, 40)
    old = t._decode_points(b, 40 * np.arange(100, 104))
    fresh = np.arange(200, 204)
    got = t._decode_points(np.full(6, 40), 40 * np.r_[100, 101, fresh])
    alone = _tables()._evaluate_points(np.full(6, 40), 40 * np.r_[100, 101, fresh])
    assert np.array_equal(got, alone) and np.array_equal(got[:, :2], old[:, :2])
    assert len(t.points) == 4


def _program_tables(model: str, cluster: str, **replace) -> CostTables:
    """CostTables of the first program of `model`'s default plan on `cluster`."""
    import dataclasses

    from rdu_cluster.engine import plan as plans

    c, m = load_cluster(cluster), load_model(model)
    program = next(iter(plans.layouts(m, c, plans.PlanSpec.parse(None, c, m))[0].programs
                        .values()))
    return CostTables(c.chip, dataclasses.replace(program, **replace), lambda coll: 3e-6)


def _one_shape(t: CostTables, k: int, tokens: int, prefix: int) -> np.ndarray:
    """A prefill step costed alone, from scalars: the target, the draft's prefill and the
    router's pass (what the chunk tables must hold, column for column)."""
    from workloads.ops import Shard, StepShape

    p = t.program
    shape = StepShape("prefill", float(k), tokens / k, prefix / k)
    rows = t._rows(p.graph(shape), 1)
    extra = np.zeros_like(rows)
    if p.draft is not None:
        extra += t._rows(p.draft_graph(shape), 1)
    if p.router is not None:
        from workloads import graph as graphs

        tp = Shard.tensor(p.shard.attn_tp)
        pre = graphs.step_graph(p.router, StepShape("prefill", float(k), tokens / k, 0.0), tp)
        label = graphs.step_graph(p.router, StepShape.decode(float(k), (tokens + prefix) / k),
                                  tp)
        extra += t._rows(pre, 1) + t._rows(label, 1)
    return rows + extra


@pytest.mark.parametrize("model, cluster, extra", [
    ("llama-3.1-8b", "sn40l-8", None), ("llama-3.1-70b", "dgx-h100", None),
    ("gpt-oss-120b", "sn40l-16", None), ("nemotron-h-56b", "sn40l-16", None),
    ("llama-3.1-8b", "sn40l-8", "draft"), ("llama-2-7b", "sn40l-8", "router")])
def test_a_prefill_step_is_its_column_of_a_chunk_table_bit_for_bit(model, cluster, extra):
    """A prefill table holds PREFILL_CHUNK token counts, evaluated at once (numpy over the
    counts); each column is the step costed alone, bit for bit (dense and MoE on RDU, dense on
    GPU, a hybrid, with a draft, with a CoE router), on both sides of chunk boundaries."""
    if extra == "draft":
        t = _program_tables(model, cluster, draft=load_model("llama-3.2-1b"))
    elif extra == "router":
        from rdu_cluster.scenarios.coe import CoEScenario

        t = _program_tables(model, cluster, router=CoEScenario.copies(4, hbm_slots=1).router)
    else:
        t = _program_tables(model, cluster)
    rng = np.random.default_rng(3)
    shapes = [(1, PREFILL_CHUNK - 1, 0), (1, PREFILL_CHUNK, 0), (3, 2 * PREFILL_CHUNK + 1, 64),
              (1, 1, 0)]
    shapes += [(int(k), int(rng.integers(k, 9000)), int(rng.choice([0, 16 * rng.integers(1, 200)])))
               for k in rng.integers(1, 9, 6)]
    for k, tokens, prefix in shapes:
        assert np.array_equal(t.prefill_step(k, tokens, prefix, None),
                              _one_shape(t, k, tokens, prefix)), (k, tokens, prefix)


def test_prefill_lengths_within_a_chunk_cost_one_evaluation_and_old_tables_go_first(
        monkeypatch):
    """A trace of varied prompt lengths pays one evaluation a chunk, not one a length; the
    tables are capped (PREFILL_TABLES, DECODE_TABLES, TIME_ROWS: oldest first) and an evicted
    one is rebuilt the same."""
    from chip import cost_tables

    t = _program_tables("llama-3.1-8b", "sn40l-8")
    first = {n: t.prefill_step(1, n, 0, None).copy() for n in range(PREFILL_CHUNK, 2 * PREFILL_CHUNK)}
    assert t.evaluations == 1
    monkeypatch.setattr(cost_tables, "PREFILL_TABLES", 3)
    for j in range(2, 6):
        t.prefill_step(1, j * PREFILL_CHUNK, 0, None)
    assert len(t.prefill) == 3 and (1, 0, 1) not in t.prefill
    assert all(np.array_equal(t.prefill_step(1, n, 0, None), v) for n, v in first.items())
    assert t.evaluations == 6
    with pytest.raises(ValueError, match="at least one token"):
        t.prefill_step(1, 0, 0, None)
    monkeypatch.setattr(cost_tables, "DECODE_TABLES", 2)  # the decode tables and time rows too
    monkeypatch.setattr(cost_tables, "TIME_ROWS", 2)
    kept = {b: _filled(t, b, 100 * b, 5).decode_span(b, 100 * b, 5, None).copy()
            for b in (1, 2, 3)}
    assert sorted(t.decode) == [(2, 0), (3, 0)]
    assert all(np.array_equal(t.decode_span(b, 100 * b, 5, None), v) for b, v in kept.items())
    for b in (1, 2, 3):
        assert t.step_times(DECODE, b, 100 * b, 5, (0, 0, 0)) == kept[b][0].tolist()
    assert len(t.times) == 2


def test_a_window_fills_its_missing_prefill_tables_at_once_with_the_same_values():
    """fill_prefill (what window() and the engine's clock call first) evaluates the missing
    tables of many shapes together, one evaluation a sequence count, over arbitrary cached
    prefixes (chunked prefill's): each column is still the step costed alone, bit for bit."""
    t = _program_tables("gpt-oss-120b", "sn40l-16")
    rng = np.random.default_rng(9)
    shapes = [(int(k), int(rng.integers(k, 9000)), int(rng.integers(0, 5000)))
              for k in rng.choice([1, 3], 40)]
    t.fill_prefill(shapes)
    assert t.evaluations == 2  # one a sequence count
    assert len(t.prefill) == len({(k, x, n // PREFILL_CHUNK) for k, n, x in shapes})
    alone = _program_tables("gpt-oss-120b", "sn40l-16")
    for k, tokens, prefix in shapes:
        assert np.array_equal(t.prefill_step(k, tokens, prefix, None),
                              _one_shape(alone, k, tokens, prefix)), (k, tokens, prefix)
    assert t.evaluations == 2  # every lookup found its table
