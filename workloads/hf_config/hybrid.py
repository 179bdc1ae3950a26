"""Importers of the hybrid stacks, attention beside another mixer: qwen3_next (Gated DeltaNet
linear attention and gated full attention, MoE layers) and nemotron_h (Mamba-2, attention and MLP
blocks).
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
)
from workloads.spec import (
    FFN,
    AttentionSpec,
    LayerSpec,
    LinearAttentionSpec,
    Mamba2Spec,
    Mixer,
    ModelSpec,
    MoESpec,
)


@register("qwen3_next", context=32768)  # Qwen3NextConfig
def _qwen3_next(c: Cfg, name: str) -> ModelSpec:
    """Gated DeltaNet + gated full attention, all layers MoE with one gated shared expert.
    `layer_types` when present, else every `full_attention_interval`-th layer is full attention
    (layer i full iff (i + 1) % interval == 0, Qwen3NextConfig)."""
    n = c.size("num_hidden_layers")
    interval = c.size("full_attention_interval", 4)
    rule = lambda i: "full_attention" if (i + 1) % interval == 0 else "linear_attention"
    mixers = layer_pattern(c, n, rule, ("full_attention", "linear_attention"))
    layers = tuple(LayerSpec(m, qwen_moe_ffn(c, i)) for i, m in enumerate(mixers))
    shared = c.get("shared_expert_intermediate_size", 0)
    moe = MoESpec(
        num_experts=c.size("num_experts"),
        top_k=c.size("num_experts_per_tok"),
        expert_intermediate=c.size("moe_intermediate_size"),
        num_shared_experts=1 if shared else 0,
        shared_intermediate=shared,
        shared_expert_gate=bool(shared),
    )
    linear = LinearAttentionSpec(
        num_key_heads=c.size("linear_num_key_heads"),
        num_value_heads=c.size("linear_num_value_heads"),
        key_head_dim=c.size("linear_key_head_dim"),
        value_head_dim=c.size("linear_value_head_dim"),
        conv_kernel=c.size("linear_conv_kernel_dim", 4),
    )
    head_dim = c.size("head_dim")
    rotary = int(head_dim * c.get("partial_rotary_factor", 1.0))
    attention = gqa(c, qk_norm=True, output_gate=True, rotary_dim=rotary)
    return base(
        c, name, layers, attention=attention, moe=moe, linear_attention=linear,
        intermediate_size=dense_width(c, layers),
        mtp_layers=c.count("num_nextn_predict_layers", 0),
    )


_NEMOTRON_BLOCKS = {
    "M": LayerSpec(Mixer.MAMBA2, FFN.NONE),
    "*": LayerSpec(Mixer.FULL_ATTENTION, FFN.NONE),
    "-": LayerSpec(Mixer.NONE, FFN.DENSE),
    "E": LayerSpec(Mixer.NONE, FFN.MOE),
}


@register("nemotron_h", context=4096)  # NemotronHConfig
def _nemotron_h(c: Cfg, name: str) -> ModelSpec:
    """Nemotron-H: each layer is ONE block (a pre-norm and a residual around it), chosen by the
    characters of `hybrid_override_pattern`: M Mamba-2, * attention, - MLP, E MoE. The MLP is
    non-gated squared ReLU (`mlp_hidden_act` relu2): two matrices."""
    pattern = str(c.req("hybrid_override_pattern"))
    n = c.size("num_hidden_layers")
    bad = sorted(set(pattern) - set(_NEMOTRON_BLOCKS))
    if bad or len(pattern) != n:
        what = f"unknown block {bad[0]!r}" if bad else f"{len(pattern)} blocks for {n} layers"
        raise c.fail(f"field 'hybrid_override_pattern': {what}; accepted: M * - E")
    if "E" in pattern:
        raise c.fail("field 'hybrid_override_pattern': MoE blocks (E) are not supported yet")
    layers = tuple(_NEMOTRON_BLOCKS[ch] for ch in pattern)
    heads = c.size("num_attention_heads")
    head_dim = c.size("attention_head_dim", c.size("head_dim", c.size("hidden_size") // heads))
    attention = AttentionSpec(
        num_heads=heads,
        num_kv_heads=c.size("num_key_value_heads", heads),
        head_dim=head_dim,
        v_head_dim=head_dim,
    )
    mamba = Mamba2Spec(
        num_heads=c.size("mamba_num_heads"),
        head_dim=c.size("mamba_head_dim"),
        state_size=c.size("ssm_state_size"),
        n_groups=c.size("n_groups"),
        conv_kernel=c.size("conv_kernel", 4),
        expand=c.size("expand", 2),
    )
    gated = c.get("mlp_hidden_act", "relu2") not in ("relu2", "squared_relu")
    return base(
        c, name, layers, attention=attention, mamba=mamba,
        intermediate_size=c.size("intermediate_size"), ffn_matrices=3 if gated else 2,
    )
