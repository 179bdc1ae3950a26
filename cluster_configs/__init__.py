"""The bundled chip and cluster TOML files (package data, found from an installed package too)."""

from __future__ import annotations

import functools
from pathlib import Path


def config_dir(kind: str) -> Path:
    """The folder of bundled `kind` files: "chips", "clusters" or "calibration". Beside this
    module: the package installs as files (setup.cfg package_data; str(resources.files(...))
    was a plain path too), and importlib.resources would load zipfile on every command."""
    return Path(__file__).resolve().parent / kind


def bundled(kind: str) -> dict[str, Path]:
    """Bundled config name -> path, for "chips" or "clusters"."""
    return dict(_bundled(kind))


@functools.cache  # package data: fixed for the process (a calibration resolves names thousands of times)
def _bundled(kind: str) -> dict[str, Path]:
    return {p.stem: p for p in sorted(config_dir(kind).glob("*.toml"))}
