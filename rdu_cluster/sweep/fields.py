"""Scenario fields: the names a sweep spec may set, their types, defaults and dataset columns.

A runner (one per scenario kind) declares its fields as `FieldDef`s and its nested namespaces as
`Namespace`s ("options." toggles, "chip." and "topology." overrides of the cluster config).
Values are normalized on parse (an integer field rejects 8.5, a float field turns 2 into 2.0) so
that a point's canonical form, and hence its id, does not depend on how the TOML spelled it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from workloads.errors import ConfigError

# A normalizer takes a raw TOML value and returns the normalized one, or raises ValueError with
# what was expected (the caller adds the field path).
Normalizer = Callable[[Any], Any]  # raises TypeError or ValueError saying what was expected


def positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"expected a positive integer, got {value!r}")
    return value


def positive_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"expected a positive number, got {value!r}")
    return float(value)


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
