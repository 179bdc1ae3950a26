"""The SN50-like socket (cluster_configs/chips/sn50.toml, clusters/sn50-16.toml): an RDU chip added
as data, `extends = "sn40l"`, uncalibrated, its announced figures only."""

from __future__ import annotations

from partitioning.estimate import estimate
from partitioning.scenario import Scenario, tensor_plan
from rdu_cluster.config import load_chip, load_cluster
from rdu_cluster.validation import calibration
from workloads.catalog import load_model


def test_sn50_has_its_announced_figures_and_sn40ls_priors():
    sn50, sn40l = load_chip("sn50"), load_chip("sn40l")
    assert (sn50.flops("bf16"), sn50.flops("fp8")) == (1.6e15, 3.2e15)
    assert sn40l.flops("fp8") == sn40l.flops("bf16")  # SN40L up-converts FP8 (no FP8 rate)
    assert sn50.tier("sram").capacity_bytes == 432e6
    assert sn50.tier("ddr").capacity_bytes == 2e12
    assert sn50.hbm.bandwidth_bytes_per_s == sn40l.hbm.bandwidth_bytes_per_s
    own = {"pcus", "pmus", "program_load_s"}
    assert (sn50.execution["pcus"], sn50.execution["pmus"]) == (2080, 2080)
    assert {k: v for k, v in sn50.execution.items() if k not in own} == {
        k: v for k, v in sn40l.execution.items() if k not in own}
    node = load_cluster("sn50-16")
    assert (node.sockets, node.chip.name) == (16, "sn50")
    assert node.topology == load_cluster("sn40l-16").topology


def test_sn50_inherits_the_sn40l_familys_fitted_values():
    with calibration.use(calibration.load("default")):
        sn50 = load_chip("sn50")
    assert "inherited from sn40l" in sn50.calibration


def _step(cluster: str, prompt_len: int, batch: int):
    c = load_cluster(cluster)
    return estimate(Scenario(load_model("llama-3.1-70b"), c, tensor_plan(c, 16), batch=batch,
                             prompt_len=prompt_len, gen_len=64))


def test_sn50_gains_over_sn40l_where_its_figures_differ():
    # Same HBM: decode at batch 1 streams the same bytes at the same rate (within the launch
    # and SRAM differences); a long prefill gains from the compute, at most the BF16 peak ratio.
    old, new = _step("sn40l-16", 1024, 1), _step("sn50-16", 1024, 1)
    assert abs(float(old.tpot_s) / float(new.tpot_s) - 1) < 0.05
    old, new = _step("sn40l-16", 8192, 8), _step("sn50-16", 8192, 8)
    gain = float(old.ttft_s) / float(new.ttft_s)
    assert 1.5 < gain <= 1.6e15 / 638e12
