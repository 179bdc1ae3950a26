"""Power, energy per token and cost per million tokens: configs, model, result columns."""

from __future__ import annotations

import pytest

from chip.cost import StepCost
from chip.power import parse_power, socket_power_w
from partitioning.estimate import estimate
from partitioning.plan import Plan
from partitioning.scenario import Scenario
from rdu_cluster.config import load_chip, load_cluster
from rdu_cluster.output import results
from rdu_cluster.scenarios.economics import cost_per_million_tokens, estimate_columns, parse_cost
from workloads.catalog import load_model
from workloads.errors import ConfigError

CHIPS = ("sn40l", "h100-sxm", "a100-sxm-80gb", "h200-sxm")


@pytest.mark.parametrize("name", CHIPS)
def test_every_chip_has_power_with_basis(name):
    p = load_chip(name).power
    assert p["source"] and 0 < p["idle_w"] < p["peak_w"]


def test_datasheet_tdp():
    assert load_chip("h100-sxm").power["peak_w"] == 700.0
    assert load_chip("a100-sxm-80gb").power["peak_w"] == 400.0


def test_power_model_bounds():
    chip = load_chip("h100-sxm")
    idle = StepCost(time_s=1.0, flops=0.0, useful_hbm_bytes=0.0)
    bw = chip.hbm.bandwidth_bytes_per_s
    full = StepCost(time_s=1.0, flops=chip.flops("bf16"), useful_hbm_bytes=bw)
    half_mem = StepCost(time_s=1.0, useful_hbm_bytes=chip.hbm.bandwidth_bytes_per_s / 2)
    assert socket_power_w(idle, chip) == pytest.approx(80.0)
    assert socket_power_w(full, chip) == pytest.approx(700.0)
    assert socket_power_w(half_mem, chip) == pytest.approx(80 + 620 * 0.25)


def test_bad_power_and_cost_tables():
    good = {"idle_w": 1, "peak_w": 2, "compute_share": 0.5, "memory_share": 0.5, "source": "x"}
    assert parse_power(good, "w")["peak_w"] == 2.0
    for bad in ({**good, "extra": 1}, {**good, "idle_w": 3}, {**good, "memory_share": 0.2},
                {k: v for k, v in good.items() if k != "source"}):
        with pytest.raises(ConfigError):
            parse_power(bad, "w")
    with pytest.raises(ConfigError):
        parse_cost({"socket_hour_usd": -1, "source": "x"}, "c")
    with pytest.raises(ConfigError):
        parse_cost({"socket_hour_usd": 1}, "c")
    # 1e308 made the cost per token infinite (JSON's Infinity, which no reader accepts)
    with pytest.raises(ConfigError, match=r"c.socket_hour_usd: expected .* \[0, 10000\]"):
        parse_cost({"socket_hour_usd": 1e308, "source": "x"}, "c")


def test_cost_arithmetic():
    # 8 sockets at $2/h for 1 s emitting 100 tokens: 16/3600 $ per 100 tokens
    assert cost_per_million_tokens(2.0, 8, 1.0, 100) == pytest.approx(16 / 3600 / 100 * 1e6)


def test_columns_in_result_rows():
    cluster = load_cluster("dgx-h100")
    est = estimate(Scenario(load_model("llama-3.1-8b"), cluster, Plan(tp=8), 4, 512, 64))
    cols = estimate_columns(est, cluster)
    assert cols["socket_hour_usd"] == 4.916
    expected = float(cols["power_w"]) * 8 * float(est.tpot_s) / 4
    assert float(cols["joules_per_token"]) == pytest.approx(expected)
    row = results.records(est, cluster.chip.name, "kernel_by_kernel", cluster)[0]
    assert row["joules_per_token"] == pytest.approx(expected)
    tbl = results.table([row])
    assert "cost_per_million_tokens_usd" in tbl.column_names
    bare = results.records(est, cluster.chip.name, "kernel_by_kernel")[0]
    assert results.table([bare]).column("joules_per_token").null_count == 1
