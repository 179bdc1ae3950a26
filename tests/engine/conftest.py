"""Small serving runs shared by the engine tests."""

from __future__ import annotations

import pytest

from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.config import load_cluster
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from workloads import traces
from workloads.catalog import load_model

PROMPT = traces.LengthDist("uniform", 64, 1024)
OUTPUT = traces.LengthDist("uniform", 4, 96)


def simulate(model="llama-3.1-8b", cluster="sn40l-16", n=40, rate=20.0, backend=None,
             prompt=PROMPT, output=OUTPUT, seed=1, hooks=(), sink=None, chunk_rows=None,
             **config):
    limits = config.pop("limits", Limits())
    trace = traces.synthetic(n, rate, "poisson", prompt, output, seed=seed)
    sim = Simulation(load_model(model), load_cluster(cluster), trace,
                     ServeConfig(limits=limits, seed=seed, **config), backend or LocalBackend())
    sim.hooks.extend(hooks)
    return sim, (sim.run() if sink is None else sim.run(sink, chunk_rows))


@pytest.fixture(scope="package", autouse=True)
def warm_ray_sockets():
    """The Ray runs of these tests reuse the socket actors of the last run of the same layout
    (RayBackend's warm_sockets): they spend their time on what they test, not on starting a
    Ray worker process a socket. Released when the package's tests end, before any other
    package's Ray work (sweeps' and capacity's tasks) needs the CPUs."""
    from rdu_cluster.backends.ray_backend import warm_sockets

    with warm_sockets():
        yield


@pytest.fixture(scope="session")
def serve():
    """The `simulate` helper: (Simulation, Tables) of a small run."""
    return simulate


@pytest.fixture(scope="session")
def small_run():
    return simulate()


@pytest.fixture(scope="session")
def small_run_8():
    """A small run on sn40l-8: the Ray tests that need fresh socket actors (or kill them) use
    eight, not sixteen: each actor started is a Ray worker process (about a second of CPU)."""
    return simulate(cluster="sn40l-8")
