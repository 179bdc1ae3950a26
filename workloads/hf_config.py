"""Import a HuggingFace `config.json` into a ModelSpec.

One small importer per `model_type`, in `IMPORTERS`; adding a family is one function, one registry
entry and one test (docs/extending.md), and a catalog file (workloads/catalog/) to name it. Field names and their meaning follow the transformers configuration classes of
each family (LlamaConfig, MixtralConfig, Qwen3MoeConfig, DeepseekV3Config, GptOssConfig,
Qwen3NextConfig, NemotronHConfig, Llama4TextConfig, Gemma2Config, Gemma3TextConfig, Phi3Config,
DeepseekV2Config, Qwen2MoeConfig, Glm4MoeConfig, Mistral3Config, Starcoder2Config) and MiniMaxAI/MiniMax-M2's
configuration_minimax_m2.py. Multimodal configs (llama4, gemma3, mistral3) nest the language model
under `text_config`; only that part is imported (the vision encoder runs once per image, outside
the decode loop this simulator costs). `quantization_config` (top level, or under
`text_config`) sets the weight dtype (see `checkpoint_precision`). Every error is a ConfigError with a one-line message naming the file and
the field or model_type.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from workloads import checks
from workloads.dtypes import DType, Precision
from workloads.errors import ConfigError
from workloads.files import read_json
from workloads.spec import (
    FFN,
    AttentionSpec,
    LayerSpec,
    LinearAttentionSpec,
    Mamba2Spec,
    Mixer,
    ModelSpec,
    MoESpec,
    check_model,
)

_MISSING = object()
# Top-level keys a nested text_config inherits when it does not set them itself.
_INHERITED = ("quantization_config", "tie_word_embeddings", "_name_or_path", "_rdu")

# The kind of every HF field the importers read other than through `size` (a positive integer),
# `count`, `fraction` or `flag` (which check their own kind): a field listed here is checked
# whichever importer reads it, and in every config.json whether read or not. A family added later
# reads its fields through those accessors; it lists a field here only to have it checked in
# configs of other families too. Names and meanings follow the transformers configuration classes.
_FLAGS = frozenset({
    "tie_word_embeddings", "attention_bias", "use_sliding_window", "use_qk_norm",
    "use_routing_bias", "use_mtp", "norm_topk_prob", "mlp_bias",
})
_COUNTS = frozenset({  # non-negative integers (0 is meaningful: no dense layer, no MTP module)
    "first_k_dense_replace", "n_shared_experts", "num_nextn_predict_layers", "num_mtp_modules",
    "shared_intermediate_size", "shared_expert_intermediate_size",
})
_INT_LISTS = frozenset({"attn_type_list"})  # mlp_only_layers: _Cfg.layer_indices
_STR_LISTS = frozenset({"layer_types"})
_TABLES = frozenset({"quantization_config", "rope_scaling", "text_config", "_rdu"})
_TEXTS = frozenset({"topk_method", "mlp_hidden_act", "hidden_act", "hybrid_override_pattern",
                    "_name_or_path", "quant_method", "name"})
_FRACTIONS = frozenset({"partial_rotary_factor"})  # in (0, 1]

# Upper bounds of sizes, far above every published model (405B: 126 layers, hidden 16384; the
# largest MoE 512 experts; vocabularies ~262k; contexts 10M), below what would exhaust memory
# building per-layer tables. A value past one is a typo or hostile input.
MAX_LAYERS = 4096
_LIMITS = {
    "num_hidden_layers": MAX_LAYERS,
    "max_position_embeddings": 2**30,
    "sliding_window": 2**30,
    "vocab_size": 2**24,
    "num_local_experts": 2**16,
    "num_experts": 2**16,
    "n_routed_experts": 2**16,
}
MAX_WIDTH = 2**20  # any other size: hidden, intermediate, heads, head and LoRA dimensions


class _Cfg:
    """A config dict that names itself in errors and checks each field it hands out."""

    def __init__(self, data: Mapping[str, Any], source: str, model_type: str):
        self.data, self.source, self.model_type = data, source, model_type

    def fail(self, what: str) -> ConfigError:
        return ConfigError(f"{self.source}: {what} (model_type {self.model_type})")

    def req(self, key: str) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            raise self.fail(f"missing field {key!r}")
        return self.get(key)

    def size(self, key: str, default: Any = _MISSING) -> int:
        """A positive integer field, at most its stated bound; `default` makes it optional."""
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self.fail(f"missing field {key!r}")
            return default
        hi = _LIMITS.get(key, MAX_WIDTH)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
            raise self.fail(f"field {key!r} must be a positive integer (at most "
                            f"{checks.show_number(hi)}), got {checks.show(value)}")
        return value

    def get(self, key: str, default: Any = None) -> Any:
        """A field of a known kind (the tables above) checked for it; others as given."""
        value = self.data.get(key)
        if value is None:
            return default
        return self._checked(key, lambda w: _kind_check(key, value, w))

    def _checked(self, key: str, check: Callable[[str], Any]) -> Any:
        try:
            return check(f"field {key!r}")
        except ConfigError as e:
            raise self.fail(str(e)) from None

    def count(self, key: str, default: int = 0, most: int | None = None) -> int:
        """A non-negative integer field (a number of layers or experts), at most `most`."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(f"field {key!r} must be a non-negative integer, got {value!r}")
        if most is not None and value > most:
            raise self.fail(f"field {key!r} is {value}, more than {most}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        """A true / false field (attention_bias, use_qk_norm, ...): checked whether or not it
        is listed in _FLAGS, so a family added later reads its own flags with this."""
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(f"field {key!r} must be true or false, got {checks.show(value)}")
        return value

    def fraction(self, key: str, default: float) -> float:
        """A share in (0, 1] (partial_rotary_factor)."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise self.fail(f"field {key!r} must be a number in (0, 1], got {value!r}")
        return float(value)

    def per_layer(self, key: str, n: int, accepted: tuple = (0, 1)) -> list:
        """A list with one entry per layer, each one of `accepted`."""
        value = self.data.get(key)
        if not isinstance(value, list) or len(value) != n:
            got = f"{len(value)} entries" if isinstance(value, list) else repr(value)
            raise self.fail(f"field {key!r} must list one entry per layer ({n}), got {got}")
        bad = [v for v in value if v not in accepted]
        if bad:
            listed = ", ".join(map(repr, accepted))
            raise self.fail(f"field {key!r}: entry {bad[0]!r}; accepted: {listed}")
        return value

    def layer_indices(self, key: str, n: int) -> set[int]:
        """A list of layer indices, each in [0, n)."""
        value = self.data.get(key)
        if not (isinstance(value, list) and all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in value)):
            raise self.fail(f"field {key!r} must list layer indices in 0..{n - 1}, got {value!r}")
        return set(value)

    def nested(self, key: str, default_type: str) -> _Cfg:
        """The `text_config` of a multimodal config, inheriting the top-level keys it lacks
        (quantization_config, tie_word_embeddings, _name_or_path); the config itself when it has
        none (text-only exports of the same family are flat)."""
        inner = self.data.get(key)
        if inner is None:
            return self
        if not isinstance(inner, Mapping):
            raise self.fail(f"field {key!r} must be a JSON object, got {type(inner).__name__}")
        merged = {"model_type": default_type} | {
            k: v for k, v in self.data.items() if k in _INHERITED} | dict(inner)
        return _Cfg(merged, f"{self.source}: {key}", self.model_type)


def _kind_check(key: str, value: Any, where: str) -> Any:
    """`value` of the known field `key` checked for its kind; `where` is "field 'key'"."""
    def want(ok: bool, what: str) -> None:
        if not ok:
            raise ConfigError(f"{where} must be {what}, got {checks.show(value)}")

    is_int = isinstance(value, int) and not isinstance(value, bool)
    if key in _FLAGS:
        want(isinstance(value, bool), "true or false")
    elif key in _COUNTS:
        want(is_int and 0 <= value <= MAX_WIDTH, "a non-negative integer (at most 2^20)")
    elif key in _INT_LISTS:
        want(isinstance(value, list) and len(value) <= MAX_LAYERS and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_LAYERS
            for v in value), "a list of integers")
    elif key in _STR_LISTS:
        want(isinstance(value, list) and len(value) <= MAX_LAYERS
             and all(isinstance(v, str) for v in value), "a list of strings")
    elif key in _TABLES:
        want(isinstance(value, Mapping), "a JSON object")
    elif key in _TEXTS:
        want(isinstance(value, str), "a string")
    elif key in _FRACTIONS:
        want(isinstance(value, (int, float)) and not isinstance(value, bool)
             and 0 < value <= 1, "a number in (0, 1]")
    return value


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
    fields.setdefault("tie_embeddings", c.flag("tie_word_embeddings", False))
    return ModelSpec(
        name=name,
        family=c.model_type,
        hidden_size=c.size("hidden_size"),
        vocab_size=c.size("vocab_size"),
        layers=layers,
        max_context=_context(c, layers),
        source=c.source,
        **fields,
    )


# transformers' default max_position_embeddings of each model_type, which its config class sets
# when a config.json leaves the key out; the class, in transformers main (2025-26), after each.
_CONTEXT_DEFAULTS = {
    "llama": 2048,  # LlamaConfig
    "mistral": 4096 * 32,  # MistralConfig
    "mixtral": 4096 * 32,  # MixtralConfig
    "qwen2": 32768,  # Qwen2Config
    "qwen3": 32768,  # Qwen3Config
    "qwen3_moe": 32768,  # Qwen3MoeConfig
    "qwen2_moe": 32768,  # Qwen2MoeConfig
    "qwen3_next": 32768,  # Qwen3NextConfig
    "deepseek_v2": 2048,  # DeepseekV2Config
    "deepseek_v3": 4096,  # DeepseekV3Config
    "gpt_oss": 131072,  # GptOssConfig
    "minimax_m2": 196608,  # MiniMaxM2Config
    "minimax": 196608,  # the same model under the name some ports register: MiniMaxM2Config's
    "nemotron_h": 4096,  # NemotronHConfig
    "llama4": 4096 * 32,  # Llama4TextConfig (the text model of Llama4Config)
    "llama4_text": 4096 * 32,  # Llama4TextConfig
    "gemma2": 8192,  # Gemma2Config
    "gemma3": 131072,  # Gemma3TextConfig (the text model of Gemma3Config)
    "gemma3_text": 131072,  # Gemma3TextConfig
    "phi3": 4096,  # Phi3Config
    "glm4_moe": 131072,  # Glm4MoeConfig
    "starcoder2": 4096,  # Starcoder2Config
}
_ATTENTION = (Mixer.FULL_ATTENTION, Mixer.SLIDING_ATTENTION)


def _context(c: _Cfg, layers: tuple[LayerSpec, ...]) -> int:
    """The context bound: `max_position_embeddings`, else the default transformers gives it for
    the model_type (a nested text model's own type first: mistral3 nests a mistral or llama
    one); 0, no bound, for a model without attention layers (a state-space stack has none)."""
    if c.data.get("max_position_embeddings") is not None:
        return c.size("max_position_embeddings")
    if not any(la.mixer in _ATTENTION for la in layers):
        return 0
    own = c.data.get("model_type")
    default = _CONTEXT_DEFAULTS.get(own if isinstance(own, str) else c.model_type,
                                    _CONTEXT_DEFAULTS.get(c.model_type))
    if default is None:
        raise c.fail("missing field 'max_position_embeddings' (no transformers default known "
                     "for this model_type)")
    return default


def _dense_width(c: _Cfg, layers: tuple[LayerSpec, ...], key: str = "intermediate_size") -> int:
    """The dense FFN width, required only when some layer has a dense FFN."""
    return c.size(key) if any(la.ffn is FFN.DENSE for la in layers) else 0


def _uniform(c: _Cfg, mixer: Mixer, ffn: FFN) -> tuple[LayerSpec, ...]:
    return (LayerSpec(mixer, ffn),) * c.size("num_hidden_layers")


def _window(c: _Cfg) -> int | None:
    """Mistral-style configs: a non-null `sliding_window` applies to every layer unless
    `use_sliding_window` is explicitly false (Qwen2/Qwen3 keep the key but switch it off)."""
    if not c.flag("use_sliding_window", True):
        return None
    window = c.get("sliding_window")
    return c.size("sliding_window") if window is not None else None


def _pattern(c: _Cfg, n: int, default: Callable[[int], str],
             accepted: tuple[str, ...] = ("full_attention", "sliding_attention")
             ) -> tuple[Mixer, ...]:
    """Per-layer attention kinds: `layer_types` when the config lists them (newer transformers
    write them out), one of the family's `accepted` kinds a layer, else its rule `default(i)`."""
    if c.get("layer_types") is None:
        return tuple(_layer_type(c, default(i)) for i in range(n))
    kinds = c.per_layer("layer_types", n, accepted)
    return tuple(_layer_type(c, k) for k in kinds)


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
        qkv_bias=c.flag("attention_bias", False),
        o_bias=c.flag("attention_bias", False),
    )


def _mistral(c: _Cfg, name: str) -> ModelSpec:
    return _dense_family(c, name)


def _qwen2(c: _Cfg, name: str) -> ModelSpec:
    # Qwen2 has biases on q/k/v (not o) by construction; no config key says so.
    return _dense_family(c, name, qkv_bias=True)


def _qwen3(c: _Cfg, name: str) -> ModelSpec:
    return _dense_family(c, name, qk_norm=True, qkv_bias=c.flag("attention_bias", False))


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
    n = c.size("num_hidden_layers")
    dense = c.layer_indices("mlp_only_layers", n) if c.get("mlp_only_layers") else set()
    sparse = layer not in dense and (layer + 1) % c.size("decoder_sparse_step", 1) == 0
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
    return _base(c, name, layers, attention=_gqa(c, qk_norm=True), moe=moe,
                 intermediate_size=_dense_width(c, layers))


def _deepseek_v3(c: _Cfg, name: str) -> ModelSpec:
    """MLA + MoE with a multi-token-prediction module; natively FP8 (quantization_config fp8,
    128x128 blocks), which sets the weight dtype."""
    return _mla_moe(c, name)


def _deepseek_v2(c: _Cfg, name: str) -> ModelSpec:
    """DeepSeek-V2 / V2-Lite: the same MLA + MoE layout as V3 without MTP and with softmax
    greedy routing (topk_method greedy / group_limited_greedy: no score-correction bias);
    V2-Lite projects q directly (q_lora_rank null)."""
    return _mla_moe(c, name)


def _mla_moe(c: _Cfg, name: str) -> ModelSpec:
    """Layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0
    (modeling_deepseek_v2 / _v3); n_shared_experts shared experts of moe_intermediate_size."""
    n = c.size("num_hidden_layers")
    first_dense = c.count("first_k_dense_replace", 0, most=n)
    freq = c.size("moe_layer_freq", 1)
    layers = tuple(
        LayerSpec(Mixer.FULL_ATTENTION, FFN.MOE if i >= first_dense and i % freq == 0 else FFN.DENSE)
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
        top_k=_top_k(c, "n_routed_experts"),
        expert_intermediate=moe_inter,
        num_shared_experts=shared,
        shared_intermediate=shared * moe_inter,
        router_bias=c.get("topk_method") == "noaux_tc",  # e_score_correction_bias
        expert_groups=groups,
        topk_groups=picked,
    )
    return _base(
        c,
        name,
        layers,
        attention=attention,
        moe=moe,
        intermediate_size=_dense_width(c, layers),
        mtp_layers=c.count("num_nextn_predict_layers", 0),
    )


def _check_groups(c: _Cfg) -> None:
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


def _routing_groups(c: _Cfg) -> tuple[int, int]:
    """(n_group, topk_group) of a group-limited router (topk_method group_limited_greedy or
    noaux_tc); plain "greedy" ignores n_group (modeling_deepseek_v2/_v3 MoEGate): (1, 1)."""
    if c.get("topk_method") not in ("group_limited_greedy", "noaux_tc"):
        return 1, 1
    groups = c.size("n_group", 1)
    return groups, c.size("topk_group", groups)


def _top_k(c: _Cfg, experts_key: str) -> int:
    top_k = c.size("num_experts_per_tok")
    if top_k > c.size(experts_key):
        raise c.fail(f"field 'num_experts_per_tok' ({top_k}) exceeds {experts_key} "
                     f"({c.size(experts_key)})")
    return top_k


def _gpt_oss(c: _Cfg, name: str) -> ModelSpec:
    """Alternating sliding (window `sliding_window`) and full attention by `layer_types`, learned
    sinks per head, biases on attention and experts (MXFP4 experts: quantization_config mxfp4)."""
    n = c.size("num_hidden_layers")
    rule = lambda i: "sliding_attention" if i % 2 == 0 else "full_attention"
    layers = tuple(LayerSpec(m, FFN.MOE) for m in _pattern(c, n, rule))
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
    return _base(c, name, layers, attention=attention, moe=moe)


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
    attention = _gqa(c, qk_norm=c.flag("use_qk_norm", False), rotary_dim=c.size("rotary_dim", None))
    mtp = c.get("num_mtp_modules", 0) if c.flag("use_mtp", False) else 0
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
    rule = lambda i: "full_attention" if (i + 1) % interval == 0 else "linear_attention"
    mixers = _pattern(c, n, rule, ("full_attention", "linear_attention"))
    layers = tuple(LayerSpec(m, _qwen_moe_ffn(c, i)) for i, m in enumerate(mixers))
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
    return _base(
        c, name, layers, attention=attention, moe=moe, linear_attention=linear,
        intermediate_size=_dense_width(c, layers),
        mtp_layers=c.count("num_nextn_predict_layers", 0),
    )


# --- 2025 families: interleaved MoE, local/global attention, nested text configs -------------


def _llama4(c: _Cfg, name: str) -> ModelSpec:
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
        top_k=_top_k(t, "num_local_experts"),
        expert_intermediate=width,
        num_shared_experts=1,
        shared_intermediate=width,
    )
    return _base(
        t, name, layers, attention=_gqa(t, sliding_window=chunk), moe=moe,
        intermediate_size=_dense_width(t, layers, "intermediate_size_mlp"),
    )


def _gemma(c: _Cfg, name: str, default: Callable[[int], str], **attn: Any) -> ModelSpec:
    """Gemma 2 / 3: sliding (local) and full (global) attention layers, GeGLU MLP, tied
    embeddings by default, a post-norm after attention and after the MLP besides the pre-norms.
    Logit soft-capping and query_pre_attn_scalar change no shape and are not costed."""
    n = c.size("num_hidden_layers")
    layers = tuple(LayerSpec(m, FFN.DENSE) for m in _pattern(c, n, default))
    window = c.size("sliding_window") if Mixer.SLIDING_ATTENTION in {la.mixer for la in layers} \
        else None
    return _base(
        c, name, layers, attention=_gqa(c, sliding_window=window, **attn),
        intermediate_size=c.size("intermediate_size"), sandwich_norms=True,
        tie_embeddings=c.flag("tie_word_embeddings", True),
    )


def _gemma2(c: _Cfg, name: str) -> ModelSpec:
    """Gemma 2: even layers sliding, odd layers global (Gemma2DecoderLayer)."""
    return _gemma(c, name, lambda i: "sliding_attention" if i % 2 == 0 else "full_attention")


def _gemma3(c: _Cfg, name: str) -> ModelSpec:
    """Gemma 3: every `sliding_window_pattern`-th layer global, the rest sliding; q/k RMSNorm.
    The multimodal checkpoints nest the text model under `text_config` and leave out the keys at
    Gemma3TextConfig's defaults; the ones that matter here are supplied as that class does:
    vocab_size 262208, sliding_window_pattern 6 (max_position_embeddings: _CONTEXT_DEFAULTS)."""
    t = c.nested("text_config", "gemma3_text")
    t = _Cfg({"vocab_size": 262208} | dict(t.data), t.source, t.model_type)
    every = t.size("sliding_window_pattern", 6)
    rule = lambda i: "full_attention" if (i + 1) % every == 0 else "sliding_attention"
    return _gemma(t, name, rule, qk_norm=True)


def _phi3(c: _Cfg, name: str) -> ModelSpec:
    """Phi-3 / Phi-4 (model_type phi3): Llama's shapes with fused qkv and gate_up projections
    (the same parameter count); `sliding_window` applies to every layer; partial rope
    (`partial_rotary_factor`, Phi-4-mini) where given."""
    head_dim = c.size("head_dim", c.size("hidden_size") // c.size("num_attention_heads"))
    rotary = round(head_dim * c.fraction("partial_rotary_factor", 1.0))
    return _dense_family(c, name, rotary_dim=rotary if rotary != head_dim else None)


def _starcoder2(c: _Cfg, name: str) -> ModelSpec:
    """StarCoder2 (Starcoder2Config, modeling_starcoder2): GQA with `sliding_window` on every
    layer, biases on every linear layer when `use_bias` (q/k/v/o and the MLP's c_fc / c_proj),
    LayerNorm with a bias (nn.LayerNorm whatever `norm_type` says), a plain two-matrix GELU MLP,
    and embeddings tied unless the config says otherwise (the class default is True)."""
    bias = c.flag("use_bias", True)
    spec = _dense_family(c, name, qkv_bias=bias, o_bias=bias)
    return replace(spec, ffn_matrices=2, ffn_bias=bias, norm_bias=True,
                   tie_embeddings=c.flag("tie_word_embeddings", True))


def _qwen2_moe(c: _Cfg, name: str) -> ModelSpec:
    """Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): q/k/v biases, sparse layers by the Qwen rule,
    one sigmoid-gated shared expert of its own width `shared_expert_intermediate_size`."""
    n = c.size("num_hidden_layers")
    layers = tuple(LayerSpec(Mixer.FULL_ATTENTION, _qwen_moe_ffn(c, i)) for i in range(n))
    shared = c.count("shared_expert_intermediate_size", 0)
    moe = MoESpec(
        num_experts=c.size("num_experts"),
        top_k=_top_k(c, "num_experts"),
        expert_intermediate=c.size("moe_intermediate_size"),
        num_shared_experts=1 if shared else 0,
        shared_intermediate=shared,
        shared_expert_gate=bool(shared),
    )
    return _base(c, name, layers, attention=_gqa(c, qkv_bias=True), moe=moe,
                 intermediate_size=_dense_width(c, layers))


def _glm4_moe(c: _Cfg, name: str) -> ModelSpec:
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
        top_k=_top_k(c, "n_routed_experts"),
        expert_intermediate=width,
        num_shared_experts=shared,
        shared_intermediate=shared * width,
        router_bias=True,  # e_score_correction_bias, always present in Glm4MoeTopkRouter
    )
    attention = _gqa(
        c, qkv_bias=c.flag("attention_bias", False), qk_norm=c.flag("use_qk_norm", False),
        rotary_dim=round(head_dim * c.fraction("partial_rotary_factor", 0.5)),
    )
    return _base(c, name, layers, attention=attention, moe=moe,
                 intermediate_size=_dense_width(c, layers),
                 mtp_layers=c.count("num_nextn_predict_layers", 0))


def _mistral3(c: _Cfg, name: str) -> ModelSpec:
    """Mistral 3 (Mistral-Small-3.1/3.2, Magistral): a Pixtral vision encoder and a Mistral
    language model under `text_config`, imported by the importer of its own model_type."""
    t = c.nested("text_config", "mistral")
    text_type = t.data["model_type"]
    if t is c or text_type not in _TEXT_OF_MISTRAL3:
        raise c.fail(f"field 'text_config.model_type': {text_type!r} unsupported; accepted: "
                     + ", ".join(_TEXT_OF_MISTRAL3))
    return IMPORTERS[text_type](t, name)


_TEXT_OF_MISTRAL3 = ("mistral", "llama")


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
    "llama4": _llama4,
    "llama4_text": _llama4,  # text-only export: the same keys, not nested
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "gemma3_text": _gemma3,  # Gemma 3 1B and text-only exports
    "phi3": _phi3,
    "deepseek_v2": _deepseek_v2,
    "qwen2_moe": _qwen2_moe,
    "glm4_moe": _glm4_moe,
    "mistral3": _mistral3,
    "starcoder2": _starcoder2,
}


def supported_model_types() -> list[str]:
    return sorted(IMPORTERS)


def read_config(path: str | Path) -> dict[str, Any]:
    """A config.json (or a directory holding one) as a dict; ConfigError naming the file."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    data = read_json(p)
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object, got {type(data).__name__}")
    return data


# quant_method -> how its settings give the weight dtype. Sources: the transformers quantizer
# configs (FbgemmFp8Config, FineGrainedFP8Config "fp8", AwqConfig, GPTQConfig, BitsAndBytesConfig,
# Mxfp4Config) and compressed-tensors' QuantizationArgs (num_bits, type "float" | "int").
QUANT_METHODS = ("awq", "bitsandbytes", "compressed-tensors", "fbgemm_fp8", "fp8", "gptq", "mxfp4")
_INT_BITS = {4: DType.INT4, 8: DType.INT8}


def checkpoint_precision(c: _Cfg, moe: bool) -> tuple[Precision, str]:
    """The weight dtype a checkpoint's `quantization_config` gives, and a label saying so.

    BF16 without one. The dtype applies to every weight matrix; checkpoints keep a few tensors
    (embeddings, lm_head, norms, routers) in BF16, which this ignores (under 2% of the weights of
    the catalog's quantized models). MXFP4 checkpoints (gpt-oss) quantize only the routed experts."""
    q = c.data.get("quantization_config")
    if q is None:
        return Precision(), ""
    if not isinstance(q, Mapping):
        raise c.fail(f"field 'quantization_config' must be a JSON object, got {q!r}")
    method = q.get("quant_method")
    if method not in QUANT_METHODS:
        raise c.fail(f"field 'quantization_config.quant_method': {method!r} unsupported; "
                     f"accepted: {', '.join(QUANT_METHODS)}")
    if method == "mxfp4":
        # transformers' Mxfp4 quantizer replaces the routed experts' modules only (gpt-oss);
        # on a dense model it quantizes nothing, so its weights are not MXFP4
        if not moe:
            raise c.fail("field 'quantization_config.quant_method': mxfp4 quantizes a MoE "
                         "model's routed experts (gpt-oss); this model has none")
        return Precision(expert_weights=DType.MXFP4), "experts mxfp4 (quantization_config mxfp4)"
    _check_blocks(c, q)
    dtype = _quant_dtype(c, method, q)
    return Precision(weights=dtype), f"{dtype.value} (quantization_config {method})"


def _check_blocks(c: _Cfg, q: Mapping[str, Any]) -> None:
    """FP8's `weight_block_size` (FineGrainedFP8Config): the [rows, columns] of a weight block
    sharing one scale, each a positive integer (DeepSeek-V3: [128, 128])."""
    blocks = q.get("weight_block_size")
    if blocks is None:
        return
    if (not isinstance(blocks, list) or len(blocks) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= MAX_WIDTH
                       for b in blocks)):
        raise c.fail("field 'quantization_config.weight_block_size' must be two positive "
                     f"integers (rows and columns a scale covers, e.g. [128, 128]), got "
                     f"{checks.show(blocks)}")


def _quant_dtype(c: _Cfg, method: str, q: Mapping[str, Any]) -> DType:
    if method in ("fp8", "fbgemm_fp8"):
        return DType.FP8
    if method == "bitsandbytes":
        return _bnb_dtype(c, q)
    if method in ("awq", "gptq"):
        return _bits(c, "quantization_config.bits", q.get("bits"), "int")
    groups = q.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise c.fail("field 'quantization_config.config_groups' must be a non-empty object")
    found = set()
    for key, group in groups.items():
        w = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(w, Mapping):
            raise c.fail(f"field 'quantization_config.config_groups.{key}.weights' missing")
        where = f"quantization_config.config_groups.{key}.weights"
        found.add(_bits(c, f"{where}.num_bits", w.get("num_bits"), w.get("type", "int")))
    if len(found) > 1:
        raise c.fail("field 'quantization_config.config_groups': groups of different weight "
                     f"dtypes ({', '.join(sorted(d.value for d in found))}) are not supported")
    return found.pop()


def _bnb_dtype(c: _Cfg, q: Mapping[str, Any]) -> DType:
    """BitsAndBytesConfig's flags: each a boolean (absent: false), at most one true, as its
    own checks require (a TypeError for a non-boolean, a ValueError for both)."""
    flags = {}
    for key in ("load_in_4bit", "load_in_8bit"):
        flags[key] = q.get(key, False)
        if not isinstance(flags[key], bool):
            raise c.fail(f"field 'quantization_config.{key}' must be true or false, got "
                         f"{checks.show(flags[key])}")
    if all(flags.values()):
        raise c.fail("field 'quantization_config': load_in_4bit and load_in_8bit are both true; "
                     "bitsandbytes takes one of them")
    if not any(flags.values()):
        raise c.fail("field 'quantization_config': bitsandbytes needs load_in_4bit or load_in_8bit")
    return DType.INT4 if flags["load_in_4bit"] else DType.INT8


def _bits(c: _Cfg, where: str, bits: Any, kind: Any) -> DType:
    if kind == "float" and bits == 8:
        return DType.FP8
    if kind == "int" and bits in _INT_BITS:
        return _INT_BITS[bits]
    raise c.fail(f"field {where!r}: {kind} {bits!r}-bit weights unsupported; "
                 "accepted: int 4, int 8, float 8")


def from_hf_config(
    config: str | Path | Mapping[str, Any],
    name: str | None = None,
    precision: Precision | None = None,
    source: str | None = None,
) -> ModelSpec:
    """A ModelSpec from a config.json path, a directory with one, or its dict.

    `name` defaults to the catalog name in `_rdu.name`, else `_name_or_path`, else the model_type.
    `source` names the file in errors (a dict's default: "config.json"). The weights take the
    dtype of the checkpoint's `quantization_config` (BF16 without one); `precision`, when given,
    replaces it."""
    if isinstance(config, Mapping):
        data, source = config, source or "config.json"
    else:
        data, source = read_config(config), source or str(config)
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or model_type not in IMPORTERS:
        raise ConfigError(
            f"{source}: unknown model_type {model_type!r}; "
            f"supported: {', '.join(supported_model_types())}"
        )
    cfg = _Cfg(data, source, model_type)
    for key, value in data.items():  # a field of a known kind is checked, read or not
        if value is not None:
            cfg._checked(key, functools.partial(_kind_check, key, value))
    meta = _Cfg(cfg.get("_rdu", {}), f"{source}: _rdu", model_type)
    name = name or meta.get("name") or cfg.get("_name_or_path") or model_type
    spec = IMPORTERS[model_type](cfg, name)
    check_model(spec, source)
    if precision is not None:
        return spec.with_precision(precision)
    # A multimodal config may quantize only its language model: text_config's own table wins.
    quant, label = checkpoint_precision(cfg.nested("text_config", model_type), spec.is_moe)
    return replace(spec, precision=quant, quantization=label)
