"""Composition of Experts: popularity, the expert cache, switch costs, Table V, serving."""

from __future__ import annotations

import numpy as np
import pytest

from rdu_cluster.config import load_cluster
from rdu_cluster.scenarios.coe import (
    CoEScenario,
    ExpertCache,
    Popularity,
    assign_experts,
    capacity_tier,
    switch_time_s,
    table_v,
)
from workloads.catalog import load_model
from workloads.errors import ConfigError
from workloads.graph import weight_bytes
from workloads.traces import LengthDist, Trace, synthetic


@pytest.fixture(scope="module")
def clusters():
    return {c: load_cluster(c) for c in ("sn40l-8", "dgx-h100", "dgx-a100")}


def test_popularity():
    p = Popularity.parse("zipf:1.2").probabilities(10)
    assert p.sum() == pytest.approx(1.0) and np.all(np.diff(p) < 0)
    assert p[0] / p[1] == pytest.approx(2**1.2)
    assert Popularity.parse("uniform").probabilities(4).tolist() == [0.25] * 4
    for bad in ("zipf:x", "normal", "zipf:-1"):
        with pytest.raises(ConfigError):
            Popularity.parse(bad)
    for bad in ("uniform:3", "trace:1"):  # an argument would be dropped
        with pytest.raises(ConfigError, match="takes no argument; expected uniform, zipf:S"):
            Popularity.parse(bad)


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_cache_policies(policy):
    c = ExpertCache(2, policy)
    hits = [c.access(e) for e in (1, 1, 1, 2, 3, 1)]
    # LRU: 3 evicts 1 (least recent of {1, 2}), so 1 misses; LFU: 3 evicts 2 (fewest uses)
    assert hits == ([False, True, True, False, False, False] if policy == "lru"
                    else [False, True, True, False, False, True])


def test_switch_copies_each_shard_at_the_tier_bandwidth(clusters):
    e = load_model("llama-2-7b")
    for c in clusters.values():
        tier = c.chip.tier(capacity_tier(c))
        bw = min(tier.bandwidth_bytes_per_s, c.chip.hbm.bandwidth_bytes_per_s)
        assert switch_time_s(e, c) == pytest.approx(weight_bytes(e) / 8 / bw)
    assert capacity_tier(clusters["sn40l-8"]) == "ddr"
    assert capacity_tier(clusters["dgx-h100"]) == "host"


def test_table_v_structure(clusters):
    sn, h100 = table_v(clusters["sn40l-8"]), table_v(clusters["dgx-h100"])
    for t in (sn, h100):
        assert t.total_s == pytest.approx(t.router_s + 8 * (t.switch_s + t.expert_s))
    assert h100.switch_s > sn.switch_s
    assert sn.memory.tier_fraction < 0.2  # 2.0 TB of 12 TB DDR


def test_table_v_needs_an_expert_for_each_prompt(clusters):
    """The setting sends each prompt of the batch to an expert of its own, a cold switch each:
    with 1 expert for 8 prompts it charged 8 cold switches of one expert, one at a time, where
    one load serves them all."""
    with pytest.raises(ConfigError, match="needs at least 8"):
        table_v(clusters["sn40l-8"], experts=1)
    assert table_v(clusters["sn40l-8"], experts=1, batch=1).batch == 1
    assert table_v(clusters["sn40l-8"], experts=8).experts == 8


def test_assign_experts_from_trace_and_seed():
    tr = Trace(np.zeros(3), np.ones(3, dtype=np.int64), np.ones(3, dtype=np.int64),
               ("expert-2", "expert-0", "expert-2"))
    sc = CoEScenario.copies(4, popularity=Popularity("trace"))
    assert assign_experts(tr, sc).tolist() == [2, 0, 2]
    bad = Trace(np.zeros(1), np.ones(1, dtype=np.int64), np.ones(1, dtype=np.int64), ("x",))
    with pytest.raises(ConfigError, match="not an expert"):
        assign_experts(bad, sc)
    uni = CoEScenario.copies(4)
    assert np.array_equal(assign_experts(tr, uni, seed=1), assign_experts(tr, uni, seed=1))


def _serve(cluster, trace, scenario, seed=7, backend=None):
    from rdu_cluster.backends.local import LocalBackend
    from rdu_cluster.engine.simulation import ServeConfig, Simulation

    config = ServeConfig(scheduler="coe", seed=seed, coe=scenario)
    sim = Simulation(scenario.experts[0], cluster, trace, config, backend or LocalBackend())
    return sim.run()


def coe_trace(n=60):
    return synthetic(n, rate=5.0, prompt=LengthDist("fixed", 256), output=LengthDist("fixed", 32),
                     seed=2)


def test_engine_serves_coe_deterministically_with_switches_as_socket_copies(clusters):
    trace = coe_trace()
    sc = CoEScenario.copies(20, popularity=Popularity("zipf", 1.5), hbm_slots=4)
    a = _serve(clusters["sn40l-8"], trace, sc)
    b = _serve(clusters["sn40l-8"], trace, sc)
    assert a.requests.to_pylist() == b.requests.to_pylist()
    req, steps = a.requests.to_pydict(), a.steps.to_pydict()
    assert req["expert"] == assign_experts(trace, sc, 7).tolist()
    assert set(req["state"]) == {"done"}
    waited = [w for w in req["switch_wait_s"] if w > 0]
    assert 0 < len(waited) < len(trace)  # hits and misses
    switch = switch_time_s(sc.experts[0], clusters["sn40l-8"])
    assert waited == pytest.approx([switch] * len(waited))  # the socket's copy time
    for phase, expert, batch in zip(steps["phase"], steps["expert"], steps["batch"]):
        assert expert >= 0 and batch > 0  # every step runs one expert
    sw = [s for s in steps["switch_s"] if s > 0]
    assert a.summary["switches"] == len(sw) and a.summary["switch_s"] == pytest.approx(sum(sw))
    sockets = a.sockets.to_pydict()
    assert sum(sockets["switches"]) == 8 * len(sw)  # every socket copies its shard
    g = _serve(clusters["dgx-h100"], trace, sc)
    assert g.summary["switches"] == a.summary["switches"]  # same policy, same order
    assert g.summary["switch_s"] > a.summary["switch_s"]  # host DRAM over PCIe is slower


def test_coe_batches_only_the_expert_in_use(clusters):
    trace = synthetic(40, rate=float("inf"), prompt=LengthDist("fixed", 128),
                      output=LengthDist("fixed", 8), seed=3)
    sc = CoEScenario.copies(4, hbm_slots=1)
    t = _serve(clusters["sn40l-8"], trace, sc)
    req, steps = t.requests.to_pydict(), t.steps.to_pydict()
    # all arrive at once: one group (one switch) per expert, each a single batch
    assert t.summary["switches"] == len(set(req["expert"])) == 4
    assert max(steps["batch"]) == max(req["expert"].count(e) for e in range(4))


def test_out_of_memory_is_one_line(clusters):
    trace = synthetic(2, rate=1.0, seed=0)
    with pytest.raises(ConfigError, match="out of memory"):
        _serve(clusters["dgx-h100"], trace, CoEScenario.copies(200))


def test_serve_cli_coe(tmp_path):
    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from rdu_cluster.cli import main

    args = ["serve", "--coe-experts", "30", "--cluster", "sn40l-8", "--requests", "20",
            "--rate", "2", "--prompt-len", "128", "--output-len", "16", "--out", str(tmp_path)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "requests.parquet").exists() and "switch" in r.output
    assert "expert" in pq.read_table(tmp_path / "requests.parquet").column_names


def test_coe_scheduler_and_experts_go_together(clusters):
    from rdu_cluster.backends.local import LocalBackend
    from rdu_cluster.engine.simulation import ServeConfig, Simulation

    trace = coe_trace(4)
    model = load_model("llama-2-7b")
    # the message names the scheduler given (it named coe when static was given with experts)
    for config, message in (
            (ServeConfig(scheduler="coe"), "--scheduler coe: only with --coe-experts"),
            (ServeConfig(coe=CoEScenario.copies(4)), "--scheduler continuous: not with --coe"),
            (ServeConfig(scheduler="static", coe=CoEScenario.copies(4)), "--scheduler static: "),
            (ServeConfig(scheduler="coe", coe=CoEScenario.copies(4), faults=("socket:1@1",)),
             "--fault: not with --coe-experts")):
        with pytest.raises(ConfigError, match=message):
            Simulation(model, clusters["sn40l-8"], trace, config, LocalBackend())


def test_router_runs_on_the_sockets_in_the_admitting_prefill_step(clusters):
    """CoE serve: the router's pass is charged to the step that admits a request (it holds the
    sockets), not added to the request's arrival."""
    import dataclasses

    from chip.cost_tables import CostTables
    from rdu_cluster.engine import plan as plans

    c = clusters["sn40l-8"]
    sc = CoEScenario.copies(4, hbm_slots=1)
    lay = plans.layouts(sc.experts[0], c, plans.PlanSpec.parse(None, c, sc.experts[0]))[0]
    prog = next(iter(lay.programs.values()))
    with_router = dataclasses.replace(prog, router=sc.router)
    bare = CostTables(c.chip, prog, lambda coll: 0.0)
    routed = CostTables(c.chip, with_router, lambda coll: 0.0)
    for load in (None, np.array([1.6])):  # an expert-load straggler step charges it too
        step = (8, 8 * 256, 0, load)
        extra = routed.prefill_step(*step)[0, 0] - bare.prefill_step(*step)[0, 0]
        assert extra > 0
        assert extra == pytest.approx(routed._router_rows(8, np.array([8 * 256]), 0)[0, 0])
    trace = synthetic(1, rate=1.0, prompt=LengthDist("fixed", 256), output=LengthDist("fixed", 4),
                      seed=0)
    req = _serve(c, trace, sc).requests.to_pydict()
    assert req["queue_s"][0] == pytest.approx(0.0)  # the router does not delay admission
