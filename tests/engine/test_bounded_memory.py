"""A run's memory follows its requests in flight: the ITLs and chunk times the summary takes
exact statistics of go to a temporary file past a bound (engine/spill.py), the steps' summary
columns are reduced to totals a block at a time, and a replica's step times are dropped once no
request yet to be recorded reads them. None of it changes the tables or the summary."""

from __future__ import annotations

import math
import os
import tempfile

import pytest

from rdu_cluster.engine import metrics, spill

KW = {"cluster": "sn40l-16", "plan": "tp4", "n": 60, "rate": 40.0, "seed": 3}


def _close(a, b) -> bool:
    """Equal, floats to 1e-12 relative (NaN as NaN), through dicts and lists."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(map(_close, a, b))
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12, abs=1e-15)
    return a == b


def test_a_spilled_run_has_the_summary_of_one_in_memory(serve, monkeypatch, tmp_path):
    _, whole = serve(**KW)
    monkeypatch.setattr(spill, "SPILL_VALUES", 5)
    monkeypatch.setattr(metrics, "TOTALS_ROWS", 3)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    sim, tiny = serve(**KW)
    streamed, tiny_streamed = serve(**KW, sink=lambda name, tbl: None, chunk_rows=7)
    for s in (sim, streamed):
        assert s.finished.itl_s.on_disk > 0 and s.finished.chunk_s.on_disk > 0
        assert s.finished.itl_s.file is None and s.finished.chunk_s.file is None  # closed
    assert os.listdir(tmp_path) == []
    assert tiny_streamed.summary == tiny.summary  # the same blocks and chunks either way
    assert tiny.requests.equals(whole.requests) and tiny.steps.equals(whole.steps)
    assert _close(tiny.summary, whole.summary)
    bench, tiny_bench = whole.summary["bench"], tiny.summary["bench"]
    for key, value in bench.items():  # order statistics are selected exactly
        if key.startswith(("p", "median_", "max_")):
            assert tiny_bench[key] == value, key


def test_a_failed_run_closes_its_spill_files(serve, monkeypatch):
    monkeypatch.setattr(spill, "SPILL_VALUES", 5)
    seen = []

    def fail(sim, _windows):
        seen.append(sim)
        if sim.finished.itl_s.file is not None:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        serve(**KW, hooks=[fail])
    assert seen[-1].finished.itl_s.file is None and seen[-1].finished.itl_s.closed


def test_a_light_run_holds_the_step_times_of_its_requests_in_flight(serve):
    held = []

    def watch(sim, _windows):
        held.append(max(g.n for g in sim.rec.ends.values()) if sim.rec.ends else 0)

    from workloads import traces
    _, t = serve(cluster="sn40l-16", plan="tp4", n=400, rate=20.0, seed=5, hooks=[watch],
                 output=traces.LengthDist("uniform", 4, 40))
    per_replica = t.steps.num_rows / 4
    assert max(held) < per_replica / 4
