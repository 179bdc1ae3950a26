"""The ledger (chip/breakdown.py): a time that is 0 at every point books nothing, and the
sums come out as booking its zeros would give them, entry for entry, in the same order."""

from __future__ import annotations

import numpy as np

from chip.breakdown import NONE, Ledger, fractions


def _plain(steps: list[tuple[str, str, object]]) -> Ledger:
    """The ledger as adding every term, zeros as zero arrays, gives it."""
    out = Ledger()
    for cause, cls, t in steps:
        t = np.asarray(t, dtype=float)
        out.by_cause[cause] = out.by_cause.get(cause, 0.0) + t
        out.by_class[cls] = out.by_class.get(cls, 0.0) + t
    return out


def test_zeros_book_nothing_and_every_sum_and_order_is_the_plain_one():
    rng = np.random.default_rng(0)
    v = lambda: rng.uniform(0, 1e-3, 64)
    steps = [("compute", "matmul", 0.0), ("kv_streaming", "attention", v()),
             ("compute", "attention", np.zeros(64)), ("prefetch_stall", "matmul", 0.0),
             ("compute", "matmul", v()), ("launch", "overhead", 2e-6),
             ("prefetch_stall", "attention", -0.0), ("kv_streaming", "matmul", v())]
    got = Ledger()
    for cause, cls, t in steps:
        got.add(cause, cls, t)
    want = _plain(steps)
    for mine, theirs in ((got.by_cause, want.by_cause), (got.by_class, want.by_class)):
        assert list(mine) == list(theirs)
        assert all(np.array_equal(np.broadcast_to(mine[k], (64,)),
                                  np.broadcast_to(theirs[k], (64,))) for k in mine)
    assert np.array_equal(got.total(), want.total())
    twice = Ledger()  # merged twice over: each entry twice its own, in order
    twice.merge(got, 2.0)
    assert list(twice.by_cause) == list(got.by_cause)
    assert all(np.array_equal(np.broadcast_to(twice.by_cause[k], (64,)),
                              np.broadcast_to(2.0 * np.asarray(got.by_cause[k]), (64,)))
               for k in got.by_cause)


def test_a_cause_with_no_weight_has_no_share_and_the_first_takes_all_where_none_has():
    w = np.array([0.0, 1.0, 3.0])
    got = fractions({"weight_streaming": w, "compute": 0.0, "kv_streaming": 2 * w})
    assert got["compute"] is NONE
    assert np.array_equal(got["weight_streaming"], np.array([1.0, 1 / 3, 1 / 3]))
    assert np.array_equal(got["kv_streaming"], np.array([0.0, 2 / 3, 2 / 3]))
    first = fractions({"weight_streaming": 0.0, "compute": 0.0})
    assert first["weight_streaming"] == 1.0 and first["compute"] is NONE


def test_add_each_is_add_for_each_class_in_turn():
    rng = np.random.default_rng(1)
    for seconds in (rng.uniform(0, 1e-6, 32), 3e-7, 0.0):
        a, b, before = Ledger(), Ledger(), rng.uniform(0, 1e-6, 32)
        for ledger in (a, b):
            ledger.add("compute", "attention", before)
        classes = ["matmul", "attention", "matmul", "norm"]
        a.add_each("pipeline_fill", classes, seconds)
        for cls in classes:
            b.add("pipeline_fill", cls, seconds)
        for mine, theirs in ((a.by_cause, b.by_cause), (a.by_class, b.by_class)):
            assert list(mine) == list(theirs)
            assert all(np.array_equal(mine[k], theirs[k]) for k in mine)
