"""Memory the runtime reserves (chip/runtime_memory.py): the engines' fractions and rules, the
one footprint check refusing what an engine would not start, and the breakdown that shows it."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from chip import runtime_memory as rm
from chip.serving_stacks import STACKS, stack
from partitioning.evaluate import evaluate_plan, footprint
from partitioning.footprint import Placement, PlanDoesNotFit
from partitioning.scenario import Scenario
from rdu_cluster.cli import main
from rdu_cluster.config import load_cluster, load_fabric
from rdu_cluster.scenarios.capacity import Pool, replica_cost
from workloads.catalog import load_model
from workloads.spec import with_dtypes

GiB = 2**30


@pytest.fixture(scope="module")
def dsv3():
    return with_dtypes(load_model("deepseek-v3"), "fp8", None)


def test_sglang_default_fraction_follows_gpu_memory_and_tp():
    # server_args.py: reserved_mem = 512 + 8192 x 1.5 + 512 x 2 + tp / 8 x 1024 MiB on an
    # 80 GiB GPU at tp 8 (14,848 MiB), at least 10 GiB over 60 GiB
    assert rm.sglang_reserved_bytes(80 * GiB, 8) == 14848 * 2**20
    assert rm.sglang_fraction(80 * GiB, 8) == round(1 - 14848 / 81920, 3)
    # tp 1 on an 80 GiB GPU: 512 + 12,288 + 512 + 128 = 13,440 MiB
    assert rm.sglang_reserved_bytes(80 * GiB, 1) == 13440 * 2**20
    # a 40 GiB GPU: chunk 4,096 (6,144), 160 graphs at tp 8 (320), 1,024: 8,000 MiB, no floor
    assert rm.sglang_reserved_bytes(40 * GiB, 8) == 8000 * 2**20
    # the H200's 141 GiB reserves the same at tp 8, a smaller share
    assert rm.sglang_fraction(141 * GiB, 8) > rm.sglang_fraction(80 * GiB, 8)


def test_vllm_token_budget_by_gpu():
    assert rm.vllm_token_budget(80 * GiB, "h100-sxm") == 8192
    assert rm.vllm_token_budget(80 * GiB, "a100-sxm-80gb") == 2048
    assert rm.vllm_token_budget(40 * GiB, "a100-sxm-40gb") == 2048


@pytest.mark.parametrize("rule, fraction, expect", [
    # total: the engine leaves (1 - f) x HBM, which holds the graphs
    ("total", 0.9, {"cuda_context": 0.5e9, "comm_buffers": 1e9, "cuda_graphs": 1e9,
                    "engine_headroom": 10e9 - 1e9}),
    # free: (1 - f) of what weights, activations and the fixed parts leave
    ("free", 0.9, {"cuda_context": 0.5e9, "comm_buffers": 1e9, "cuda_graphs": 1e9,
                   "engine_headroom": 0.1 * (100e9 - 40e9 - 2e9 - 2.5e9)}),
    # static: (1 - f) x HBM holds activations and graphs
    ("static", 0.85, {"cuda_context": 0.5e9, "comm_buffers": 1e9,
                      "cuda_graphs": rm.sglang_graph_max_bs(100e9, 8) * 2 * 2**20,
                      "engine_headroom": 15e9 - 2e9 - rm.sglang_graph_max_bs(100e9, 8) * 2**21}),
])
def test_parts_by_rule(rule, fraction, expect):
    r = rm.RuntimeMemory("x", rule, fraction, 0.5e9, 1e9, 1e9)
    parts = r.parts(100e9, 40e9, 2e9, group=8, tp=8)
    assert parts == pytest.approx(expect)
    # one socket alone holds no communicator
    assert "comm_buffers" not in r.parts(100e9, 40e9, 2e9, group=1)


def test_every_stack_has_a_runtime():
    for name in STACKS:
        assert rm.for_stack(name).source
    assert rm.for_stack("tensorrt-llm-0.17") is rm.TENSORRT_LLM  # a version: its family's
    with pytest.raises(Exception, match="no runtime memory profile"):
        rm.for_stack("mystery")


@pytest.mark.parametrize("name", ["vllm", "sglang", "tensorrt-llm"])
def test_deepseek_v3_fp8_tp8_does_not_start_on_h100_under_any_stack(dsv3, name):
    h100 = load_cluster("dgx-h100")
    # without a reservation it fits (85.9 GB a GPU): the runtime is what refuses it
    evaluate_plan(Scenario(dsv3, h100, "tp8", placement=Placement(runtime=rm.NONE)))
    with pytest.raises(PlanDoesNotFit, match=f"reserved by {name} ") as err:
        evaluate_plan(Scenario(dsv3, h100, "tp8", options=stack(name)))
    assert "weights 84.7" in str(err.value)


def test_deepseek_v3_fp8_tp8_on_h200_shows_the_reservation(dsv3):
    h200 = load_cluster("hgx-h200")
    pe = evaluate_plan(Scenario(dsv3, h200, "tp8", options=stack("vllm")))
    fp = pe.footprints[0]
    parts = fp.reserved
    cap = h200.chip.hbm.capacity_bytes
    assert fp.runtime == "vllm"
    assert parts["engine_headroom"] == pytest.approx(0.1 * cap - parts["cuda_graphs"])
    assert fp.regions[("reserved", "hbm")] == pytest.approx(sum(parts.values()))
    assert fp.tier("hbm") == pytest.approx(sum(fp.regions[(r, "hbm")] for r in (
        "weights", "kv_cache", "activations", "reserved")))
    # the activation workspace is at vLLM's token budget, not the 1,024-token prompt
    short = evaluate_plan(Scenario(dsv3, h200, "tp8", options=stack("vllm"), placement=Placement(
        runtime=replace(rm.VLLM, token_budget=1024))))
    assert fp.regions[("activations", "hbm")] > short.footprints[0].regions[
        ("activations", "hbm")]


def test_cli_refuses_on_h100_and_shows_the_breakdown_on_h200():
    args = ["simulate", "--model", "deepseek-v3", "--weights", "fp8", "--plan", "tp8"]
    r = CliRunner().invoke(main, [*args, "--cluster", "dgx-h100"])
    assert r.exit_code == 2
    line = r.output.strip()
    assert "\n" not in line and "reserved by" in line and "engine headroom" in line
    r = CliRunner().invoke(main, [*args, "--cluster", "hgx-h200", "--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.output.splitlines()[0])
    parts = [row[f"reserved_{p}_bytes_per_socket"] for p in rm.PARTS]
    assert row["reserved_by"] and row["reserved_bytes_per_socket"] == pytest.approx(sum(parts))
    assert row["reserved_bytes_per_socket"] > 10e9  # vLLM keeps 0.1 of 151 GB and more
    r = CliRunner().invoke(main, [*args, "--cluster", "hgx-h200"])
    assert "reserved by the runtime" in r.output and "engine headroom" in r.output


def test_rdu_runtime_reserves_program_images_and_leaves_sram_to_the_layer_map():
    spec = load_model("llama-3.1-70b")
    sn = load_cluster("sn40l-16")
    pe = evaluate_plan(Scenario(spec, sn, "tp16"))
    fp = pe.footprints[0]
    assert fp.runtime == "sn40l-runtime"
    assert fp.regions[("reserved", "hbm")] == rm.declared("rdu_program_images")
    # its PMU buffers are planned per layer (chip/tile_array.py), not reserved once
    assert ("reserved", "sram") not in fp.regions
    # an HBM that holds the plan only without the images refuses it, naming them
    bare = evaluate_plan(Scenario(spec, sn, "tp16", placement=Placement(runtime=rm.NONE)))
    need = float(np.max(bare.footprints[0].tier("hbm")))
    tight = load_cluster("sn40l-16", {"chip.tiers.hbm.capacity_bytes":
                                      need + rm.declared("rdu_program_images") / 2})
    evaluate_plan(Scenario(spec, tight, "tp16", placement=Placement(runtime=rm.NONE)))
    with pytest.raises(PlanDoesNotFit, match="reserved by sn40l-runtime .*program images"):
        evaluate_plan(Scenario(spec, tight, "tp16"))


def test_serve_and_capacity_use_the_one_check(dsv3):
    h100 = load_cluster("dgx-h100")
    _, why = footprint(Scenario(dsv3, h100, "tp8", 1, 1024, 256), check=False)
    assert "reserved by" in why
    fab = load_fabric("ib-ndr")
    assert replica_cost(dsv3, Pool("dgx-h100", "tp8", 1), (1024, 256), fab) is None
    assert replica_cost(dsv3, Pool("hgx-h200", "tp8", 1), (1024, 256), fab) is not None


def test_hosting_footprint_counts_each_sockets_reservation():
    from rdu_cluster.scenarios.hosting import footprint as hosting

    for name in ("dgx-h100", "sn40l-8"):
        node = load_cluster(name)
        fp = hosting(20, "llama-2-7b", node)
        per_socket = sum(rm.of(node.chip).parts(node.chip.hbm.capacity_bytes, 0.0, 0.0,
                                                node.sockets).values())
        for p in fp.placements:
            assert p.hbm_bytes["reserved"] == pytest.approx(node.sockets * per_socket, rel=1e-6)
            # the experts get what the router, the KV reserve and the reservation leave
            assert sum(p.hbm_bytes.values()) <= p.hbm_capacity


@pytest.mark.parametrize("args", [
    ["plan", "--model", "deepseek-v3", "--weights", "fp8", "--cluster", "dgx-h100"],
    ["serve", "--model", "deepseek-v3", "--weights", "fp8", "--cluster", "dgx-h100", "--plan",
     "tp8", "--requests", "2", "--rate", "1", "--out", "never-written"],
    ["footprint", "--experts", "2", "--expert-model", "llama-3.1-405b", "--cluster", "dgx-h100"],
])
def test_every_command_refuses_naming_the_reservation(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, args)
    lines = r.output.strip().splitlines()
    # the default stack's runtime (chip/serving_stacks.py DEFAULT_STACK)
    assert r.exit_code == 2 and len(lines) == 1 and "reserved by " in lines[0], r.output
    assert not list(tmp_path.iterdir())  # nothing written


def test_each_stack_runs_as_many_requests_at_once_as_its_engine_defaults_to():
    """max_running: the engine's own cap on running requests where none is given (SGLang's
    request pool, vLLM's max_num_seqs by its GPU rule, TensorRT-LLM's max_batch_size before
    and after NVIDIA/TensorRT-LLM#2253, Vidur's batch_size_cap); a release takes its family's;
    an RDU's runtime publishes none, so a run takes the engine's Limits.max_batch."""
    from rdu_cluster.engine import schedulers

    h100, a100, h200, rdu = (load_cluster(c).chip for c in
                             ("dgx-h100", "dgx-a100", "hgx-h200", "sn40l-8"))
    cap = lambda chip, name: rm.of(chip, stack(name)).max_running
    assert {n: cap(h100, n) for n in STACKS} == {
        "sglang": 4096, "sglang-0.5.10": 4096, "vllm": 1024, "tensorrt-llm": 2048,
        "tensorrt-llm-1.3": 2048, "tensorrt-llm-0.11": 256, "eager": 128}
    assert cap(a100, "vllm") == 256 and cap(h200, "vllm") == 1024  # vLLM: not an A100, >= 70 GiB
    assert rm.of(rdu).max_running is None
    assert schedulers.max_batch_for(rdu) == schedulers.Limits.max_batch == 32
    assert schedulers.max_batch_for(h100) == 4096  # no options: the default stack's
    assert schedulers.max_batch_for(h100, stack("vllm")) == 1024
