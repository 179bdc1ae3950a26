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
