"""Attention data parallelism with expert parallelism (adpN plans): grammar, validation, KV per
socket, the layer's ops under attention DP, the EP all-to-all's cost, plan search, CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from chip.execution import params_for
from chip.kernel_by_kernel import GpuOptions, GpuParams
from partitioning.evaluate import evaluate_plan, plan_comm_time
from partitioning.plan import Plan, validate
from partitioning.program import groups_of
from partitioning.scenario import Scenario
from partitioning.search import enumerate_plans
from rdu_cluster.config import load_cluster
from workloads import graph
from workloads.catalog import FP8_WEIGHTS, load_model
from workloads.errors import ConfigError
from workloads.ops import Collective, CollectiveKind, OpClass, Shard, StepShape


@pytest.fixture(scope="module")
def h200():
    return load_cluster("hgx-h200")


@pytest.fixture(scope="module")
def dsv3():
    return load_model("deepseek-v3", FP8_WEIGHTS)


def test_adp_plan_names_round_trip():
    for name in ("adp8ep8", "adp8tp8", "adp16ep16", "adp4tp2ep4", "adp8ep8dp2"):
        assert Plan.parse(name).name == name
    p = Plan.parse("ep8adp8")  # any order, one canonical name
    assert (p.adp, p.tp, p.ep, p.width, p.attn_width, p.sockets) == (8, 1, 8, 8, 1, 8)
    assert p.name == "adp8ep8"
    assert Plan.parse("adp4tp8").attn_width == 2
    with pytest.raises(ConfigError, match="--plan"):
        Plan.parse("adp0ep8")


@pytest.mark.parametrize("text, field", [
    ("adp3ep8", "adp=3 does not divide the stage width 8"),
    ("adp16ep8", "adp=16 does not divide the stage width 8"),
])
def test_bad_adp_degrees_name_the_field(dsv3, text, field):
    with pytest.raises(ConfigError, match=field):
        validate(Plan.parse(text), dsv3, 8)


def test_adp_with_block_degrees_is_refused():
    spec = load_model("nemotron-h-56b")
    with pytest.raises(ConfigError, match="adp does not combine with per-block degrees"):
        validate(Plan.parse("adp2tp16@mamba2=8"), spec, 16)


def test_kv_sharded_by_sequence_not_replicated(h200, dsv3):
    """MLA's latent cache is whole on every tp8 socket (one latent head); under adp8ep8 each
    socket holds its eighth of the sequences: exactly 1/8 at batch 64."""
    s = Scenario(dsv3, h200, "tp8", batch=64, prompt_len=1024, gen_len=256)
    tp = evaluate_plan(s, prefill=False)
    adp = evaluate_plan(s.but(plan="adp8ep8"), prefill=False)
    whole = graph.kv_cache_bytes(dsv3, 64, 1024 + 256)
    assert tp.kv_cache_bytes_per_socket == pytest.approx(whole)
    assert adp.kv_cache_bytes_per_socket == pytest.approx(whole / 8)
    # the busiest group sets it: 65 sequences on 8 groups, 9 on one
    odd = evaluate_plan(s.but(plan="adp8ep8", batch=65), prefill=False)
    assert odd.kv_cache_bytes_per_socket == pytest.approx(whole / 64 * 9)


def test_gqa_kv_per_socket_under_adp():
    """GQA: tp4 splits 4 KV heads over 4 sockets for all sequences; adp2tp4 keeps 2 heads a
    socket for half of them: the same bytes; adp4tp4 all heads for a quarter: the same too."""
    spec = load_model("qwen3-235b-a22b")
    per = {}
    for name in ("tp4", "adp2tp4", "adp4tp4"):
        g = graph.step_graph(spec, StepShape.decode(8, 1000.0), Plan.parse(name).shard)
        per[name] = float(g.total("kv_read_bytes"))
    assert per["adp2tp4"] == pytest.approx(per["tp4"])
    assert per["adp4tp4"] == pytest.approx(per["tp4"])


def _ops(spec, shard, batch=64):
    g = graph.step_graph(spec, StepShape.decode(batch, 1024.0), shard)
    return {op.name: (block, op) for block in g.blocks for op in block.ops}, g


def test_dense_layers_and_shared_expert_as_sglang_runs_them(dsv3):
    """Under adp8ep8: DeepSeek's dense layers run over the 8 sockets on the gathered batch
    (all-gather before, reduce-scatter after, no all-reduce); the shared expert is whole on
    each socket for its own tokens; attention runs on 8 of the 64 sequences."""
    shard = Plan.parse("adp8ep8").shard
    g = graph.step_graph(dsv3, StepShape.decode(64, 1024.0), shard)
    dense, moe = g.blocks[1], g.blocks[2]
    names = [op.name for op in dense.ops]
    assert "mlp_gather" in names and "mlp_scatter" in names and "mlp_all_reduce" not in names
    up = next(op for op in dense.ops if op.name == "up_proj")
    assert up.flops == pytest.approx(2.0 * 64 * dsv3.hidden_size * dsv3.intermediate_size / 8)
    shared = next(op for op in moe.ops if op.name == "shared_up_proj")
    assert shared.flops == pytest.approx(
        2.0 * 8 * dsv3.hidden_size * dsv3.moe.shared_intermediate)
    assert not any(op.name == "shared_all_reduce" for op in moe.ops)
    attn = next(op for op in moe.ops if op.cls is OpClass.ATTENTION)
    assert attn.streams == 8  # 8 sequences, one latent head each
    tp = graph.step_graph(dsv3, StepShape.decode(64, 1024.0), Plan.parse("tp8").shard)
    assert [op.name for op in tp.blocks[1].ops].count("mlp_all_reduce") == 1


def test_contexts_split_round_robin_busiest_group():
    shape = StepShape.decode_contexts((100, 10, 10, 10, 900))
    share = graph.rank_shape(shape, 2)  # (100, 10, 900) and (10, 10)
    assert share.contexts == (100, 10, 900) and share.batch == 3
    assert graph.rank_shape(StepShape.decode(9.0, 5.0), 4).batch == 3


def test_all_to_all_scales_with_the_busiest_rank_load(dsv3):
    shard = Plan.parse("adp8ep8").shard
    def dispatch(load):
        ops = graph.layer_ops(dsv3, dsv3.layers[5], StepShape.decode(64, 1.0),
                              replace(shard, expert_load=load))
        return next(op.comm for op in ops if op.name == "ep_dispatch")
    base, hot = dispatch(1.0), dispatch(1.5)
    assert hot.bytes == pytest.approx(1.5 * base.bytes)
    # FP8 dispatch (1 byte + a float scale per 128) of each socket's 8 tokens, 8 copies each
    assert base.bytes == pytest.approx(8 * 8 * dsv3.hidden_size * (1 + 4 / 128))


def test_all_to_all_cost_monotonic_in_load_and_latency(h200):
    p = params_for(GpuParams, h200.chip)
    comm = plan_comm_time(h200, Plan.parse("adp8ep8"))
    c = lambda nbytes: Collective(CollectiveKind.ALL_TO_ALL, nbytes, "ep", 8)
    opts = GpuOptions(cuda_graphs=True)
    times = [float(p.collective_time(comm, c(b), opts)) for b in (1e5, 1e6, 1e7)]
    assert times[0] > p.ep_a2a_latency_s and times == sorted(times) and times[2] > times[1]
    slower = replace(p, ep_a2a_latency_s=2 * p.ep_a2a_latency_s)
    assert float(slower.collective_time(comm, c(1e6), opts)) == pytest.approx(
        times[1] + p.ep_a2a_latency_s)


def test_attention_groups_of_two(dsv3):
    plan = Plan.parse("adp4tp8")
    assert groups_of(plan, 5)[("attn_tp", 2)] == (4, 5)
    e = evaluate_plan(Scenario(dsv3, load_cluster("hgx-h200"), plan, batch=8, prompt_len=256,
                               gen_len=16), prefill=False)
    assert float(e.tpot_s) > 0


def test_plan_search_ranks_adp_plans(dsv3, h200):
    plans = list(enumerate_plans(dsv3, 8))
    assert Plan(ep=8, adp=8) in plans and Plan(tp=8, adp=8) in plans
    assert not any(p.adp > 1 for p in enumerate_plans(load_model("llama-3.1-8b"), 8))


ARGS = ["simulate", "--model", "deepseek-v3", "--weights", "fp8", "--cluster", "hgx-h200",
        "--batch", "64", "--json"]


@pytest.mark.slow  # two DeepSeek-V3 simulations, prefill included (~6 s)
def test_cli_simulate_json_kv_per_socket():
    from rdu_cluster.cli import main

    args = ARGS
    kv = {}
    for plan in ("tp8", "adp8ep8"):
        r = CliRunner().invoke(main, [*args, "--plan", plan])
        assert r.exit_code == 0, r.output
        row = json.loads(r.output.splitlines()[-1])
        kv[plan] = row["kv_cache_bytes_per_socket"]
    assert kv["adp8ep8"] < kv["tp8"] and np.isclose(kv["tp8"], 8 * kv["adp8ep8"])


def test_cli_bad_adp_degree_exit_2():
    from rdu_cluster.cli import main

    r = CliRunner().invoke(main, [*ARGS, "--plan", "adp3ep8"])
    assert r.exit_code == 2 and "adp=3 does not divide" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_serve_plan_takes_adp(dsv3, h200):
    from rdu_cluster.engine.plan import PlanSpec

    p = PlanSpec.parse("adp8ep8", h200, dsv3)
    assert (p.tp, p.ep, p.adp, p.name) == (8, 8, 8, "adp8ep8")
    assert p.shard() == Plan.parse("adp8ep8").shard
    with pytest.raises(ConfigError, match="serve takes"):
        PlanSpec.parse("tp4dp2", h200, dsv3)
    with pytest.raises(ConfigError, match="adp=3"):
        PlanSpec.parse("adp3ep8", h200, dsv3)


def test_shard_rules():
    s = Shard(attn_tp=1, mlp_tp=8, expert_tp=1, ep=8, vocab_tp=8, attn_dp=8)
    assert (s.shared_tp, s.embed_tp, s.scheduler_sockets) == (1, 1, 1)
    t = Shard.tensor(8)
    assert (t.shared_tp, t.embed_tp, t.scheduler_sockets) == (8, 8, 8)


def test_plan_search_ranks_adp_among_the_rest():
    from partitioning.evaluate import search_plans

    spec = load_model("qwen1.5-moe-a2.7b")
    r = search_plans(Scenario(spec, load_cluster("hgx-h200"), batch=64, prompt_len=1024,
                              gen_len=64), "throughput")
    names = [e.plan.name for e in r.ranked]
    assert any(n.startswith("adp") for n in names) and any(n.startswith("tp") for n in names)
