"""The RDU's SRAM and tile array as mechanisms (chip/tile_array.py), overlap of collectives on
RDUs and GPUs, calibration that follows a chip's family, and the hardware sensitivity."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from chip import tile_array
from chip.dataflow import DataflowParams
from chip.execution import params_for
from partitioning.estimate import estimate
from partitioning.plan import Plan
from partitioning.scenario import Scenario, tensor_plan
from partitioning.sensitivity import hardware_sensitivity
from rdu_cluster.cli import main
from rdu_cluster.config import load_cluster
from rdu_cluster.validation import calibration
from workloads import graph as graphs
from workloads.catalog import load_model
from workloads.ops import OpClass, Shard, StepShape

SRAM = 545259520  # sn40l.toml: 520 MiB


def _run(model, overrides=None, cluster="sn40l-16", check=True, tp=None, **kw):
    c = load_cluster(cluster, overrides or {})
    kw = {"prompt_len": 1024, "gen_len": 64, **kw}
    return estimate(Scenario(load_model(model), c, tensor_plan(c, tp), **kw), check=check)


def _sram(factor):
    return {"chip.tiers.sram.capacity_bytes": SRAM * factor}


@pytest.mark.parametrize("model", ["llama-3.1-8b", "deepseek-v3"])
def test_half_the_sram_is_slower_and_twice_no_slower_by_a_named_mechanism(model):
    # The shipped profile keeps a fitted share of the free SRAM for KernelLooping's prefetch:
    # less SRAM, a shallower prefetch, more of each layer's chain exposed as a prefetch stall.
    with calibration.use(calibration.load("default")):
        base, half, double = (_run(model, overrides=_sram(f)) for f in (1, 0.5, 2))
    assert float(half.tpot_s) > float(base.tpot_s) >= float(double.tpot_s)
    stall = [float(e.decode.cause("prefetch_stall")) for e in (half, base)]
    assert stall[0] > stall[1] > 0
    assert float(half.tpot_s - base.tpot_s) == pytest.approx(stall[0] - stall[1], rel=1e-6)


def test_weights_and_kv_resident_in_sram_when_they_fit():
    # Llama 3.1 8B over 16 sockets streams ~1 GB a socket a step: more than 520 MiB, so it
    # streams from HBM; with twice the SRAM it stays resident and the stream is gone.
    base, double = _run("llama-3.1-8b"), _run("llama-3.1-8b", overrides=_sram(2))
    assert float(double.decode.cause("weight_streaming")) < 0.05 * float(
        base.decode.cause("weight_streaming"))
    spec, chip = load_model("llama-3.1-8b"), load_cluster("sn40l-16").chip
    graph = graphs.step_graph(spec, StepShape.decode(1, 1088), Shard.tensor(16))
    sram = tile_array.sram_plan(graph, chip, params_for(DataflowParams, chip), True)
    # 21 MB of KV cache a socket would fit, but stays in HBM while the weights stream
    assert not sram.resident_weights and not sram.resident_kv
    assert float(double.decode.cause("kv_streaming")) < 0.05 * float(
        base.decode.cause("kv_streaming"))  # with them, it stays on chip too
    big = load_cluster("sn40l-16", _sram(2)).chip
    pb = params_for(DataflowParams, big)
    assert tile_array.sram_plan(graph, big, pb, True).resident_kv
    long = graphs.step_graph(spec, StepShape.decode(1, 131072), Shard.tensor(16))
    plan = tile_array.sram_plan(long, big, pb, True)
    assert plan.resident_weights and not plan.resident_kv  # 1 GB of KV a socket does not


def test_batch_streaming_batch_is_bounded_by_activation_buffers():
    spec, chip = load_model("llama-3.1-8b"), load_cluster("sn40l-16").chip
    p = params_for(DataflowParams, chip)
    graph = graphs.step_graph(spec, StepShape.decode(64, 1088), Shard.tensor(16))
    ops = [op for op in graph.blocks[1].ops if op.cls is not OpClass.COLLECTIVE]
    sram = tile_array.sram_plan(graph, chip, p, True)
    m = tile_array.layer_map(ops, chip, p, 64.0, True, sram)
    assert float(m.restream) == 1 and float(m.in_flight) == 64  # decode: KBs a sequence
    # ~57 KB of activations a sequence and layer: 272 MB of buffers hold ~4,800 sequences
    # (Argonne's batch-16 slowdown on SN40L is not this). A 100 MB SRAM (50 MB of activation
    # buffers) holds 879. A batch of 1,024 then either streams the layer's 28 MB of weights twice
    # or spills 145 sequences' 8 MB (written and read back: 16.5 MB): the compiler spills. A
    # batch of 2,048 spills 66 MB as one group, or re-streams the weights in three groups of 683.
    small = load_cluster("sn40l-16", _sram(100e6 / SRAM)).chip
    ps = params_for(DataflowParams, small)
    for batch, group, groups in ((1024, 1024, 1), (2048, 683, 3)):
        big = graphs.step_graph(spec, StepShape.decode(batch, 1088), Shard.tensor(16))
        wide = [op for op in big.blocks[1].ops if op.cls is not OpClass.COLLECTIVE]
        tiny = tile_array.layer_map(wide, small, ps, float(batch), True,
                                    tile_array.sram_plan(big, small, ps, True))
        assert (float(tiny.in_flight), float(tiny.restream)) == (group, groups)
        # (the footprint's SRAM check wants a whole batch's largest op in SRAM: not asked here)
        slow = _run("llama-3.1-8b", _sram(100e6 / SRAM), batch=batch, check=False)
        base = _run("llama-3.1-8b", batch=batch)
        ratio = float(slow.decode.cause("weight_streaming")) / float(
            base.decode.cause("weight_streaming"))
        assert ratio == pytest.approx(groups)
        assert (float(slow.decode.cause("activations")) > 0) == (groups == 1)


def test_batch_streaming_takes_the_group_of_fewest_hbm_bytes():
    """Re-streamed weights plus spilled activations: the groups chosen cost no more HBM bytes
    than any other number of groups (a brute force over every one)."""
    rng = np.random.default_rng(7)
    budget = 50e6
    for _ in range(300):
        batch = float(rng.integers(1, 5000))
        per_seq = float(rng.uniform(1e3, 2e6))
        weights = float(rng.uniform(1e5, 5e8))
        fits = min(max(np.floor(budget / per_seq), 1.0), batch)
        k = tile_array._groups(np.asarray(fits), np.asarray(batch), np.asarray(weights),
                               np.asarray(per_seq), budget)
        every = np.arange(1.0, batch + 1)  # every number of groups, at once
        hbm = every * weights + tile_array.spill_bytes(every, batch, per_seq, budget)
        assert float(hbm[int(k) - 1]) <= float(hbm.min()) * (1 + 1e-12)


def test_pcus_set_the_stage_balance_and_pmus_the_stage_buffers():
    base = _run("llama-3.1-8b")
    few = _run("llama-3.1-8b", {"chip.execution.pcus": 32})
    assert float(few.ttft_s) > 1.05 * float(base.ttft_s)  # prefill: compute-bound stages
    spec = load_model("llama-3.1-8b")
    graph = graphs.step_graph(spec, StepShape.decode(1, 1088), Shard.tensor(16))
    ops = [op for op in graph.blocks[1].ops if op.cls is not OpClass.COLLECTIVE]
    for pmus in (1040, 4160):
        c = load_cluster("sn40l-16", {"chip.execution.pmus": pmus}).chip
        p = params_for(DataflowParams, c)
        m = tile_array.layer_map(ops, c, p, 1.0, True, tile_array.sram_plan(graph, c, p, True))
        # every stage streaming weights double-buffers: two halves of at least one PMU (the
        # KV cache, 21 MB a socket, is resident here: its stages stream nothing)
        streaming = sum(1 for op in ops if op.weight_bytes)
        assert float(m.stream_pmus) >= 2 * streaming
        assert float(m.buffer_bytes) == pytest.approx(float(m.stream_pmus + m.act_pmus)
                                                      * SRAM / pmus)


def test_the_compute_rate_asked_at_some_points_is_the_whole_ones_there_bit_for_bit():
    """compute_rate computes only the points its mask asks for (a decode table's contexts
    where compute can bind), each what the whole vector gives it, and 1.0 elsewhere."""
    c = load_cluster("sn40l-16").chip
    p = params_for(DataflowParams, c)
    ctx = np.arange(0.0, 4097.0)
    graph = graphs.step_graph(load_model("llama-3.1-70b"), StepShape.decode(150.0, ctx),
                              Shard.tensor(8))
    ops = [op for op in graph.blocks[1].ops if op.cls is not OpClass.COLLECTIVE]
    assert any(np.ndim(op.flops) for op in ops)  # the attention's FLOPs vary with the context
    whole = tile_array.compute_rate(ops, c, p, np.ones(ctx.shape, dtype=bool))
    assert len(np.unique(whole)) > 10  # a rate that varies, so the points are told apart
    for mask in (ctx < 1500, (ctx % 7 == 3) | (ctx > 4000), ctx == 2048):
        got = tile_array.compute_rate(ops, c, p, mask)
        assert np.array_equal(got[mask], whole[mask]) and np.all(got[~mask] == 1.0)


@pytest.mark.parametrize("model, cluster, sram", [
    ("llama-3.1-70b", "sn40l-16", 1.0),  # weights stream: stage buffers that vary over a grid
    ("llama-3.1-8b", "sn40l-16", 2.0),  # weights (and short KV caches) resident in SRAM
    ("llama-3.1-8b", "sn40l-8", 0.2),  # BatchStreaming groups and spills at large batches
])
def test_a_grid_point_costs_what_it_costs_alone_bit_for_bit(model, cluster, sram):
    """What a grid works out once (a stage's stream buffers from the grid's smallest and
    largest total where they cannot differ between them; one BatchStreaming group where the
    buffers hold every batch; the PCU balance of scalar FLOPs) leaves each point's cost, by
    cause and by class, what the point costs alone."""
    from chip import execution
    from partitioning.estimate import tp_comm_time

    spec, c = load_model(model), load_cluster(cluster, _sram(sram))
    comm, shard = tp_comm_time(c, c.sockets), Shard.tensor(c.sockets)
    p = params_for(DataflowParams, c.chip)
    batch, ctx = np.array([[1.0], [3.0], [64.0], [700.0]]), np.array([[1.0, 900.0, 32768.0]])

    def maps(graph):  # each layer's map on the tile array
        sram = tile_array.sram_plan(graph, c.chip, p, True)
        return [tile_array.layer_map([op for op in b.ops if op.cls is not OpClass.COLLECTIVE],
                                     c.chip, p, graph.shape.batch, True, sram)
                for b in graph.blocks]

    for phase in (StepShape.decode, StepShape.prefill):
        g = graphs.step_graph(spec, phase(batch, ctx), shard)
        grid, grid_maps = execution.step_cost(g, c.chip, comm), maps(g)
        for i, j in np.ndindex(4, 3):
            g1 = graphs.step_graph(spec, phase(batch[i, 0], ctx[0, j]), shard)
            one = execution.step_cost(g1, c.chip, comm)
            for part, alone in (("time", {"": one.time_s}), ("cause", one.by_cause),
                                ("class", one.by_class)):
                whole = {"": grid.time_s} if part == "time" else (
                    grid.by_cause if part == "cause" else grid.by_class)
                for key, t in alone.items():
                    assert np.broadcast_to(whole[key], (4, 3))[i, j] == t, (phase, i, j, key)
            for m, m1 in zip(grid_maps, maps(g1)):
                for f in dataclasses.fields(m):
                    got = np.broadcast_to(getattr(m, f.name), (4, 3))[i, j]
                    assert got == getattr(m1, f.name), (phase, i, j, f.name)


def test_link_latency_moves_the_rdu_step_where_collectives_are_exposed():
    with calibration.use(calibration.load("default")):
        base = _run("llama-3.1-8b")
        slow = _run("llama-3.1-8b", {"topology.link_latency_s": 2e-6})
        fast_bw = _run("llama-3.1-8b", {"topology.link_bandwidth_bytes_per_s": 100e9})
    assert float(slow.tpot_s) > float(base.tpot_s)
    assert float(slow.decode.by_class["collective"]) > float(base.decode.by_class["collective"])
    assert float(fast_bw.tpot_s) < float(base.tpot_s)  # the message's bytes are on the chain


def test_gpu_overlap_hides_a_collective_behind_its_producer_only():
    from chip.serving_stacks import stack

    trt = stack("tensorrt-llm")
    plain = _run("llama-3.1-70b", cluster="dgx-h100", tp=8, batch=64, options=trt)
    over_opts = dataclasses.replace(trt, overlap_comm=True)
    over = _run("llama-3.1-70b", cluster="dgx-h100", tp=8, batch=64, options=over_opts)
    comm = [float(e.decode.cause("communication")) for e in (plain, over)]
    assert 0 < comm[1] < comm[0]
    # a faster link moves what stays exposed
    faster = _run("llama-3.1-70b", {"topology.link_bandwidth_bytes_per_s": 900e9},
                  cluster="dgx-h100", tp=8, batch=64, options=over_opts)
    assert float(faster.decode.cause("communication")) <= comm[1]


def test_a_chip_that_only_extends_another_runs_with_its_calibration(tmp_path):
    chip = tmp_path / "h100-twin.toml"
    chip.write_text('extends = "h100-sxm"\nname = "h100-twin"\n')
    own = tmp_path / "h100-own.toml"
    own.write_text('extends = "h100-sxm"\nname = "h100-own"\n[execution]\n'
                   'nccl_eager_launch_s = 3e-6\n')
    for path, name in ((chip, "twin"), (own, "own")):
        (tmp_path / f"{name}.toml").write_text(
            f'extends = "dgx-h100"\nname = "dgx-{name}"\nchip = "{path}"\n')
    with calibration.use(calibration.load("default")):
        h100 = load_cluster("dgx-h100")
        twin = load_cluster(str(tmp_path / "twin.toml"))
        mine = load_cluster(str(tmp_path / "own.toml"))
    assert twin.chip.execution == h100.chip.execution
    assert twin.chip.calibration == "default (inherited from h100-sxm)"
    assert h100.chip.calibration == "default (h100-sxm)"
    with calibration.use(calibration.load("default")):  # --set of a figure keeps the fit
        wider = load_cluster(str(tmp_path / "twin.toml"),
                             {"chip.tiers.hbm.bandwidth_bytes_per_s": 4e12})
    assert wider.chip.execution == h100.chip.execution and wider.chip.calibration == \
        "default (inherited from h100-sxm)"
    assert mine.chip.execution["nccl_eager_launch_s"] == 3e-6  # its own value stays
    assert mine.chip.execution["nccl_busbw_fraction"] == h100.chip.execution[
        "nccl_busbw_fraction"]
    assert load_cluster("dgx-h100").chip.calibration == "first principles"
    args = ["simulate", "--model", "llama-3.1-8b", "--tp", "8", "--json"]
    out = [json.loads(CliRunner().invoke(main, [*args, "--cluster", c]).output)
           for c in ("dgx-h100", str(tmp_path / "twin.toml"))]
    assert out[0]["tpot_s"] == out[1]["tpot_s"] and out[0]["ttft_s"] == out[1]["ttft_s"]
    assert out[1]["calibration"] == "default (inherited from h100-sxm)"


def test_calibrate_a_new_chip_of_a_calibrated_family(tmp_path):
    from rdu_cluster.validation import published as v

    (tmp_path / "sn50x.toml").write_text('extends = "sn40l"\nname = "sn50x"\n'
                                         '[tiers.hbm]\nbandwidth_bytes_per_s = 2.4e12\n')
    (tmp_path / "sn50x-16.toml").write_text(
        f'extends = "sn40l-16"\nname = "sn50x-16"\nchip = "{tmp_path / "sn50x.toml"}"\n')
    row = next(r for r in v.load_cases() if r["id"] == "sn40l16-llama8b-tokens")
    text = v.resources.files("rdu_cluster").joinpath("validation/measurements.toml").read_text()
    block = text[text.index('[[row]]\nid = "sn40l16-llama8b-tokens"'):]
    block = block[:block.index("\n[[row]]")]
    cases = tmp_path / "rows.toml"
    cases.write_text('version = "t"\n' + block.replace(
        'cluster = "sn40l-16"', f'cluster = "{tmp_path / "sn50x-16.toml"}"').replace(
        f"value = {row['value']}", "value = 1400.0"))
    out = tmp_path / "p.toml"
    result = CliRunner().invoke(main, ["calibrate", "--chip", "sn50x", "--cases", str(cases),
                                       "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert 'family = "sn40l"' in out.read_text()
    profile = calibration.load(str(out))
    assert ("sn50x", "collective_latency_s") in profile.values
    with calibration.use(profile):
        assert load_cluster(str(tmp_path / "sn50x-16.toml")).chip.calibration == \
            f"{profile.name} (sn50x)"


def test_sensitivity_ranks_hbm_bandwidth_first_for_405b_at_batch_1(tmp_path):
    plot = tmp_path / "t.html"
    r = CliRunner().invoke(main, ["sensitivity", "--model", "llama-3.1-405b", "--cluster",
                                  "sn40l-16", "--plan", "tp16", "--json", "--plot", str(plot)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.output.splitlines()]
    assert rows[0]["figure"] == "HBM bandwidth" and rows[0]["elasticity_tpot_s"] < -0.5
    assert rows[0]["mechanism"] == "weight_streaming"
    assert {x["figure"] for x in rows} >= {"peak FLOP/s", "SRAM capacity", "link latency",
                                           "PCUs", "PMUs", "DDR bandwidth"}
    assert all(x["calibration"] == "default (sn40l)" for x in rows)
    page = plot.read_text()
    assert "<svg" in page and "<script" not in page and "HBM bandwidth" in page


def test_sensitivity_of_a_gpu_skips_what_it_lacks():
    rows = hardware_sensitivity(Scenario(load_model("llama-3.1-8b"), load_cluster("dgx-h100"),
                                         Plan(tp=8), batch=1, prompt_len=1024, gen_len=64))
    names = [r.figure for r in rows]
    assert "SRAM capacity" not in names and "PCUs" not in names and "link bandwidth" in names
