"""The config.json importers: one per model_type, each on its catalog file, and the errors."""

from __future__ import annotations

import json

import pytest

from workloads import catalog
from workloads.dtypes import DType
from workloads.errors import ConfigError
from workloads.hf_config import IMPORTERS, from_hf_config, supported_model_types
from workloads.spec import FFN, Mixer

# One catalog file per importer (minimax and minimax_m2 share one).
BY_TYPE = {
    "llama": "llama-3.1-8b",
    "mistral": "mistral-7b",
    "mixtral": "mixtral-8x7b",
    "qwen2": "qwen2.5-7b",
    "qwen3": "qwen3-32b",
    "qwen3_moe": "qwen3-235b-a22b",
    "deepseek_v3": "deepseek-v3",
    "gpt_oss": "gpt-oss-120b",
    "minimax_m2": "minimax-m2",
    "qwen3_next": "qwen3-next-80b-a3b",
    "nemotron_h": "nemotron-h-56b",
}


def test_every_importer_has_a_catalog_file():
    assert set(IMPORTERS) - {"minimax"} == set(BY_TYPE)


@pytest.mark.parametrize("model_type", sorted(BY_TYPE))
def test_importer_on_its_catalog_file(model_type):
    cfg = catalog.model_config(BY_TYPE[model_type])
    assert cfg["model_type"] == model_type
    spec = from_hf_config(cfg)
    assert spec.family == model_type
    assert spec.num_layers == cfg["num_hidden_layers"]
    assert spec.hidden_size == cfg["hidden_size"]


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
    assert spec.precision.weights is DType.BF16  # native FP8, BF16 by default (documented)


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
