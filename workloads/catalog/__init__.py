"""The bundled model catalog: one HuggingFace config.json per model, as published (keys the
importer does not read trimmed), plus an `_rdu` key with the catalog name, the HF repository
(`hf_repo`, and `hf_aliases`: the instruct / base / renamed repositories of the same weights), the
published total/active parameter figures and their source.

Files are read beside this module (package data installed as files), so the catalog works from an
installed (non-editable) package. A model is named by its catalog name or a HF repository id, either in any case. The
weight dtype is the checkpoint's: its `quantization_config` (DeepSeek-V3 fp8, gpt-oss experts
mxfp4, ...) or BF16 without one; `load_model(name, precision)` chooses another (a 671B model at
BF16 fits 16 SN40L only with DDR spill: `load_model("deepseek-v3", BF16_WEIGHTS)`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from workloads.dtypes import DType, Precision
from workloads.errors import ConfigError
from workloads.hf_config import from_hf_config, read_config
from workloads.spec import ModelSpec

FP8_WEIGHTS = Precision(weights=DType.FP8)
BF16_WEIGHTS = Precision(weights=DType.BF16)


@functools.cache  # package data: fixed for the process
def _files() -> dict[str, Any]:
    root = Path(__file__).resolve().parent  # package data as files (resources loads zipfile)
    return {
        p.name[: -len(".json")]: p
        for p in root.iterdir()
        if p.name.endswith(".json") and not p.name.startswith("_")
    }


def list_models() -> list[str]:
    """Catalog names, sorted."""
    return sorted(_files())


@functools.cache
def _hf_ids() -> dict[str, str]:
    """Lower-cased HF repository id -> catalog name."""
    out: dict[str, str] = {}
    for name in _files():
        meta = _read(name)["_rdu"]
        for repo in [meta["hf_repo"], *meta.get("hf_aliases", [])]:
            out[repo.lower()] = name
    return out


def catalog_name(ref: str) -> str | None:
    """The catalog name `ref` stands for (a name or HF repository id in any case), or None."""
    key = ref.strip().lower()
    return _lower_names().get(key) or _hf_ids().get(key)


@functools.cache
def _lower_names() -> dict[str, str]:
    return {n.lower(): n for n in _files()}


def model_config(name: str) -> dict[str, Any]:
    """The catalog's config.json for `name` (or its HF repository id), with its `_rdu` key."""
    found = catalog_name(name)
    if found is None:
        raise ConfigError(
            f"model: unknown model {name!r}; catalog: {', '.join(list_models())} "
            "(or a HuggingFace repository id of one, or a path to a config.json)"
        )
    return _read(found)


def _read(name: str) -> dict[str, Any]:
    return json.loads(_files()[name].read_text())


def _path_name(path: Path, key: str) -> str:
    """A model given by path is named as given: a directory by its path, a JSON file by its
    stem, except a HuggingFace checkpoint's `config.json`, named by its directory as the
    directory itself would be (`models/llama/config.json` and `models/llama` are one model;
    its stem, 'config', named none)."""
    if not path.is_file():
        return key
    if path.name != "config.json":
        return path.stem
    return str(path.parent) if str(path.parent) != "." else path.resolve().parent.name


def published(name: str) -> dict[str, Any]:
    """The published parameter figures of a catalog model and their source."""
    return model_config(name)["_rdu"]["published"]


def load_model(name_or_path: str | Path, precision: Precision | None = None) -> ModelSpec:
    """A catalog name or HF repository id (any case), or a path to a config.json (or a
    directory holding one). An existing path wins over a repository id of the same spelling."""
    key = str(name_or_path)
    name = key if key in _files() else None
    path = Path(key)
    if name is None and (path.suffix == ".json" or path.exists()):
        source = str(path / "config.json" if path.is_dir() else path)
        return from_hf_config(read_config(path), name=_path_name(path, key),
                              precision=precision, source=source)
    name = name or catalog_name(key)
    cfg = model_config(key)  # raises the unknown-name error when name is None
    return from_hf_config(cfg, name=name, precision=precision, source=f"catalog {name}.json")
