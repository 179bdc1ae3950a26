"""Sweep specs: a TOML file of a base scenario, axes and filters, parsed with exact key sets.

    [sweep]                      # all optional
    kind = "simulate"            # a registered runner: rdu-cluster sweep --help lists them
    name = "decode-grid"
    seed = 0
    on_infeasible = "record"     # or "error"
    points_per_task = 2048

    [base]                       # any scenario field; nested ones as TOML dotted keys
    model = "llama-3.1-8b"
    cluster = "sn40l-16"
    options.kernel_looping = true

    [[axes]]
    type = "grid"                # cartesian product of its lists
    batch = [1, 2, 4, 8]
    chip.tiers.hbm.bandwidth_bytes_per_s = [1.6e12, 1.8e12]

    [[axes]]
    type = "zip"                 # lists walked in step
    cluster = ["sn40l-16", "dgx-h100"]
    tp = [16, 8]

    [[axes]]
    type = "list"                # explicit points
    points = [{ model = "llama-3.1-8b" }, { model = "llama-3.1-70b", gen_len = 128 }]

    [filters]                    # a table, so it may stand anywhere in the file
    keep = ["batch * (prompt_len + gen_len) <= 2**20"]      # keep where all hold
    drop = ["cluster == 'dgx-h100' and batch > 64"]         # drop where any holds

Every error is a ConfigError naming the file and the field path (axes[1].batch[2]).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pyarrow as pa

from rdu_cluster.sweep import registry
from rdu_cluster.sweep.axes import (
    Axis,
    Filter,
    canonical,
    combinations,
    compile_filter,
    grid_size,
    point_id,
)
from rdu_cluster.sweep.fields import (
    FieldDef,
    Namespace,
    accepted,
    arrow_type_of,
    column_name,
    lookup,
)
from rdu_cluster.sweep.registry import Point, Runner
from workloads import checks
from workloads.errors import ConfigError
from workloads.files import read_toml

TOP_KEYS = {"sweep", "base", "axes", "filters"}
FILTER_KEYS = {"keep", "drop"}
SWEEP_KEYS = {"kind", "name", "description", "seed", "on_infeasible", "points_per_task"}
AXIS_TYPES = ("grid", "zip", "list")
ON_INFEASIBLE = ("record", "error")  # record: a row with feasible = false and the reason
DEFAULT_MAX_POINTS = 1_000_000


@dataclass(frozen=True)
class Column:
    """A scenario column of the dataset: which field, under what name, of what type."""

    field: str
    name: str
    type: pa.DataType


@dataclass(frozen=True)
class Spec:
    source: str  # file name, for messages
    name: str
    description: str
    kind: str
    seed: int
    on_infeasible: str
    points_per_task: int | None
    base: Mapping[str, Any]
    axes: tuple[Axis, ...]
    filters: tuple[Filter, ...]
    hash: str
    normalized: Mapping[str, Any] = field(repr=False)  # what the hash covers

    @property
    def runner(self) -> Runner:
        return registry.get(self.kind)

    @property
    def grid_size(self) -> int:
        return grid_size(self.axes)

    def origin(self, name: str) -> str:
        """Where a field gets its values (for messages): "axes[1]" or "base"."""
        for axis in self.axes:
            if name in axis.names():
                return axis.where
        return "base"

    def values_of(self, name: str) -> list[Any]:
        out = [self.base[name]] if name in self.base else []
        for axis in self.axes:
            if name in axis.fields:
                out += list(axis.values[axis.fields.index(name)])
            out += [p[name] for p in axis.points if name in p]
        return out

    def field_names(self) -> list[str]:
        names = set(self.base)
        for axis in self.axes:
            names |= axis.names()
        runner = self.runner
        names |= {n for n, f in runner.fields.items() if f.default is not None}
        return sorted(names)

    def columns(self) -> list[Column]:
        """The scenario columns every part file carries, with types fixed by the spec alone."""
        runner, cols = self.runner, []
        for name in self.field_names():
            found = lookup(name, runner.fields, runner.namespaces)
            if isinstance(found, FieldDef):
                if found.column:
                    cols.append(Column(name, found.column, found.arrow_type))
            elif found is not None:
                cols.append(Column(name, column_name(name), arrow_type_of(self.values_of(name))))
        return cols


def load_spec(path: str | Path) -> Spec:
    path = Path(path)
    raw = read_toml(path, "sweep spec")
    return parse_spec(raw, path.name, default_name=path.stem)


def parse_spec(raw: Mapping[str, Any], source: str = "spec", default_name: str = "sweep") -> Spec:
    _exact(raw, TOP_KEYS, source, "")
    head = raw.get("sweep", {})
    if not isinstance(head, Mapping):
        raise ConfigError(f"{source}: sweep: expected a table")
    _exact(head, SWEEP_KEYS, source, "sweep.")
    kind = _get(head, "kind", str, "simulate", f"{source}: sweep.kind")
    runner = registry.get(kind, f"{source}: sweep.kind")
    ctx = _Ctx(source, runner)
    base = ctx.fields_of(_table(raw, "base", source, required=False), "base", list_ok=False)
    axes = tuple(ctx.axis(a, f"axes[{i}]") for i, a in enumerate(_array(raw, "axes", source)))
    _check_disjoint(axes, source)
    ftable = _table(raw, "filters", source, required=False)
    _exact(ftable, FILTER_KEYS, source, "filters.")
    filters = tuple(
        compile_filter(t, f"{source}: filters.{key}[{i}]", key == "drop", ctx.known)
        for key in ("keep", "drop")
        for i, t in enumerate(_strings(ftable, key, f"{source}: filters.{key}"))
    )
    seed = checks.integer(_get(head, "seed", int, 0, f"{source}: sweep.seed"),
                          f"{source}: sweep.seed", 0, 2**63 - 1)
    on_inf = _get(head, "on_infeasible", str, "record", f"{source}: sweep.on_infeasible")
    if on_inf not in ON_INFEASIBLE:
        raise ConfigError(f"{source}: sweep.on_infeasible: {on_inf!r}; accepted: record, error")
    ppt = _get(head, "points_per_task", int, None, f"{source}: sweep.points_per_task")
    if ppt is not None:
        checks.integer(ppt, f"{source}: sweep.points_per_task", 1, DEFAULT_MAX_POINTS)
    normalized = {
        "kind": kind,
        "seed": seed,
        "on_infeasible": on_inf,
        "base": dict(base),
        "axes": [_axis_json(a) for a in axes],
        "keep": [f.text for f in filters if not f.drop],
        "drop": [f.text for f in filters if f.drop],
    }
    return Spec(
        source=source,
        name=_get(head, "name", str, default_name, f"{source}: sweep.name"),
        description=_get(head, "description", str, "", f"{source}: sweep.description"),
        kind=kind,
        seed=seed,
        on_infeasible=on_inf,
        points_per_task=ppt,
        base=base,
        axes=axes,
        filters=filters,
        hash=hashlib.sha256(canonical(normalized).encode()).hexdigest()[:16],
        normalized=normalized,
    )


@dataclass
class Expansion:
    points: list[Point]
    grid_size: int
    filtered_out: int
    duplicates: int


def expand(spec: Spec, max_points: int = DEFAULT_MAX_POINTS) -> Expansion:
    """Every point of the spec, in a fixed order, after filters. The grid is counted before it
    is built: a grid larger than `max_points` is refused without building it."""
    size = spec.grid_size
    if size > max_points:
        shown = " x ".join(f"{a.describe()}={a.size:,}" for a in spec.axes)
        raise ConfigError(
            f"{spec.source}: axes: {size:,} points ({shown}) exceed --max-points {max_points:,}"
        )
    runner = spec.runner
    defaults = {n: f.default for n, f in runner.fields.items() if f.default is not None}
    points, seen, dropped, dups = [], set(), 0, 0
    unset = {n: None for n in runner.fields}
    for fields in combinations({**defaults, **spec.base}, spec.axes):
        view = {**unset, **fields}
        if not all(f.keeps(view) for f in spec.filters):
            dropped += 1
            continue
        pid = point_id(spec.kind, fields)
        if pid in seen:  # two axes combinations that name the same scenario: run it once
            dups += 1
            continue
        seen.add(pid)
        points.append(Point(pid, fields))
    _check_required(spec, points)
    return Expansion(points, size, dropped, dups)


def _check_required(spec: Spec, points: list[Point]) -> None:
    for req in spec.runner.required:
        names = (req,) if isinstance(req, str) else req  # a tuple: any one of them
        name = names[0]
        for p in points:
            if not any(n in p.fields for n in names):
                raise ConfigError(
                    f"{spec.source}: {name}: missing field (set it in [base] or in an axis)"
                )


class _Ctx:
    """Field validation for one spec: knows the runner's fields and the file name."""

    def __init__(self, source: str, runner: Runner):
        self.source, self.runner = source, runner

    def known(self, name: str) -> bool:
        return lookup(name, self.runner.fields, self.runner.namespaces) is not None

    def fields_of(self, table: Mapping[str, Any], where: str, list_ok: bool) -> dict[str, Any]:
        out = {}
        for name, value in _flatten(table):
            out[name] = self.value(name, value, f"{where}.{name}", list_ok)
        return out

    def value(self, name: str, value: Any, where: str, list_ok: bool) -> Any:
        found = lookup(name, self.runner.fields, self.runner.namespaces)
        if found is None:
            self.unknown(where)
        if isinstance(value, list) and not list_ok:
            raise ConfigError(
                f"{self.source}: {where}: a list belongs in an axis ([[axes]]), not here"
            )
        return _normalize(found, value, f"{self.source}: {where}")

    def unknown(self, where: str) -> NoReturn:
        r = self.runner
        raise ConfigError(
            f"{self.source}: {where}: unknown field; accepted: {accepted(r.fields, r.namespaces)}"
        )

    def axis(self, raw: Any, where: str) -> Axis:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{self.source}: {where}: expected a table")
        kind = raw.get("type")
        if kind not in AXIS_TYPES:
            raise ConfigError(
                f"{self.source}: {where}.type: {kind!r}; accepted: {', '.join(AXIS_TYPES)}"
            )
        if kind == "list":
            return self._list_axis(raw, where)
        names, lists = [], []
        for name, values in _flatten({k: v for k, v in raw.items() if k != "type"}):
            w = f"{where}.{name}"
            if not self.known(name):
                self.unknown(w)
            if not isinstance(values, list):
                raise ConfigError(f"{self.source}: {w}: expected a list of values")
            if not values:
                raise ConfigError(f"{self.source}: {w}: empty axis")
            names.append(name)
            lists.append(
                tuple(self.value(name, v, f"{w}[{i}]", False) for i, v in enumerate(values))
            )
        if not names:
            raise ConfigError(f"{self.source}: {where}: empty axis (no fields)")
        if kind == "zip" and len({len(v) for v in lists}) > 1:
            lens = ", ".join(f"{n}: {len(v)}" for n, v in zip(names, lists))
            raise ConfigError(f"{self.source}: {where}: zip lists differ in length ({lens})")
        return Axis(kind, where, tuple(names), tuple(lists))

    def _list_axis(self, raw: Mapping[str, Any], where: str) -> Axis:
        _exact(raw, {"type", "points"}, self.source, f"{where}.")
        pts = raw.get("points")
        if not isinstance(pts, list) or not pts:
            raise ConfigError(f"{self.source}: {where}.points: empty axis (expected points)")
        out = []
        for i, p in enumerate(pts):
            if not isinstance(p, Mapping) or not p:
                raise ConfigError(f"{self.source}: {where}.points[{i}]: expected a table")
            out.append(self.fields_of(p, f"{where}.points[{i}]", list_ok=False))
        return Axis("list", where, points=tuple(out))


def _normalize(found: FieldDef | Namespace, value: Any, where: str) -> Any:
    # TOML admits nan and inf; no scenario value is either (and a point's id could not hold it)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite value, got {value!r}")
    try:
        return found.normalize(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _flatten(table: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """TOML dotted keys (options.kernel_looping = true) arrive as nested tables: flatten them
    back to dotted field names."""
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{name}.")
        else:
            yield name, value


def _check_disjoint(axes: tuple[Axis, ...], source: str) -> None:
    owner: dict[str, str] = {}
    for axis in axes:
        for name in sorted(axis.names()):
            if name in owner:
                raise ConfigError(
                    f"{source}: {axis.where}.{name}: already an axis in {owner[name]}"
                )
            owner[name] = axis.where


def _axis_json(axis: Axis) -> dict[str, Any]:
    if axis.kind == "list":
        return {"type": "list", "points": [dict(p) for p in axis.points]}
    return {"type": axis.kind, **{f: list(v) for f, v in zip(axis.fields, axis.values)}}


def _exact(raw: Mapping[str, Any], keys: set[str], source: str, prefix: str) -> None:
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise ConfigError(
            f"{source}: {prefix}{unknown[0]}: unknown field; accepted: {', '.join(sorted(keys))}"
        )


def _table(raw: Mapping[str, Any], key: str, source: str, required: bool) -> Mapping[str, Any]:
    value = raw.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: {key}: expected a table ([{key}])")
    return value


def _array(raw: Mapping[str, Any], key: str, source: str) -> list[Any]:
    value = raw.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(f"{source}: {key}: expected an array of tables ([[{key}]])")
    return value


def _strings(raw: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = raw.get(key, [])
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of expressions")
    return value


def _get(raw: Mapping[str, Any], key: str, kind: type, default: Any, where: str) -> Any:
    if key not in raw:
        return default
    value = raw[key]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise ConfigError(f"{where}: expected a {kind.__name__}, got {value!r}")
    return value
