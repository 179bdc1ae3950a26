"""Calibration profiles: fitted values of the unknown parameters, applied after a chip is loaded.

A profile (cluster_configs/calibration/<name>.toml, written by `rdu-cluster calibrate`) lists
each fitted parameter with the chips it applies to, its first-principles value, its range and
basis, the rows it was fitted to, and the residuals. `load_cluster` applies the active profile to
the chip's [execution] values; `--calibration PROFILE|none` (every command) chooses it, and
`use(profile)` scopes one in code. The default for the command line is the shipped profile,
"default"; for library code it is none (first-principles values), so the simulator's own tests
do not depend on a fit.

The parameter declarations (published | derived | unknown, range, basis) are
rdu_cluster/validation/parameters.toml.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import cluster_configs
from workloads.errors import ConfigError

DEFAULT = "default"
STATUSES = ("published", "derived", "unknown")


@dataclass(frozen=True)
class Declaration:
    """One entry of parameters.toml: a chip [execution] key or a topology key, and its status."""

    key: str
    status: str
    basis: str
    chips: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()
    range: tuple[float, float] | None = None


@dataclass(frozen=True)
class Profile:
    name: str
    values: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (chip, key) -> value
    meta: Mapping[str, Any] = field(default_factory=dict)


def declarations() -> list[Declaration]:
    text = resources.files("rdu_cluster").joinpath("validation/parameters.toml").read_text()
    out = []
    for i, d in enumerate(tomllib.loads(text)["parameter"]):
        where = f"parameters.toml: parameter {i + 1} ({d.get('key')})"
        if d.get("status") not in STATUSES:
            raise ConfigError(f"{where}.status: {d.get('status')!r}; accepted: {STATUSES}")
        rng = d.get("range")
        if d["status"] == "unknown" and (not rng or not 0 < rng[0] < rng[1]):
            raise ConfigError(f"{where}.range: an unknown parameter needs [low, high], 0 < low < high")
        out.append(Declaration(d["key"], d["status"], d["basis"], tuple(d.get("chips", ())),
                               tuple(d.get("clusters", ())), tuple(rng) if rng else None))
    return out


# ---- profiles on disk ------------------------------------------------------------------------


def profile_path(ref: str) -> Path:
    if ref.endswith(".toml") or "/" in ref:
        return Path(ref)
    return cluster_configs.config_dir("calibration") / f"{ref}.toml"


def load(ref: str | None) -> Profile | None:
    """A profile by bundled name or path; None or "none": no profile (first-principles values)."""
    if ref is None or ref == "none":
        return None
    path = profile_path(ref)
    if not path.is_file():
        found = sorted(p.stem for p in cluster_configs.config_dir("calibration").glob("*.toml"))
        raise ConfigError(
            f"calibration: {ref!r} not found; accepted: none, {', '.join(found)} or a .toml path"
        )
    with path.open("rb") as f:
        raw = tomllib.load(f)
    values = {}
    for i, p in enumerate(raw.get("parameter", [])):
        v = p.get("value")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ConfigError(f"{path.name}: parameter {i + 1}.value: expected a number >= 0")
        for chip in p["chips"]:
            values[(chip, p["key"])] = float(v)
    meta = {k: v for k, v in raw.items() if k != "parameter"}
    return Profile(raw.get("name", path.stem), values, meta)


# ---- the active profile ------------------------------------------------------------------------

_ACTIVE: list[Profile | None] = [None]


def active() -> Profile | None:
    return _ACTIVE[-1]


def activate(profile: Profile | None) -> None:
    """Make `profile` the one `load_cluster` applies (the CLI's --calibration does this)."""
    _ACTIVE[-1] = profile


@contextlib.contextmanager
def use(profile: Profile | None) -> Iterator[None]:
    _ACTIVE.append(profile)
    try:
        yield
    finally:
        _ACTIVE.pop()


def apply_chip(chip, profile: Profile | None = None, keep: frozenset | set = frozenset()):
    """The chip with the profile's values (default: the active profile) in its [execution],
    except the keys in `keep` (values the user set explicitly)."""
    profile = profile if profile is not None else active()
    if profile is None:
        return chip
    updates = {
        k: v for (c, k), v in profile.values.items() if c == chip.name and k not in keep
    }
    if not updates:
        return chip
    unknown = set(updates) - set(chip.execution)
    if unknown:
        raise ConfigError(
            f"calibration {profile.name}: chip {chip.name} has no execution parameter "
            f"{', '.join(sorted(unknown))}"
        )
    return dataclasses.replace(chip, execution={**chip.execution, **updates})


def apply(cluster, profile: Profile | None = None):
    """The cluster with its chip calibrated (see apply_chip)."""
    chip = apply_chip(cluster.chip, profile)
    return cluster if chip is cluster.chip else dataclasses.replace(cluster, chip=chip)
