"""Operator graphs: structure, sharding, KV and state bytes, MoE weights, grids."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads import catalog, graph, params
from workloads.ops import CollectiveKind, OpClass, Shard, StepShape

FIELDS = ("flops", "weight_bytes", "kv_read_bytes", "kv_write_bytes", "act_in_bytes",
          "act_out_bytes")


@pytest.fixture(scope="module")
def models():
    return {n: catalog.load_model(n) for n in catalog.list_models()}


def _ops(g, name):
    return [(b, op) for b, op in g.ops() if op.name == name]


def test_llama_layer_ops_in_execution_order(models):
    g = graph.decode_graph(models["llama-3.1-8b"], 1, 100, Shard.tensor(2))
    names = [op.name for op in g.blocks[1].ops]
    assert names == [
        "input_norm", "q_proj", "k_proj", "v_proj", "rope", "attention", "o_proj",
        "attn_all_reduce", "attn_residual", "post_attention_norm", "gate_proj", "up_proj", "act",
        "down_proj", "mlp_all_reduce", "mlp_residual",
    ]
    assert [op.name for op in g.blocks[0].ops] == ["embedding", "embedding_all_reduce"]
    assert [op.name for op in g.blocks[-1].ops] == [
        "final_norm", "lm_head", "logits_all_gather", "sampling"]


@pytest.mark.parametrize("name", catalog.list_models())
def test_blocks_cover_every_layer_in_order(models, name):
    spec = models[name]
    g = graph.decode_graph(spec, 2, 512)
    layers = g.blocks[1:-1]
    assert sum(b.repeat for b in layers) == spec.num_layers
    firsts = [b.first_layer for b in layers]
    assert firsts[0] == 0 and all(
        b.first_layer + b.repeat == nxt for b, nxt in zip(layers, firsts[1:], strict=False))


def test_deepseek_blocks(models):
    g = graph.decode_graph(models["deepseek-v3"], 1, 1000)
    assert [(b.first_layer, b.repeat) for b in g.blocks[1:-1]] == [(0, 3), (3, 58)]


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_divides_matmul_weights(models, tp):
    spec = models["llama-3.1-70b"]
    one = graph.decode_graph(spec, 1, 1000)
    split = graph.decode_graph(spec, 1, 1000, Shard.tensor(tp))
    for cls in (OpClass.MATMUL, OpClass.LM_HEAD, OpClass.EMBEDDING):
        w1 = sum(b.repeat * op.weight_bytes for b, op in one.ops() if op.cls is cls)
        wt = sum(b.repeat * op.weight_bytes for b, op in split.ops() if op.cls is cls)
        assert wt == pytest.approx(w1 / tp)
    kv1, kvt = one.total("kv_read_bytes"), split.total("kv_read_bytes")
    assert kvt == pytest.approx(kv1 / tp)


def test_kv_heads_replicated_beyond_their_count(models):
    spec = models["llama-3.1-70b"]  # 8 KV heads
    g = graph.decode_graph(spec, 1, 1000, Shard.tensor(16))
    (_, k_proj), = _ops(g, "k_proj")
    assert k_proj.weight_bytes == 8192 * 128 * 2  # one full KV head per socket


def test_decode_kv_read_is_the_cache(models):
    spec = models["llama-3.1-8b"]
    g = graph.decode_graph(spec, 8, 2048)
    assert g.total("kv_read_bytes") == pytest.approx(graph.kv_cache_bytes(spec, 8, 2048))
    assert g.total("kv_write_bytes") == pytest.approx(8 * graph.kv_bytes_per_token(spec))
    assert graph.kv_bytes_per_token(spec) == 32 * 8 * 256 * 2


def test_sliding_window_caps_kv_and_contexts_are_exact(models):
    spec = models["mistral-7b"]  # every layer slides over 4096 tokens
    assert graph.kv_cache_bytes(spec, 1, 10_000) == graph.kv_cache_bytes(spec, 1, 4096)
    exact = graph.step_graph(spec, StepShape.decode_contexts((100, 8000)))
    mean = graph.decode_graph(spec, 2, 4050)
    per_token = graph.kv_bytes_per_token(spec)
    assert exact.total("kv_read_bytes") == pytest.approx((100 + 4096) * per_token)
    assert mean.total("kv_read_bytes") == pytest.approx(2 * 4050 * per_token)
    (_, att), = _ops(exact, "attention")
    # 32 heads x (2 x 128 + 2 x 128 + 5) FLOPs per (query, key) pair: 101 and 4096 keys.
    assert att.flops == pytest.approx((101 + 4096) * 32 * 517)


def test_gpt_oss_hybrid_window_kv(models):
    spec = models["gpt-oss-120b"]
    per_layer = 8 * 128 * 2
    assert graph.kv_cache_bytes(spec, 1, 1000) == pytest.approx(18 * per_layer * (1000 + 128))


def test_prefill_causal_half_square_and_last_token_logits(models):
    spec = models["llama-3.1-8b"]
    g = graph.prefill_graph(spec, 2, 1000)
    (_, att), = _ops(g, "attention")
    assert att.flops == pytest.approx(2 * 1000 * 1001 / 2 * 32 * 517)
    assert att.kv_read_bytes == 0 and att.kv_write_bytes == 2 * 1000 * 8 * 256 * 2
    (_, head), = _ops(g, "lm_head")
    assert head.flops == 2 * 2 * 4096 * 128256  # two sequences, their last token each
    (_, head), = _ops(graph.step_graph(spec, StepShape("decode", 2, 4, 100)), "lm_head")
    assert head.flops == 2 * 8 * 4096 * 128256  # every new token of a verification step


def test_mla_decode_absorbed_latent_cache(models):
    spec = models["deepseek-v3"]
    one = graph.decode_graph(spec, 4, 1000)
    names = [op.name for op in one.blocks[1].ops]
    assert "q_absorb" in names and "v_up_proj" in names and "kv_b_proj" not in names
    assert "kv_b_proj" in [op.name for op in graph.prefill_graph(spec, 1, 64).blocks[1].ops]
    assert one.total("kv_read_bytes") == pytest.approx(61 * 4 * 1000 * 576 * 2)
    # The latent is shared by all heads: replicated on every attn_tp socket.
    split = graph.decode_graph(spec, 4, 1000, Shard.tensor(8))
    assert split.total("kv_read_bytes") == pytest.approx(one.total("kv_read_bytes"))


def test_distinct_experts_formula():
    assert graph.distinct_experts(8, 2, 1) == pytest.approx(2.0)
    assert graph.distinct_experts(256, 8, 2) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 2))
    assert graph.distinct_experts(256, 8, 10_000) == pytest.approx(256)


def _expert_weight_bytes(g):
    return sum(b.repeat * op.weight_bytes for b, op in g.ops() if op.cls is OpClass.EXPERT)


def test_moe_decode_reads_distinct_experts(models):
    spec = models["mixtral-8x7b"]
    per_expert = 3 * 4096 * 14336 * 2 * 32  # bytes, all 32 layers
    assert _expert_weight_bytes(graph.decode_graph(spec, 1, 100)) == pytest.approx(2 * per_expert)
    expected = 8 * (1 - 0.75**4)
    assert _expert_weight_bytes(graph.decode_graph(spec, 4, 100)) == pytest.approx(
        expected * per_expert)
    assert _expert_weight_bytes(graph.decode_graph(spec, 512, 100)) == pytest.approx(
        8 * per_expert)


def test_identical_sequences_read_one_sequences_experts(models):
    """A batch of copies (one prompt replicated, greedy decoding) routes as one sequence: the
    step reads the experts a single sequence reads, and runs every sequence's rows through them."""
    spec = models["mixtral-8x7b"]
    same = lambda b, n: graph.step_graph(spec, StepShape("decode", b, n, 100.0, identical=True))
    one = graph.decode_graph(spec, 1, 100)
    for b in (4, 64):
        assert _expert_weight_bytes(same(b, 1.0)) == pytest.approx(_expert_weight_bytes(one))
        copies, own = same(b, 1.0), graph.decode_graph(spec, b, 100)
        assert copies.total("flops") == pytest.approx(own.total("flops"))
    prompt = graph.prefill_graph(spec, 1, 3)  # a 3-token prompt: its tokens route apart
    assert _expert_weight_bytes(same(16, 3.0)) == pytest.approx(_expert_weight_bytes(prompt))
    dense = models["llama-3.1-8b"]
    assert graph.step_graph(dense, StepShape("decode", 16, 1.0, 100.0, identical=True)).total(
        "weight_bytes") == pytest.approx(graph.decode_graph(dense, 16, 100).total("weight_bytes"))


def test_expert_parallel_and_load(models):
    spec = models["deepseek-v3"]
    per_expert = params.expert_params(spec) * spec.precision.weights.bytes * 58  # FP8: 1 byte
    ep = Shard(ep=8)
    g = graph.decode_graph(spec, 4096, 100, ep)  # every expert touched
    assert _expert_weight_bytes(g) == pytest.approx(32 * per_expert)
    kinds = {op.comm.kind for _, op in g.ops() if op.comm is not None}
    assert kinds == {CollectiveKind.ALL_TO_ALL}
    small = graph.decode_graph(spec, 2, 100, ep)
    loaded = graph.decode_graph(spec, 2, 100, Shard(ep=8, expert_load=1.5))
    assert _expert_weight_bytes(loaded) == pytest.approx(1.5 * _expert_weight_bytes(small))
    assert loaded.total("flops") > small.total("flops")


def test_recurrent_state_is_fixed_per_sequence(models):
    spec = models["qwen3-next-80b-a3b"]
    short, long = graph.decode_graph(spec, 2, 100), graph.decode_graph(spec, 2, 100_000)
    lin = [op for b, op in short.ops() if op.cls is OpClass.LINEAR_ATTENTION]
    lin_long = [op for b, op in long.ops() if op.cls is OpClass.LINEAR_ATTENTION]
    assert lin and [op.kv_read_bytes for op in lin] == [op.kv_read_bytes for op in lin_long]
    # 32 value heads x 128 x 128 state at bf16, read once per sequence per step.
    assert lin[0].kv_read_bytes == 2 * 32 * 128 * 128 * 2
    grow = graph.kv_cache_bytes(spec, 1, 2000) - graph.kv_cache_bytes(spec, 1, 1000)
    assert grow == pytest.approx(1000 * 12 * 2 * 256 * 2 * 2)  # only the 12 attention layers


@pytest.mark.parametrize(
    "name", ["llama-3.1-70b", "deepseek-v3", "gpt-oss-120b", "qwen3-next-80b-a3b",
             "nemotron-h-56b", "mistral-7b"])
@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_array_grid_equals_scalar_points(models, name, phase):
    spec = models[name]
    batch = np.array([[1.0, 3.0, 64.0], [7.0, 256.0, 2.0]])
    length = np.array([[1.0, 500.0, 8000.0], [129.0, 4096.0, 33.0]])
    shard = Shard(attn_tp=4, mlp_tp=4, expert_tp=2, ep=2, vocab_tp=4)
    make = StepShape.decode if phase == "decode" else StepShape.prefill
    grid = graph.step_graph(spec, make(batch, length), shard)
    for idx in np.ndindex(batch.shape):
        point = graph.step_graph(spec, make(float(batch[idx]), float(length[idx])), shard)
        for (_, gop), (_, pop) in zip(grid.ops(), point.ops(), strict=True):
            for f in FIELDS:
                assert np.broadcast_to(getattr(gop, f), batch.shape)[idx] == pytest.approx(
                    float(getattr(pop, f))), (gop.name, f)


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 512), context=st.integers(0, 20_000), factor=st.integers(2, 5))
def test_weight_free_work_is_linear_in_batch(models, batch, context, factor):
    spec = models["gpt-oss-20b"]
    g1 = graph.decode_graph(spec, batch, context)
    gk = graph.decode_graph(spec, batch * factor, context)
    for (_, a), (_, b) in zip(g1.ops(), gk.ops(), strict=True):
        if a.cls in (OpClass.EXPERT, OpClass.COLLECTIVE):
            continue
        for f in ("flops", "kv_read_bytes", "kv_write_bytes", "act_in_bytes", "act_out_bytes"):
            assert float(getattr(b, f)) == pytest.approx(factor * float(getattr(a, f))), a.name
        if a.cls is not OpClass.EMBEDDING:
            assert float(b.weight_bytes) == pytest.approx(float(a.weight_bytes))


def test_weight_bytes_consistent_with_params(models):
    for spec in models.values():
        if spec.precision.expert_weights is None:
            assert graph.weight_bytes(spec) == pytest.approx(
                params.total_params(spec) * spec.precision.weights.bytes)


def test_prefill_reads_every_weight_once(models):
    """A long prefill touches every expert: its weight bytes are the model's, minus the unread
    embedding rows (the prompt gathers 2 x 4096 of them)."""
    spec = models["qwen3-235b-a22b"]
    g = graph.prefill_graph(spec, 2, 4096)
    unread = (params.embedding_params(spec) - 2 * 4096 * spec.hidden_size) * 2
    assert g.total("weight_bytes") == pytest.approx(graph.weight_bytes(spec) - unread, rel=1e-6)


def test_grid_is_fast(models):
    """20,000 design points of a 70B model in one evaluation (the benchmark needs 20k/s)."""
    import time

    spec = models["llama-3.1-70b"]
    rng = np.random.default_rng(0)
    b, c = rng.integers(1, 256, 20_000).astype(float), rng.integers(1, 8192, 20_000).astype(float)
    start = time.perf_counter()
    g = graph.step_graph(spec, StepShape.decode(b, c), Shard.tensor(8))
    g.total("flops")
    assert time.perf_counter() - start < 0.5


def test_fp8_weights_run_their_gemms_at_the_fp8_rate_where_the_chip_has_one():
    """FP8 checkpoints are served W8A8: their GEMMs (dense, router, experts) name fp8 math,
    which H100 runs at twice its BF16 rate and SN40L / A100 (no FP8 path) at BF16's; norms,
    attention and weight-only formats (int4, mxfp4) stay at the activations' dtype."""
    from rdu_cluster.config import load_chip
    from workloads.catalog import load_model
    from workloads.graph import prefill_graph
    from workloads.ops import OpClass
    from workloads.spec import with_dtypes

    gemms = (OpClass.MATMUL, OpClass.EXPERT, OpClass.LM_HEAD, OpClass.ROUTER)
    for model in ("llama-3.1-8b", "mixtral-8x7b"):
        for weights, expect in (("fp8", "fp8"), ("int4", "bf16"), ("bf16", "bf16")):
            g = prefill_graph(with_dtypes(load_model(model), weights, None), 1.0, 512.0)
            ops = [o for b in g.blocks for o in b.ops]
            gemm = [o.cls in gemms and float(np.max(o.weight_bytes)) > 0 for o in ops]
            assert {o.flop_dtype for o, is_gemm in zip(ops, gemm) if is_gemm} == {expect}
            assert {o.flop_dtype for o, is_gemm in zip(ops, gemm) if not is_gemm} == {"bf16"}
    h100, sn40l, a100 = (load_chip(c) for c in ("h100-sxm", "sn40l", "a100-sxm-80gb"))
    assert h100.flops("fp8") == pytest.approx(2 * h100.flops("bf16"), rel=1e-3)
    assert sn40l.flops("fp8") == sn40l.flops("bf16") and a100.flops("fp8") == a100.flops("bf16")
