"""Per-stack kernel figures (chip/kernel_efficiency.py): a stack without figures runs the chip's
generic kernels, a stack with figures for a class changes that class only, versions fall back to
their base, and calibrate fits a stack's figures on that stack's rows only."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from chip import execution, kernel_efficiency
from chip.kernel_by_kernel import GpuParams, Kernel, kernel_times, replay_bytes, stack_kernels
from chip.serving_stacks import STACKS
from partitioning.estimate import tp_comm_time
from rdu_cluster.config import load_chip, load_cluster
from rdu_cluster.validation import calibration, fit
from rdu_cluster.validation import published as v
from workloads import catalog
from workloads.errors import ConfigError
from workloads.graph import decode_graph
from workloads.ops import Op, OpClass, Shard, StepShape
from workloads.spec import with_dtypes

H200 = load_chip("h200-sxm")
DSV3 = with_dtypes(catalog.load_model("deepseek-v3"), "fp8", None, "weights", "kv")
CLUSTER = load_cluster("hgx-h200")


_comm = tp_comm_time(CLUSTER, 8)


def _with(chip, **values):
    return dataclasses.replace(chip, execution={**chip.execution, **values})


def _cost(chip, stack, batch=1):
    graph = decode_graph(DSV3, batch, 1024, Shard.tensor(8))
    return execution.step_cost(graph, chip, _comm, STACKS[stack])


MLA_ONLY = {"sglang.mla_latency_s": 20e-6}


def test_a_stack_without_figures_keeps_the_generic_kernels():
    """sglang's figures in the chip table change nothing for vllm (and for sglang on a chip
    table without them everything is as before the figures existed)."""
    chip = _with(H200, **MLA_ONLY, **{"sglang.hbm_efficiency": 0.7})
    for stack in ("vllm", "tensorrt-llm"):
        plain, other = _cost(H200, stack), _cost(chip, stack)
        assert float(other.time_s) == float(plain.time_s)
    assert kernel_efficiency.for_stack(H200.execution, "sglang") is None


def test_a_stack_with_figures_changes_only_that_class():
    plain, mla = _cost(H200, "sglang"), _cost(_with(H200, **MLA_ONLY), "sglang")
    assert float(mla.by_class["attention"]) > float(plain.by_class["attention"])
    for cls in set(plain.by_class) - {"attention", "overhead"}:
        assert float(mla.by_class[cls]) == pytest.approx(float(plain.by_class[cls]), rel=1e-12), cls
    # the MLA kernel's latency is the figure, not the chip's kernel_latency_s: 61 layers of it
    extra = float(mla.by_class["attention"]) - float(plain.by_class["attention"])
    chip_latency = H200.execution["kernel_latency_s"]
    assert extra == pytest.approx(61 * (20e-6 - chip_latency), rel=0.05)


def test_small_m_fp8_gemm_is_bound_by_its_column_bands():
    """A decode GEMM of the stack's block-scaled kernel runs one thread block per 128 output
    columns: DeepSeek-V3's shared-expert gate/up at TP 8 (7168 x 512, FP8) is 4 blocks, each
    streaming a 7168 x 128 slab at the block rate; a prefill (banded=False) is not bound."""
    op = Op("gate_up", OpClass.MATMUL, flops=2.0 * 7168 * 512, weight_bytes=7168 * 512.0,
            act_in_bytes=2.0 * 7168, act_out_bytes=2.0 * 512, flop_dtype="fp8",
            column_bytes=7168.0)
    chip = _with(H200, **{"sglang.block_bytes_per_s": 100e9, "sglang.fp8_gemm_latency_s": 4e-6})
    p = execution.params_for(GpuParams, chip)
    decode = kernel_times(Kernel((op,)), chip, p,
                          stack=stack_kernels(chip.execution, STACKS["sglang"], True))
    prefill = kernel_times(Kernel((op,)), chip, p,
                           stack=stack_kernels(chip.execution, STACKS["sglang"], False))
    assert float(decode[3]) == pytest.approx(4e-6 + 7168 * 128 / 100e9, rel=1e-9)
    assert float(prefill[3]) < 6e-6  # the weight stream at the chip's rate after the latency


def test_a_version_takes_its_own_figures_and_falls_back_to_its_base():
    chip = _with(H200, **{"sglang.moe_latency_s": 5e-6, "sglang.mla_latency_s": 17e-6,
                          "sglang-0.5.10.moe_latency_s": 15e-6})
    old = kernel_efficiency.for_stack(chip.execution, "sglang-0.5.10")
    assert old.latency == {"moe": 15e-6, "mla": 17e-6}
    assert STACKS["sglang-0.5.10"].host == STACKS["sglang"].host
    assert STACKS["tensorrt-llm-1.3"].host == "python" != STACKS["tensorrt-llm"].host


def test_moe_pays_per_expert_group_it_holds():
    chip = _with(H200, **{"tensorrt-llm-1.3.moe_expert_s": 0.2e-6})
    plain = _cost(H200, "tensorrt-llm-1.3")
    per_expert = _cost(chip, "tensorrt-llm-1.3")
    # two grouped GEMMs a MoE layer, 256 experts on every GPU at TP 8, 58 MoE layers
    extra = float(per_expert.by_class["expert"]) - float(plain.by_class["expert"])
    assert extra == pytest.approx(58 * 2 * 256 * 0.2e-6, rel=1e-6)


def test_bad_stack_figures_are_refused_with_the_key():
    for value, needle in ((-1.0, "positive"), (1.5, "fraction"), (2e-3, "seconds")):
        key = "sglang.hbm_efficiency" if value == 1.5 else "sglang.moe_latency_s"
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
            execution.parse_params(GpuParams,
                                   {**H200.execution, key: value}, "h200")
        assert needle in str(e.value)


def test_a_stack_with_its_own_host_figures_pays_them_and_no_other_stack_does():
    """eager.python_host_* replace the chip's python_host_* for eager's steps only: the host
    cause of an eager step is the stack's step time plus a sequence's share per sequence."""
    own = {"eager.python_host_step_s": 1.2e-3, "eager.python_host_seq_s": 0.1e-3}
    chip = _with(H200, **own)
    eager = _cost(chip, "eager", batch=16)
    assert float(eager.cause("host")) == pytest.approx(1.2e-3 + 16 * 0.1e-3, rel=1e-9)
    for stack in ("vllm", "sglang", "tensorrt-llm-1.3"):
        assert float(_cost(chip, stack, batch=16).time_s) == float(
            _cost(H200, stack, batch=16).time_s), stack
    # without them eager runs the chip's python host figures, as before they existed
    p = execution.params_for(GpuParams, H200)
    plain = _cost(H200, "eager", batch=16)
    assert float(plain.cause("host")) == pytest.approx(
        p.python_host_step_s + 16 * p.python_host_seq_s, rel=1e-9)
    assert kernel_efficiency.first_principles(H200.execution, "eager.python_host_seq_s") == \
        H200.execution["python_host_seq_s"]


def test_a_stack_host_figure_is_checked_as_a_host_loop_not_a_kernel():
    ok = {**H200.execution, "eager.python_host_step_s": 2e-3}
    execution.parse_params(GpuParams, ok, "h200")  # milliseconds: a host loop's order
    with pytest.raises(ConfigError, match=r"eager\.python_host_step_s.*under 0\.1"):
        execution.parse_params(GpuParams, {**H200.execution, "eager.python_host_step_s": 0.5},
                               "h200")


def test_every_stack_figure_is_declared_for_a_stack_and_parameter_that_exist():
    decls = [d for d in calibration.declarations() if kernel_efficiency.is_stack_key(d.key)]
    assert decls
    for d in decls:
        stack, _, param = d.key.rpartition(".")
        assert stack in STACKS and param in kernel_efficiency.PARAMS
        assert d.status == "unknown" and d.range and d.basis


def test_calibrate_fits_a_stack_only_on_rows_of_that_stack():
    """Each stack's figures respond to its own rows only: the sglang and tensorrt-llm-1.3
    figures form groups with disjoint rows, each row of the stack the figures are named for."""
    rows = [r for r in v.load_cases() if r["id"].startswith("aic-h100-")
            and r.get("kernel", "gemm") in ("mla", "gemm")]
    rows = [dict(r, role="calibrate") for r in rows]
    decls = [d for d in fit.fitted_declarations("h100-sxm")
             if d.key.endswith(("mla_latency_s", "fp8_gemm_latency_s"))]
    sim = fit.Simulator(rows)
    touching = fit.responses(decls, rows, sim)
    by_id = {r["id"]: r for r in rows}
    for d in decls:
        stack = d.key.rpartition(".")[0]
        assert touching[fit._pid(d)], d.key
        assert {by_id[i]["options"] for i in touching[fit._pid(d)]} == {stack}


def test_kernel_rows_parse_and_name_their_fields():
    rows = [r for r in v.load_cases() if r["id"].startswith("aic-")]
    assert {r["options"] for r in rows} == {"sglang", "sglang-0.5.10", "tensorrt-llm-1.3"}
    assert {r.get("kernel") for r in rows} == {"moe", "mla", "attention", None}
    assert all("aiconfigurator_core/systems/data/" in r["source"] for r in rows)
    bad = dict(next(r for r in rows if r.get("kernel") == "moe"), kernel="conv")
    with pytest.raises(ConfigError, match=r"\.kernel: 'conv'; accepted: moe, mla, attention"):
        v.check_row(bad, "row")
    gemm = next(r for r in rows if r["metric"] == "linear_time_us")
    with pytest.raises(ConfigError, match=r"\.routing: 'balanced'"):
        v.check_row(dict(gemm, routing="balanced"), "row")
    no_model = {k: val for k, val in bad.items() if k != "model"} | {"kernel": "moe"}
    with pytest.raises(ConfigError, match="layer_kernel_us needs model"):
        v.check_row(no_model, "row")


def test_balanced_routing_touches_the_most_experts():
    shape = StepShape.decode(16, 1024)
    spread = dataclasses.replace(shape, spread=True)
    from workloads.graph import layer_ops

    moe_layer = DSV3.layers[-1]
    weight = [sum(o.weight_bytes for o in layer_ops(DSV3, moe_layer, s, Shard.tensor(8))
                  if o.cls is OpClass.EXPERT) for s in (shape, spread)]
    per_expert = 3 * 7168 * 2048 / 8
    assert weight[1] == pytest.approx(128 * per_expert)  # min(256, 16 x 8)
    assert weight[0] < weight[1]  # uniform: 256 (1 - (1 - 8/256)^16) = 102 experts
    assert np.isclose(weight[0] / per_expert, 256 * (1 - (1 - 8 / 256) ** 16))


def test_balanced_logits_through_a_group_limited_router_touch_half_the_experts():
    """SGLang 0.5.14's collector routes DeepSeek-V3's balanced logits through its grouped
    router: all 8 groups tie, 4 are kept, so a token keeps 4 of its experts and shares 4 tied
    ones with every other token (graph.spread_experts): min(128, 4N + 4) experts."""
    from workloads.graph import layer_ops, spread_experts

    per_expert = 3 * 7168 * 2048 / 8
    moe_layer = DSV3.layers[-1]

    def experts(n, grouped):
        shape = dataclasses.replace(StepShape.decode(n, 1024), spread=True, spread_grouped=grouped)
        return sum(o.weight_bytes for o in layer_ops(DSV3, moe_layer, shape, Shard.tensor(8))
                   if o.cls is OpClass.EXPERT) / per_expert

    assert [experts(n, True) for n in (1, 4, 16, 64)] == pytest.approx([8, 20, 68, 128])
    assert experts(16, False) == pytest.approx(128) and experts(64, False) == pytest.approx(256)
    qwen = catalog.load_model("qwen3-235b-a22b").moe  # no groups: the same as plain balanced
    assert spread_experts(qwen, 4, True) == spread_experts(qwen, 4, False) == 32
    rows = v.load_cases()
    grouped = [r for r in rows if r.get("routing") == "balanced-grouped"]
    assert grouped and all(r["model"] == "deepseek-v3" and r["options"] == "sglang"
                           for r in grouped)
    gemm = next(r for r in rows if r["metric"] == "linear_time_us")
    with pytest.raises(ConfigError, match=r"\.routing: 'balanced-grouped'"):
        v.check_row(dict(gemm, routing="balanced-grouped"), "row")


def test_a_replayed_kernel_reads_a_working_set_that_fits_l2_from_it():
    """A per-kernel profiler replays one op on the same buffers: a working set within the L2
    streams at the L2's rate; a replay's set is all its kernels' bytes together."""
    p = execution.params_for(GpuParams, H200)

    def kernel(nbytes):
        return Kernel((Op("copy", OpClass.MATMUL, flops=1.0, weight_bytes=float(nbytes)),))

    def stream(nbytes, warm):
        return float(kernel_times(kernel(nbytes), H200, p, warm_l2=warm)[3])

    small = 0.4 * p.l2_bytes
    eta, lat = p.hbm_efficiency, p.kernel_latency_s
    assert stream(small, True) == pytest.approx(lat + small / (eta * p.l2_bytes_per_s))
    assert stream(small, False) == pytest.approx(lat + small / (eta * H200.hbm.bandwidth_bytes_per_s))
    assert stream(small, True) < stream(small, False)
    assert float(replay_bytes([kernel(small)] * 3)) == pytest.approx(3 * small)
    assert float(replay_bytes([kernel(small)] * 3)) > p.l2_bytes  # together they do not fit


def test_attention_rows_run_warm_and_moe_rows_cold(monkeypatch):
    """The attention collectors replay one KV cache (warm where it fits); the MoE collector
    routes anew each iteration, so its rows do not depend on the L2."""
    rows = {r["id"]: r for r in v.load_cases()}
    attn = rows["aic-h100-sglang-attn-llama-3.1-70b-tp8-b16-c4095"]  # 33.5 MB of KV: fits
    wide = rows["aic-h100-sglang-attn-llama-3.1-8b-tp1-b16-c1023"]  # 67 MB: does not
    moe = rows["aic-h100-sglang-moe-deepseek-v3-tp8-n1"]
    with calibration.use(None):
        warm = {r["id"]: v.run_case(r).simulated for r in (attn, wide, moe)}
        monkeypatch.setattr(v, "WARM_L2_KERNELS", ())
        cold = {r["id"]: v.run_case(r).simulated for r in (attn, wide, moe)}
    assert warm[attn["id"]] < 0.8 * cold[attn["id"]]
    assert warm[wide["id"]] == cold[wide["id"]]
    assert warm[moe["id"]] == cold[moe["id"]]
