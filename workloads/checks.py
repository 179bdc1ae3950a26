"""The checks every input shares (Calculon-style): an exact key set, numbers that are finite and in
range, integers within a stated bound, a named source. Each raises ConfigError naming the field
(`<where>.<key>`, or `where` alone for a command-line value), the value and what is accepted.

The bounds are what a finite machine can hold, stated once here so every message quotes them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from workloads.errors import ConfigError

# A count no real model, trace or cluster reaches (2^40 ~ 1.1e12): larger ones are typos or
# hostile input, and numpy's int64 arithmetic on products of two of them stays exact.
MAX_COUNT = 2**40
# A batch past 2^20 sequences holds more KV cache than any cluster here (2^20 x 1 token x 1 KB).
MAX_BATCH = 2**20
# The longest time an input may set (an arrival, a think time, a ramp-up), in seconds: 2^24 s is
# 194 days, beyond any published trace (Azure's and Mooncake's cover hours to a week), and a
# run's vLLM peak figures count in one-second buckets (bench.py), 2^24 of them 128 MB.
MAX_SECONDS = float(2**24)
# Hardware figures: a bandwidth or a peak rate below 10^6 a second (bytes or flops) is 10^2 below
# the slowest memory, link or datapath a config here describes (a PCIe 1.0 lane moves 2.5e8 B/s);
# a latency (one op, one hop, one step overhead) above 1 s is 10^4 past the largest one (~10 us
# a network hop). Past these, a run's times leave floating point (1e-300 B/s, 1e300 s).
MIN_RATE = 1e6
MAX_LATENCY_S = 1.0


def exact_keys(
    table: Mapping[str, Any], required: Iterable[str], where: str, optional: Iterable[str] = ()
) -> None:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table, got {show(table)}")
    required, optional = set(required), set(optional)
    unknown = sorted(set(table) - required - optional)
    if unknown:
        accepted = ", ".join(sorted(required | optional))
        raise ConfigError(f"{where}.{unknown[0]}: unknown field; accepted: {accepted}")
    missing = sorted(required - set(table))
    if missing:
        raise ConfigError(f"{where}.{missing[0]}: missing field")


def number(
    value: Any,
    where: str,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
) -> float:
    """A finite real number in [lo, hi] ((lo, hi] with `lo_open`); bools are not numbers."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and isinstance(value, int) and abs(value) > 2**1000:
        ok = False  # a 300-digit integer: no quantity here is that large, and float() overflows
    if ok:
        x = float(value)
        ok = math.isfinite(x) and (lo is None or x > lo or (x == lo and not lo_open))
        ok = ok and (hi is None or x <= hi)
    if not ok:
        raise ConfigError(f"{where}: expected {_range(lo, hi, lo_open, 'number')}, "
                          f"got {show(value)}")
    return float(value)


def integer(value: Any, where: str, lo: int = 1, hi: int = MAX_COUNT) -> int:
    """An integer in [lo, hi]. TOML, JSON and `--set` tell integers from floats: `8.0` is refused
    here as in every other integer field (a count written as a float is a typo, or a figure put
    in the wrong field)."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        bound = f"; at most {show_number(hi)} accepted" if lo in (0, 1) else ""
        raise ConfigError(f"{where}: expected {_range(lo, hi, False, 'integer')}, "
                          f"got {show(value)}{bound}")
    return value


def positive(table: Mapping[str, Any], key: str, where: str) -> float:
    return number(table.get(key), f"{where}.{key}", 0.0, lo_open=True)


def non_negative(table: Mapping[str, Any], key: str, where: str) -> float:
    return number(table.get(key), f"{where}.{key}", 0.0)


def rate(table: Mapping[str, Any], key: str, where: str) -> float:
    """A bandwidth or peak rate (per second): MIN_RATE or more."""
    return number(table.get(key), f"{where}.{key}", MIN_RATE)


def latency(table: Mapping[str, Any], key: str, where: str) -> float:
    """A hardware latency or overhead in seconds: 0 to MAX_LATENCY_S."""
    return number(table.get(key), f"{where}.{key}", 0.0, MAX_LATENCY_S)


def source(table: Mapping[str, Any], where: str, key: str = "source") -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}.{key}: expected a non-empty string naming the basis")
    return value


def _range(lo, hi, lo_open: bool, kind: str) -> str:
    if kind == "integer" and lo in (0, 1):
        return "a positive integer" if lo == 1 else "a non-negative integer"
    if lo == 0 and lo_open and hi is None:
        return f"a positive finite {kind}"
    if lo == 0 and hi is None:
        return f"a non-negative finite {kind}" if kind == "number" else "a non-negative integer"
    if lo is None and hi is None:
        return f"a finite {kind}"
    left = "(" if lo_open else "["
    return f"a finite {kind} in {left}{show_number(lo)}, {show_number(hi)}]" if kind == "number" else \
        f"an integer in [{show_number(lo)}, {show_number(hi)}]"


def show_number(x) -> str:
    if x is None:
        return "inf"
    if isinstance(x, int) and x >= 2**20 and (x & (x - 1)) == 0:
        return f"2^{x.bit_length() - 1}"
    return f"{x:g}" if isinstance(x, float) else str(x)


def show(value: Any) -> str:
    """The value as the user wrote it, cut short: a 10^400 integer is not echoed in full."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**15:
        return f"an integer of {len(str(abs(value))) if abs(value) < 10**4000 else 'over 4000'}" \
               " digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
