"""Hosting footprint: nodes per system for N experts, and where the bytes live."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from chip import runtime_memory
from rdu_cluster.cli import main
from rdu_cluster.config import load_cluster
from rdu_cluster.scenarios.hosting import footprint
from workloads.errors import ConfigError


@pytest.fixture(scope="module")
def sn8():
    return load_cluster("sn40l-8")


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100")


def test_sn40l_hosts_850_experts_in_one_node(sn8):
    fp = footprint(850, "llama-2-7b", sn8)
    chosen = fp.chosen
    assert chosen.name == "tiered" and chosen.nodes == 1  # 11.5 TB in 12 TB of DDR
    assert chosen.tier_bytes["experts"] == pytest.approx(850 * fp.expert_bytes)


def test_gpu_all_in_hbm_count(h100):
    fp = footprint(850, "llama-2-7b", h100)
    hbm = next(p for p in fp.placements if p.name == "hbm")
    # what a node's HBM holds before its experts: router, KV reserve and the runtime's
    # reservation (8 sockets of the default stack's, chip/runtime_memory.py); then whole experts
    rt = runtime_memory.of(h100.chip)
    reserved = 8 * sum(rt.parts(h100.chip.hbm.capacity_bytes, 0.0, 0.0, 8).values())
    assert hbm.hbm_bytes["reserved"] == pytest.approx(reserved)
    per_node = int((hbm.hbm_capacity - hbm.hbm_bytes["router"] - hbm.hbm_bytes["kv_reserve"]
                    - reserved) // fp.expert_bytes)
    assert 30 < per_node < 49  # 49 a node before the reservation was counted
    assert hbm.experts_in_hbm == per_node and hbm.nodes == -(-850 // per_node)
    # tiered: host DRAM (2.048 TB a node) bounds it
    tiered = next(p for p in fp.placements if p.name == "tiered")
    assert tiered.nodes == 6


def test_latency_target_selects_placement(h100):
    loose = footprint(150, "llama-2-7b", h100, latency_target_s=1.0).chosen
    tight = footprint(150, "llama-2-7b", h100, latency_target_s=0.02).chosen
    assert loose.name == "tiered" and tight.name == "hbm" and tight.nodes > loose.nodes
    assert footprint(150, "llama-2-7b", h100, latency_target_s=1e-4).chosen is None


def test_bad_input(sn8):
    with pytest.raises(ConfigError):
        footprint(0, "llama-2-7b", sn8)
    with pytest.raises(ConfigError):
        footprint(10, "llama-2-7b", sn8, latency_target_s=-1)


def test_cli():
    r = CliRunner().invoke(main, ["footprint", "--experts", "150", "--cluster", "sn40l-8",
                                  "--cluster", "dgx-h100"])
    assert r.exit_code == 0, r.output
    assert "chosen" in r.output and "ddr" in r.output and "host" in r.output
    r = CliRunner().invoke(main, ["footprint", "--experts", "5", "--expert-model", "nope"])
    assert r.exit_code == 2


@pytest.mark.parametrize("value", ["inf", "0", "nan"])
def test_latency_target_message_states_the_range_accepted(value):
    r = CliRunner().invoke(main, ["footprint", "--experts", "4", "--latency-target", value])
    assert r.exit_code == 2, r.output
    assert f"'{value}': expected a positive finite number" in r.output
    assert "inf]" not in r.output


def test_tiered_holds_whole_experts_within_each_node_tier(sn8):
    """Nodes were total bytes / tier capacity, as if experts split across nodes: 65,536 x 70B
    took 771 nodes whose busiest held 86 experts, 12,135 GB in 12,000 GB of DDR."""
    fp = footprint(65536, "llama-3.1-70b", sn8)
    tiered = next(p for p in fp.placements if p.name == "tiered")
    assert tiered.nodes == 772  # 85 experts of 141.1 GB in 12 TB a node
    assert tiered.tier_bytes["experts"] <= tiered.tier_capacity


def test_tiered_does_not_fit_when_one_expert_exceeds_the_tier():
    small = load_cluster("sn40l-8", {"chip.tiers.ddr.capacity_bytes": 1e9})  # 8 GB a node
    tiered = next(p for p in footprint(2, "llama-2-7b", small).placements if p.name == "tiered")
    assert not tiered.fits


def test_json_says_why_a_system_has_no_placement():
    """Its placement fields were null with no reason (the text table said it)."""
    r = CliRunner().invoke(main, ["footprint", "--experts", "150", "--cluster", "sn40l-8",
                                  "--latency-target", "1e-9", "--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.output)
    assert row["placement"] is None
    assert row["infeasible_reason"] == "no placement meets the target"


def test_expert_dtypes_set_the_bytes_each_expert_takes():
    """--weights / --kv-dtype are each expert's (as simulate's): FP8 experts take half the
    capacity tier's bytes; the records name the dtypes; a dtype that is none is refused."""
    got = {}
    for w in ("bf16", "fp8"):
        r = CliRunner().invoke(main, ["footprint", "--experts", "150", "--expert-model",
                                      "llama-3.1-8b", "--cluster", "sn40l-8", "--weights", w,
                                      "--json"])
        assert r.exit_code == 0, r.output
        got[w] = json.loads(r.stdout)
    assert [got[w]["weights"] for w in got] == ["bf16", "fp8"]
    assert got["fp8"]["tier_bytes_per_node"]["experts"] == got["bf16"]["tier_bytes_per_node"][
        "experts"] / 2
    bad = CliRunner().invoke(main, ["footprint", "--experts", "4", "--kv-dtype", "fp9"])
    assert bad.exit_code == 2 and "--kv-dtype: unknown dtype 'fp9'" in bad.output
