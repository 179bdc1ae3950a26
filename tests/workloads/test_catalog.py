"""The bundled catalog: names, loading by name or path, precision, errors."""

from __future__ import annotations

import json

import pytest

from workloads import catalog, graph
from workloads.dtypes import DType, Precision
from workloads.errors import ConfigError

REQUIRED = [
    "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-3.2-1b", "llama-3.2-3b",
    "llama-2-7b", "llama-2-70b", "mistral-7b", "mixtral-8x7b", "qwen3-32b", "qwen3-235b-a22b",
    "deepseek-v3", "gpt-oss-120b", "gpt-oss-20b", "minimax-m2", "qwen3-next-80b-a3b",
    "nemotron-h-56b", "llama-4-maverick", "gemma-2-9b", "gemma-3-27b", "phi-3-mini-4k",
    "deepseek-v2", "qwen1.5-moe-a2.7b", "glm-4.5-air", "mistral-small-3.1-24b",
]


def test_required_names_present():
    names = catalog.list_models()
    assert len(names) >= 16 and set(REQUIRED) <= set(names)


@pytest.mark.parametrize("name", catalog.list_models())
def test_each_file_names_itself(name):
    meta = catalog.model_config(name)["_rdu"]
    assert meta["name"] == name and meta["hf_repo"] and meta["published"]["source"]
    assert catalog.load_model(name).name == name


def test_unknown_name_lists_catalog():
    with pytest.raises(ConfigError) as e:
        catalog.load_model("llama-9")
    msg = str(e.value)
    assert "\n" not in msg and "unknown model 'llama-9'" in msg and "deepseek-v3" in msg


def test_load_by_path(tmp_path):
    path = tmp_path / "my-model.json"
    path.write_text(json.dumps(catalog.model_config("mistral-7b")))
    spec = catalog.load_model(path)
    assert spec.name == "my-model" and spec.num_layers == 32


def test_a_checkpoint_config_json_is_named_by_its_folder(tmp_path, monkeypatch):
    """`dir/config.json` and `dir` name one model (its stem, 'config', named every checkpoint
    alike); a config.json in the current folder takes the folder's name."""
    folder = tmp_path / "llama-local"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(catalog.model_config("llama-3.2-1b")))
    monkeypatch.chdir(tmp_path)
    assert catalog.load_model("llama-local/config.json").name == "llama-local"
    assert catalog.load_model("llama-local").name == "llama-local"
    monkeypatch.chdir(folder)
    assert catalog.load_model("config.json").name == "llama-local"


def test_precision_override_and_defaults():
    ds = catalog.load_model("deepseek-v3", catalog.BF16_WEIGHTS)
    fp8 = catalog.load_model("deepseek-v3")  # the checkpoint's quantization_config: fp8
    assert ds.precision.weights is DType.BF16 and fp8.precision.weights is DType.FP8
    assert fp8.quantization == "fp8 (quantization_config fp8)" and ds.quantization == ""
    # 671B at BF16 is 1.34 TB, over 16 x 64 GB of SN40L HBM; at FP8 it is 0.67 TB.
    assert graph.weight_bytes(ds) > 16 * 64e9 > graph.weight_bytes(fp8)
    gpt = catalog.load_model("gpt-oss-120b")
    assert gpt.precision.routed_expert_weights is DType.MXFP4
    # 116.8B with MXFP4 experts (4.25 bits) and BF16 for the rest: about 63 GB.
    assert 60e9 < graph.weight_bytes(gpt) < 66e9
    int4 = catalog.load_model("llama-3.1-8b", Precision(weights=DType.INT4))
    assert graph.weight_bytes(int4) == pytest.approx(8.03e9 * 0.5, rel=0.001)


@pytest.mark.parametrize(
    "ref, name",
    [
        ("LLAMA-3.1-70B", "llama-3.1-70b"),
        ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
        ("meta-llama/llama-3.1-70b", "llama-3.1-70b"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-v3"),
        ("google/gemma-3-27b-it", "gemma-3-27b"),
        ("Qwen/Qwen1.5-MoE-A2.7B-Chat", "qwen1.5-moe-a2.7b"),
    ],
)
def test_names_case_insensitive_and_hf_repo_ids(ref, name):
    assert catalog.catalog_name(ref) == name
    assert catalog.load_model(ref).name == name


def test_hf_ids_unique_across_catalog():
    seen: dict[str, str] = {}
    for name in catalog.list_models():
        meta = catalog.model_config(name)["_rdu"]
        for repo in [meta["hf_repo"], *meta.get("hf_aliases", [])]:
            assert seen.setdefault(repo.lower(), name) == name, repo


def test_errors_name_the_file(tmp_path):
    cfg = catalog.model_config("gemma-2-9b")
    del cfg["hidden_size"]
    path = tmp_path / "gemma.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as e:
        catalog.load_model(path)
    assert str(e.value).startswith(f"{path}: missing field 'hidden_size'")
    nested = catalog.model_config("gemma-3-27b")
    nested["text_config"]["num_hidden_layers"] = -1
    (tmp_path / "config.json").write_text(json.dumps(nested))
    with pytest.raises(ConfigError) as e:
        catalog.load_model(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'config.json'}: text_config: field "
                                   "'num_hidden_layers' must be a positive integer")
