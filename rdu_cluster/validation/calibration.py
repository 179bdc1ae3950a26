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
import functools
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import cluster_configs
from chip import kernel_efficiency
from workloads import checks
from workloads.errors import ConfigError
from workloads.files import parse_toml, read_text

DEFAULT = "default"
# What `rdu-cluster calibrate` writes beside chips, key and value (fit.profile_text).
PROFILE_EXTRA = {"first_principles", "range", "basis", "rows", "family"}
PROFILE_META = {"name", "date", "code_version", "measurements_version", "method", "residual"}
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
    # A declaration derived for a chip no entry lists: the declared chip of its family it
    # follows (`calibrate --chip NEW` on a chip that extends one), and NEW's own value.
    family: str = ""
    value: float | None = None


@dataclass(frozen=True)
class Profile:
    name: str
    values: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (chip, key) -> value
    meta: Mapping[str, Any] = field(default_factory=dict)
    rows: frozenset[str] = frozenset()  # the ids of the rows it was fitted to (validate's check)
    path: str = ""  # the file it was read from (its uncertainty model lies beside it)


def bounds(d: Declaration) -> tuple[float, float]:
    """An unknown parameter's declared range: _declared refuses one without (calibrate fits
    only unknown parameters)."""
    return cast("tuple[float, float]", d.range)


def declarations() -> list[Declaration]:
    # beside this module (package data installed as files: importlib.resources loads zipfile)
    return list(_declared((Path(__file__).resolve().parent / "parameters.toml").read_text()))


@functools.lru_cache(maxsize=2)
def _declared(text: str) -> tuple[Declaration, ...]:
    """parameters.toml's declarations, parsed once per text: every command's --calibration
    reads them (tomllib: ~6 ms of the profile's 7 ms load, in each of thousands of CLI runs of
    the tests). Keyed by the text, so an edited file is read again."""
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
    return tuple(out)


# ---- profiles on disk ------------------------------------------------------------------------


def profile_path(ref: str) -> Path:
    if ref.endswith(".toml") or "/" in ref:
        return Path(ref)
    return cluster_configs.config_dir("calibration") / f"{ref}.toml"


def load(ref: str | None) -> Profile | None:
    """A profile by bundled name or path; None or "none": no profile (first-principles values).
    Every field is checked: a profile holds only unknown parameters (parameters.toml) of the
    chips they are declared for, each with a value in its declared range."""
    if ref is None or ref == "none":
        return None
    path = profile_path(ref)
    if not path.is_file():
        found = sorted(p.stem for p in cluster_configs.config_dir("calibration").glob("*.toml"))
        raise ConfigError(
            f"calibration: {ref!r} not found; accepted: none, {', '.join(found)} or a .toml path"
        )
    return _loaded(read_text(path, "calibration"), path)


@functools.lru_cache(maxsize=8)
def _loaded(text: str, path: Path) -> Profile:
    """A profile file checked once per text: every command's --calibration loads one (1 ms of
    checks a load; the tests make thousands of CLI runs). Keyed by the text, so an edited file
    is read again; a profile is a value (frozen, and no caller changes its mappings)."""
    return _parse(parse_toml(text, f"calibration {path.name}"), path)


def load_text(text: str, path: str | Path) -> Profile:
    """A profile from its text (what `calibrate` is about to write to `path`)."""
    return _parse(tomllib.loads(text), Path(path))


def _parse(raw: dict[str, Any], path: Path) -> Profile:
    where = f"calibration {path.name}"
    # what profile_text writes: a misspelt table ([[paramter]]) or an empty file was a profile
    # of no values, i.e. --calibration none under another name
    checks.exact_keys(raw, {"parameter"}, where, PROFILE_META)
    entries = raw["parameter"]
    if not (isinstance(entries, list) and entries):
        raise ConfigError(f"{where}: parameter: expected [[parameter]] tables (one or more), "
                          f"got {checks.show(entries)}")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: name: expected a non-empty string, got {checks.show(name)}")
    fitted = {(d.key, d.chips): bounds(d) for d in declarations()
              if d.status == "unknown" and d.chips}
    declared: dict[str, list[tuple[str, ...]]] = {}  # key -> the chip tuples it is declared for
    for key, chips in fitted:
        declared.setdefault(key, []).append(chips)
    values: dict[tuple[str, str], float] = {}
    rows: set[str] = set()
    for i, p in enumerate(entries):
        key, chips, v = _entry(p, fitted, declared, f"{where}: parameter {i + 1}")
        rows |= _rows(p, f"{where}: parameter {i + 1}")
        for chip in chips:
            if (chip, key) in values:
                raise ConfigError(f"{where}: parameter {i + 1}: {key} of {chip} is set twice; "
                                  "expected once")
            values[(chip, key)] = v
    meta = {k: v for k, v in raw.items() if k != "parameter"}
    return Profile(name, values, meta, frozenset(rows), str(path))


def _rows(p: Mapping[str, Any], where: str) -> set[str]:
    rows = p.get("rows", [])
    if not (isinstance(rows, list) and all(isinstance(r, str) and r for r in rows)):
        raise ConfigError(f"{where}.rows: expected a list of row ids, got {checks.show(rows)}")
    return set(rows)


def _entry(p: Any, fitted: Mapping[tuple[str, tuple[str, ...]], tuple[float, float]],
           declared: Mapping[str, list[tuple[str, ...]]],
           where: str) -> tuple[str, tuple[str, ...], float]:
    """One [[parameter]]: an unknown parameter (the only kind calibrate fits) with the chips of
    its declaration, all of them (they share one value), and a value in its declared range.
    `declared`: `fitted`'s chip tuples by key (made once per profile, not once per entry)."""
    checks.exact_keys(p, {"chips", "key", "value"}, where, PROFILE_EXTRA)
    if p["key"] not in declared:
        raise ConfigError(f"{where}.key: {checks.show(p['key'])}; accepted: the unknown "
                          f"parameters of parameters.toml ({', '.join(sorted(declared))})")
    chips = tuple(p["chips"]) if isinstance(p["chips"], list) else None
    family = p.get("family")
    if family is not None and chips is not None and len(chips) == 1:
        # a chip of a declared chip's family, fitted on its own (calibrate --chip NEW)
        match = [c for c in declared[p["key"]] if family in c]
        if not match:
            raise ConfigError(f"{where}.family: {checks.show(family)}; accepted: a chip "
                              f"{p['key']} is declared for")
        lo, hi = fitted[(p["key"], match[0])]
        v = checks.number(p["value"], f"{where}.value", 0.0)
        if not lo <= v <= hi:
            raise ConfigError(f"{where}.value: {v:g} outside {p['key']}'s declared range "
                              f"[{lo:g}, {hi:g}] (parameters.toml, {family})")
        return p["key"], chips, v
    if chips not in declared[p["key"]]:
        shown = " or ".join(str(list(c)) for c in declared[p["key"]])
        raise ConfigError(f"{where}.chips: {checks.show(p['chips'])}; accepted: the chips "
                          f"{p['key']} is declared for together ({shown})")
    v = checks.number(p["value"], f"{where}.value", 0.0)
    lo, hi = fitted[(p["key"], chips)]
    if not lo <= v <= hi:  # calibrate fits within it: a value outside was never fitted
        raise ConfigError(f"{where}.value: {v:g} outside {p['key']}'s declared range "
                          f"[{lo:g}, {hi:g}] (parameters.toml)")
    return p["key"], chips, v


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
    except the keys in `keep` (values the user set explicitly), and `calibration` naming where
    they came from. A chip inherits the values of the nearest chip of its family (itself, then
    the chips it `extends`) that the profile calibrates, for each key no file between them sets
    itself: a variant that only changes tiers keeps its parent's fit; one that states its own
    value of a parameter keeps that."""
    profile = profile if profile is not None else active()
    if profile is None:
        return chip
    updates, sources = {}, set()
    for key in {k for (_, k) in profile.values} - set(keep):
        member = calibrated_member(chip, key, profile)
        if member is not None:
            updates[key] = profile.values[(member, key)]
            sources.add(member)
    if not updates:
        return chip
    unknown = {k for k in updates
               if k not in chip.execution and not kernel_efficiency.is_stack_key(k)}
    if unknown:
        raise ConfigError(
            f"calibration {profile.name}: chip {chip.name} has no execution parameter "
            f"{', '.join(sorted(unknown))}"
        )
    names = ", ".join(sorted(sources))
    label = (f"{profile.name} ({names})" if sources == {chip.name}
             else f"{profile.name} (inherited from {names})")
    return dataclasses.replace(chip, execution={**chip.execution, **updates}, calibration=label)


def calibrated_member(chip, key: str, profile: Profile) -> str | None:
    """The family member whose fitted `key` the chip runs with, or None (its own value)."""
    for name, own in chip.family or ((chip.name, frozenset()),):
        if (name, key) in profile.values:
            return name
        if key in own:
            return None
    return None


def label(clusters) -> str:
    """The `calibration` output field of a run on these clusters: each chip's (ChipSpec.
    calibration: the profile and the family member it came from, or "first principles"), one
    chip's alone, several as "chip: label; ..."."""
    chips = {c.chip.name: c.chip.calibration for c in clusters}
    if len(chips) == 1:
        return next(iter(chips.values()))
    return "; ".join(f"{name}: {text}" for name, text in chips.items())


def apply(cluster, profile: Profile | None = None):
    """The cluster with its chip calibrated (see apply_chip)."""
    chip = apply_chip(cluster.chip, profile)
    return cluster if chip is cluster.chip else dataclasses.replace(cluster, chip=chip)
