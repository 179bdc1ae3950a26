"""Total and active parameter counts of every catalog model against the published figures.

Tolerance: 1% of the published figure, or half a unit of its last quoted digit when the figure is
quoted so coarsely that 1% is finer than its own rounding ("37B" stands for 36.5B..37.5B; "10B"
for 9.5B..10.5B). Only five figures need that: DeepSeek-V3 active (37B), Qwen3-235B-A22B active
(22B), MiniMax-M2 active (10B), Llama 4 Maverick active (17B; counted 17.18B) and GLM-4.5-Air
active (12B; counted 12.18B). Qwen3-Next-80B-A3B's "3B activated" is the A3B of its name,
not a count (the model's own shapes give 3.87B with embeddings, 3.25B without any); its exact
active figure comes from safetensors tensor shapes instead (see the source below).

Active-parameter conventions differ by publisher and are taken from each source, never chosen to
fit: Meta, Mistral and Qwen count the embedding table; OpenAI's gpt-oss model card does not
(Table 1 arithmetic: 4/128 of 114.71B MLP + 0.96B attention + 0.58B unembedding = 5.13B), nor
does DeepSeek (DeepSeek-V2-Lite's published 2.4B active is 2.45B without it, 2.66B with it).
MiniMax and Zhipu (GLM-4.5) do not say; see the notes in their catalog files. Multimodal models
are held to figures of their language model (Gemma 3's report gives it apart; Llama 4 Maverick's
400B includes a vision encoder under 1B, inside the 1%).
"""

from __future__ import annotations

import pytest

from workloads import catalog, params

B = 1e9
# name: (total, active, source). Dense models: active = total.
PUBLISHED = {
    "llama-3.1-8b": (8.03 * B, 8.03 * B, "HF meta-llama/Llama-3.1-8B safetensors: 8,030,261,248"),
    "llama-3.1-70b": (70.6 * B, 70.6 * B, "HF meta-llama/Llama-3.1-70B safetensors: 70.6B"),
    "llama-3.1-405b": (406 * B, 406 * B, "HF meta-llama/Llama-3.1-405B safetensors: 406B"),
    "llama-3.2-1b": (1.23 * B, 1.23 * B, "meta-llama/Llama-3.2-1B model card: 1.23B"),
    "llama-3.2-3b": (3.21 * B, 3.21 * B, "meta-llama/Llama-3.2-3B model card: 3.21B"),
    "llama-2-7b": (6.74 * B, 6.74 * B, "HF meta-llama/Llama-2-7b-hf safetensors: 6,738,415,616"),
    "llama-2-70b": (68.98 * B, 68.98 * B, "HF meta-llama/Llama-2-70b-hf: 68,976,648,192"),
    "mistral-7b": (7.24 * B, 7.24 * B, "HF mistralai/Mistral-7B-v0.1 safetensors: 7,241,732,096"),
    "mixtral-8x7b": (46.7 * B, 12.9 * B, "Mixtral of Experts, arXiv 2401.04088: 46.7B / 12.9B"),
    "qwen2.5-7b": (7.61 * B, 7.61 * B, "Qwen/Qwen2.5-7B model card: 7.61B"),
    "qwen2.5-72b": (72.7 * B, 72.7 * B, "Qwen/Qwen2.5-72B model card: 72.7B"),
    "qwen3-32b": (32.8 * B, 32.8 * B, "Qwen/Qwen3-32B model card: 32.8B"),
    "qwen3-235b-a22b": (235 * B, 22 * B, "Qwen/Qwen3-235B-A22B model card: 235B / 22B"),
    "deepseek-v3": (671 * B, 37 * B, "DeepSeek-V3 Technical Report, arXiv 2412.19437: 671B / 37B"),
    "gpt-oss-120b": (116.83 * B, 5.13 * B, "gpt-oss model card, arXiv 2508.10925, Table 1"),
    "gpt-oss-20b": (20.91 * B, 3.61 * B, "gpt-oss model card, arXiv 2508.10925, Table 1"),
    "minimax-m2": (230 * B, 10 * B, "MiniMaxAI/MiniMax-M2 model card: 230B total, 10B active"),
    "qwen3-next-80b-a3b": (
        80 * B,
        3_874_929_408,
        (
            "Qwen/Qwen3-Next-80B-A3B model card: 80B total; active: total minus the inactive "
            "expert tensors of the safetensors headers of the same architecture "
            "(Qwen/Qwen3-Coder-Next)"
        ),
    ),
    "nemotron-h-56b": (56 * B, 56 * B, "Nemotron-H, arXiv 2504.03624: Nemotron-H-56B"),
    # The families of issue 17, one or more per importer.
    "llama-4-maverick": (400 * B, 17 * B, "Llama-4-Maverick-17B-128E model card: 400B / 17B"),
    "gemma-2-9b": (9_241_705_984, 9_241_705_984, "Gemma 2 report, arXiv 2408.00118, Table 2"),
    "gemma-3-27b": (27.016 * B, 27.016 * B, "Gemma 3 report, arXiv 2503.19786, Table 1 (text)"),
    "phi-3-mini-4k": (3.8 * B, 3.8 * B, "Phi-3 report, arXiv 2404.14219: phi-3-mini 3.8B"),
    "deepseek-v2": (236 * B, 21 * B, "DeepSeek-V2, arXiv 2405.04434: 236B / 21B"),
    "qwen1.5-moe-a2.7b": (14.3 * B, 2.7 * B, "Qwen/Qwen1.5-MoE-A2.7B model card: 14.3B / 2.7B"),
    "glm-4.5-air": (106 * B, 12 * B, "GLM-4.5 report, arXiv 2508.06471: GLM-4.5-Air 106B / 12B"),
    "mistral-small-3.1-24b": (
        23.6 * B, 23.6 * B, "mistralai/Mistral-Small-24B-Base-2501 safetensors: 23.6B (text)"),
}


def _tolerance(published: float, rounding: float) -> float:
    return max(0.01 * published, rounding)


def test_every_catalog_model_has_a_published_figure():
    """Each catalog file carries its published counts (checked below for every file); this
    table restates those of the models above, from their sources, as a second reading."""
    assert set(PUBLISHED) <= set(catalog.list_models())
    for name in catalog.list_models():
        pub = catalog.published(name)
        assert pub["total_params"] > 0 and pub["active_params"] > 0 and pub["source"], name


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalog_metadata_agrees_with_this_table(name):
    pub = catalog.published(name)
    total, active, _ = PUBLISHED[name]
    assert pub["total_params"] == pytest.approx(total)
    assert pub["active_params"] == pytest.approx(active)
    assert pub["source"]


@pytest.mark.parametrize("name", catalog.list_models())
def test_total_params_match_published(name):
    spec = catalog.load_model(name)
    pub = catalog.published(name)
    total, source = pub["total_params"], pub["source"]
    tol = _tolerance(total, catalog.published(name).get("total_rounding", 0.0))
    assert abs(params.total_params(spec) - total) <= tol, source


@pytest.mark.parametrize("name", catalog.list_models())
def test_active_params_match_published(name):
    spec = catalog.load_model(name)
    pub = catalog.published(name)
    active, source = pub["active_params"], pub["source"]
    counted = params.active_params(
        spec,
        input_embedding=pub.get("active_counts_input_embedding", True),
        output_embedding=pub.get("active_counts_output_embedding", True),
    )
    assert abs(counted - active) <= _tolerance(active, pub.get("active_rounding", 0.0)), source


def test_mtp_modules_are_counted_only_on_request():
    spec = catalog.load_model("deepseek-v3")
    extra = params.total_params(spec, include_mtp=True) - params.total_params(spec)
    # The HF checkpoint holds 685B = 671B + 14B MTP (DeepSeek-V3 README); 14B includes copies of
    # the embedding and head (2 x 0.93B) that the MTP module shares with the main model.
    assert 11.0 * B < extra < 12.5 * B
    assert params.mtp_params(catalog.load_model("llama-3.1-8b")) == 0


def test_tied_embeddings_count_once():
    spec = catalog.load_model("llama-3.2-1b")
    parts = params.param_breakdown(spec)
    assert parts["lm_head"] == 0 and parts["embedding"] == 128256 * 2048


def test_mla_breakdown_deepseek_v3():
    a = catalog.load_model("deepseek-v3").attention
    # q_a 7168x1536 + norm 1536 + q_b 1536x(128x192) + kv_a 7168x576 + norm 512
    # + kv_b 512x(128x256) + o 16384x7168
    expected = (
        7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256
        + 128 * 128 * 7168
    )
    assert params.attention_params(a, 7168) == expected
