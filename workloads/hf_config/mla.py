"""Importers of DeepSeek's multi-head latent attention (MLA) with MoE: deepseek_v3 and
deepseek_v2, one layout (`_mla_moe`) with group-limited routing (`_check_groups`,
`_routing_groups`).
"""

from __future__ import annotations

from workloads.hf_config.common import Cfg, base, dense_width, register, top_k_of
from workloads.spec import FFN, AttentionSpec, LayerSpec, Mixer, ModelSpec, MoESpec


@register("deepseek_v3", context=4096)  # DeepseekV3Config
def _deepseek_v3(c: Cfg, name: str) -> ModelSpec:
    """MLA + MoE with a multi-token-prediction module; natively FP8 (quantization_config fp8,
    128x128 blocks), which sets the weight dtype."""
    return _mla_moe(c, name)


@register("deepseek_v2", context=2048)  # DeepseekV2Config
def _deepseek_v2(c: Cfg, name: str) -> ModelSpec:
    """DeepSeek-V2 / V2-Lite: the same MLA + MoE layout as V3 without MTP and with softmax
    greedy routing (topk_method greedy / group_limited_greedy: no score-correction bias);
    V2-Lite projects q directly (q_lora_rank null)."""
    return _mla_moe(c, name)


def _mla_moe(c: Cfg, name: str) -> ModelSpec:
    """Layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0
    (modeling_deepseek_v2 / _v3); n_shared_experts shared experts of moe_intermediate_size."""
    n = c.size("num_hidden_layers")
    first_dense = c.count("first_k_dense_replace", 0, most=n)
    freq = c.size("moe_layer_freq", 1)
    layers = tuple(
        LayerSpec(Mixer.FULL_ATTENTION,
                  FFN.MOE if i >= first_dense and i % freq == 0 else FFN.DENSE)
        for i in range(n)
    )
    rope, nope = c.size("qk_rope_head_dim"), c.size("qk_nope_head_dim")
    q_lora = c.get("q_lora_rank")
    attention = AttentionSpec(
        num_heads=c.size("num_attention_heads"),
        num_kv_heads=c.size("num_attention_heads"),  # every head has its own (up-projected) k/v
        head_dim=rope + nope,
        v_head_dim=c.size("v_head_dim"),
        mla=True,
        q_lora_rank=c.size("q_lora_rank") if q_lora is not None else None,
        kv_lora_rank=c.size("kv_lora_rank"),
        qk_rope_head_dim=rope,
        qk_nope_head_dim=nope,
        rotary_dim=rope,
    )
    shared = c.count("n_shared_experts", 0)
    moe_inter = c.size("moe_intermediate_size")
    _check_groups(c)
    groups, picked = _routing_groups(c)
    moe = MoESpec(
        num_experts=c.size("n_routed_experts"),
        top_k=top_k_of(c, "n_routed_experts"),
        expert_intermediate=moe_inter,
        num_shared_experts=shared,
        shared_intermediate=shared * moe_inter,
        router_bias=c.get("topk_method") == "noaux_tc",  # e_score_correction_bias
        expert_groups=groups,
        topk_groups=picked,
    )
    return base(
        c,
        name,
        layers,
        attention=attention,
        moe=moe,
        intermediate_size=dense_width(c, layers),
        mtp_layers=c.count("num_nextn_predict_layers", 0),
    )


def _check_groups(c: Cfg) -> None:
    """Group-limited routing (DeepSeek V2 group_limited_greedy, V3 noaux_tc): the routed experts
    fall in n_group groups, a token picks topk_group of them and its top_k experts within
    those (modeling_deepseek_v2/_v3 MoEGate): each count must fit in the one before."""
    if c.get("n_group") is None and c.get("topk_group") is None:
        return
    experts, groups = c.size("n_routed_experts"), c.size("n_group", 1)
    picked = c.size("topk_group", groups)
    if picked > groups:
        raise c.fail(f"field 'topk_group' ({picked}) exceeds n_group ({groups}): a token's "
                     "experts come from topk_group of the n_group groups")
    if experts % groups:
        raise c.fail(f"field 'n_group' ({groups}) must divide n_routed_experts ({experts})")
    top_k = c.size("num_experts_per_tok")
    if top_k > picked * (experts // groups):
        raise c.fail(f"field 'num_experts_per_tok' ({top_k}) exceeds the {picked} x "
                     f"{experts // groups} experts of the topk_group groups a token picks")


def _routing_groups(c: Cfg) -> tuple[int, int]:
    """(n_group, topk_group) of a group-limited router (topk_method group_limited_greedy or
    noaux_tc); plain "greedy" ignores n_group (modeling_deepseek_v2/_v3 MoEGate): (1, 1)."""
    if c.get("topk_method") not in ("group_limited_greedy", "noaux_tc"):
        return 1, 1
    groups = c.size("n_group", 1)
    return groups, c.size("topk_group", groups)
