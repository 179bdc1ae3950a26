"""Import a HuggingFace `config.json` into a ModelSpec.

One small importer per `model_type`, in `IMPORTERS`; adding a family is one function, one registry
entry and one test. Field names and their meaning follow the transformers configuration classes of
each family (LlamaConfig, MixtralConfig, Qwen3MoeConfig, DeepseekV3Config, GptOssConfig,
Qwen3NextConfig, NemotronHConfig) and MiniMaxAI/MiniMax-M2's configuration_minimax_m2.py.
Every error is a ConfigError with a one-line message naming the field or model_type.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from workloads.dtypes import DType, Precision
from workloads.errors import ConfigError
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

_MISSING = object()


class _Cfg:
    """A config dict that names itself in errors."""

    def __init__(self, data: Mapping[str, Any], source: str, model_type: str):
        self.data, self.source, self.model_type = data, source, model_type

    def fail(self, what: str) -> ConfigError:
        return ConfigError(f"{self.source}: {what} (model_type {self.model_type})")

    def req(self, key: str) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            raise self.fail(f"missing field {key!r}")
        return value

    def size(self, key: str, default: Any = _MISSING) -> int:
        """A positive integer field; `default` makes it optional."""
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self.fail(f"missing field {key!r}")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(f"field {key!r} must be a positive integer, got {value!r}")
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value


# --- shared pieces -----------------------------------------------------------------------------


def _gqa(c: _Cfg, **extra: Any) -> AttentionSpec:
    heads = c.size("num_attention_heads")
    hidden = c.size("hidden_size")
    head_dim = c.size("head_dim", hidden // heads)
    return AttentionSpec(
        num_heads=heads,
        num_kv_heads=c.size("num_key_value_heads", heads),
        head_dim=head_dim,
        v_head_dim=head_dim,
        **extra,
    )


def _base(c: _Cfg, name: str, layers: tuple[LayerSpec, ...], **fields: Any) -> ModelSpec:
    fields.setdefault("tie_embeddings", bool(c.get("tie_word_embeddings", False)))
    return ModelSpec(
        name=name,
        family=c.model_type,
        hidden_size=c.size("hidden_size"),
        vocab_size=c.size("vocab_size"),
        layers=layers,
        max_context=c.size("max_position_embeddings", 0),
        source=c.source,
        **fields,
    )


def _uniform(c: _Cfg, mixer: Mixer, ffn: FFN) -> tuple[LayerSpec, ...]:
    return (LayerSpec(mixer, ffn),) * c.size("num_hidden_layers")


def _window(c: _Cfg) -> int | None:
    """Mistral-style configs: a non-null `sliding_window` applies to every layer unless
    `use_sliding_window` is explicitly false (Qwen2/Qwen3 keep the key but switch it off)."""
    if c.get("use_sliding_window") is False:
        return None
    window = c.get("sliding_window")
    return c.size("sliding_window") if window is not None else None


def _dense_family(c: _Cfg, name: str, **attn: Any) -> ModelSpec:
    window = _window(c)
    mixer = Mixer.SLIDING_ATTENTION if window else Mixer.FULL_ATTENTION
    return _base(
        c,
        name,
        _uniform(c, mixer, FFN.DENSE),
        attention=_gqa(c, sliding_window=window, **attn),
        intermediate_size=c.size("intermediate_size"),
    )


# --- importers, one per model_type ------------------------------------------------------------


def _llama(c: _Cfg, name: str) -> ModelSpec:
    return _dense_family(
        c,
        name,
        qkv_bias=bool(c.get("attention_bias", False)),
        o_bias=bool(c.get("attention_bias", False)),
    )


def _mistral(c: _Cfg, name: str) -> ModelSpec:
    return _dense_family(c, name)


def _qwen2(c: _Cfg, name: str) -> ModelSpec:
    # Qwen2 has biases on q/k/v (not o) by construction; no config key says so.
    return _dense_family(c, name, qkv_bias=True)


def _qwen3(c: _Cfg, name: str) -> ModelSpec:
    return _dense_family(c, name, qk_norm=True, qkv_bias=bool(c.get("attention_bias", False)))


def _mixtral(c: _Cfg, name: str) -> ModelSpec:
    window = _window(c)
    mixer = Mixer.SLIDING_ATTENTION if window else Mixer.FULL_ATTENTION
    moe = MoESpec(
        num_experts=c.size("num_local_experts"),
        top_k=c.size("num_experts_per_tok"),
        expert_intermediate=c.size("intermediate_size"),
    )
    return _base(
        c,
        name,
        _uniform(c, mixer, FFN.MOE),
        attention=_gqa(c, sliding_window=window),
        moe=moe,
    )


def _qwen_moe_ffn(c: _Cfg, layer: int) -> FFN:
    """Qwen2/3-MoE rule (modeling_qwen3_moe): layer i is sparse when it is not listed in
    `mlp_only_layers`, num_experts > 0 and (i + 1) % decoder_sparse_step == 0."""
    sparse = layer not in c.get("mlp_only_layers", []) and (layer + 1) % c.size(
        "decoder_sparse_step", 1
    ) == 0
    return FFN.MOE if sparse else FFN.DENSE


def _qwen3_moe(c: _Cfg, name: str) -> ModelSpec:
    layers = tuple(
        LayerSpec(Mixer.FULL_ATTENTION, _qwen_moe_ffn(c, i))
        for i in range(c.size("num_hidden_layers"))
    )
    moe = MoESpec(
        num_experts=c.size("num_experts"),
        top_k=c.size("num_experts_per_tok"),
        expert_intermediate=c.size("moe_intermediate_size"),
    )
    dense = c.size("intermediate_size") if FFN.DENSE in {la.ffn for la in layers} else 0
    return _base(
        c, name, layers, attention=_gqa(c, qk_norm=True), moe=moe, intermediate_size=dense
    )


def _deepseek_v3(c: _Cfg, name: str) -> ModelSpec:
    """MLA + MoE. Layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0
    (modeling_deepseek_v3). Natively FP8 (quantization_config fp8, 128x128 blocks); the import
    keeps BF16 so that FP8 is an explicit choice (see catalog.load_model)."""
    first_dense = c.get("first_k_dense_replace", 0)
    freq = c.size("moe_layer_freq", 1)
    layers = tuple(
        LayerSpec(Mixer.FULL_ATTENTION, FFN.MOE if i >= first_dense and i % freq == 0 else FFN.DENSE)
        for i in range(c.size("num_hidden_layers"))
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
    shared = c.get("n_shared_experts", 0)
    moe_inter = c.size("moe_intermediate_size")
    moe = MoESpec(
        num_experts=c.size("n_routed_experts"),
        top_k=c.size("num_experts_per_tok"),
        expert_intermediate=moe_inter,
        num_shared_experts=shared,
        shared_intermediate=shared * moe_inter,
        router_bias=c.get("topk_method") == "noaux_tc",  # e_score_correction_bias
    )
    return _base(
        c,
        name,
        layers,
        attention=attention,
        moe=moe,
        intermediate_size=c.size("intermediate_size"),
        mtp_layers=c.get("num_nextn_predict_layers", 0),
    )


def _gpt_oss(c: _Cfg, name: str) -> ModelSpec:
    """Alternating sliding (window `sliding_window`) and full attention by `layer_types`, learned
    sinks per head, biases on attention and experts, MXFP4 experts when the checkpoint says so."""
    n = c.size("num_hidden_layers")
    types = c.get("layer_types") or [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)
    ]
    layers = tuple(LayerSpec(_layer_type(c, t), FFN.MOE) for t in types)
    if len(layers) != n:
        raise c.fail(f"field 'layer_types' has {len(layers)} entries, num_hidden_layers is {n}")
    moe = MoESpec(
        num_experts=c.size("num_local_experts"),
        # gpt-oss configs carry both names; older ones only experts_per_token.
        top_k=c.size("num_experts_per_tok" if "num_experts_per_tok" in c.data else "experts_per_token"),
        expert_intermediate=c.size("intermediate_size"),
        router_bias=True,
        expert_bias=True,
    )
    attention = _gqa(c, sliding_window=c.size("sliding_window"), sinks=True, qkv_bias=True,
                     o_bias=True)
    quant = c.get("quantization_config", {})
    experts = DType.MXFP4 if quant.get("quant_method") == "mxfp4" else None
    return _base(
        c, name, layers, attention=attention, moe=moe,
        precision=Precision(expert_weights=experts),
    )


def _layer_type(c: _Cfg, text: str) -> Mixer:
    kinds = {
        "full_attention": Mixer.FULL_ATTENTION,
        "sliding_attention": Mixer.SLIDING_ATTENTION,
        "linear_attention": Mixer.LINEAR_ATTENTION,
    }
    if text not in kinds:
        raise c.fail(f"field 'layer_types': unknown {text!r}; accepted: {', '.join(kinds)}")
    return kinds[text]


def _minimax_m2(c: _Cfg, name: str) -> ModelSpec:
    """MiniMax-M2: GQA with per-layer q/k RMSNorm and partial rope (`rotary_dim`), 256 routed
    experts (sigmoid routing with a score-correction bias), `num_mtp_modules` MTP modules.
    `attn_type_list` 1 = softmax attention (0 would be MiniMax-01's lightning attention)."""
    n = c.size("num_hidden_layers")
    kinds = c.get("attn_type_list", [1] * n)
    if any(k != 1 for k in kinds):
        raise c.fail("field 'attn_type_list': only softmax attention (1) is supported")
    moe = MoESpec(
        num_experts=c.size("num_local_experts"),
        top_k=c.size("num_experts_per_tok"),
        expert_intermediate=c.size("intermediate_size"),
        num_shared_experts=1 if c.get("shared_intermediate_size", 0) else 0,
        shared_intermediate=c.get("shared_intermediate_size", 0),
        router_bias=bool(c.get("use_routing_bias", False)),
    )
    attention = _gqa(c, qk_norm=bool(c.get("use_qk_norm", False)), rotary_dim=c.get("rotary_dim"))
    mtp = c.get("num_mtp_modules", 0) if c.get("use_mtp", False) else 0
    return _base(
        c, name, _uniform(c, Mixer.FULL_ATTENTION, FFN.MOE), attention=attention, moe=moe,
        mtp_layers=mtp,
    )


def _qwen3_next(c: _Cfg, name: str) -> ModelSpec:
    """Gated DeltaNet + gated full attention, all layers MoE with one gated shared expert.
    `layer_types` when present, else every `full_attention_interval`-th layer is full attention
    (layer i full iff (i + 1) % interval == 0, Qwen3NextConfig)."""
    n = c.size("num_hidden_layers")
    interval = c.size("full_attention_interval", 4)
    types = c.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
    ]
    layers = tuple(LayerSpec(_layer_type(c, t), _qwen_moe_ffn(c, i)) for i, t in enumerate(types))
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
    attention = _gqa(c, qk_norm=True, output_gate=True, rotary_dim=rotary)
    dense = c.size("intermediate_size") if FFN.DENSE in {la.ffn for la in layers} else 0
    return _base(
        c, name, layers, attention=attention, moe=moe, linear_attention=linear,
        intermediate_size=dense, mtp_layers=c.get("num_nextn_predict_layers", 0),
    )


_NEMOTRON_BLOCKS = {
    "M": LayerSpec(Mixer.MAMBA2, FFN.NONE),
    "*": LayerSpec(Mixer.FULL_ATTENTION, FFN.NONE),
    "-": LayerSpec(Mixer.NONE, FFN.DENSE),
    "E": LayerSpec(Mixer.NONE, FFN.MOE),
}


def _nemotron_h(c: _Cfg, name: str) -> ModelSpec:
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
    head_dim = c.size("attention_head_dim", c.get("head_dim", c.size("hidden_size") // heads))
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
    return _base(
        c, name, layers, attention=attention, mamba=mamba,
        intermediate_size=c.size("intermediate_size"), ffn_matrices=3 if gated else 2,
    )


IMPORTERS: dict[str, Callable[[_Cfg, str], ModelSpec]] = {
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v3": _deepseek_v3,
    "gpt_oss": _gpt_oss,
    "minimax": _minimax_m2,  # the name some ports register; the Hub config says minimax_m2
    "minimax_m2": _minimax_m2,
    "qwen3_next": _qwen3_next,
    "nemotron_h": _nemotron_h,
}


def supported_model_types() -> list[str]:
    return sorted(IMPORTERS)


def read_config(path: str | Path) -> dict[str, Any]:
    """A config.json (or a directory holding one) as a dict; ConfigError naming the file."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: malformed JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object, got {type(data).__name__}")
    return data


def from_hf_config(
    config: str | Path | Mapping[str, Any],
    name: str | None = None,
    precision: Precision | None = None,
) -> ModelSpec:
    """A ModelSpec from a config.json path, a directory with one, or its dict.

    `name` defaults to the catalog name in `_rdu.name`, else `_name_or_path`, else the model_type.
    `precision`, when given, replaces the importer's default (BF16, gpt-oss experts MXFP4)."""
    if isinstance(config, Mapping):
        data, source = config, "config.json"
    else:
        data, source = read_config(config), str(config)
    model_type = data.get("model_type")
    if model_type not in IMPORTERS:
        raise ConfigError(
            f"{source}: unknown model_type {model_type!r}; "
            f"supported: {', '.join(supported_model_types())}"
        )
    meta = data.get("_rdu", {})
    name = name or meta.get("name") or data.get("_name_or_path") or model_type
    spec = IMPORTERS[model_type](_Cfg(data, source, model_type), name)
    return spec.with_precision(precision) if precision is not None else spec
