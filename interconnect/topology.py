"""Topology specs from the [topology] table of a cluster TOML."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workloads.errors import ConfigError

KINDS = ("full_mesh", "switch", "ring", "torus2d")


@dataclass(frozen=True)
class TopologySpec:
    kind: str
    link_bandwidth_bytes_per_s: float  # per link (or per socket-to-switch port), each way
    link_latency_s: float  # per hop
    inter_node_bandwidth_bytes_per_s: float = 0.0  # per socket, each way; 0: single node
    inter_node_latency_s: float = 0.0
    source: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "topology") -> TopologySpec:
        required = {"kind", "link_bandwidth_bytes_per_s", "link_latency_s", "source"}
        optional = {"inter_node_bandwidth_bytes_per_s", "inter_node_latency_s"}
        unknown = set(d) - required - optional
        if unknown:
            raise ConfigError(
                f"{where}.{min(unknown)}: unknown field; accepted: "
                + ", ".join(sorted(required | optional))
            )
        missing = required - set(d)
        if missing:
            raise ConfigError(f"{where}.{min(missing)}: missing field")
        if d["kind"] not in KINDS:
            raise ConfigError(f"{where}.kind: {d['kind']!r} unknown; accepted: {', '.join(KINDS)}")
        for key in sorted((required | optional) - {"kind", "source"}):
            if key in d and (not isinstance(d[key], (int, float)) or d[key] < 0):
                raise ConfigError(f"{where}.{key}: expected a non-negative number, got {d[key]!r}")
        return cls(**{k: (float(v) if k not in ("kind", "source") else v) for k, v in d.items()})
