"""engine/alike.py: a closed-loop run of alike replicas computed from one replica of each kind
gives the whole run's statistics and energy (to the rounding of the shifted times)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from rdu_cluster.backends import make as make_backend
from rdu_cluster.config import load_fabric
from rdu_cluster.engine import alike, bench
from rdu_cluster.engine.disagg import Pool
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from workloads import sessions as sessions_
from workloads import traces
from workloads.catalog import load_model

MODEL = load_model("llama-3.1-8b")
FABRIC = load_fabric("ib-ndr")


# Counts that a tie at one instant decides, which the rounding of a shifted time may break the
# other way (a completion and the send it causes): vLLM's peak of requests in flight, and the
# steady window's completed requests where one completes at the window's last send. Capacity
# reads neither; the output throughput counts chunk times, shifted alike, so its ties hold.
TIES = ("max_concurrent_requests", "request_throughput")


def _case(replicas: int, clients: int, per_client: int, ramp_s: float, output: str = "16",
          system: tuple[str, str] = ("dgx-h100", "tp2")):
    whole = Pool(*system, replicas).spec(MODEL, FABRIC)
    one = Pool(*system, 1).spec(MODEL, FABRIC)
    t = traces.synthetic(clients * per_client, math.inf, "poisson",
                         traces.LengthDist.parse("300", "--prompt-len"),
                         traces.LengthDist.parse(output, "--output-len"), seed=0)
    t = traces.ramped(t, ramp_s, clients)
    spec = bench.MetricSpec((50.0, 99.0), (("ttft", 500.0), ("tpot", 10.0)), clients)
    config = ServeConfig(plan=system[1], seed=0, metrics=spec, concurrency=clients)
    return whole, one, t, config


def _same_figures(fast: dict, full: dict) -> None:
    """Every figure capacity reads, within 1e-9 of the whole run's (TIES aside); the ITL
    statistics and the peak figures None (a summary-only run takes neither)."""
    for key in ("requests", "served", "unserved", "output_tokens"):
        assert fast[key] == full[key], key
    assert fast["makespan_s"] == pytest.approx(full["makespan_s"], rel=1e-9)
    assert fast["joules_per_token"] == pytest.approx(full["joules_per_token"], rel=1e-9)
    for key, value in full["bench"].items():
        if key in TIES:
            continue
        if "_itl_" in key or key in bench.PEAKS:
            assert fast["bench"][key] is None, key
            continue
        assert fast["bench"][key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize("replicas, clients, system", [
    (3, 10, ("dgx-h100", "tp2")), (4, 12, ("dgx-h100", "tp2")), (3, 10, ("sn40l-16", "tp16"))])
def test_alike_replicas_give_the_whole_runs_figures(replicas, clients, system):
    whole, one, t, config = _case(replicas, clients, 3, 0.4, system=system)
    assert alike.applies(MODEL, whole, one, t, config, replicas, 0.4)
    backend = lambda: make_backend("local")
    full = Simulation(MODEL, whole, t, config, backend()).run().summary
    fast = alike.run(MODEL, whole, one, t, config, backend, replicas, 0.4)
    assert fast["replicas_simulated"] == len(alike.kinds(replicas, clients)) < replicas
    _same_figures(fast, full)


def _sessions(replicas: int, sessions: int, ramp_s: float, think: str = "0.5",
              prompt: str = "96"):
    whole = Pool("dgx-h100", "tp2", replicas).spec(MODEL, FABRIC)
    one = Pool("dgx-h100", "tp2", 1).spec(MODEL, FABRIC)
    spec = sessions_.SessionSpec(sessions, 3, 256, user=traces.LengthDist.parse(prompt, "p"),
                                 output=traces.LengthDist("fixed", 24),
                                 think=sessions_.ThinkTime.parse(think))
    t = traces.ramped(sessions_.sessions(spec, seed=0), ramp_s)
    metric = bench.MetricSpec((50.0, 99.0), (("ttft", 500.0), ("tpot", 10.0)), sessions)
    return whole, one, t, ServeConfig(plan="tp2", seed=0, metrics=metric)


@pytest.mark.parametrize("replicas, sessions", [(3, 10), (4, 8)])
def test_alike_replicas_give_the_whole_runs_figures_with_sessions(replicas, sessions):
    """Sessions pinned to their first turn's replica, each replica's prefix cache holding the
    shared system prompt and its own sessions' histories: one replica of each kind gives the
    whole run's figures."""
    whole, one, t, config = _sessions(replicas, sessions, 0.6)
    assert alike.applies(MODEL, whole, one, t, config, replicas, 0.6)
    backend = lambda: make_backend("local")
    sim = Simulation(MODEL, whole, t, config, backend())
    full = sim.run().summary
    assert full["prefix_cache_hit_rate"] > 0.5  # the histories are hit, turn after turn
    fast = alike.run(MODEL, whole, one, t, config, backend, replicas, 0.6)
    assert fast["replicas_simulated"] == len(alike.kinds(replicas, sessions)) < replicas
    _same_figures(fast, full)


def test_sessions_not_alike_are_refused():
    whole, one, t, config = _sessions(3, 10, 0.6, think="exponential:0.5")
    assert not alike.applies(MODEL, whole, one, t, config, 3, 0.6)  # think times differ
    whole, one, t, config = _sessions(3, 10, 0.6, prompt="uniform:64:128")
    assert not alike.applies(MODEL, whole, one, t, config, 3, 0.6)  # messages differ
    whole, one, t, config = _sessions(3, 10, 0.6)
    assert not alike.applies(MODEL, whole, one, t, config, 3, 0.5)  # another ramp
    assert not alike.applies(MODEL, whole, one, t, replace(config, routing="least-kv"), 3, 0.6)
    # a session that shares a chunk with another (not every one): not the same cache
    content = list(t.content)
    content[3] = ((content[3][0][0], content[3][0][1]), (content[0][1][0], content[3][1][1]),
                  *content[3][2:])
    assert not alike.applies(MODEL, whole, one, replace(t, content=tuple(content)), config, 3,
                             0.6)


def test_kinds_pin_clients_round_robin():
    assert alike.kinds(3, 10) == [alike.Kind(4, (0,)), alike.Kind(3, (1, 2))]
    assert alike.kinds(4, 8) == [alike.Kind(2, (0, 1, 2, 3))]
    assert alike.kinds(3, 2) == [alike.Kind(1, (0, 1))]  # (applies refuses an idle replica)


def test_runs_not_alike_are_refused():
    whole, one, t, config = _case(3, 10, 4, 0.4, output="uniform:8:40")
    assert not alike.applies(MODEL, whole, one, t, config, 3, 0.4)  # lengths differ
    whole, one, t, config = _case(3, 10, 4, 0.4)
    assert not alike.applies(MODEL, whole, one, t, config, 3, 0.5)  # another ramp
    assert not alike.applies(MODEL, whole, one, t, replace(config, routing="least-kv"), 3, 0.4)
    # a ring's routes pass the node's other sockets: four tp4 replicas fill a node of 16,
    # one alone would be a ring of 4 (in a full mesh or behind a switch the node's size is
    # moot: test_a_full_mesh_nodes_replicas_are_alike_whatever_the_nodes_size)
    whole, one = (Pool("sn40l-16-ring", "tp4", n).spec(MODEL, FABRIC) for n in (4, 1))
    assert not alike.applies(MODEL, whole, one, t, replace(config, concurrency=10), 4, 0.4)


def test_a_full_mesh_nodes_replicas_are_alike_whatever_the_nodes_size():
    """sn40l-16's sockets are a full mesh: two tp8 replicas a node of 16, where one alone is a
    node of 8; a route crosses only its own two sockets' links, so the replica's collectives
    cost the same (interconnect.alone_layout) and one replica gives the whole run's figures."""
    whole, one, t, config = _case(4, 12, 3, 0.4, system=("sn40l-16", "tp8"))
    assert (whole.sockets_per_node, one.sockets_per_node) == (16, 8)
    assert alike.applies(MODEL, whole, one, t, config, 4, 0.4)
    backend = lambda: make_backend("local")
    full = Simulation(MODEL, whole, t, config, backend()).run().summary
    fast = alike.run(MODEL, whole, one, t, config, backend, 4, 0.4)
    assert fast["replicas_simulated"] == 1
    _same_figures(fast, full)
