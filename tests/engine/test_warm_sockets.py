"""warm_sockets: socket actors kept between runs, reloaded by the next run of their layout."""

from __future__ import annotations

import pytest

from tests.engine.test_ray_backend import _compare, _kill

pytestmark = pytest.mark.slow


def test_warm_sockets_reload_the_last_runs_actors_and_revive_one_killed_while_kept(
    ray_session, serve, small_run
):
    """Inside warm_sockets a run reloads the actors the last run of its layout closed (the
    same actors, the local tables); one killed while kept is revived at start-up; on leaving
    the scope every kept actor is killed."""
    from rdu_cluster.backends.ray_backend import RayBackend, warm_sockets

    def actors_of(into):
        return lambda sim, _window: into.update(sim.backend.actors)

    first, second = {}, {}
    with warm_sockets():
        serve(backend=RayBackend(), hooks=[actors_of(first)])
        _kill(ray_session, first[4])
        backend = RayBackend()
        _, tables = serve(backend=backend, hooks=[actors_of(second)])
    assert len(first) == 16 and backend.restarts == 1
    assert {i for i in first if second[i] is not first[i]} == {4}  # the rest: the same handles
    _compare(small_run[1], tables)
    with pytest.raises((ray_session.exceptions.RayActorError, ray_session.exceptions.ActorDiedError)):
        ray_session.get(second[0].evaluations.remote(), timeout=30)
