"""The Ray backend: one actor per socket gives the tables of the local backend row by row, and
a socket actor killed mid-run is restored from its checkpoint with nothing lost or repeated."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.slow


def _compare(a, b):
    for name in ("requests", "steps", "sockets", "links"):
        ta, tb = getattr(a, name), getattr(b, name)
        assert ta.num_rows == tb.num_rows, name
        assert ta.to_pylist() == tb.to_pylist(), name  # row by row, bit for bit


@pytest.fixture
def short_windows(serve, monkeypatch):
    """The local run's tables, in windows of at most 4 spans (for the Ray run too): many
    round trips, as a loaded run's windows ended by completions and moves would make."""
    from rdu_cluster.engine import replica

    monkeypatch.setattr(replica, "MAX_SPANS", 4)
    return serve()[1]


def test_ray_backend_matches_local_row_by_row_on_16_sockets(ray_session, serve, short_windows):
    from rdu_cluster.backends.ray_backend import RayBackend

    local = short_windows
    sim, remote = serve(backend=RayBackend())
    assert len(sim.backend.actors) == 0  # closed
    assert sim.windows == local.summary["windows"] > 10
    _compare(local, remote)


def test_ray_rows_streamed_in_chunks_match_local(ray_session, serve, short_windows):
    """Streamed (serve --out), a sockets row goes out only once the reply that fills in its
    occupancy is collected (a follower's: up to MAX_QUEUED windows later, here at the end):
    the chunks still make the local tables."""
    import pyarrow as pa

    from rdu_cluster.backends.ray_backend import RayBackend

    local = short_windows
    chunks: dict[str, list] = {}
    _, remote = serve(backend=RayBackend(), chunk_rows=5,
                      sink=lambda name, tbl: chunks.setdefault(name, []).append(tbl))
    assert len(chunks["steps"]) > 3
    for name in ("requests", "steps", "sockets"):
        assert pa.concat_tables(chunks[name]).to_pylist() == getattr(local, name).to_pylist()
        assert getattr(remote, name) is None


def _kill(ray, actor) -> None:
    """ray.kill, and wait until the actor is gone: the kill is asynchronous, and a call that
    reaches the actor before it dies is answered (then the engine has nothing to revive and
    the restart count depends on timing; under a loaded test run it did)."""
    ray.kill(actor)
    for _ in range(200):
        try:
            ray.get(actor.evaluations.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError):
            return
        time.sleep(0.05)
    raise AssertionError("a killed socket actor still answers")


def test_killed_socket_actor_restarts_from_checkpoint_with_identical_tables(
    ray_session, serve, monkeypatch
):
    """Socket 5 is a follower (its commands are batched, so it dies with replies owed); socket
    0 leads the tp16 group and dies after its periodic checkpoints, so its replay is short.
    One window per plan (no lookahead), so the run has more than two batches of windows and
    5's first batch is collected, and replayed, before the run ends."""
    from rdu_cluster.backends.ray_backend import MAX_QUEUED, RayBackend
    from rdu_cluster.engine.simulation import Simulation

    monkeypatch.setattr(Simulation, "_can_look_ahead", lambda self: False)
    _, undisturbed = serve()
    backend = RayBackend(checkpoint_every=8)
    killed = []

    def kill(sim, window):
        if window in (3, 40):
            victim = 5 if window == 3 else 0
            _kill(ray_session, sim.backend.actor(victim))
            killed.append(victim)

    _sim, disturbed = serve(backend=backend, hooks=[kill])
    assert killed == [5, 0] and backend.restarts == 2
    # 5 replays its first batch (MAX_QUEUED commands since start-up, its only checkpoint);
    # 0 only the commands since its last periodic checkpoint, fewer than checkpoint_every
    assert MAX_QUEUED <= backend.replayed < MAX_QUEUED + 8
    _compare(undisturbed, disturbed)


FAULT = "socket:3@1.0"  # tp16 on sn40l-16 loses socket 3: re-planned to tp8 on 0-2, 4-8


def test_idle_actors_killed_right_before_a_fault_are_revived_with_identical_tables(
    ray_session, serve
):
    """Sockets 3 (the one the fault fails) and 2 (re-planned by it) die idle -- nothing owed,
    nothing queued -- in the window before the fault fires: set_fault and the re-plan's
    reprogram meet dead actors and revive them from their checkpoints."""
    from rdu_cluster.backends.ray_backend import RayBackend

    _, undisturbed = serve(faults=[FAULT])
    backend = RayBackend()
    killed = []

    def kill_before_fault(sim, _window):
        if not killed and max(getattr(r, "window_end", 0.0) for r in sim.replicas) >= 1.0:
            sim.backend.sync()  # every reply collected, every queue sent: the actors idle
            assert not any(sim.backend.inflight.values()) and not any(sim.backend.queued.values())
            for victim in (3, 2):
                _kill(ray_session, sim.backend.actor(victim))
                killed.append(victim)

    _, disturbed = serve(backend=backend, faults=[FAULT], hooks=[kill_before_fault])
    assert killed == [3, 2] and backend.restarts == 2
    assert "recovery" in disturbed.steps.column("phase").to_pylist()  # the re-plan happened
    _compare(undisturbed, disturbed)


def test_an_actor_killed_during_start_up_is_created_afresh_with_identical_tables(
    ray_session, serve, small_run_8
):
    from rdu_cluster.backends.ray_backend import RayBackend

    killed = []

    class DiesStarting(RayBackend):
        def start(self, setups):
            self.reuse = False  # new actors, created through _create (no kept ones reloaded)
            super().start(setups)
            self.reuse = True  # kept on closing, for the next eight-socket tests

        def _create(self, index):
            super()._create(index)
            if index == 7 and not killed:  # before the start-up wait reaches it
                killed.append(index)
                self.ray.kill(self.actors[index])

    _, undisturbed = small_run_8
    backend = DiesStarting()
    _, disturbed = serve(backend=backend, cluster="sn40l-8")
    assert killed == [7] and backend.restarts == 1 and backend.incarnation[7] == 1
    _compare(undisturbed, disturbed)


def test_ray_backend_matches_local_on_a_coe_run(ray_session):
    """Expert switches are region copies sent through the same command path."""
    from rdu_cluster.backends.local import LocalBackend
    from rdu_cluster.backends.ray_backend import RayBackend
    from rdu_cluster.config import load_cluster
    from rdu_cluster.engine.simulation import ServeConfig, Simulation
    from rdu_cluster.scenarios.coe import CoEScenario, Popularity
    from workloads.traces import LengthDist, synthetic

    trace = synthetic(24, rate=float("inf"), prompt=LengthDist("fixed", 128),
                      output=LengthDist("fixed", 16), seed=4)
    sc = CoEScenario.copies(12, popularity=Popularity("zipf", 1.2), hbm_slots=3)
    config = ServeConfig(scheduler="coe", seed=3, coe=sc)
    cluster = load_cluster("sn40l-8")
    runs = [Simulation(sc.experts[0], cluster, trace, config, b).run()
            for b in (LocalBackend(), RayBackend())]
    assert runs[0].summary["switches"] > 3
    _compare(*runs)


def test_ray_backend_matches_local_with_a_separate_tree_draft(ray_session, serve):
    """Draft sockets run a program of their own (their own leader) and size their own KV."""
    from rdu_cluster.backends.ray_backend import RayBackend
    from workloads.speculative import ConstantAcceptance, Speculation

    kw = {"cluster": "sn40l-8", "n": 12, "rate": 40.0, "plan": "tp4", "draft": "llama-3.2-1b",
          "speculation": Speculation(3, ConstantAcceptance(0.7), (3, 2, 1)),
          "draft_placement": "separate", "draft_sockets": 4}
    _, local = serve(**kw)
    _, remote = serve(backend=RayBackend(), **kw)
    assert local.summary["tokens_per_decode"] > 2
    _compare(local, remote)


def test_ray_timeline_is_the_local_one(ray_session, tmp_path):
    """serve --timeline records the same trace events on either backend."""
    from rdu_cluster.backends.local import LocalBackend
    from rdu_cluster.backends.ray_backend import RayBackend
    from rdu_cluster.config import load_cluster
    from rdu_cluster.engine.simulation import ServeConfig, Simulation
    from rdu_cluster.output.timeline import Timeline
    from workloads.catalog import load_model
    from workloads.traces import LengthDist, synthetic

    trace = synthetic(12, 20.0, "poisson", LengthDist("uniform", 64, 512),
                      LengthDist("fixed", 16, 16), seed=2)
    out = []
    for i, backend in enumerate((LocalBackend(), RayBackend())):
        sim = Simulation(load_model("llama-3.1-8b"), load_cluster("sn40l-8"), trace,
                         ServeConfig(plan="tp4pp2", seed=2), backend)
        timeline = Timeline(tmp_path / f"t{i}.json")
        sim.observers.append(timeline)
        sim.run()
        timeline.finish()
        timeline.commit()
        out.append(json.loads((tmp_path / f"t{i}.json").read_text()))
    assert len(out[0]["traceEvents"]) > 100 and out[0] == out[1]
