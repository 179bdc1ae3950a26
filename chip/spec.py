"""Chip specs: compute peaks, memory tiers, execution-model parameters, power.

Values come from `cluster_configs/chips/*.toml`, where every figure names its source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TierSpec:
    """One memory tier of a socket: "sram", "hbm", "ddr" (RDU) or "host" (GPU host DRAM
    reached over PCIe). `bandwidth_bytes_per_s` is the peak the socket sees from that tier."""

    name: str
    capacity_bytes: float
    bandwidth_bytes_per_s: float
    source: str = ""


@dataclass(frozen=True)
class ChipSpec:
    name: str
    kind: str  # "rdu" | "gpu"
    peak_flops: Mapping[str, float]  # dense FLOP/s by dtype name ("bf16", "fp8", ...)
    tiers: tuple[TierSpec, ...]
    execution_model: str  # "dataflow" | "kernel_by_kernel"
    execution: Mapping[str, Any] = field(default_factory=dict)  # that model's parameters
    power: Mapping[str, float | str] = field(default_factory=dict)  # figures and "source"
    description: str = ""
    source: str = ""
    # The chip and the chips it `extends`, nearest first: (name, the [execution] keys that file
    # sets itself). A calibration profile's values follow it (validation/calibration.py).
    family: tuple[tuple[str, frozenset[str]], ...] = ()
    # The calibration the run's values come from: "PROFILE (CHIP)", "PROFILE (inherited from
    # CHIP)" or "first principles" (validation/calibration.py sets it).
    calibration: str = "first principles"

    def tier(self, name: str) -> TierSpec:
        for tier in self.tiers:
            if tier.name == name:
                return tier
        names = ", ".join(t.name for t in self.tiers)
        raise KeyError(f"chip {self.name}: no tier {name!r}; tiers: {names}")

    def has_tier(self, name: str) -> bool:
        return any(t.name == name for t in self.tiers)

    @property
    def hbm(self) -> TierSpec:
        return self.tier("hbm")

    def flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for math in `dtype`. A dtype the chip has no faster path for runs at
        its BF16 rate (weights are up-converted on the fly: int4/mxfp4 weight-only formats)."""
        return float(self.peak_flops.get(dtype, self.peak_flops["bf16"]))
