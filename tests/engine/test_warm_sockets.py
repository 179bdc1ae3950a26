"""warm_sockets: socket actors kept between runs, reloaded by the next run of their layout."""

from __future__ import annotations

import pytest

from tests.engine.test_ray_backend import _compare, _kill

pytestmark = pytest.mark.slow


def test_warm_sockets_reload_the_last_runs_actors_and_revive_one_killed_while_kept(
    ray_session, serve, small_run_8
):
    """Inside warm_sockets a run reloads the actors the last run of its layout closed (the
    same actors, the local tables); one killed while kept is revived at start-up; on leaving
    the scope every kept actor is killed. A scope opened inside another (this one is inside
    the package's) takes over the actors the outer one kept: no process is started for them."""
    from rdu_cluster.backends.ray_backend import RayBackend, warm_sockets

    def actors_of(into):
        return lambda sim, _window: into.update(sim.backend.actors)

    outer, first, second = {}, {}, {}
    serve(backend=RayBackend(), hooks=[actors_of(outer)], cluster="sn40l-8", n=4)
    with warm_sockets():
        serve(backend=RayBackend(), hooks=[actors_of(first)], cluster="sn40l-8")
        _kill(ray_session, first[4])
        backend = RayBackend()
        _, tables = serve(backend=backend, hooks=[actors_of(second)], cluster="sn40l-8")
    assert len(first) == 8 and all(first[i] is outer[i] for i in outer)  # taken over
    assert backend.restarts == 1
    assert {i for i in first if second[i] is not first[i]} == {4}  # the rest: the same handles
    _compare(small_run_8[1], tables)
    with pytest.raises((ray_session.exceptions.RayActorError, ray_session.exceptions.ActorDiedError)):
        ray_session.get(second[0].evaluations.remote(), timeout=30)

