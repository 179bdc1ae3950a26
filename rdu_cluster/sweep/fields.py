"""Scenario fields: the names a sweep spec may set, their types, defaults and dataset columns.

A runner (one per scenario kind) declares its fields as `FieldDef`s and its nested namespaces as
`Namespace`s ("options." toggles, "chip." and "topology." overrides of the cluster config).
Values are normalized on parse (an integer field rejects 8.5, a float field turns 2 into 2.0) so
that a point's canonical form, and hence its id, does not depend on how the TOML spelled it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from workloads import checks
from workloads.errors import ConfigError

# A normalizer takes a raw TOML value and returns the normalized one, or raises ValueError with
# what was expected (the caller adds the field path).
Normalizer = Callable[[Any], Any]  # raises TypeError or ValueError saying what was expected


def int_in(lo: int, hi: int) -> Normalizer:
    """An integer in [lo, hi]: every count a point drives a loop or an allocation with has a
    stated bound (checks.MAX_COUNT and the bounds of traces, plans, clusters)."""

    def normalize(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            what = {0: "a non-negative integer", 1: "a positive integer"}.get(lo, f"an integer >= {lo}")
            raise ValueError(f"expected {what} (at most {hi:,}), got {value!r:.40}")
        return value

    return normalize


positive_int = int_in(1, checks.MAX_COUNT)
nonnegative_int = int_in(0, 2**63 - 1)


def positive_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"expected a finite positive number, got {value!r:.40}")
    return float(value)


def float_in(lo: float, hi: float) -> Normalizer:
    """A number in (lo, hi]: the bounds the command line states for the same option."""

    def normalize(value: Any) -> float:
        v = positive_float(value)
        if not lo < v <= hi:
            raise ValueError(f"expected a number in ({lo:g}, {hi:g}], got {value!r:.40}")
        return v

    return normalize


def fraction(value: Any) -> float:
    """A share in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"expected a number in (0, 1], got {value!r}")
    return float(value)


def choice(*accepted: str) -> Normalizer:
    """One of a fixed set of names."""

    def normalize(value: Any) -> str:
        if value not in accepted:
            raise ValueError(f"{value!r}; accepted: {', '.join(accepted)}")
        return value

    return normalize


def length_dist(value: Any) -> str:
    """A token-length distribution, as `serve --prompt-len` takes it: N, fixed:N, uniform:LO:HI
    or lognormal:MEAN:SIGMA; normalized (1024, "1024" and "fixed:1024" are one value)."""
    from workloads.traces import LengthDist

    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"expected N or 'uniform:LO:HI' / 'lognormal:MEAN:SIGMA', got {value!r}")
    try:
        d = LengthDist.parse(str(value), "")
    except ConfigError as e:
        raise ValueError(str(e).lstrip(": ")) from None
    if d.kind == "fixed":  # fixed and uniform lengths are whole tokens (the sampler rounds)
        return str(round(d.a))
    if d.kind == "uniform":
        return f"uniform:{round(d.a)}:{round(d.b)}"
    num = lambda x: str(int(x)) if float(x).is_integer() else repr(float(x))
    return f"lognormal:{num(d.a)}:{num(d.b)}"


def text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def scalar(value: Any) -> Any:
    """A config override: any TOML scalar; the config loader checks it against its field."""
    if isinstance(value, (dict, list)):
        raise TypeError(f"expected a number, string or boolean, got {value!r}")
    return value


def dtype(value: Any) -> str:
    from workloads.dtypes import DType

    if not isinstance(value, str):
        raise TypeError(f"expected a dtype name, got {value!r}")
    try:
        return DType.parse(value).value
    except ConfigError as e:
        raise ValueError(str(e).split(": ", 1)[-1]) from None


@dataclass(frozen=True)
class FieldDef:
    """One scenario field. `column` is its dataset column, or None where the runner's own result
    columns already carry it (batch, tp, ...). `default` None means "unset": the field is then
    absent from the point (and its id), and filters see None."""

    name: str
    normalize: Normalizer
    arrow_type: pa.DataType
    default: Any = None
    column: str | None = None
    doc: str = ""


@dataclass(frozen=True)
class Namespace:
    """A family of nested fields, e.g. "options." (toggles) or "chip." (config overrides).
    `names`, when given, is the exact set accepted after the prefix."""

    prefix: str
    normalize: Normalizer
    names: frozenset[str] | None = None
    doc: str = ""


def column_name(field: str) -> str:
    """Dataset column of a nested field: dots become underscores, and the unit suffix that the
    config names carry (_bytes_per_s, _s) stays in place."""
    return field.replace(".", "_")


def arrow_type_of(values: list[Any]) -> pa.DataType:
    """The column type of a namespace field, from every value the spec gives it (so all part
    files of a sweep agree, whatever chunk they hold)."""
    if all(isinstance(v, bool) for v in values):
        return pa.bool_()
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return pa.int64()
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return pa.float64()
    return pa.string()


def lookup(
    name: str, fields: Mapping[str, FieldDef], namespaces: tuple[Namespace, ...]
) -> FieldDef | Namespace | None:
    if name in fields:
        return fields[name]
    for ns in namespaces:
        if name.startswith(ns.prefix) and len(name) > len(ns.prefix):
            rest = name[len(ns.prefix) :]
            if ns.names is None or rest in ns.names:
                return ns
    return None


def accepted(fields: Mapping[str, FieldDef], namespaces: tuple[Namespace, ...]) -> str:
    parts = sorted(fields)
    for ns in namespaces:
        if ns.names is None:
            parts.append(f"{ns.prefix}*")
        else:
            parts += [f"{ns.prefix}{n}" for n in sorted(ns.names)]
    return ", ".join(parts)
