"""Sending and routing: closed-loop clients and replica routing policies. Load-aware routing
and closed loops couple replicas in time; the engine's windows must still give what a loop
advancing one step at a time, all replicas interleaved by time, gives."""

from __future__ import annotations

import numpy as np
import pytest

from rdu_cluster.engine import replica_routing
from rdu_cluster.engine.dispatch import Dispatcher
from workloads.errors import ConfigError

PLAN = {"plan": "tp4"}  # sn40l-16: 4 replicas


# Every routing policy's windows against a step-by-step loop: tests/engine/test_policies.py.


def test_a_closed_loop_plans_as_a_longer_one_while_each_clients_replica_has_more_to_send():
    """engine/checkpoint.py: a run is kept for a longer one only while every replica that
    holds a client still has one of its requests to send (its plans then assume more to
    come, as the longer run's do); continued, the new requests follow their clients."""
    d = Dispatcher(concurrency=3)
    d.route = np.array([0, 1, 0, 0, 1, 0])
    d.unsent_to, d.unsent = {0: 2, 1: 1}, 3
    assert d.plans_hold()
    d.unsent_to[1] = 0
    assert not d.plans_hold()
    d.extend(lambda i: None, 10)
    assert d.route.tolist() == [0, 1, 0] * 3 + [0] and d.unsent == 7
    assert d.unsent_to == {0: 5, 1: 1}
    assert d.chain.tolist() == list(range(3, 10)) and d.chain_key.tolist() == list(range(7))


def test_least_outstanding_spreads_a_burst_that_round_robin_piles_up(serve):
    """Long requests at ids 0, 4, 8... pile onto replica 0 under round-robin; the
    load-aware policy sends the next request elsewhere."""
    _, rr = serve(n=40, rate=200.0, seed=5, **PLAN)
    _, lo = serve(n=40, rate=200.0, seed=5, **PLAN, routing="least-outstanding")
    assert rr.requests.column("replica").to_pylist() == [i % 4 for i in range(40)]
    assert lo.requests.column("replica").to_pylist() != rr.requests.column("replica").to_pylist()
    assert set(lo.requests.column("replica").to_pylist()) == {0, 1, 2, 3}


def test_closed_loop_keeps_n_requests_in_flight(serve):
    n = 5
    _, t = serve(n=30, rate=float("inf"), concurrency=n, seed=2)
    r = t.requests.to_pydict()
    sends = np.asarray(r["arrival_s"])
    finish = np.asarray(r["finish_s"])
    assert np.all(sends[:n] == 0.0)
    # request i is sent when request i - n (its client's previous one) finishes
    assert np.allclose(sends[n:], finish[:-n])
    events = sorted([(s, 1) for s in sends] + [(f, -1) for f in finish])
    assert max(np.cumsum([d for _, d in events])) == n


def test_closed_loop_honours_trace_arrivals(serve):
    _, t = serve(n=20, rate=0.5, concurrency=8, seed=2)
    r = t.requests.to_pydict()
    assert min(r["arrival_s"][1:]) > 0  # a slow trace: no request before its arrival


def test_routing_registry_names_and_errors():
    assert {"round-robin", "least-outstanding", "least-kv"} <= set(replica_routing.names())
    with pytest.raises(ConfigError, match="--routing: unknown 'nope'"):
        replica_routing.get("nope")
    with pytest.raises(ConfigError, match="--concurrency"):
        Dispatcher(concurrency=0)


@pytest.mark.slow
def test_ray_gives_the_local_tables_with_load_aware_routing(ray_session, serve):
    from rdu_cluster.backends.ray_backend import RayBackend

    _, local = serve(n=30, rate=60.0, seed=3, routing="least-kv", concurrency=8, **PLAN)
    _, remote = serve(n=30, rate=60.0, seed=3, routing="least-kv", concurrency=8,
                      backend=RayBackend(), **PLAN)
    for name in ("requests", "steps", "sockets", "links"):
        assert getattr(local, name).to_pylist() == getattr(remote, name).to_pylist(), name
    assert local.summary["bench"] == remote.summary["bench"]
