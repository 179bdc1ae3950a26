"""Importers of the mixture-of-experts families with softmax attention: mixtral, qwen3_moe,
gpt_oss, minimax_m2, llama4 (interleaved MoE and dense layers, a nested text config), qwen2_moe
and glm4_moe.
"""

from __future__ import annotations

from workloads.hf_config.common import (
    Cfg,
    base,
    dense_width,
    gqa,
    layer_pattern,
    qwen_moe_ffn,
    register,
    sliding_window,
    top_k_of,
    uniform,
)
from workloads.spec import FFN, LayerSpec, Mixer, ModelSpec, MoESpec


@register("mixtral", context=4096 * 32)  # MixtralConfig
def _mixtral(c: Cfg, name: str) -> ModelSpec:
    window = sliding_window(c)
    mixer = Mixer.SLIDING_ATTENTION if window else Mixer.FULL_ATTENTION
    moe = MoESpec(
        num_experts=c.size("num_local_experts"),
        top_k=c.size("num_experts_per_tok"),
        expert_intermediate=c.size("intermediate_size"),
    )
    return base(
        c,
        name,
        uniform(c, mixer, FFN.MOE),
        attention=gqa(c, sliding_window=window),
        moe=moe,
    )


@register("qwen3_moe", context=32768)  # Qwen3MoeConfig
def _qwen3_moe(c: Cfg, name: str) -> ModelSpec:
    layers = tuple(
        LayerSpec(Mixer.FULL_ATTENTION, qwen_moe_ffn(c, i))
        for i in range(c.size("num_hidden_layers"))
    )
    moe = MoESpec(
        num_experts=c.size("num_experts"),
        top_k=c.size("num_experts_per_tok"),
        expert_intermediate=c.size("moe_intermediate_size"),
    )
    return base(c, name, layers, attention=gqa(c, qk_norm=True), moe=moe,
                intermediate_size=dense_width(c, layers))


@register("gpt_oss", context=131072)  # GptOssConfig
def _gpt_oss(c: Cfg, name: str) -> ModelSpec:
    """Alternating sliding (window `sliding_window`) and full attention by `layer_types`, learned
    sinks per head, biases on attention and experts (MXFP4 experts: quantization_config mxfp4)."""
    n = c.size("num_hidden_layers")
    rule = lambda i: "sliding_attention" if i % 2 == 0 else "full_attention"
    layers = tuple(LayerSpec(m, FFN.MOE) for m in layer_pattern(c, n, rule))
    moe = MoESpec(
        num_experts=c.size("num_local_experts"),
        # gpt-oss configs carry both names; older ones only experts_per_token.
        top_k=c.size("num_experts_per_tok" if "num_experts_per_tok" in c.data
                     else "experts_per_token"),
        expert_intermediate=c.size("intermediate_size"),
        router_bias=True,
        expert_bias=True,
    )
    attention = gqa(c, sliding_window=c.size("sliding_window"), sinks=True, qkv_bias=True,
                    o_bias=True)
    return base(c, name, layers, attention=attention, moe=moe)


# minimax: the name some ports register; the Hub config says minimax_m2
@register("minimax_m2", "minimax", context=196608)  # MiniMaxM2Config
def _minimax_m2(c: Cfg, name: str) -> ModelSpec:
    """MiniMax-M2: GQA with per-layer q/k RMSNorm and partial rope (`rotary_dim`), 256 routed
    experts (sigmoid routing with a score-correction bias), `num_mtp_modules` MTP modules.
    `attn_type_list` 1 = softmax attention (0 would be MiniMax-01's lightning attention)."""
    n = c.size("num_hidden_layers")
    kinds = c.per_layer("attn_type_list", n) if c.get("attn_type_list") is not None else [1]
    if any(k != 1 for k in kinds):
        raise c.fail("field 'attn_type_list': only softmax attention (1) is supported")
    moe = MoESpec(
        num_experts=c.size("num_local_experts"),
        top_k=c.size("num_experts_per_tok"),
        expert_intermediate=c.size("intermediate_size"),
        num_shared_experts=1 if c.get("shared_intermediate_size", 0) else 0,
        shared_intermediate=c.get("shared_intermediate_size", 0),
        router_bias=c.flag("use_routing_bias", False),
    )
    attention = gqa(c, qk_norm=c.flag("use_qk_norm", False), rotary_dim=c.size("rotary_dim", None))
    mtp = c.get("num_mtp_modules", 0) if c.flag("use_mtp", False) else 0
    return base(
        c, name, uniform(c, Mixer.FULL_ATTENTION, FFN.MOE), attention=attention, moe=moe,
        mtp_layers=mtp,
    )


# --- 2025 families: interleaved MoE, nested text configs ---------------------------------------


# llama4_text: text-only export: the same keys, not nested. The context default is
# Llama4TextConfig's (the text model of Llama4Config)
@register("llama4", "llama4_text", context=4096 * 32)
def _llama4(c: Cfg, name: str) -> ModelSpec:
    """Llama 4 (Llama4TextConfig under `text_config`). MoE layers: `moe_layers`, else every
    `interleave_moe_layer_step`-th layer (i = step-1, 2*step-1, ...); the others are dense MLPs of
    `intermediate_size_mlp`. Each MoE layer has one shared expert as wide as a routed one. RoPE
    layers (`no_rope_layers[i]` 1; default: all but every `no_rope_layer_interval`-th) use chunked
    attention over `attention_chunk_size` tokens; NoPE layers attend globally.

    Chunked attention is costed as a sliding window of the chunk size: the cache such a layer
    holds is at most one chunk, as for a window, but a token at position p attends p mod C + 1
    keys where a window reads min(p + 1, C), so attention reads of those layers are an upper
    bound (up to 2x at long context). The query/key L2 norm of `use_qk_norm` has no weights and
    is not counted."""
    t = c.nested("text_config", "llama4_text")
    n = t.size("num_hidden_layers")
    step = t.size("interleave_moe_layer_step", 1)
    moe_layers = (t.layer_indices("moe_layers", n) if t.get("moe_layers") is not None
                  else set(range(step - 1, n, step)))
    interval = t.size("no_rope_layer_interval", 4)
    rope = (t.per_layer("no_rope_layers", n) if t.get("no_rope_layers")
            else [int((i + 1) % interval != 0) for i in range(n)])
    chunk = t.size("attention_chunk_size") if t.get("attention_chunk_size") is not None else None
    local = Mixer.SLIDING_ATTENTION if chunk else Mixer.FULL_ATTENTION
    layers = tuple(
        LayerSpec(local if rope[i] else Mixer.FULL_ATTENTION,
                  FFN.MOE if i in moe_layers else FFN.DENSE)
        for i in range(n)
    )
    width = t.size("intermediate_size")
    moe = MoESpec(
        num_experts=t.size("num_local_experts"),
        top_k=top_k_of(t, "num_local_experts"),
        expert_intermediate=width,
        num_shared_experts=1,
        shared_intermediate=width,
    )
    return base(
        t, name, layers, attention=gqa(t, sliding_window=chunk), moe=moe,
        intermediate_size=dense_width(t, layers, "intermediate_size_mlp"),
    )


@register("qwen2_moe", context=32768)  # Qwen2MoeConfig
def _qwen2_moe(c: Cfg, name: str) -> ModelSpec:
    """Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): q/k/v biases, sparse layers by the Qwen rule,
    one sigmoid-gated shared expert of its own width `shared_expert_intermediate_size`."""
    n = c.size("num_hidden_layers")
    layers = tuple(LayerSpec(Mixer.FULL_ATTENTION, qwen_moe_ffn(c, i)) for i in range(n))
    shared = c.count("shared_expert_intermediate_size", 0)
    moe = MoESpec(
        num_experts=c.size("num_experts"),
        top_k=top_k_of(c, "num_experts"),
        expert_intermediate=c.size("moe_intermediate_size"),
        num_shared_experts=1 if shared else 0,
        shared_intermediate=shared,
        shared_expert_gate=bool(shared),
    )
    return base(c, name, layers, attention=gqa(c, qkv_bias=True), moe=moe,
                intermediate_size=dense_width(c, layers))


@register("glm4_moe", context=131072)  # Glm4MoeConfig
def _glm4_moe(c: Cfg, name: str) -> ModelSpec:
    """GLM-4.5 / 4.6 (Glm4MoeConfig): the first `first_k_dense_replace` layers dense, the rest
    MoE with `n_shared_experts` shared experts and sigmoid routing with a score-correction bias;
    q/k/v biases (`attention_bias`), optional q/k RMSNorm (`use_qk_norm`), rope on
    `partial_rotary_factor` of each head (default 0.5), `num_nextn_predict_layers` MTP layers."""
    n = c.size("num_hidden_layers")
    first_dense = c.count("first_k_dense_replace", 1, most=n)
    layers = tuple(LayerSpec(Mixer.FULL_ATTENTION, FFN.MOE if i >= first_dense else FFN.DENSE)
                   for i in range(n))
    head_dim = c.size("head_dim", c.size("hidden_size") // c.size("num_attention_heads"))
    shared = c.count("n_shared_experts", 1)
    width = c.size("moe_intermediate_size")
    moe = MoESpec(
        num_experts=c.size("n_routed_experts"),
        top_k=top_k_of(c, "n_routed_experts"),
        expert_intermediate=width,
        num_shared_experts=shared,
        shared_intermediate=shared * width,
        router_bias=True,  # e_score_correction_bias, always present in Glm4MoeTopkRouter
    )
    attention = gqa(
        c, qkv_bias=c.flag("attention_bias", False), qk_norm=c.flag("use_qk_norm", False),
        rotary_dim=round(head_dim * c.fraction("partial_rotary_factor", 0.5)),
    )
    return base(c, name, layers, attention=attention, moe=moe,
                intermediate_size=dense_width(c, layers),
                mtp_layers=c.count("num_nextn_predict_layers", 0))
