"""Execution models: breakdown invariants, parameter checking, fusion rules, and properties
(more bandwidth is never slower, more overhead is never faster, an optimization turned on is
never slower, GPU bandwidth utilization does not fall with batch at fixed context)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toy_graphs import alpha_beta, toy_graph

from chip import execution
from chip.breakdown import hbm_utilization
from chip.dataflow import UNFUSED_BASELINE, DataflowOptions, DataflowParams
from chip.kernel_by_kernel import GpuOptions, GpuParams, fuse
from rdu_cluster.config import load_chip, parse_chip
from workloads.errors import ConfigError
from workloads.ops import OpClass

SN40L = load_chip("sn40l")
H100 = load_chip("h100-sxm")
COMM = alpha_beta()
DF_OPTIONS = [DataflowOptions(*flags) for flags in itertools.product((False, True), repeat=4)]
GPU_OPTIONS = [GpuOptions(*flags) for flags in itertools.product((False, True), repeat=2)]
CASES = [(SN40L, o) for o in DF_OPTIONS] + [(H100, o) for o in GPU_OPTIONS]
FAST = settings(max_examples=25, deadline=None)


def cost(graph, chip, options=None, comm=COMM):
    return execution.step_cost(graph, chip, comm, options)


def with_execution(chip, **changes):
    return dataclasses.replace(chip, execution={**chip.execution, **changes})


def with_bandwidth(chip, factor):
    tiers = tuple(
        dataclasses.replace(t, bandwidth_bytes_per_s=t.bandwidth_bytes_per_s * factor)
        if t.name == "hbm"
        else t
        for t in chip.tiers
    )
    return dataclasses.replace(chip, tiers=tiers)


# ---- invariants -------------------------------------------------------------------------------


@pytest.mark.parametrize("chip,options", CASES, ids=lambda x: getattr(x, "name", str(x)))
def test_breakdowns_add_up_on_a_grid(chip, options):
    batch = np.array([1.0, 8.0, 64.0, 256.0])[:, None]
    context = np.array([512.0, 8192.0, 65536.0])[None, :]
    for tp in (1, 8):
        c = cost(toy_graph(batch, context, tp=tp), chip, options)
        assert np.shape(c.time_s) == (4, 3)
        assert np.all(c.time_s > 0)
        np.testing.assert_allclose(sum(c.by_cause.values()), c.time_s, rtol=1e-12)
        np.testing.assert_allclose(sum(c.by_class.values()), c.time_s, rtol=1e-12)
        assert all(np.all(np.asarray(v) >= 0) for v in c.by_cause.values())


def test_prefill_runs_through_the_same_models():
    g = toy_graph(batch=1.0, context=0.0, new_tokens=2048.0, tp=1)
    for chip in (SN40L, H100):
        c = cost(g, chip)
        np.testing.assert_allclose(sum(c.by_cause.values()), c.time_s)
        assert c.cause("compute") > 0.5 * c.time_s  # a long prompt is compute-bound


def test_roofline_bounds_every_model():
    """Without communication (the dataflow model overlaps what the roofline model adds)."""
    g = toy_graph(batch=np.array([1.0, 16.0, 128.0]), context=4096.0, tp=8)
    for chip, options in CASES:
        roof = execution.step_cost(g, chip, lambda c: 0.0, None, model="roofline")
        assert np.all(cost(g, chip, options, lambda c: 0.0).time_s >= roof.time_s * (1 - 1e-9))


def test_hbm_utilization_is_useful_bytes_over_time_and_peak():
    c = cost(toy_graph(), H100)
    expected = c.useful_hbm_bytes / (c.time_s * H100.hbm.bandwidth_bytes_per_s)
    np.testing.assert_allclose(hbm_utilization(c, H100.hbm.bandwidth_bytes_per_s), expected)
    assert 0 < expected < 1


# ---- parameters -------------------------------------------------------------------------------


def _raw_chip(name):
    import tomllib

    import cluster_configs

    with cluster_configs.bundled("chips")[name].open("rb") as f:
        return tomllib.load(f)


@pytest.mark.parametrize("name,params", [("sn40l", DataflowParams), ("h100-sxm", GpuParams)])
def test_execution_tables_have_exactly_the_model_fields(name, params):
    raw = _raw_chip(name)
    assert set(raw["execution"]) == {f.name for f in dataclasses.fields(params)}
    extra = {**raw, "execution": {**raw["execution"], "warp_factor": 1.0}}
    with pytest.raises(ConfigError, match=r"execution\.warp_factor: unknown field"):
        parse_chip(extra, f"{name}.toml")
    key = min(raw["execution"])
    missing = {**raw, "execution": {k: v for k, v in raw["execution"].items() if k != key}}
    with pytest.raises(ConfigError, match=rf"execution\.{key}: missing field"):
        parse_chip(missing, f"{name}.toml")
    bad = {**raw, "execution": {**raw["execution"], "hbm_efficiency": 1.5}}
    with pytest.raises(ConfigError, match=r"execution\.hbm_efficiency"):
        parse_chip(bad, f"{name}.toml")


def test_every_bundled_chip_loads():
    for name in ("sn40l", "h100-sxm", "h200-sxm", "a100-sxm-80gb"):
        assert load_chip(name).execution


def test_wrong_options_type_is_a_config_error():
    with pytest.raises(ConfigError, match="DataflowOptions"):
        cost(toy_graph(), SN40L, GpuOptions())
    with pytest.raises(ConfigError, match="GpuOptions"):
        cost(toy_graph(), H100, DataflowOptions())


# ---- fusion -----------------------------------------------------------------------------------


def test_gpu_fusion_follows_the_usual_rules():
    layer = toy_graph(tp=8).blocks[1]
    kernels = fuse(layer.ops, 5)
    names = [[op.name for op in k.ops] for k in kernels]
    assert names == [
        ["attn_norm"],
        ["qkv", "rope"],
        ["attn_score", "softmax", "attn_value"],
        ["o_proj"],
        ["attn_allreduce"],
        ["attn_residual", "mlp_norm"],
        ["gate_up", "act_mul"],
        ["down"],
        ["mlp_allreduce"],
        ["mlp_residual"],
    ]
    assert all(1 <= len(k.ops) <= 5 for k in kernels)
    assert max(len(k.ops) for k in fuse(layer.ops, 2)) <= 2


def test_rdu_fuses_a_layer_into_one_kernel_and_the_baseline_does_not():
    g = toy_graph(tp=8)
    fused = cost(g, SN40L, DataflowOptions(kernel_looping=False))
    assert fused.kernels == sum(b.repeat for b in g.blocks)
    looped = cost(g, SN40L)
    assert looped.kernels == len(g.blocks)
    unfused = cost(g, SN40L, UNFUSED_BASELINE)
    assert unfused.kernels == sum(b.repeat * len(b.ops) for b in g.blocks)


def test_rdu_intermediates_spill_only_when_they_do_not_fit():
    small = cost(toy_graph(batch=1.0, context=4096.0), SN40L, DataflowOptions())
    assert small.cause("activations") == 0
    big = toy_graph(batch=256.0, context=65536.0)
    assert np.all(cost(big, SN40L, DataflowOptions(batch_streaming=False)).cause("activations") > 0)
    off = cost(big, SN40L, DataflowOptions(batch_streaming=False))
    on = cost(big, SN40L)
    # BatchStreaming spills at most what the whole batch would (it spills only where that
    # costs fewer HBM bytes than re-streaming the weights once more per group: tile_array)
    assert 0 <= on.cause("activations") <= off.cause("activations")
    hbm = ("weight_streaming", "activations")
    assert sum(on.cause(c) for c in hbm) <= sum(off.cause(c) for c in hbm) * (1 + 1e-12)
    tiny = cost(toy_graph(batch=8.0, context=65536.0), SN40L)
    assert tiny.cause("activations") == 0  # a few sequences' intermediates fit: nothing spills


# ---- properties -------------------------------------------------------------------------------

batches = st.sampled_from([1.0, 2.0, 8.0, 32.0, 128.0])
contexts = st.sampled_from([128.0, 2048.0, 16384.0])
tps = st.sampled_from([1, 8])
case = st.sampled_from(CASES)


@FAST
@given(case, batches, contexts, tps, st.floats(1.0, 4.0))
def test_more_bandwidth_is_never_slower(chip_options, batch, context, tp, factor):
    chip, options = chip_options
    g = toy_graph(batch, context, tp=tp)
    # 1e-12 relative: a factor of 1 + 2e-16 may round the sum either way
    faster = cost(g, with_bandwidth(chip, factor), options).time_s
    assert faster <= cost(g, chip, options).time_s * (1 + 1e-12)


OVERHEADS = {
    "sn40l": [
        "hbm_latency_s",
        "op_latency_s",
        "call_sync_s",
        "argument_load_s",
        "program_load_s",
        "host_command_s",
        "device_command_s",
        "host_step_s",
    ],
    "h100-sxm": [
        "kernel_latency_s",
        "kernel_gap_s",
        "graph_kernel_gap_s",
        "launch_host_s",
        "graph_launch_s",
        "nccl_overhead_s",
        "host_step_s",
    ],
}


@FAST
@given(case, batches, contexts, tps, st.data(), st.floats(1.0, 10.0))
def test_more_overhead_is_never_faster(chip_options, batch, context, tp, data, factor):
    chip, options = chip_options
    key = data.draw(st.sampled_from(OVERHEADS[chip.name]))
    worse = with_execution(chip, **{key: chip.execution[key] * factor})
    g = toy_graph(batch, context, tp=tp)
    assert cost(g, worse, options).time_s >= cost(g, chip, options).time_s * (1 - 1e-12)


@FAST
@given(
    st.sampled_from(DF_OPTIONS),
    st.sampled_from(["kernel_looping", "batch_streaming", "schedule_offloading", "fused"]),
    batches,
    contexts,
    tps,
)
def test_turning_a_dataflow_optimization_on_is_never_slower(options, flag, batch, context, tp):
    g = toy_graph(batch, context, tp=tp)
    off = dataclasses.replace(options, **{flag: False})
    on = dataclasses.replace(options, **{flag: True})
    assert cost(g, SN40L, on).time_s <= cost(g, SN40L, off).time_s * (1 + 1e-12)


@FAST
@given(
    st.sampled_from(GPU_OPTIONS),
    st.sampled_from(["cuda_graphs", "overlap_comm", "overlap_host", "split_kv", "gqa_packing"]),
    batches,
    contexts,
    tps,
)
def test_turning_a_gpu_optimization_on_is_never_slower(options, flag, batch, context, tp):
    g = toy_graph(batch, context, tp=tp)
    off = dataclasses.replace(options, **{flag: False})
    on = dataclasses.replace(options, **{flag: True})
    assert cost(g, H100, on).time_s <= cost(g, H100, off).time_s * (1 + 1e-12)


@FAST
@given(st.sampled_from(GPU_OPTIONS), st.sampled_from([2048.0, 8192.0, 32768.0]), tps)
def test_gpu_bandwidth_utilization_does_not_fall_as_batch_grows(options, context, tp):
    """In decode's memory-bound regime (batch up to 128 in BF16 on H100: below the ridge of
    ~225 FLOP per weight byte) a bigger batch amortizes the per-kernel and per-step overheads.
    Domain: contexts of 2K and more. At very short contexts (~128 tokens) utilization does dip
    by ~1% over batch 1 -> 128, because activation round trips and KV writes (traffic that is
    not "useful": not weights or KV reads) grow with batch faster than overheads amortize."""
    batch = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0])
    c = cost(toy_graph(batch, context, tp=tp), H100, options)
    util = hbm_utilization(c, H100.hbm.bandwidth_bytes_per_s)
    assert np.all(np.diff(util) >= -1e-12)


def test_identical_layers_are_costed_once():
    """A block's repeat multiplies its time: 2 x 16 layers cost what 32 do."""
    g32 = toy_graph(layers=32, tp=8)
    blocks = list(g32.blocks)
    half = dataclasses.replace(blocks[1], repeat=16)
    g16x2 = g32.with_blocks((blocks[0], half, half, blocks[2]))
    for chip, options in [(H100, None), (SN40L, DataflowOptions())]:
        np.testing.assert_allclose(
            cost(g16x2, chip, options).time_s, cost(g32, chip, options).time_s
        )


def test_collectives_are_separate_gpu_kernels():
    layer = toy_graph(tp=8).blocks[1]
    colls = [k for k in fuse(layer.ops, 5) if k.is_collective]
    assert len(colls) == 2 and all(len(k.ops) == 1 for k in colls)
    assert all(k.ops[0].cls is OpClass.COLLECTIVE for k in colls)


# ---- NCCL's bus bandwidth (GpuParams.collective_time) -------------------------------------------


def _nccl_allreduce_us(fraction, sizes, ranks=8, opts=None):
    from partitioning.evaluate import tp_comm_time
    from rdu_cluster.config import load_cluster
    from workloads.ops import Collective, CollectiveKind

    cluster = load_cluster("dgx-h100")
    p = dataclasses.replace(execution.params_for(GpuParams, cluster.chip),
                            nccl_busbw_fraction=fraction)
    comm = tp_comm_time(cluster, ranks)
    return np.array([1e6 * float(p.collective_time(
        comm, Collective(CollectiveKind.ALL_REDUCE, float(b), "attn_tp", ranks),
        opts or GpuOptions()))
        for b in sizes])


def test_nccl_allreduce_curve_is_monotone_in_size_and_gpu_count():
    sizes = 2.0 ** np.arange(11, 27)  # 2 KiB .. 64 MiB
    t8 = _nccl_allreduce_us(0.8, sizes)
    assert np.all(np.diff(t8) >= 0)
    # large messages: the ring's 2(p-1)/p bytes per link grow with p
    t2, t4 = _nccl_allreduce_us(0.8, sizes[-1:], 2), _nccl_allreduce_us(0.8, sizes[-1:], 4)
    assert t2[0] < t4[0] < t8[-1]


def test_nccl_bus_bandwidth_fraction_scales_the_per_byte_term_only():
    small, big = 2048.0, 64 * 2.0**20
    full, part = _nccl_allreduce_us(1.0, [small, big]), _nccl_allreduce_us(0.5, [small, big])
    assert part[0] == pytest.approx(full[0], rel=0.05)  # latency-bound: barely changes
    # bandwidth-bound: twice the per-byte time, i.e. close to twice the time
    assert 1.8 < part[1] / full[1] < 2.0
    # 8 GPUs on NVSwitch, 64 MiB: 2(p-1)/p x B / (fraction x 450 GB/s) plus the latencies
    busbw_term = 1e6 * 1.75 * big / (0.5 * 450e9)
    assert part[1] == pytest.approx(busbw_term, rel=0.15)


def test_custom_allreduce_runs_at_the_link_rate():
    big = [64 * 2.0**20]
    custom = GpuOptions(cuda_graphs=True, allreduce="custom")
    assert _nccl_allreduce_us(0.5, big, opts=custom)[0] == pytest.approx(
        _nccl_allreduce_us(1.0, big, opts=custom)[0])


def test_eager_nccl_calls_pay_their_host_issue_and_graphed_ones_do_not():
    size = [2048.0]
    eager = _nccl_allreduce_us(0.8, size, opts=GpuOptions(cuda_graphs=False))[0]
    graphed = _nccl_allreduce_us(0.8, size, opts=GpuOptions(cuda_graphs=True))[0]
    chip = load_chip("h100-sxm")
    assert eager - graphed == pytest.approx(1e6 * chip.execution["nccl_eager_launch_s"])


def test_a_kernel_pays_its_latency_once_then_streams():
    from chip.kernel_by_kernel import Kernel, kernel_times
    from workloads.ops import Op

    chip = load_chip("h100-sxm")
    p = execution.params_for(GpuParams, chip)
    bw = chip.hbm.bandwidth_bytes_per_s * p.hbm_efficiency

    def t_mem(nbytes, latency):
        q = dataclasses.replace(p, kernel_latency_s=latency)
        op = Op("w", OpClass.MATMUL, flops=1.0, weight_bytes=nbytes)
        return float(kernel_times(Kernel((op,)), chip, q)[3])

    assert t_mem(1e8, 0.0) == pytest.approx(1e8 / bw)
    assert t_mem(1e8, 3e-6) - t_mem(1e8, 0.0) == pytest.approx(3e-6)
    # small kernels reach a smaller share of the bandwidth than large ones
    assert 1e6 / t_mem(1e6, 3e-6) < 1e8 / t_mem(1e8, 3e-6)


@pytest.mark.parametrize("batch", [1.0, 64.0, 1024.0])
def test_kernel_looping_is_never_slower_for_a_moe_layer(batch):
    """A looped MoE layer waits for its routed experts' stream after the router; the experts'
    own compute consumes that stream as it arrives. Added after the stream in full, a large
    batch's expert compute was counted twice: Mixtral 8x7B on tp16 at batch 1024 decoded in
    7.09 ms a step with kernel looping on and 4.90 ms with it off."""
    from workloads.catalog import load_model
    from workloads.graph import decode_graph
    from workloads.ops import Shard

    g = decode_graph(load_model("mixtral-8x7b"), batch, 64.0, Shard.tensor(16))
    on = cost(g, SN40L, DataflowOptions())
    off = cost(g, SN40L, DataflowOptions(kernel_looping=False))
    assert on.time_s <= off.time_s * (1 + 1e-12)


# ---- decode attention without a split context, host work overlapped ----------------------------


def _attention_ms(model, batch, context, tp, split_kv, chip=H100, gqa_packing=True):
    from workloads.catalog import load_model
    from workloads.graph import decode_graph
    from workloads.ops import Shard

    g = decode_graph(load_model(model), batch, context, Shard.tensor(tp))
    c = cost(g, chip, GpuOptions(cuda_graphs=True, split_kv=split_kv, gqa_packing=gqa_packing))
    return 1e3 * float(c.by_class["attention"])


def test_unsplit_attention_streams_each_kv_head_with_one_block():
    """One block per (sequence, KV head) at sm_stream_bytes_per_s: the time per context token is
    one KV head's bytes over one SM's rate, whatever the TP degree (fewer heads a GPU, the same
    stream each), while a split kernel spreads the bytes over the chip."""
    p = execution.params_for(GpuParams, H100)
    layers, head_bytes = 32, 2 * 128 * 2  # Llama 3.1 8B: K and V of one 128-wide head, BF16
    for tp in (1, 2, 4):
        slope = (_attention_ms("llama-3.1-8b", 1.0, 8192.0, tp, False)
                 - _attention_ms("llama-3.1-8b", 1.0, 4096.0, tp, False)) / 4096.0
        assert slope == pytest.approx(1e3 * layers * head_bytes / p.sm_stream_bytes_per_s,
                                      rel=1e-6)
    # a split kernel reads 8 KV heads a layer at the chip's rate: far faster at batch 1
    assert _attention_ms("llama-3.1-8b", 1.0, 8192.0, 1, True) < 0.2 * _attention_ms(
        "llama-3.1-8b", 1.0, 8192.0, 1, False)


def test_unsplit_attention_runs_in_waves_once_streams_outnumber_the_sms():
    """Below the SM count the streams run side by side (batch 2 costs what batch 1 does); above
    it, in ceil(streams / SMs) waves. With H100's fitted rate (~48 GB/s a block) the chip's own
    bandwidth binds first (above ~64 streams), so a slow block (5 GB/s) shows the waves."""
    slow = with_execution(H100, sm_stream_bytes_per_s=5e9)
    one = _attention_ms("llama-3.1-8b", 1.0, 4096.0, 1, False, slow)
    assert _attention_ms("llama-3.1-8b", 2.0, 4096.0, 1, False, slow) == pytest.approx(
        one, rel=1e-3)
    # 8 KV heads x 33 sequences = 264 streams on 132 SMs: two waves; 34: three, of which a
    # split kernel, filling every SM with pieces, needs 272 / 132
    assert _attention_ms("llama-3.1-8b", 33.0, 4096.0, 1, False, slow) == pytest.approx(
        2 * one, rel=0.02)
    three = _attention_ms("llama-3.1-8b", 34.0, 4096.0, 1, False, slow)
    assert three == pytest.approx(3 * one, rel=0.02)
    split = _attention_ms("llama-3.1-8b", 34.0, 4096.0, 1, True, slow)
    assert split == pytest.approx(272 / 132 * one, rel=0.02)


@pytest.mark.parametrize("split_kv", [False, True])
def test_unpacked_gqa_reads_a_kv_head_once_per_query_head(split_kv):
    """Without GQA packing each query head's block reads its KV head: Llama 3.1 8B (4 query
    heads a KV head) streams 4x the bytes through its SMs, Llama 2 7B (MHA) the same as packed.
    A slow block rate (5 GB/s) keeps the SM side binding."""
    slow = with_execution(H100, sm_stream_bytes_per_s=5e9)
    ms = {(m, packed): _attention_ms(m, 132.0, 2048.0, 1, split_kv, slow, packed)
          for m in ("llama-3.1-8b", "llama-2-7b") for packed in (False, True)}
    assert ms["llama-3.1-8b", False] == pytest.approx(4 * ms["llama-3.1-8b", True], rel=0.01)
    assert ms["llama-2-7b", False] == pytest.approx(ms["llama-2-7b", True], rel=1e-9)


@pytest.mark.parametrize("host, seq_key", [("cpp", "host_seq_s"), ("python", "python_host_seq_s")])
def test_host_time_grows_by_each_sequence_share(host, seq_key):
    """Each sequence of the batch adds its per-step host work (scheduling, stop checks, output
    processing): host time is affine in the batch with the stack's per-sequence slope."""
    chip = with_execution(H100, **{seq_key: 40e-6})
    opts = GpuOptions(cuda_graphs=True, host=host)
    hosts = [float(cost(toy_graph(b, 1024.0), chip, opts).by_cause["host"]) for b in (1, 17, 65)]
    assert hosts[1] - hosts[0] == pytest.approx(16 * 40e-6)
    assert hosts[2] - hosts[0] == pytest.approx(64 * 40e-6)


def test_python_engine_pays_a_hand_off_per_further_worker():
    """A Python engine spanning TP GPUs hands each step to its other workers (`worker_sync`,
    python_worker_s each); a C++ runtime (one process per rank, in lockstep) pays none."""
    chip = with_execution(H100, python_worker_s=0.3e-3)
    for tp in (1, 2, 4):
        g = toy_graph(1.0, 1024.0, tp=tp)
        py = cost(g, chip, GpuOptions(cuda_graphs=True, host="python"))
        cpp = cost(g, chip, GpuOptions(cuda_graphs=True, host="cpp"))
        assert float(py.by_cause["worker_sync"]) == pytest.approx((tp - 1) * 0.3e-3)
        assert float(cpp.by_cause.get("worker_sync", 0.0)) == 0.0


def test_an_overlapped_engine_shows_host_and_hand_off_only_past_the_step():
    """SGLang-class overlap: the host's work and the workers' hand-off run beside the GPU's
    step, so together only what outlasts it shows, split between them in their proportion."""
    g = toy_graph(1.0, 1024.0, tp=2)
    for step_host in (1e-6, 1.0):
        chip = with_execution(H100, python_host_step_s=step_host, python_host_seq_s=0.0,
                              python_worker_s=step_host)
        base = GpuOptions(cuda_graphs=True, host="python")
        plain = cost(g, chip, base)
        over = cost(g, chip, dataclasses.replace(base, overlap_host=True))
        busy = float(plain.time_s) - float(plain.by_cause["host"]) - float(
            plain.by_cause["worker_sync"]) - float(plain.by_cause["launch"])
        shown = float(over.by_cause["host"]) + float(over.by_cause["worker_sync"])
        assert shown == pytest.approx(max(0.0, 2 * step_host - busy))
        assert float(over.by_cause["host"]) == pytest.approx(float(over.by_cause["worker_sync"]))


def test_overlapped_host_work_shows_only_where_it_outlasts_the_step():
    g = toy_graph(1.0, 1024.0)
    gpu = cost(g, H100, GpuOptions(cuda_graphs=True, host="cpp"))
    host = float(gpu.by_cause["host"])
    for step_host in (0.1 * host, 1e3 * host):
        chip = with_execution(H100, host_step_s=step_host, host_seq_s=0.0)
        cpp = cost(g, chip, GpuOptions(cuda_graphs=True, host="cpp"))
        over = cost(g, chip, GpuOptions(cuda_graphs=True, host="cpp", overlap_host=True))
        busy = float(cpp.time_s) - float(cpp.by_cause["host"]) - float(cpp.by_cause["launch"])
        assert float(over.by_cause["host"]) == pytest.approx(max(0.0, step_host - busy))
        assert float(over.time_s) <= float(cpp.time_s)
