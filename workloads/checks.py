"""The checks every config table shares (Calculon-style): an exact key set, numbers in range, a
named source. Each raises ConfigError naming `<where>.<key>` and what is accepted."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from workloads.errors import ConfigError


def exact_keys(
    table: Mapping[str, Any], required: Iterable[str], where: str, optional: Iterable[str] = ()
) -> None:
    required, optional = set(required), set(optional)
    unknown = sorted(set(table) - required - optional)
    if unknown:
        accepted = ", ".join(sorted(required | optional))
        raise ConfigError(f"{where}.{unknown[0]}: unknown field; accepted: {accepted}")
    missing = sorted(required - set(table))
    if missing:
        raise ConfigError(f"{where}.{missing[0]}: missing field")


def non_negative(table: Mapping[str, Any], key: str, where: str) -> float:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{where}.{key}: expected a non-negative number, got {value!r}")
    return float(value)


def source(table: Mapping[str, Any], where: str, key: str = "source") -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}.{key}: expected a non-empty string naming the basis")
    return value
