"""Parameter counts from a ModelSpec: total, active per token, and by component.

Counted from the shapes the HuggingFace modeling code instantiates (weights, biases, norm scales,
router and per-head buffers such as attention sinks or Mamba's A_log/D/dt_bias). Active parameters
are those a token's forward pass touches: every non-MoE weight, the router, the shared experts and
top_k routed experts. The input embedding is a gather of one row per token; publishers differ on
whether they count it as active, so `active_params(..., input_embedding=...)` makes that explicit.
MTP modules (DeepSeek-V3, MiniMax-M2) are counted only with include_mtp=True: they are not part
of the main model's forward pass and the published totals leave them out.
"""

from __future__ import annotations

from workloads.spec import FFN, AttentionSpec, LayerSpec, Mixer, ModelSpec, part

# Components of a layer; also the tensor classes weight_bytes prices.
COMPONENTS = (
    "attention",
    "linear_attention",
    "mamba",
    "norms",
    "dense_ffn",
    "router",
    "shared_experts",
    "routed_experts",
)


def attention_params(a: AttentionSpec, hidden: int) -> int:
    if a.mla:
        return _mla_params(a, hidden)
    q_out = a.num_heads * a.head_dim * (2 if a.output_gate else 1)
    kv = a.num_kv_heads * a.head_dim + a.num_kv_heads * a.v_head_dim
    n = hidden * (q_out + kv) + a.num_heads * a.v_head_dim * hidden
    if a.qkv_bias:
        n += q_out + kv
    if a.o_bias:
        n += hidden
    if a.qk_norm:
        n += 2 * a.head_dim
    if a.sinks:
        n += a.num_heads
    return n


def _mla_params(a: AttentionSpec, hidden: int) -> int:
    """DeepSeek-V3 MLA: q_a_proj, q_a_layernorm, q_b_proj (or q_proj), kv_a_proj_with_mqa,
    kv_a_layernorm, kv_b_proj, o_proj."""
    nope, rope, lat = a.mla_dims
    qk = nope + rope
    if a.q_lora_rank:
        q = hidden * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * a.num_heads * qk
    else:
        q = hidden * a.num_heads * qk
    kv_a = hidden * (lat + rope) + lat
    kv_b = lat * a.num_heads * (nope + a.v_head_dim)
    return q + kv_a + kv_b + a.num_heads * a.v_head_dim * hidden


def linear_attention_params(spec: ModelSpec) -> int:
    """Qwen3-Next gated DeltaNet: in_proj_qkvz, in_proj_ba, conv1d (no bias) over q, k, v,
    dt_bias and A_log per value head, a gated RMSNorm of value_head_dim, out_proj."""
    la, h = part(spec.linear_attention, "linear attention"), spec.hidden_size
    key_dim = la.num_key_heads * la.key_head_dim
    value_dim = la.num_value_heads * la.value_head_dim
    conv_dim = 2 * key_dim + value_dim
    return (
        h * (2 * key_dim + 2 * value_dim)
        + h * 2 * la.num_value_heads
        + conv_dim * la.conv_kernel
        + 2 * la.num_value_heads
        + la.value_head_dim
        + value_dim * h
    )


def mamba_params(spec: ModelSpec) -> int:
    """Mamba-2 mixer (NemotronHMamba2Mixer): in_proj to (z, x, B, C, dt), depthwise conv1d with
    bias over (x, B, C), dt_bias, A_log and D per head, a gated RMSNorm of d_inner, out_proj."""
    m, h = part(spec.mamba, "Mamba-2 mixer"), spec.hidden_size
    d_inner = m.num_heads * m.head_dim
    bc = 2 * m.n_groups * m.state_size
    conv_dim = d_inner + bc
    return (
        h * (2 * d_inner + bc + m.num_heads)
        + conv_dim * (m.conv_kernel + 1)
        + 3 * m.num_heads
        + d_inner
        + d_inner * h
    )


def expert_params(spec: ModelSpec) -> int:
    """One routed expert (gpt-oss adds biases: gate_up 2*inter, down hidden)."""
    moe, h = part(spec.moe, "MoE"), spec.hidden_size
    n = moe.expert_matrices * h * moe.expert_intermediate
    if moe.expert_bias:
        n += (moe.expert_matrices - 1) * moe.expert_intermediate + h
    return n


def _router_params(spec: ModelSpec) -> int:
    moe = part(spec.moe, "MoE")
    return spec.hidden_size * moe.num_experts + (moe.num_experts if moe.router_bias else 0)


def _shared_params(spec: ModelSpec) -> int:
    moe, h = part(spec.moe, "MoE"), spec.hidden_size
    return 3 * h * moe.shared_intermediate + (h if moe.shared_expert_gate else 0)


def layer_params(spec: ModelSpec, layer: LayerSpec, active: bool = False) -> dict[str, int]:
    """Parameters of one layer by component; `active`: routed experts count top_k only."""
    h = spec.hidden_size
    out = dict.fromkeys(COMPONENTS, 0)
    if layer.mixer in (Mixer.FULL_ATTENTION, Mixer.SLIDING_ATTENTION):
        out["attention"] = attention_params(part(spec.attention, "attention"), h)
    elif layer.mixer is Mixer.LINEAR_ATTENTION:
        out["linear_attention"] = linear_attention_params(spec)
    elif layer.mixer is Mixer.MAMBA2:
        out["mamba"] = mamba_params(spec)
    # One RMSNorm scale in front of each sub-block (input_layernorm, post_attention_layernorm).
    out["norms"] = h * ((layer.mixer is not Mixer.NONE) + (layer.ffn is not FFN.NONE))
    if spec.sandwich_norms:  # and one after each (Gemma 2/3)
        out["norms"] *= 2
    if spec.norm_bias:  # LayerNorm: a bias beside each scale (StarCoder2)
        out["norms"] *= 2
    if layer.ffn is FFN.DENSE:
        out["dense_ffn"] = spec.ffn_matrices * h * spec.intermediate_size
        if spec.ffn_bias:  # one bias per output: the up (and gate) widths and the down's hidden
            out["dense_ffn"] += (spec.ffn_matrices - 1) * spec.intermediate_size + h
    elif layer.ffn is FFN.MOE:
        moe = part(spec.moe, "MoE")
        experts = moe.top_k if active else moe.num_experts
        out["router"] = _router_params(spec)
        out["shared_experts"] = _shared_params(spec)
        out["routed_experts"] = experts * expert_params(spec)
    return out


def embedding_params(spec: ModelSpec) -> int:
    return spec.vocab_size * spec.hidden_size


def lm_head_params(spec: ModelSpec) -> int:
    """Zero when tied: the head reuses the embedding matrix."""
    return 0 if spec.tie_embeddings else spec.vocab_size * spec.hidden_size


def mtp_params(spec: ModelSpec, active: bool = False) -> int:
    """DeepSeek-V3 style MTP modules: enorm, hnorm, eh_proj (2h -> h) and one decoder layer like
    the model's last, sharing the embedding and output head with the main model (so the copies the
    HF checkpoint stores in its extra layer are not counted again)."""
    if not spec.mtp_layers:
        return 0
    h = spec.hidden_size
    block = sum(layer_params(spec, spec.layers[-1], active).values())
    return spec.mtp_layers * (2 * h + 2 * h * h + block)


def param_breakdown(spec: ModelSpec, active: bool = False) -> dict[str, int]:
    """Whole-model parameters by component (plus embedding, lm_head, final_norm, mtp)."""
    total = dict.fromkeys(COMPONENTS, 0)
    for layer in spec.layers:
        for k, v in layer_params(spec, layer, active).items():
            total[k] += v
    total["embedding"] = embedding_params(spec)
    total["lm_head"] = lm_head_params(spec)
    total["final_norm"] = spec.hidden_size * (2 if spec.norm_bias else 1)
    total["mtp"] = mtp_params(spec, active)
    return total


def total_params(spec: ModelSpec, include_mtp: bool = False) -> int:
    parts = param_breakdown(spec)
    return sum(parts.values()) - (0 if include_mtp else parts["mtp"])


def active_params(
    spec: ModelSpec,
    include_mtp: bool = False,
    input_embedding: bool = True,
    output_embedding: bool = True,
) -> int:
    """Parameters one token touches. `input_embedding=False` leaves out the embedding table
    (OpenAI's gpt-oss model card counts only the unembedding as active); a tied head is then
    still counted once, as the unembedding. `output_embedding=False` leaves out the unembedding
    too (a non-embedding count)."""
    parts = param_breakdown(spec, active=True)
    n = sum(parts.values()) - (0 if include_mtp else parts["mtp"])
    if not input_embedding and not spec.tie_embeddings:
        n -= parts["embedding"]
    if not output_embedding:
        n -= parts["lm_head"] if not spec.tie_embeddings else parts["embedding"]
    return n
