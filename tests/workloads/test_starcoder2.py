"""The starcoder2 family (workloads/hf_config/dense.py `_starcoder2`, catalog
starcoder2-15b.json): biases on every linear layer, LayerNorm with a bias, a two-matrix GELU MLP,
a sliding window on every layer, tied embeddings by Starcoder2Config's default."""

from __future__ import annotations

import pytest

from workloads import catalog
from workloads.hf_config import from_hf_config
from workloads.params import param_breakdown, total_params
from workloads.spec import Mixer

# Starcoder2Config's defaults are StarCoder2-3B's shapes (transformers
# configuration_starcoder2.py); 7B's from its config.json. Published: the HF model pages'
# safetensors counts, 3.03B and 7.17B parameters (rounded to 0.01B).
SIZES = {
    "3b": ({"hidden_size": 3072, "intermediate_size": 12288, "num_hidden_layers": 30,
            "num_attention_heads": 24, "num_key_value_heads": 2}, 3.03e9),
    "7b": ({"hidden_size": 4608, "intermediate_size": 18432, "num_hidden_layers": 32,
            "num_attention_heads": 36, "num_key_value_heads": 4}, 7.17e9),
}


def _config(**fields):
    return {"model_type": "starcoder2", "vocab_size": 49152, "max_position_embeddings": 16384,
            "sliding_window": 4096, "use_bias": True, **fields}


def test_starcoder2_15b_imports_with_its_own_fields():
    spec = from_hf_config(catalog.model_config("starcoder2-15b"))
    a = spec.attention
    assert spec.family == "starcoder2" and spec.num_layers == 40
    assert (a.num_heads, a.num_kv_heads, a.head_dim) == (48, 4, 128)
    assert a.qkv_bias and a.o_bias and a.sliding_window == 4096
    assert {la.mixer for la in spec.layers} == {Mixer.SLIDING_ATTENTION}
    assert (spec.ffn_matrices, spec.ffn_bias, spec.norm_bias) == (2, True, True)
    assert spec.tie_embeddings and spec.max_context == 16384
    # 15.66B counted; the HF page's 16B and the paper's "15B" bracket it
    assert 15.5e9 < total_params(spec) < 16.0e9


@pytest.mark.parametrize("size", sorted(SIZES))
def test_starcoder2_counts_match_the_published_figures(size):
    fields, published = SIZES[size]
    counted = total_params(from_hf_config(_config(**fields)))
    assert abs(counted - published) <= 0.005e9, counted  # the figure's own rounding


def test_use_bias_and_layer_norm_are_counted_as_modeling_starcoder2_builds_them():
    fields = SIZES["3b"][0]
    h, inter, n = fields["hidden_size"], fields["intermediate_size"], fields["num_hidden_layers"]
    kv = fields["num_key_value_heads"] * h // fields["num_attention_heads"]
    with_bias = param_breakdown(from_hf_config(_config(**fields)))
    without = param_breakdown(from_hf_config(_config(**fields, use_bias=False)))
    # q, k, v, o biases and c_fc, c_proj biases in each layer; the LayerNorms keep theirs
    assert with_bias["attention"] - without["attention"] == n * (2 * h + 2 * kv)
    assert with_bias["dense_ffn"] - without["dense_ffn"] == n * (inter + h)
    assert with_bias["norms"] == without["norms"] == n * 2 * 2 * h
    assert with_bias["final_norm"] == 2 * h


def test_an_untied_starcoder2_counts_its_head():
    fields = SIZES["3b"][0]
    tied = total_params(from_hf_config(_config(**fields)))
    untied = total_params(from_hf_config(_config(**fields, tie_word_embeddings=False)))
    assert untied - tied == 49152 * fields["hidden_size"]
