"""The config.json importers: one per model_type, each on its catalog file, and the errors."""

from __future__ import annotations

import json

import pytest

from workloads import catalog
from workloads.dtypes import DType
from workloads.errors import ConfigError
from workloads.hf_config import IMPORTERS, from_hf_config, supported_model_types
from workloads.spec import FFN, Mixer

# A catalog file per importer, found in the catalog (a family added with its catalog file is
# tested here without editing this file); minimax and minimax_m2 share one.
BY_TYPE: dict[str, str] = {}
for _name in catalog.list_models():
    BY_TYPE.setdefault(catalog.model_config(_name)["model_type"], _name)
# Text-only spellings of nested families: the same importer on the flat text_config.
FLAT = {"llama4_text": "llama-4-maverick", "gemma3_text": "gemma-3-27b"}


def test_every_importer_has_a_catalog_file():
    """A model family is an importer (a module of workloads/hf_config/) and a catalog file that
    names a model of it (workloads/catalog/NAME.json, with its published parameter counts)."""
    missing = set(IMPORTERS) - {"minimax"} - set(FLAT) - set(BY_TYPE)
    assert not missing, f"model_type without a catalog file in workloads/catalog/: {missing}"
    assert set(BY_TYPE) <= set(IMPORTERS)


@pytest.mark.parametrize("model_type", sorted(BY_TYPE))
def test_importer_on_its_catalog_file(model_type):
    cfg = catalog.model_config(BY_TYPE[model_type])
    assert cfg["model_type"] == model_type
    spec = from_hf_config(cfg)
    text = cfg.get("text_config", cfg)
    assert spec.family == model_type
    assert spec.num_layers == text["num_hidden_layers"]
    assert spec.hidden_size == text["hidden_size"]


@pytest.mark.parametrize("model_type", sorted(FLAT))
def test_flat_text_configs(model_type):
    cfg = catalog.model_config(FLAT[model_type])
    flat = dict(cfg["text_config"], model_type=model_type, tie_word_embeddings=cfg.get(
        "tie_word_embeddings", model_type == "gemma3_text"))
    nested, text = from_hf_config(cfg), from_hf_config(flat)
    assert (text.layers, text.attention, text.moe) == (nested.layers, nested.attention, nested.moe)


def test_llama4_interleaved_moe_and_chunked_attention():
    spec = from_hf_config(catalog.model_config("llama-4-maverick"))
    ffn, mixers = [la.ffn for la in spec.layers], [la.mixer for la in spec.layers]
    assert ffn[:4] == [FFN.DENSE, FFN.MOE, FFN.DENSE, FFN.MOE] and ffn.count(FFN.MOE) == 24
    # RoPE layers chunk over 8192 tokens; every 4th layer (NoPE) is global.
    assert mixers[:4] == [Mixer.SLIDING_ATTENTION] * 3 + [Mixer.FULL_ATTENTION]
    assert mixers.count(Mixer.FULL_ATTENTION) == 12 and spec.attention.sliding_window == 8192
    assert spec.moe.num_shared_experts == 1 and spec.moe.shared_intermediate == 8192
    assert spec.intermediate_size == 16384 and spec.moe.num_experts == 128
    cfg = catalog.model_config("llama-4-maverick")
    cfg["text_config"] |= {"moe_layers": [0], "no_rope_layers": [0] * 48}
    spec = from_hf_config(cfg)
    assert [la.ffn for la in spec.layers].count(FFN.MOE) == 1
    assert {la.mixer for la in spec.layers} == {Mixer.FULL_ATTENTION}
    # Scout's text model (Llama-4-Scout-17B-16E config.json): every layer MoE, 16 experts.
    cfg = catalog.model_config("llama-4-maverick")
    cfg["text_config"] |= {"interleave_moe_layer_step": 1, "num_local_experts": 16}
    scout = from_hf_config(cfg)
    assert {la.ffn for la in scout.layers} == {FFN.MOE} and scout.intermediate_size == 0


def test_gemma_local_global_patterns():
    g2 = from_hf_config(catalog.model_config("gemma-2-9b"))
    assert [la.mixer for la in g2.layers][:2] == [Mixer.SLIDING_ATTENTION, Mixer.FULL_ATTENTION]
    assert g2.attention.head_dim == 256 and g2.tie_embeddings and g2.sandwich_norms
    g3 = from_hf_config(catalog.model_config("gemma-3-27b"))
    mixers = [la.mixer for la in g3.layers]
    assert mixers[:6] == [Mixer.SLIDING_ATTENTION] * 5 + [Mixer.FULL_ATTENTION]
    assert mixers.count(Mixer.FULL_ATTENTION) == 10 and g3.attention.sliding_window == 1024
    assert g3.vocab_size == 262208 and g3.attention.qk_norm and g3.tie_embeddings


def test_deepseek_v2_and_qwen2_moe_shared_width():
    ds = from_hf_config(catalog.model_config("deepseek-v2"))
    assert ds.attention.q_lora_rank == 1536 and ds.moe.shared_intermediate == 2 * 1536
    assert [la.ffn for la in ds.layers][:2] == [FFN.DENSE, FFN.MOE] and not ds.moe.router_bias
    assert ds.mtp_layers == 0 and ds.moe.top_k == 6
    # V2-Lite projects q directly: q_lora_rank null (DeepSeek-V2-Lite config.json).
    lite = from_hf_config(dict(catalog.model_config("deepseek-v2"), q_lora_rank=None))
    assert lite.attention.q_lora_rank is None
    qw = from_hf_config(catalog.model_config("qwen1.5-moe-a2.7b"))
    assert qw.moe.shared_intermediate == 5632 and qw.moe.expert_intermediate == 1408
    assert qw.moe.shared_expert_gate and qw.attention.qkv_bias


def test_glm4_moe_and_mistral3():
    glm = from_hf_config(catalog.model_config("glm-4.5-air"))
    assert [la.ffn for la in glm.layers].count(FFN.DENSE) == 1 and glm.mtp_layers == 1
    assert glm.attention.rotary_dim == 64 and glm.moe.router_bias and glm.attention.qkv_bias
    m3 = from_hf_config(catalog.model_config("mistral-small-3.1-24b"))
    assert m3.family == "mistral3" and m3.attention.head_dim == 128
    assert m3.attention.sliding_window is None and m3.num_layers == 40


@pytest.mark.parametrize(
    "quant, weights, experts",
    [
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, DType.FP8, None),
        ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, DType.FP8, None),
        ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
            "weights": {"num_bits": 8, "type": "float"}}}}, DType.FP8, None),
        ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
            "weights": {"num_bits": 4, "type": "int"}}}}, DType.INT4, None),
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, DType.INT4, None),
        ({"quant_method": "gptq", "bits": 8}, DType.INT8, None),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, DType.INT4, None),
        ({"quant_method": "bitsandbytes", "load_in_4bit": False, "load_in_8bit": True},
         DType.INT8, None),
    ],
)
def test_quantization_config_sets_weight_dtype(quant, weights, experts):
    cfg = dict(catalog.model_config("llama-3.1-8b"), quantization_config=quant)
    spec = from_hf_config(cfg)
    assert spec.precision.weights is weights and spec.precision.expert_weights is experts
    assert spec.quantization.startswith(weights.value) and quant["quant_method"] in spec.quantization
    # A nested config's quantization_config sits at the top level.
    nested = dict(catalog.model_config("mistral-small-3.1-24b"), quantization_config=quant)
    assert from_hf_config(nested).precision.weights is weights


def test_mxfp4_quantizes_only_experts_of_moe_models():
    gpt = from_hf_config(catalog.model_config("gpt-oss-120b"))
    assert (gpt.precision.weights, gpt.precision.expert_weights) == (DType.BF16, DType.MXFP4)
    assert gpt.quantization == "experts mxfp4 (quantization_config mxfp4)"


@pytest.mark.parametrize(
    "quant, fragment",
    [
        ({"quant_method": "hqq"},
         "'quantization_config.quant_method': 'hqq' unsupported; accepted: awq, bitsandbytes"),
        ({"quant_method": "awq", "bits": 3}, "'quantization_config.bits': int 3-bit"),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": {
            "weights": {"num_bits": 4, "type": "float"}}}}, "float 4-bit weights unsupported"),
        ("fp8", "'quantization_config' must be a JSON object"),
        # BitsAndBytesConfig's own checks: boolean flags, at most one set ("false" read as true).
        ({"quant_method": "bitsandbytes", "load_in_4bit": "false", "load_in_8bit": True},
         "field 'quantization_config.load_in_4bit' must be true or false, got 'false'"),
        ({"quant_method": "bitsandbytes", "load_in_8bit": 2},
         "field 'quantization_config.load_in_8bit' must be true or false, got 2"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": True},
         "load_in_4bit and load_in_8bit are both true; bitsandbytes takes one of them"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": False},
         "bitsandbytes needs load_in_4bit or load_in_8bit"),
        # transformers' Mxfp4 quantizer replaces experts only: a dense model's weights stay
        ({"quant_method": "mxfp4"}, "mxfp4 quantizes a MoE model's routed experts"),
        ({"quant_method": "fp8", "weight_block_size": [0, 0]},
         "'quantization_config.weight_block_size' must be two positive integers"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, "got [128]"),
    ],
)
def test_bad_quantization_config(quant, fragment):
    cfg = dict(catalog.model_config("llama-3.1-8b"), quantization_config=quant)
    assert fragment in _one_line_error(cfg)


@pytest.mark.parametrize(
    "name, key, value, fragment",
    [
        ("llama-4-maverick", "interleave_moe_layer_step", 0, "must be a positive integer"),
        ("llama-4-maverick", "no_rope_layers", [1, 0], "one entry per layer (48), got 2"),
        ("llama-4-maverick", "moe_layers", [48], "layer indices in 0..47"),
        ("llama-4-maverick", "num_experts_per_tok", 129, "exceeds num_local_experts (128)"),
        ("gemma-3-27b", "layer_types", ["full_attention"] * 61 + ["chunked"], "entry 'chunked'"),
        ("gemma-3-27b", "sliding_window_pattern", "6", "must be a positive integer"),
        ("gemma-2-9b", "sliding_window", -1, "'sliding_window' must be a positive integer"),
        ("phi-3-mini-4k", "partial_rotary_factor", 1.5, "must be a number in (0, 1]"),
        ("deepseek-v2", "first_k_dense_replace", 61, "is 61, more than 60"),
        ("deepseek-v2", "n_shared_experts", -2, "must be a non-negative integer"),
        ("deepseek-v2", "topk_group", 13, "'topk_group' (13) exceeds n_group (8)"),
        ("deepseek-v2", "n_group", 7, "'n_group' (7) must divide n_routed_experts (160)"),
        ("deepseek-v3", "n_group", 256, "'num_experts_per_tok' (8) exceeds the 4 x 1 experts"),
        ("qwen1.5-moe-a2.7b", "shared_expert_intermediate_size", 1.5, "non-negative integer"),
        ("qwen1.5-moe-a2.7b", "mlp_only_layers", "0,1", "must list layer indices in 0..23"),
        ("glm-4.5-air", "partial_rotary_factor", 0, "must be a number in (0, 1]"),
        ("mistral-small-3.1-24b", "text_config", [], "'text_config' must be a JSON object"),
        ("qwen3-next-80b-a3b", "layer_types", ["full_attention"] * 3,
         "'layer_types' must list one entry per layer (48), got 3 entries"),
        ("qwen3-next-80b-a3b", "layer_types", ["sliding_attention"] * 48,
         "entry 'sliding_attention'; accepted: 'full_attention', 'linear_attention'"),
        ("gpt-oss-20b", "layer_types", ["linear_attention"] * 24,
         "entry 'linear_attention'; accepted: 'full_attention', 'sliding_attention'"),
        ("gpt-oss-20b", "layer_types", ["full_attention"] * 3, "one entry per layer (24), got 3"),
        ("minimax-m2", "attn_type_list", [1, 1, 1], "one entry per layer (62), got 3 entries"),
        ("minimax-m2", "attn_type_list", [], "one entry per layer (62), got 0 entries"),
        ("gemma-3-27b", "quantization_config", {"quant_method": "magic"},
         "text_config: field 'quantization_config.quant_method': 'magic' unsupported"),
    ],
)
def test_new_family_fields_validated(name, key, value, fragment):
    cfg = catalog.model_config(name)
    target = cfg["text_config"] if "text_config" in cfg and key != "text_config" else cfg
    target[key] = value
    msg = _one_line_error(cfg)
    assert fragment in msg and msg.startswith("config.json")


def test_minimax_alias():
    cfg = dict(catalog.model_config("minimax-m2"), model_type="minimax")
    spec = from_hf_config(cfg)
    assert spec.moe.num_experts == 256 and spec.moe.top_k == 8 and spec.mtp_layers == 3
    assert spec.attention.rotary_dim == 64 and spec.attention.qk_norm


def test_llama_gqa():
    a = from_hf_config(catalog.model_config("llama-3.1-70b")).attention
    assert (a.num_heads, a.num_kv_heads, a.head_dim, a.kind) == (64, 8, 128, "gqa")
    assert from_hf_config(catalog.model_config("llama-2-7b")).attention.kind == "mha"


def test_mistral_sliding_window_all_layers():
    spec = from_hf_config(catalog.model_config("mistral-7b"))
    assert spec.attention.sliding_window == 4096
    assert {la.mixer for la in spec.layers} == {Mixer.SLIDING_ATTENTION}
    # Qwen2.5 carries sliding_window but use_sliding_window is false.
    assert {la.mixer for la in from_hf_config(catalog.model_config("qwen2.5-7b")).layers} == {
        Mixer.FULL_ATTENTION
    }


def test_deepseek_v3_first_k_dense_and_mla():
    spec = from_hf_config(catalog.model_config("deepseek-v3"))
    ffn = [la.ffn for la in spec.layers]
    assert ffn[:3] == [FFN.DENSE] * 3 and ffn[3:] == [FFN.MOE] * 58
    a = spec.attention
    assert a.kind == "mla" and (a.q_lora_rank, a.kv_lora_rank) == (1536, 512)
    assert (a.qk_rope_head_dim, a.qk_nope_head_dim, a.v_head_dim) == (64, 128, 128)
    assert spec.moe.num_shared_experts == 1 and spec.moe.shared_intermediate == 2048
    assert spec.mtp_layers == 1
    assert spec.precision.weights is DType.FP8  # the quantization_config: fp8, 128x128 blocks


def test_group_limited_routers_carry_their_groups():
    """noaux_tc (V3) and group_limited_greedy (V2) pick experts within topk_group of n_group
    groups; plain greedy (V2-Lite) ignores n_group."""
    v3 = from_hf_config(catalog.model_config("deepseek-v3")).moe
    v2 = from_hf_config(catalog.model_config("deepseek-v2")).moe
    lite = from_hf_config(dict(catalog.model_config("deepseek-v2"), topk_method="greedy")).moe
    assert (v3.expert_groups, v3.topk_groups) == (8, 4)
    assert (v2.expert_groups, v2.topk_groups) == (8, 3)
    assert (lite.expert_groups, lite.topk_groups) == (1, 1)


def test_text_config_quantization_sets_the_weights():
    # A multimodal checkpoint's quantization_config may sit with its language model.
    cfg = catalog.model_config("gemma-3-27b")
    cfg["text_config"]["quantization_config"] = {"quant_method": "fp8"}
    spec = from_hf_config(cfg)
    assert spec.precision.weights is DType.FP8
    assert spec.quantization == "fp8 (quantization_config fp8)"


def test_gpt_oss_layer_types_sinks_mxfp4():
    spec = from_hf_config(catalog.model_config("gpt-oss-120b"))
    assert spec.layers[0].mixer is Mixer.SLIDING_ATTENTION
    assert spec.layers[1].mixer is Mixer.FULL_ATTENTION
    assert spec.attention.sliding_window == 128 and spec.attention.sinks
    assert spec.precision.expert_weights is DType.MXFP4
    assert spec.precision.weights is DType.BF16


def test_qwen3_next_layer_pattern():
    spec = from_hf_config(catalog.model_config("qwen3-next-80b-a3b"))
    mixers = [la.mixer for la in spec.layers]
    assert mixers[:4] == [Mixer.LINEAR_ATTENTION] * 3 + [Mixer.FULL_ATTENTION]
    assert mixers.count(Mixer.FULL_ATTENTION) == 12
    la = spec.linear_attention
    assert (la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim) == (
        16, 32, 128, 128)
    assert spec.attention.output_gate and spec.moe.shared_expert_gate
    # An explicit layer_types wins over full_attention_interval.
    cfg = dict(catalog.model_config("qwen3-next-80b-a3b"), num_hidden_layers=2,
               layer_types=["full_attention", "linear_attention"])
    assert [la.mixer for la in from_hf_config(cfg).layers] == [
        Mixer.FULL_ATTENTION, Mixer.LINEAR_ATTENTION]


def test_nemotron_h_pattern():
    spec = from_hf_config(catalog.model_config("nemotron-h-56b"))
    mixers = [la.mixer for la in spec.layers]
    assert mixers.count(Mixer.MAMBA2) == 54 and mixers.count(Mixer.FULL_ATTENTION) == 10
    assert [la.ffn for la in spec.layers].count(FFN.DENSE) == 54
    assert spec.ffn_matrices == 2  # squared ReLU, no gate
    assert spec.mamba.state_size == 256 and spec.mamba.n_groups == 8


def test_context_default_when_max_position_embeddings_is_absent():
    # transformers' config classes default the key (LlamaConfig: 2048); without it a 1M-token
    # prompt was accepted.
    cfg = dict(catalog.model_config("llama-3.2-1b"))
    del cfg["max_position_embeddings"]
    assert from_hf_config(cfg).max_context == 2048
    nested = catalog.model_config("mistral-small-3.1-24b")
    text = {k: v for k, v in nested["text_config"].items() if k != "max_position_embeddings"}
    assert from_hf_config(dict(nested, text_config=text)).max_context == 131072  # MistralConfig
    assert from_hf_config(dict(nested, text_config=dict(text, model_type="llama"))
                          ).max_context == 2048


def test_context_default_known_for_every_model_type():
    for model_type in IMPORTERS:
        if model_type == "mistral3":  # its text model's type decides
            continue
        name = BY_TYPE.get(model_type) or FLAT.get(model_type) or BY_TYPE["minimax_m2"]
        cfg = catalog.model_config(name)
        cfg = dict(cfg.get("text_config", cfg) if model_type in FLAT else cfg,
                   model_type=model_type)
        for c in (cfg, cfg.get("text_config", {})):
            c.pop("max_position_embeddings", None)
        assert from_hf_config(cfg).max_context > 0, model_type


def test_state_space_only_model_has_no_context_bound():
    cfg = dict(catalog.model_config("nemotron-h-56b"), hybrid_override_pattern="M-M-",
               num_hidden_layers=4)
    del cfg["max_position_embeddings"]
    assert from_hf_config(cfg).max_context == 0
    assert from_hf_config(dict(cfg, hybrid_override_pattern="M*M-")).max_context == 4096


def _one_line_error(cfg) -> str:
    with pytest.raises(ConfigError) as e:
        from_hf_config(cfg)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_unknown_model_type_lists_supported():
    msg = _one_line_error({"model_type": "foo"})
    assert msg.startswith("config.json: unknown model_type 'foo'; supported: ")
    assert ", ".join(supported_model_types()) in msg


def test_missing_field_named():
    cfg = dict(catalog.model_config("llama-3.1-8b"))
    del cfg["num_attention_heads"]
    assert _one_line_error(cfg) == (
        "config.json: missing field 'num_attention_heads' (model_type llama)"
    )


@pytest.mark.parametrize("value", [0, -4, "32", 1.5, True])
def test_non_positive_or_non_integer_size(value):
    cfg = dict(catalog.model_config("llama-3.1-8b"), hidden_size=value)
    assert "field 'hidden_size' must be a positive integer" in _one_line_error(cfg)


def test_bad_hybrid_pattern():
    cfg = dict(catalog.model_config("nemotron-h-56b"), hybrid_override_pattern="MX")
    assert "hybrid_override_pattern" in _one_line_error(cfg)


def test_malformed_json_names_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", ')
    msg = _one_line_error(path)
    assert str(path) in msg and "malformed JSON" in msg


def test_path_and_directory(tmp_path):
    cfg = catalog.model_config("llama-3.2-1b")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert from_hf_config(tmp_path).num_layers == 16
    assert from_hf_config(tmp_path / "config.json").tie_embeddings
    assert "no such file" in _one_line_error(tmp_path / "nope.json")
