"""Light load: a window holds an arrival's one-step prefill and, tentatively, the decodes after
it (Replica.plan_window's lookahead). Kept or dropped, the tables are what one window per plan
gives: the same requests and links, the same steps (only their window numbers and the order
in which replicas' windows were recorded differ), the same socket time in fewer rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rdu_cluster.engine.simulation import Simulation
from workloads import traces


class Spy:
    """Counts the windows whose tentative span was kept, and those where it was dropped (the
    command had one op list more than the spans left)."""

    def __init__(self) -> None:
        self.kept = self.dropped = 0

    def window(self, sim, rep, window, res, step, t0, m) -> None:
        self.dropped += len(window.ops) > len(window.spans) + 1
        self.kept += len(window.spans) == 2 and window.spans[0].applied


def _by_step(tbl):
    return tbl.drop_columns(["window"]).sort_by([("replica", "ascending"),
                                                 ("step", "ascending")])


def test_tentative_spans_give_the_tables_of_one_window_per_plan(serve, monkeypatch):
    spy = Spy()

    def watch(sim, _windows):  # a hook runs after each window: from then on the spy watches
        if spy not in sim.observers:
            sim.observers.append(spy)

    kw = {"cluster": "sn40l-16", "plan": "tp4", "n": 120, "rate": 60.0, "seed": 7,
          "prompt": traces.LengthDist("uniform", 256, 4096),
          "output": traces.LengthDist("uniform", 8, 200), "hooks": [watch]}
    sim, ahead = serve(**kw)
    assert sim.lookahead and spy.kept > 10 and spy.dropped > 0
    monkeypatch.setattr(Simulation, "_can_look_ahead", lambda self: False)
    sim_one, one = serve(**kw)
    assert sim_one.windows > sim.windows
    assert ahead.requests.equals(one.requests) and ahead.links.equals(one.links)
    assert _by_step(ahead.steps).equals(_by_step(one.steps))
    assert ahead.sockets.num_rows < one.sockets.num_rows
    for col in ("busy_s", "sent_bytes"):
        assert np.isclose(pc.sum(ahead.sockets[col]).as_py(), pc.sum(one.sockets[col]).as_py(),
                          rtol=1e-12)


def test_no_lookahead_where_a_span_draws_random_numbers(serve):
    sim, _ = serve(model="mixtral-8x7b", plan="tp2ep8", n=6, rate=50.0)
    assert sim.sampler is not None and not sim.lookahead


def _streamed(serve, chunk_rows: int, **kw):
    chunks: dict[str, list] = {}
    _sim, tables = serve(**kw, sink=lambda name, tbl: chunks.setdefault(name, []).append(tbl),
                         chunk_rows=chunk_rows)
    return tables, {name: pa.concat_tables(parts) for name, parts in chunks.items()}, chunks


def test_streamed_rows_are_the_tables_whatever_the_chunk(serve):
    """Steps and sockets rows handed on in chunks as they are recorded make the same tables
    (rows, order, schema and metadata) as a run that keeps them, and the same summary."""
    kw = {"cluster": "sn40l-16", "plan": "tp4", "n": 60, "rate": 40.0, "seed": 3}
    _, whole = serve(**kw)
    small, small_tables, parts = _streamed(serve, 7, **kw)
    big, big_tables, big_parts = _streamed(serve, 10**9, **kw)
    assert len(parts["steps"]) > 10 and len(parts["sockets"]) > 10
    assert len(big_parts["steps"]) == len(big_parts["sockets"]) == 1
    for name in ("steps", "sockets"):
        assert small_tables[name].equals(whole.__dict__[name], check_metadata=True)
        assert big_tables[name].equals(whole.__dict__[name], check_metadata=True)
        assert getattr(small, name) is None
    assert small.requests.equals(whole.requests) and small.links.equals(whole.links)
    assert small.summary == big.summary == whole.summary
