"""Plans, footprints, fit checks, pipelines, MoE routing and plan search, with the numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from chip import runtime_memory
from partitioning.evaluate import evaluate_plan, search_plans
from partitioning.expert_routing import RoutingModel, expert_load
from partitioning.footprint import Placement, PlanDoesNotFit, fit_message, footprints
from partitioning.plan import Plan, validate
from partitioning.program import build_programs, groups_of
from partitioning.scenario import Scenario
from rdu_cluster.config import load_cluster
from workloads import graph, params
from workloads.catalog import BF16_WEIGHTS, FP8_WEIGHTS, load_model
from workloads.errors import ConfigError

HBM = 68719476736  # SN40L HBM per socket: 64 GiB (cluster_configs/chips/sn40l.toml)


@pytest.fixture(scope="module")
def sn8():
    return load_cluster("sn40l-8")


@pytest.fixture(scope="module")
def sn16():
    return load_cluster("sn40l-16")


def test_plan_names_round_trip():
    for name in ("tp8", "tp4pp2", "ep16", "tp8ep2", "tp2pp2dp4", "tp16@mamba2=8"):
        assert Plan.parse(name).name == name
    p = Plan.parse("tp8ep2")
    assert (p.tp, p.ep, p.width, p.sockets) == (8, 2, 16, 16)


@pytest.mark.parametrize("text", [
    "tp", "tp0", "xp4", "tp4tp2", "tp8@ssm=4",
    "tp8@", "tp8@ ",  # an '@' with nothing after it was read as tp8
    "tp16@mamba2=8,mamba2=4",  # the last of two degrees won, silently
    "tp16@mamba2=8_0", "tp16@mamba2=+8",  # int() reads '8_0' as 80
    "tp\u0661\u0666",  # Arabic-Indic digits: \d and int() take them
    "tp16@none=2",  # not a mixer kind a block can have
])
def test_bad_plan_names(text):
    with pytest.raises(ConfigError, match="--plan"):
        Plan.parse(text)


def test_tp3_on_16_sockets_is_rejected(sn16):
    spec = load_model("llama-3.1-70b")
    with pytest.raises(ConfigError, match="does not divide the 16"):
        evaluate_plan(Scenario(spec, sn16, Plan.parse("tp3")))


@pytest.mark.parametrize("plan, message", [
    ("tp8", ("plan tp8: tp 8 does not divide the expert FFN width 14337 (each expert is split "
             "over tp)")),
    ("tp2ep4", "plan tp2ep4: tp 2 does not divide the expert FFN width 14337"),
])
def test_expert_width_must_divide_by_tp(plan, message):
    # A dense FFN width that the width does not divide was refused; an expert's was not.
    spec = replace(load_model("mixtral-8x7b"), moe=replace(load_model("mixtral-8x7b").moe,
                                                           expert_intermediate=14337))
    with pytest.raises(ConfigError) as e:
        validate(Plan.parse(plan), spec, 8)
    assert str(e.value).startswith(message)
    validate(Plan.parse("ep8"), spec, 8)  # whole experts: tp 1


def test_shared_expert_width_must_divide_by_the_width():
    spec = load_model("qwen3-next-80b-a3b")  # shared expert 512 wide, split over the width
    blocks = "@full_attention=1,linear_attention=1"
    validate(Plan.parse("tp16ep32" + blocks), spec, 512)
    with pytest.raises(ConfigError, match="^plan tp16ep64@.*: width 1024 does not divide the "
                                          "shared-expert FFN width 512$"):
        validate(Plan.parse("tp16ep64" + blocks), spec, 1024)


def test_groups_layout():
    p = Plan.parse("tp4pp2ep2")
    g = groups_of(p, 13)  # stage 1 (sockets 8..15), ep group 1, tp index 1
    assert g["attn_tp"] == tuple(range(8, 16))
    assert g["expert_tp"] == (12, 13, 14, 15)
    assert g["ep"] == (9, 13)
    assert "pp" not in g and groups_of(p, 5)["pp"] == (5, 13)


def _weights(fps):
    return sum(fp.region("weights") for fp in fps)


def test_footprints_add_up_to_model_bytes(sn16):
    spec = load_model("llama-3.1-8b")
    whole = graph.weight_bytes(spec)
    # Pipeline stages hold disjoint layers: the sum is the model, to the byte.
    plan = Plan.parse("tp1pp4")
    fps = footprints(spec, build_programs(spec, plan), sn16.chip, 1, 4096, 4096, Placement())
    assert _weights(fps) == pytest.approx(whole, rel=1e-12)
    # Tensor parallel splits every matrix; only the norm scales are replicated on each socket.
    plan = Plan.parse("tp8")
    fps = footprints(spec, build_programs(spec, plan), sn16.chip, 1, 4096, 4096, Placement())
    parts = params.param_breakdown(spec)
    norms = (parts["norms"] + parts["final_norm"]) * spec.precision.weights.bytes
    assert _weights(fps) == pytest.approx(whole + 7 * norms, rel=1e-12)
    # KV cache: 32 layers x 8 KV heads x 256 values x 2 bytes = 128 KiB a token, split 8 ways.
    assert fps[0].region("kv_cache") == pytest.approx(4096 * 131072 / 8)


def test_tp_beats_pp_at_batch_1_on_one_node(sn8):
    spec = load_model("llama-3.1-70b")
    r = search_plans(Scenario(spec, sn8, batch=1, prompt_len=4096, gen_len=128), "latency")
    best = r.ranked[0]
    assert best.plan.name == "tp8"
    pp = next(e for e in r.ranked if e.plan.name == "tp4pp2")
    assert best.tokens_per_s_per_request > 1.5 * pp.tokens_per_s_per_request
    assert pp.bubble_fraction == pytest.approx(0.5, abs=1e-9)
    assert pp.tpot_s == pytest.approx(sum(pp.stage_times_s))


def test_llama_405b_bf16_needs_16_sockets(sn8, sn16):
    spec = load_model("llama-3.1-405b")
    weights = graph.weight_bytes(spec)
    assert weights == pytest.approx(811.5e9, rel=1e-3)  # 405.8B parameters x 2 bytes
    assert weights > 8 * HBM > weights / 2  # 8 x 68.7 GB = 549.8 GB < 811.5 GB
    with pytest.raises(PlanDoesNotFit, match=r"hbm of socket 0 overflows by") as err:
        evaluate_plan(Scenario(spec, sn8, Plan.parse("tp8"), 1, 8192, 256))
    over = float(str(err.value).split("overflows by ")[1].split(" GB")[0]) * 1e9
    # ~32.7 GB of weights, + the runtime's program images, + KV
    images = runtime_memory.declared("rdu_program_images")
    assert over == pytest.approx(weights / 8 + images - HBM, rel=0.05)
    assert not search_plans(Scenario(spec, sn8, prompt_len=8192, gen_len=256)).ranked
    e = evaluate_plan(Scenario(spec, sn16, Plan.parse("tp16"), 1, 8192, 256))
    assert 50.7e9 < e.hbm_used_bytes < HBM  # 811.5 / 16 = 50.7 GB weights + KV + activations


def test_deepseek_v3_fits_16_only_with_fp8_or_ddr_spill(sn16):
    spec = load_model("deepseek-v3", BF16_WEIGHTS)
    bf16 = graph.weight_bytes(spec)
    assert bf16 == pytest.approx(1342e9, rel=2e-3)  # 671B x 2 bytes
    assert bf16 > 16 * HBM  # 1,099.5 GB
    assert not search_plans(Scenario(spec, sn16, prompt_len=8192, gen_len=256)).ranked
    fp8 = load_model("deepseek-v3", FP8_WEIGHTS)
    assert graph.weight_bytes(fp8) < 16 * HBM
    e = evaluate_plan(Scenario(fp8, sn16, Plan.parse("ep16"), prompt_len=8192, gen_len=256))
    assert e.hbm_used_bytes < HBM and e.ddr_used_bytes == 0
    spill = Placement(weights="auto")
    e = evaluate_plan(Scenario(spec, sn16, Plan.parse("tp16"), prompt_len=8192, gen_len=256,
                               placement=spill))
    # Per socket ~83.9 GB of weights: 68.7 GB stays in HBM, experts spill ~18.6 GB to DDR.
    assert e.hbm_used_bytes == pytest.approx(HBM)
    assert 15e9 < e.ddr_used_bytes < 22e9
    fp = e.footprints[0]
    assert 0 < fp.spilled_fraction["experts"] < 1 and fp.spilled_fraction["dense_weights"] == 0
    # Spilled expert bytes stream at DDR bandwidth (200 GB/s), after the HBM stream.
    ddr_bw = sn16.chip.tier("ddr").bandwidth_bytes_per_s
    assert e.stage_ddr_s[0] > 0
    assert e.stage_ddr_s[0] * ddr_bw < e.ddr_used_bytes  # only touched experts are read
    fast = evaluate_plan(Scenario(fp8, sn16, Plan.parse("tp16"), prompt_len=8192, gen_len=256))
    assert fast.tokens_per_s_per_request > e.tokens_per_s_per_request


def test_expert_load_model():
    uni = RoutingModel("uniform", seed=1)
    one = expert_load(uni, 256, 8, 16, 1)
    many = expert_load(uni, 256, 8, 16, 4096)
    assert one > 2 and 1 <= many < 1.2  # a few tokens spread unevenly, many average out
    assert expert_load(uni, 256, 8, 16, 1) == one  # deterministic
    zipf = expert_load(RoutingModel("zipf", zipf_s=1.2, seed=1), 256, 8, 16, 4096)
    assert zipf > many


def test_identical_routing_costs_a_batch_as_its_one_sequence_routes(sn16):
    """Copies of one sequence route alike: a batch of 16 reads 2 of Mixtral's 8 experts a layer
    (independent sequences: nearly all 8), so its decode is faster; under EP the copies land on
    the groups one token reaches, which loads the busiest group as one token does."""
    spec = load_model("mixtral-8x7b")
    at = lambda plan, routing=None: evaluate_plan(
        Scenario(spec, sn16, Plan.parse(plan), 16, 1024, 64, routing=routing), prefill=False)
    uni = at("tp8dp2")
    same = at("tp8dp2", RoutingModel("identical"))
    assert same.tpot_s < 0.8 * uni.tpot_s
    one = expert_load(RoutingModel("uniform"), 8, 2, 4, 1)
    ep = at("tp4ep4", RoutingModel("identical"))
    assert ep.expert_load == pytest.approx(one) and one > 1
    with pytest.raises(ConfigError, match="routing: 'hot' unknown; accepted: uniform, zipf"):
        RoutingModel("hot")


def test_ep_all_to_all_and_imbalance_slow_moe(sn16):
    spec = load_model("deepseek-v3", FP8_WEIGHTS)
    scenario = Scenario(spec, sn16, Plan.parse("ep16"), 16, 1024, 64)
    e = evaluate_plan(scenario, prefill=False)
    skew = evaluate_plan(scenario.but(routing=RoutingModel("zipf", 1.2)), prefill=False)
    assert skew.expert_load > e.expert_load >= 1
    assert skew.tpot_s > e.tpot_s
    assert e.stage_decode[0].by_class.get("collective", 0) > 0


def test_gpu_cluster_same_path():
    dgx = load_cluster("dgx-h100")
    spec = load_model("llama-3.1-70b")
    r = search_plans(Scenario(spec, dgx, batch=8, prompt_len=2048, gen_len=128), "throughput")
    assert r.ranked and r.ranked[0].tokens_per_s_total >= r.ranked[-1].tokens_per_s_total


def test_hybrid_per_block_degrees(sn16):
    spec = load_model("nemotron-h-56b")
    at = lambda plan: evaluate_plan(Scenario(spec, sn16, Plan.parse(plan), prompt_len=4096,
                                             gen_len=64), prefill=False)
    a, b = at("tp16"), at("tp16@mamba2=8")
    assert b.footprints[0].region("weights") > a.footprints[0].region("weights")


def test_cli_plan_json_and_errors():
    from rdu_cluster.cli import main

    r = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-8b", "--cluster", "sn40l-8",
                                  "--top", "3", "--json"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.output.splitlines()]
    assert rows[0]["plan"] == "tp8" and len(rows) == 3
    r = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-405b", "--cluster", "sn40l-8"])
    assert r.exit_code == 2 and "overflows by" in r.output


def test_best_plan_and_named_plan(sn16):
    from partitioning.estimate import best_plan, estimate

    spec = load_model("llama-3.1-70b")
    assert best_plan(Scenario(spec, sn16, batch=1, prompt_len=2048)).name == "tp16"
    assert estimate(Scenario(spec, sn16, "tp4pp2", prompt_len=2048)).sockets == 8
    with pytest.raises(PlanDoesNotFit, match="overflows by"):
        best_plan(Scenario(load_model("deepseek-v3", BF16_WEIGHTS), sn16, prompt_len=2048))


def test_plan_refusal_names_the_same_mixer_under_any_hash_seed():
    """Llama 4 Maverick's full and sliding attention both fail tp16 (40 heads); the model's
    mixers are a frozenset, so the message named either from run to run (by the hash seed)."""
    root = str(Path(__file__).resolve().parents[2])
    code = ("from partitioning.plan import Plan, validate\n"
            "from workloads.catalog import load_model\n"
            "try:\n    validate(Plan.parse('tp16'), load_model('llama-4-maverick'), 16)\n"
            "except ValueError as e:\n    print(e)\n")
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root},
                           timeout=60).stdout
            for seed in ("0", "1")}
    assert seen == {"plan tp16: full_attention degree 16 does not divide its 40 heads\n"}


def test_fit_message_shows_a_small_overflow():
    """A plan short of 93 kB of SRAM read "overflows by 0.0 GB (needs 0.5 GB, has 0.5 GB)"."""
    msg = fit_message(Plan.parse("tp16"), "m", "c", "sram", 0, 545353000.0, 545259520.0)
    assert msg.endswith("overflows by 0.000093 GB (needs 0.545353 GB, has 0.545260 GB)")
    big = fit_message(Plan.parse("tp8"), "m", "c", "hbm", 0, 101.6e9, 85.9e9)
    assert big.endswith("overflows by 15.7 GB (needs 101.6 GB, has 85.9 GB)")
