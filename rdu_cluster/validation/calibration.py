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
import math
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import cluster_configs
from workloads import checks
from workloads.errors import ConfigError
from workloads.files import read_toml

DEFAULT = "default"
# What `rdu-cluster calibrate` writes beside chips, key and value (fit.profile_text).
PROFILE_EXTRA = {"first_principles", "range", "basis", "rows"}
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
    """A profile by bundled name or path; None or "none": no profile (first-principles values).
    Every field is checked: a profile holds only declared parameters (parameters.toml) of the
    chips they are declared for, each with a finite value >= 0."""
    if ref is None or ref == "none":
        return None
    path = profile_path(ref)
    if not path.is_file():
        found = sorted(p.stem for p in cluster_configs.config_dir("calibration").glob("*.toml"))
        raise ConfigError(
            f"calibration: {ref!r} not found; accepted: none, {', '.join(found)} or a .toml path"
        )
    raw = read_toml(path, "calibration")
    entries = raw.get("parameter", [])
    if not isinstance(entries, list):
        raise ConfigError(f"calibration {path.name}: parameter: expected [[parameter]] tables, "
                          f"got {checks.show(entries)}")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"calibration {path.name}: name: expected a non-empty string, got "
                          f"{checks.show(name)}")
    declared: dict[str, tuple[str, ...]] = {}
    ranges: dict[tuple[str, str], tuple[float, float]] = {}  # (chip, key) -> declared range
    for d in declarations():
        declared[d.key] = declared.get(d.key, ()) + d.chips
        for chip in d.chips if d.range else ():
            ranges[(chip, d.key)] = d.range
    values = {}
    for i, p in enumerate(entries):
        where = f"calibration {path.name}: parameter {i + 1}"
        checks.exact_keys(p, {"chips", "key", "value"}, where, PROFILE_EXTRA)
        if p["key"] not in declared:
            raise ConfigError(f"{where}.key: {checks.show(p['key'])}; accepted: the keys of "
                              f"parameters.toml ({', '.join(sorted(declared))})")
        chips = p["chips"]
        if not (isinstance(chips, list) and chips
                and all(isinstance(c, str) and c in declared[p["key"]] for c in chips)):
            raise ConfigError(f"{where}.chips: {checks.show(chips)}; accepted: a list of the "
                              f"chips {p['key']} is declared for ({', '.join(declared[p['key']])})")
        v = checks.number(p["value"], f"{where}.value", 0.0)
        for chip in chips:
            if (chip, p["key"]) in values:
                raise ConfigError(f"{where}: {p['key']} of {chip} is set twice; expected once")
            lo, hi = ranges.get((chip, p["key"]), (0.0, math.inf))
            if not lo <= v <= hi:  # calibrate fits within it: a value outside was never fitted
                raise ConfigError(f"{where}.value: {v:g} outside {p['key']}'s declared range "
                                  f"[{lo:g}, {hi:g}] (parameters.toml)")
            values[(chip, p["key"])] = v
    meta = {k: v for k, v in raw.items() if k != "parameter"}
    return Profile(name, values, meta)


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
