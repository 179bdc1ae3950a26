"""Import a HuggingFace `config.json` into a ModelSpec.

One small importer per `model_type`, registered with `@register` (common.py) in the module of its
architecture: dense.py (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, starcoder2, mistral3),
moe.py (mixtral, qwen3_moe, gpt_oss, minimax_m2, llama4, qwen2_moe, glm4_moe), mla.py
(deepseek_v2, deepseek_v3) and hybrid.py (qwen3_next, nemotron_h); common.py holds the field
readers, the pieces importers share and the registry (`IMPORTERS`). Adding a family is one
function registered in one of those modules (or a module of its own: every module of this package
is imported here) and one test (docs/extending.md), and a catalog file (workloads/catalog/) to
name it. Field names and their meaning follow the transformers configuration classes of each
family (LlamaConfig, MixtralConfig, Qwen3MoeConfig, DeepseekV3Config, GptOssConfig,
Qwen3NextConfig, NemotronHConfig, Llama4TextConfig, Gemma2Config, Gemma3TextConfig, Phi3Config,
DeepseekV2Config, Qwen2MoeConfig, Glm4MoeConfig, Mistral3Config, Starcoder2Config) and
MiniMaxAI/MiniMax-M2's configuration_minimax_m2.py. Multimodal configs (llama4, gemma3, mistral3)
nest the language model under `text_config`; only that part is imported (the vision encoder runs
once per image, outside the decode loop this simulator costs). `quantization_config` (top level,
or under `text_config`) sets the weight dtype (quantization.py: `checkpoint_precision`). Every
error is a ConfigError with a one-line message naming the file and the field or model_type.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from workloads.dtypes import Precision
from workloads.errors import ConfigError
from workloads.files import read_json
from workloads.hf_config.common import IMPORTERS, Cfg, kind_check, supported_model_types
from workloads.hf_config.quantization import checkpoint_precision
from workloads.spec import ModelSpec, check_model

__all__ = [
    "IMPORTERS",
    "checkpoint_precision",
    "from_hf_config",
    "read_config",
    "supported_model_types",
]

# A family module registers its importers as it is imported: every module of this package is
# imported here, in name order, so a family in a module of its own needs no line elsewhere.
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")


def read_config(path: str | Path) -> dict[str, Any]:
    """A config.json (or a directory holding one) as a dict; ConfigError naming the file."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    data = read_json(p)
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object, got {type(data).__name__}")
    return data


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
    cfg = Cfg(data, source, model_type)
    for key, value in data.items():  # a field of a known kind is checked, read or not
        if value is not None:
            cfg.checked(key, functools.partial(kind_check, key, value))
    meta = Cfg(cfg.get("_rdu", {}), f"{source}: _rdu", model_type)
    name = name or meta.get("name") or cfg.get("_name_or_path") or model_type
    spec = IMPORTERS[model_type](cfg, name)
    check_model(spec, source)
    if precision is not None:
        return spec.with_precision(precision)
    # A multimodal config may quantize only its language model: text_config's own table wins.
    quant, label = checkpoint_precision(cfg.nested("text_config", model_type), spec.is_moe)
    return replace(spec, precision=quant, quantization=label)
