"""The event loop's garbage-collector settings: raised while it runs, restored after, a
caller's frozen objects left frozen; a run's tables do not depend on them."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import pytest

from rdu_cluster.engine import loop
from rdu_cluster.engine.events import Event


@dataclass(frozen=True)
class _Probe(Event):
    seen: list

    def handle(self, sim) -> list[Event]:
        self.seen.append((gc.get_threshold(), gc.get_freeze_count() > 0))
        return [_Probe(self.time + 1.0, self.seen)] if self.time < 2 else []


class _Sim:
    now = 0.0


@pytest.fixture(autouse=True)
def _nothing_frozen():
    """Each test starts with nothing frozen, as a CLI process does: tests/conftest.py freezes
    the session's objects, and a run inside a caller's freeze takes the other path (the last
    tests here set up that one themselves). Frozen again after."""
    frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    yield
    if frozen:
        gc.freeze()


def test_collections_are_fewer_while_the_loop_runs_and_as_before_after():
    before, frozen_before, seen = gc.get_threshold(), gc.get_freeze_count(), []
    assert loop.run(_Sim(), [_Probe(0.0, seen)]) == 2.0
    assert len(seen) == 3
    assert all(t[0] >= loop.GC_THRESHOLD and t[1:] == before[1:] and frozen
               for t, frozen in seen)
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen_before


class _Cycle:
    pass


def test_a_run_does_not_keep_the_garbage_of_earlier_runs():
    """Garbage in reference cycles (a finished run's simulation) must not be frozen with the
    live objects: frozen, it outlived every later run of a sweep until a full collection, and a
    54-point serve sweep grew ~20 MB a point (benchmarks/bench_memory.py)."""
    import weakref

    garbage = _Cycle()
    garbage.me = garbage
    gone = weakref.ref(garbage)
    del garbage
    loop.run(_Sim(), [_Probe(0.0, [])])
    assert gone() is None


def test_a_callers_frozen_objects_stay_frozen():
    """A run inside a caller's gc.freeze() neither freezes nor unfreezes: the caller's object
    stays in the permanent generation (gc.get_objects() does not list it). The freeze count is
    no test of this: frozen objects freed by reference counting during the run (a cache
    replacing an entry) lower it."""
    mine = _Cycle()
    gc.freeze()
    try:
        loop.run(_Sim(), [_Probe(0.0, [])])
        assert not any(o is mine for o in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(o is mine for o in gc.get_objects())  # the check can fail: unfrozen, it is listed


def test_settings_are_restored_when_a_handler_raises():
    before, frozen_before = gc.get_threshold(), gc.get_freeze_count()

    @dataclass(frozen=True)
    class _Boom(Event):
        def handle(self, sim) -> list[Event]:
            raise ValueError("boom")

    with pytest.raises(ValueError):
        loop.run(_Sim(), [_Boom(0.0)])
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen_before


def test_a_run_gives_the_same_tables_with_the_default_collector(serve, monkeypatch):
    kw = {"n": 60, "rate": 40.0}
    _, fewer = serve(**kw)
    monkeypatch.setattr(loop, "GC_THRESHOLD", 1)
    _, default = serve(**kw)
    for name in ("requests", "steps", "sockets"):
        assert getattr(fewer, name).equals(getattr(default, name))


def test_the_loop_fixes_the_allocators_thresholds_once(monkeypatch):
    """glibc's mallopt gets the thresholds its dynamic rule would reach (mmap at 32 MiB, trim
    at twice that), once a process; where there is no mallopt nothing is set."""
    from rdu_cluster.engine import allocator

    calls = []

    class _Libc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: _Libc())
    loop.run(_Sim(), [])
    loop.run(_Sim(), [])
    assert calls == [(allocator.M_MMAP_THRESHOLD, 32 << 20), (allocator.M_TRIM_THRESHOLD, 64 << 20)]

    class _NoMallopt:  # macOS, Windows
        pass

    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: _NoMallopt())
    assert allocator.keep_freed_memory() is False


@dataclass(frozen=True)
class _Decides(Event):
    """Decides (a deferred decision: `decision`) during its event at t = 1, which still makes
    the next event."""

    seen: list
    decision: list

    def handle(self, sim) -> list[Event]:
        from rdu_cluster.engine.decided import Decided

        self.seen.append(self.time)
        if self.time == 1.0:
            self.decision.append(Decided("ttft", 5.0, 3))
        return [_Decides(self.time + 1.0, self.seen, self.decision)] if self.time < 3 else []


def test_a_decision_made_in_an_event_stops_the_coupled_loop_at_its_end_with_its_state_kept():
    """run_coupled: a decision the run made during an event (Watch.defer) is raised once the
    event is done, and a checkpoint not yet taken is taken there first (the state a longer
    run shares: engine/checkpoint.py); one already taken is left as it was."""
    from rdu_cluster.engine.checkpoint import Checkpoint
    from rdu_cluster.engine.decided import Decided

    for taken_before in (False, True):
        seen: list = []
        decision: list = []
        cp = Checkpoint(10, lambda: True, taken=taken_before)
        with pytest.raises(Decided) as got:
            loop.run_coupled([_Sim()], [(0, _Decides(0.0, seen, decision))], list, cp, "owner",
                             list, pending=lambda d=decision: d[0] if d else None)
        assert seen == [0.0, 1.0] and got.value.at_least_ms == 5.0
        if taken_before:
            assert cp.state is None
        else:
            owner, heap, order = cp.state
            assert owner == "owner" and [e.time for *_, e in heap] == [2.0] and order == 3
