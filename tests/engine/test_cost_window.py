"""CostTables.window: a window of many spans is gathered a table at a time (`_grouped`); its
rows must be those of costing each span alone, column for column."""

from __future__ import annotations

import numpy as np

from chip.socket import CHUNK, DECODE, GROUPED, MIXED, PREFILL, CostTables, Spans
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
    setup = next(iter(sim._setups(sim.layouts[0], sim.plan.tp).values()))
    return CostTables(sim.cluster.chip, setup.program, setup.comm_time)


def test_a_grouped_window_has_the_rows_of_its_spans_costed_one_by_one():
    rng = np.random.default_rng(5)
    m = 3 * GROUPED
    kind = rng.choice([DECODE, DECODE, PREFILL, MIXED], m)
    steps = np.where(kind == DECODE, rng.integers(1, 40, m), 1)
    batch = np.where(kind == PREFILL, 0, rng.integers(1, 33, m))
    # context sums on both sides of chunk boundaries: some spans cross one
    ctx = np.where(kind == PREFILL, 0, rng.integers(1, 3, m) * CHUNK - rng.integers(0, 300, m))
    pre_seqs = np.where(kind == DECODE, 0, rng.integers(1, 3, m))
    pre_tokens = np.where(kind == DECODE, 0, rng.choice([128, 512], m))
    pre_prefix = np.where(kind == DECODE, 0, rng.choice([0, 64], m))
    spans = Spans(kind=kind, steps=steps, batch=batch, ctx_sum=ctx, pre_seqs=pre_seqs,
                  pre_tokens=pre_tokens, pre_prefix=pre_prefix)
    crossing = (ctx // CHUNK) != ((ctx + batch * (steps - 1)) // CHUNK)
    assert (crossing & (kind == DECODE)).any()
    grouped = _tables().window(spans)
    one = _tables()
    alone = np.concatenate([one.span(spans, i, int(steps[i]), None) for i in range(m)], axis=1)
    assert grouped.shape == alone.shape == (alone.shape[0], int(steps.sum()))
    assert np.array_equal(grouped, alone)


def test_a_decode_span_is_its_steps_read_one_by_one_from_the_chunk_tables():
    """decode_span slices each chunk's table; a step is column s % CHUNK of table s // CHUNK
    (s its context sum), including spans over several chunks and batches that skip one."""
    t = _tables()
    for b, s0, n in ((21, CHUNK - 50, 9), (7, 3 * CHUNK - 1, 2000), (5000, CHUNK - 3, 4),
                     (1, 0, 1), (32, 2 * CHUNK, 128)):
        sums = s0 + b * np.arange(n)
        one_by_one = np.stack([t._decode_chunk(b, int(s) // CHUNK)[:, int(s) % CHUNK]
                               for s in sums], axis=1)
        assert np.array_equal(t.decode_span(b, s0, n, None), one_by_one)


def test_step_times_are_the_time_row_of_span_rows():
    """What lookahead.Clock times a span with (a list, no numpy call) is the same floats."""
    t, rng = _tables(), np.random.default_rng(11)
    for _ in range(200):
        kind = int(rng.choice([DECODE, DECODE, PREFILL, MIXED]))
        b = 0 if kind == PREFILL else int(rng.integers(1, 33))
        n = int(rng.integers(1, 80)) if kind == DECODE else 1
        ctx = 0 if kind == PREFILL else int(rng.integers(1, 3) * CHUNK - rng.integers(0, 300))
        pre = (0, 0, 0) if kind == DECODE else (int(rng.integers(1, 3)), 512, 64)
        expected = t.span_rows(kind, b, ctx, n, pre)[0].tolist()
        assert t.step_times(kind, b, ctx, n, pre) == expected
        assert t.step_times(kind, b, ctx, n, pre) == expected  # from its memo as well
