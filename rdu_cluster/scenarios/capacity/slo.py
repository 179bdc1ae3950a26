"""The latency SLO a capacity question sets: a TTFT and / or TPOT bound at a percentile."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from rdu_cluster.engine import bench
from workloads.errors import ConfigError


@dataclass(frozen=True)
class SLO:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    percentile: float = 99.0

    @classmethod
    def parse(cls, items: Sequence[str], percentile: float) -> SLO:
        for item in items:  # e2el is a goodput key, not an SLO one: named as the only keys
            if item.partition(":")[0] not in ("ttft", "tpot"):
                raise ConfigError(f"--slo: {item!r}; accepted: KEY:MS with KEY one of ttft, tpot")
        bounds = dict(bench.MetricSpec.parse(None, [f.replace("slo", "") for f in items],
                                             "--slo").goodput)
        if not 0 < percentile < 100:
            raise ConfigError(f"--slo-percentile: {percentile} must be in (0, 100)")
        if not bounds:
            raise ConfigError("--slo: give at least one bound (ttft:MS, tpot:MS)")
        return cls(bounds.get("ttft"), bounds.get("tpot"), percentile)

    def misses(self, ttft_ms: float, tpot_ms: float) -> float:
        """How far the worse measure is over its bound (0.1: 10% over; <= 0 meets)."""
        parts = [m / b - 1 for m, b in ((ttft_ms, self.ttft_ms), (tpot_ms, self.tpot_ms))
                 if b is not None]
        return max(parts)

    def part(self, key: str) -> SLO | None:
        """The SLO's bound on `key` alone ('ttft': the one a pair's prefill pool sets, 'tpot':
        its decode pool's); None where the SLO has not both (the part is the whole, or none)."""
        if self.tpot_ms is None or self.ttft_ms is None:
            return None
        return replace(self, tpot_ms=None) if key == "ttft" else replace(self, ttft_ms=None)

    def goodput_args(self) -> str:
        return " ".join(f"{k}:{v:g}" for k, v in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms))
                        if v is not None)
