"""The Scenario parameter object: what its fields default to, and that the cost entry points
read them (a field left out is not silently dropped)."""

from __future__ import annotations

import pytest

from partitioning.estimate import estimate
from partitioning.evaluate import evaluate_plan
from partitioning.expert_routing import RoutingModel
from partitioning.plan import Plan
from partitioning.scenario import Scenario, tensor_plan
from rdu_cluster.config import load_cluster
from workloads.catalog import load_model
from workloads.errors import ConfigError


@pytest.fixture(scope="module")
def sn8():
    return load_cluster("sn40l-8")


def test_plan_defaults_to_tp_over_the_cluster_and_parses_text(sn8):
    spec = load_model("llama-3.1-8b")
    assert Scenario(spec, sn8).plan == Plan(tp=8)
    assert Scenario(spec, sn8, "tp4dp2").plan == Plan(tp=4, dp=2)
    assert tensor_plan(sn8, 2) == Plan(tp=2, dp=4)
    with pytest.raises(ConfigError, match="^--tp: 3 does not divide the 8 sockets of sn40l-8$"):
        tensor_plan(sn8, 3, "--tp")


def test_each_field_reaches_the_cost(sn8):
    spec = load_model("mixtral-8x7b")
    base = Scenario(spec, sn8, "tp4dp2", batch=16, prompt_len=512, gen_len=64)
    tpot = lambda s: float(estimate(s).tpot_s)
    ref = tpot(base)
    assert tpot(base.but(batch=64)) > ref
    assert tpot(base.but(prompt_len=4096)) > ref
    assert tpot(base.but(routing=RoutingModel("identical"))) < ref
    assert tpot(base.but(plan=Plan(tp=8))) < ref
    from chip.dataflow import UNFUSED_BASELINE

    assert tpot(base.but(options=UNFUSED_BASELINE)) > ref
    # the scenario is a value: a variant leaves it as it was
    assert float(evaluate_plan(base, prefill=False).tpot_s) == ref
