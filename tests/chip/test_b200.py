"""The B200 node (cluster_configs/chips/b200.toml, clusters/dgx-b200.toml): a chip added as data,
`extends = "h100-sxm"`, uncalibrated."""

from __future__ import annotations

import pytest

from partitioning.estimate import estimate
from partitioning.scenario import Scenario, tensor_plan
from rdu_cluster.config import load_chip, load_cluster
from rdu_cluster.validation import calibration
from workloads.catalog import load_model


def test_b200_has_its_datasheet_figures_and_h100s_priors():
    b200, h100 = load_chip("b200"), load_chip("h100-sxm")
    # DGX B200 / HGX B200 per GPU, dense: BF16 2.25, FP8 4.5 PFLOP/s; 180 GB HBM3e at 8 TB/s
    assert (b200.flops("bf16"), b200.flops("fp8")) == (2250e12, 4500e12)
    assert b200.hbm.capacity_bytes == 180 * 2**30
    assert b200.hbm.bandwidth_bytes_per_s == 8e12
    assert b200.power["peak_w"] == 1000.0
    # every execution value but the SM count is H100's first-principles prior
    assert b200.execution["sm_count"] == 148
    assert {k: v for k, v in b200.execution.items() if k != "sm_count"} == {
        k: v for k, v in h100.execution.items() if k != "sm_count"}
    node = load_cluster("dgx-b200")
    assert (node.sockets, node.topology.kind) == (8, "switch")
    assert node.topology.link_bandwidth_bytes_per_s == 900e9  # NVLink 5: 1.8 TB/s both ways


def test_b200_inherits_the_h100_familys_fitted_values():
    # A chip that extends a calibrated chip runs with its fitted values (calibration follows
    # hardware families), and says so; its own figures (sm_count) stay its own.
    profile = calibration.load("default")
    with calibration.use(profile):
        h100, b200 = load_chip("h100-sxm"), load_chip("b200")
    assert h100.execution != load_chip("h100-sxm").execution  # the profile does fit H100
    assert "inherited from h100-sxm" in b200.calibration
    own = {"sm_count"}
    assert {k: v for k, v in b200.execution.items() if k not in own} == {
        k: v for k, v in h100.execution.items() if k not in own}
    assert b200.execution["sm_count"] == load_chip("b200").execution["sm_count"] == 148


def _step(cluster: str, prompt_len: int, batch: int):
    c = load_cluster(cluster)
    return estimate(Scenario(load_model("llama-3.1-70b"), c, tensor_plan(c, 8), batch=batch,
                             prompt_len=prompt_len, gen_len=64))


def test_b200_gains_over_h100_at_most_its_datasheet_ratios():
    # Same priors, so the gain comes from the figures alone and cannot exceed them: decode at
    # batch 1 is bound by HBM (8 / 3.35 TB/s) plus fixed overheads; a long prefill by the
    # tensor cores (2,250 / 989.4 TFLOP/s BF16) plus collectives.
    h100, b200 = _step("dgx-h100", 1024, 1), _step("dgx-b200", 1024, 1)
    decode = float(h100.tpot_s) / float(b200.tpot_s)
    assert 1.0 < decode <= 8 / 3.35
    h100, b200 = _step("dgx-h100", 8192, 8), _step("dgx-b200", 8192, 8)
    prefill = float(h100.ttft_s) / float(b200.ttft_s)
    assert 1.3 < prefill <= 2250 / 989.4
    print(f"B200 over H100: decode x{decode:.2f}, prefill x{prefill:.2f}")


@pytest.mark.parametrize("key", ["compute_efficiency", "nccl_busbw_fraction"])
def test_b200_keys_are_declared_on_their_own(key):
    # an entry's chips share one fitted value: b200 is in no entry with the chips rows measure
    decls = [d for d in calibration.declarations() if d.key == key and "b200" in d.chips]
    assert [d.chips for d in decls] == [("b200",)]
