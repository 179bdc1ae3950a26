"""The bundled chip and cluster TOML files (package data, found from an installed package too)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def config_dir(kind: str) -> Path:
    """The folder of bundled `kind` files: "chips", "clusters" or "calibration"."""
    return Path(str(resources.files(__name__).joinpath(kind)))


def bundled(kind: str) -> dict[str, Path]:
    """Bundled config name -> path, for "chips" or "clusters"."""
    return {p.stem: p for p in sorted(config_dir(kind).glob("*.toml"))}
