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
    "nemotron-h-56b",
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


def test_precision_override_and_defaults():
    ds = catalog.load_model("deepseek-v3")
    fp8 = catalog.load_model("deepseek-v3", catalog.FP8_WEIGHTS)
    assert ds.precision.weights is DType.BF16 and fp8.precision.weights is DType.FP8
    # 671B at BF16 is 1.34 TB, over 16 x 64 GB of SN40L HBM; at FP8 it is 0.67 TB.
    assert graph.weight_bytes(ds) > 16 * 64e9 > graph.weight_bytes(fp8)
    gpt = catalog.load_model("gpt-oss-120b")
    assert gpt.precision.routed_expert_weights is DType.MXFP4
    # 116.8B with MXFP4 experts (4.25 bits) and BF16 for the rest: about 63 GB.
    assert 60e9 < graph.weight_bytes(gpt) < 66e9
    int4 = catalog.load_model("llama-3.1-8b", Precision(weights=DType.INT4))
    assert graph.weight_bytes(int4) == pytest.approx(8.03e9 * 0.5, rel=0.001)
