"""The bundled model catalog: one HuggingFace config.json per model, as published (keys the
importer does not read trimmed), plus an `_rdu` key with the catalog name, the HF repository, the
published total/active parameter figures and their source.

Files are read with importlib.resources, so the catalog works from an installed (non-editable)
package. Default precision is BF16 everywhere except where the published checkpoint is natively
lower and nothing else is published: gpt-oss experts are MXFP4. DeepSeek-V3 and MiniMax-M2 ship
FP8 checkpoints, but stay BF16 by default so FP8 is an explicit choice (a 671B model fits 16 SN40L
only with FP8 weights or DDR spill; `load_model("deepseek-v3", FP8_WEIGHTS)` says so).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from workloads.dtypes import DType, Precision
from workloads.errors import ConfigError
from workloads.hf_config import from_hf_config, read_config
from workloads.spec import ModelSpec

FP8_WEIGHTS = Precision(weights=DType.FP8)


def _files() -> dict[str, Any]:
    root = resources.files(__name__)
    return {
        p.name[: -len(".json")]: p
        for p in root.iterdir()
        if p.name.endswith(".json") and not p.name.startswith("_")
    }


def list_models() -> list[str]:
    """Catalog names, sorted."""
    return sorted(_files())


def model_config(name: str) -> dict[str, Any]:
    """The catalog's config.json for `name`, as a dict (with its `_rdu` key)."""
    files = _files()
    if name not in files:
        raise ConfigError(
            f"model: unknown model {name!r}; catalog: {', '.join(sorted(files))} "
            "(or give a path to a config.json)"
        )
    return json.loads(files[name].read_text())


def published(name: str) -> dict[str, Any]:
    """The published parameter figures of a catalog model and their source."""
    return model_config(name)["_rdu"]["published"]


def load_model(name_or_path: str | Path, precision: Precision | None = None) -> ModelSpec:
    """A catalog name, or a path to a config.json (or a directory holding one)."""
    key = str(name_or_path)
    if key in _files():
        return from_hf_config(model_config(key), name=key, precision=precision)
    path = Path(key)
    if path.suffix == ".json" or path.is_dir() or path.exists():
        return from_hf_config(read_config(path), name=path.stem if path.is_file() else key,
                              precision=precision)
    return from_hf_config(model_config(key))  # raises the unknown-name error
