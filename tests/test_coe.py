"""Composition of Experts: popularity, the expert cache, switch costs, Table V, serving."""

from __future__ import annotations

import numpy as np
import pytest

from rdu_cluster.coe import (
    CoEScenario,
    ExpertCache,
    Popularity,
    assign_experts,
    capacity_tier,
    serve_coe,
    switch_time_s,
    table_v,
)
from rdu_cluster.config import load_cluster
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


def test_serve_is_deterministic_and_hits_with_skew(clusters):
    trace = synthetic(60, rate=5.0, prompt=LengthDist("fixed", 256),
                      output=LengthDist("fixed", 32), seed=2)
    sc = CoEScenario.copies(20, popularity=Popularity("zipf", 1.5), hbm_slots=4)
    a = serve_coe(sc, clusters["sn40l-8"], trace, seed=7)
    b = serve_coe(sc, clusters["sn40l-8"], trace, seed=7)
    assert np.array_equal(a.finish_s, b.finish_s) and a.hit_rate == b.hit_rate
    assert 0.0 < a.hit_rate < 1.0
    assert np.all(a.first_token_s >= a.arrival_s) and np.all(a.finish_s >= a.first_token_s)
    g = serve_coe(sc, clusters["dgx-h100"], trace, seed=7)
    assert g.switch_s_total > a.switch_s_total  # same misses (same cache), slower copies


def test_out_of_memory_is_one_line(clusters):
    trace = synthetic(2, rate=1.0, seed=0)
    with pytest.raises(ConfigError, match="out of memory"):
        serve_coe(CoEScenario.copies(200), clusters["dgx-h100"], trace)


def test_serve_cli_coe(tmp_path):
    from click.testing import CliRunner

    from rdu_cluster.cli import main

    args = ["serve", "--coe-experts", "30", "--cluster", "sn40l-8", "--requests", "20",
            "--rate", "2", "--prompt-len", "128", "--output-len", "16", "--out", str(tmp_path)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "requests.parquet").exists() and "switch" in r.output
