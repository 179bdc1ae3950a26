"""The one plan evaluator: a grid of points evaluated at once equals each point evaluated
alone (any plan: pipeline, expert parallel, DDR spill), fit is decided per point with one
message, and what plans share is cached without changing any figure."""

from __future__ import annotations

import numpy as np
import pytest

from partitioning.evaluate import clear_caches, evaluate_plan, search_plans
from partitioning.footprint import Placement, PlanDoesNotFit
from partitioning.plan import Plan
from partitioning.scenario import Scenario
from rdu_cluster.config import load_cluster
from workloads.catalog import load_model

BATCH = np.array([1.0, 8.0, 64.0])
PROMPT = np.array([512.0, 4096.0, 2048.0])
GEN = np.array([16.0, 256.0, 64.0])


@pytest.mark.parametrize("model,plan,spill", [
    ("llama-3.1-70b", "tp4pp2", False),
    ("qwen3-235b-a22b", "tp2ep4dp2", False),
    ("qwen3-next-80b-a3b", "tp4@linear_attention=2", False),
    ("llama-3.1-405b", "tp8", True),
])
def test_a_grid_equals_its_points_alone(model, plan, spill):
    spec, cluster = load_model(model), load_cluster("sn40l-16")
    placement = Placement("auto", "auto") if spill else Placement()
    grid = evaluate_plan(Scenario(spec, cluster, Plan.parse(plan), BATCH, PROMPT, GEN,
                                  placement=placement), check=False)
    for i in range(len(BATCH)):
        one = evaluate_plan(Scenario(spec, cluster, Plan.parse(plan), BATCH[i], PROMPT[i],
                                     GEN[i], placement=placement), check=False)
        assert grid.tpot_s[i] == pytest.approx(one.tpot_s, rel=1e-12)
        assert grid.ttft_s[i] == pytest.approx(one.ttft_s, rel=1e-12)
        assert grid.hbm_used_bytes[i] == pytest.approx(one.hbm_used_bytes, rel=1e-12)
        assert grid.ddr_used_bytes[i] == pytest.approx(one.ddr_used_bytes, rel=1e-12, abs=1)
        assert grid.misfit[i] == one.misfit
        assert grid.bound[i] == one.bound
        for cause, t in one.decode.by_cause.items():
            assert np.broadcast_to(grid.decode.by_cause[cause], BATCH.shape)[i] == \
                pytest.approx(t, rel=1e-12, abs=1e-15)
    if spill:
        assert np.all(grid.ddr_used_bytes > 0) and np.all(grid.misfit == "")


def test_fit_is_decided_per_point_with_one_message():
    spec, cluster = load_model("qwen3-235b-a22b"), load_cluster("sn40l-16")
    batch = np.array([4.0, 128.0])
    e = evaluate_plan(Scenario(spec, cluster, Plan.parse("tp16"), batch, 8192, 256), check=False)
    assert e.misfit[0] == "" and e.misfit[1].startswith("plan tp16: qwen3-235b-a22b does not "
                                                        "fit sn40l-16: hbm of socket 0")
    assert list(e.fits) == [True, False]
    with pytest.raises(PlanDoesNotFit) as err:
        evaluate_plan(Scenario(spec, cluster, Plan.parse("tp16"), batch, 8192, 256))
    assert str(err.value) == e.misfit[1]


def test_shared_costs_change_no_figure():
    """A search with every cache warm, and plans evaluated after it, report what a cold
    evaluation reports."""
    spec, cluster = load_model("nemotron-h-56b"), load_cluster("sn40l-8")
    scenario = Scenario(spec, cluster, prompt_len=2048, gen_len=64)
    warm = search_plans(scenario)
    again = {e.plan.name: e.tpot_s for e in search_plans(scenario).ranked}
    for e in warm.ranked[:6]:
        clear_caches()
        cold = evaluate_plan(scenario.but(plan=e.plan), prefill=False)
        assert cold.tpot_s == pytest.approx(e.tpot_s, rel=1e-12) == again[e.plan.name]
        assert cold.hbm_used_bytes == e.hbm_used_bytes


@pytest.mark.parametrize("model,plan", [
    ("nemotron-h-56b", "tp4pp4@full_attention=2,mamba2=2"),
    ("qwen3-next-80b-a3b", "tp2ep2pp4@linear_attention=2"),
    ("llama-3.1-70b", "tp4pp2"),
])
def test_a_stage_by_layer_kind_holds_what_its_graph_holds(model, plan):
    """The footprint sums a stage's ops by layer kind (Program.stage_ops) rather than block
    by block: every op tuple of the stage's graph, each as many times as the graph runs it."""
    from partitioning.program import build_programs
    from workloads.ops import StepShape

    spec = load_model(model)
    for prog in build_programs(spec, Plan.parse(plan)):
        for shape in (StepShape.decode(8.0, 4096.0), StepShape.prefill(1.0, 2048.0)):
            by_block: dict = {}
            for block in prog.graph(spec, shape).blocks:
                by_block[id(block.ops)] = by_block.get(id(block.ops), 0) + block.repeat
            by_kind = {id(ops): n for ops, n in prog.stage_ops(spec, shape)}
            assert by_kind == by_block


def test_clear_caches_forgets_everything_plans_shared():
    """A cold benchmark is cold: after clear_caches no cache of the evaluator holds an entry
    (the topology, the cluster's wiring, is kept)."""
    from chip import breakdown, dataflow, execution
    from interconnect import collectives
    from partitioning import evaluate, program
    from partitioning.footprint import _BLOCKS
    from partitioning.plan import _TRAITS

    spec, cluster = load_model("qwen3-next-80b-a3b"), load_cluster("sn40l-8")
    search_plans(Scenario(spec, cluster, prompt_len=2048, gen_len=64))
    caches = [evaluate._COSTS, evaluate._FOOTPRINTS, program._GRAPHS, program._STAGES,
              program._LAYERS, program._PROGRAMS, program._KINDS, program._SENDS, _BLOCKS,
              dataflow._MEMOS, dataflow._OPS, dataflow._PROGRAMS, breakdown._SUMS,
              execution._PARAMS, _TRAITS,
              collectives._TIMES]
    functions = [evaluate._plan_comm, evaluate._concurrent, evaluate._comm,
                 program._with_cached]
    assert all(caches) and all(f.cache_info().currsize for f in functions)
    clear_caches()
    assert not any(caches) and not any(f.cache_info().currsize for f in functions)


def test_a_replicas_kv_tokens_are_its_kv_batch_before_rounding():
    """kv_capacity's tokens (a prefix cache's room) and kv_batch read one room: the batch is
    the tokens over a sequence's, rounded down; 0 for a plan that does not fit."""
    from partitioning.evaluate import kv_batch, kv_capacity

    def kv_tokens(s: Scenario) -> float:
        batch, tokens = kv_capacity(s)
        assert batch == kv_batch(s)
        return tokens

    spec, cluster = load_model("llama-3.1-70b"), load_cluster("dgx-h100")
    for prompt, gen in ((6744, 400), (512, 32)):
        s = Scenario(spec, cluster, Plan.parse("tp4"), 1, prompt, gen)
        tokens = kv_tokens(s)
        assert kv_batch(s) == int(tokens // (prompt + gen)) > 0
    tight = Scenario(load_model("llama-3.1-405b"), cluster, Plan.parse("tp1"), 1, 512, 32)
    assert kv_tokens(tight) == 0 == kv_batch(tight)
