"""Socket power from utilization, and the [power] table of a chip TOML.

    P = idle_w + (peak_w - idle_w) * min(1, compute_share * u_compute + memory_share * u_memory)

u_compute is the step's FLOPs over the time at peak BF16 rate; u_memory the HBM bytes the step
moves (weights and KV cache read once, plus the intermediates a GPU round-trips through HBM, taken
from the step's activation time at the HBM rate) over the time at peak HBM bandwidth. At full use
of both a socket draws peak_w; idle, idle_w. The split of the dynamic range between compute and
memory (compute_share + memory_share = 1) is a stated assumption of each chip's TOML.

Scope: accelerator sockets only. Host CPUs, switches, fans and facility overhead (PUE) are left
out, for every system alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from chip.cost import StepCost
from chip.spec import ChipSpec
from workloads import checks
from workloads.errors import ConfigError
from workloads.ops import Work

POWER_KEYS = ("idle_w", "peak_w", "compute_share", "memory_share", "source")
# A bound, not a figure: a whole SambaRack SN40L-16 draws ~10 kW and a DGX H100 system ~10.2 kW,
# so one socket drawing 1e5 W (ten racks) is past any real one, and every derived figure (joules
# per token, energy of a run) stays finite (1.7e308 W gave infinite joules per token).
MAX_SOCKET_W = 1e5


@dataclass(frozen=True)
class PowerSpec:
    idle_w: float
    peak_w: float
    compute_share: float
    memory_share: float
    source: str


def parse_power(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Check a chip's [power] table (exact keys) and return it as a plain dict; {} if absent."""
    if not table:
        return {}
    checks.exact_keys(table, POWER_KEYS, where)
    out: dict[str, Any] = {"source": checks.source(table, where)}
    for key in POWER_KEYS[:-1]:
        hi = MAX_SOCKET_W if key.endswith("_w") else 1.0
        out[key] = checks.number(table.get(key), f"{where}.{key}", 0.0, hi)
    if not 0 < out["peak_w"] or out["idle_w"] > out["peak_w"]:
        raise ConfigError(f"{where}: idle_w must not exceed peak_w, and peak_w must be positive")
    if abs(out["compute_share"] + out["memory_share"] - 1.0) > 1e-9:
        raise ConfigError(f"{where}: compute_share + memory_share must be 1")
    return out


def power_spec(chip: ChipSpec) -> PowerSpec | None:
    p = chip.power
    if not p:
        return None
    return PowerSpec(float(p["idle_w"]), float(p["peak_w"]), float(p["compute_share"]),
                     float(p["memory_share"]), str(p["source"]))


def utilization(cost: StepCost, chip: ChipSpec) -> tuple[Work, Work]:
    """(u_compute, u_memory) of one socket over one step, each in [0, 1]."""
    t = np.asarray(cost.time_s, dtype=float)
    u_c = np.asarray(cost.flops, dtype=float) / (t * chip.flops("bf16"))
    streamed = np.asarray(cost.useful_hbm_bytes, dtype=float) / (t * chip.hbm.bandwidth_bytes_per_s)
    u_m = streamed + np.asarray(cost.cause("activations"), dtype=float) / t
    return np.clip(u_c, 0.0, 1.0), np.clip(u_m, 0.0, 1.0)


def socket_power_w(cost: StepCost, chip: ChipSpec) -> Work | None:
    """Mean power of one socket over the step; None when the chip has no [power] table."""
    spec = power_spec(chip)
    if spec is None:
        return None
    u_c, u_m = utilization(cost, chip)
    load = np.minimum(1.0, spec.compute_share * u_c + spec.memory_share * u_m)
    return spec.idle_w + (spec.peak_w - spec.idle_w) * load


def idle_power_w(chip: ChipSpec) -> float | None:
    spec = power_spec(chip)
    return None if spec is None else spec.idle_w


def step_energy_j(cost: StepCost, chip: ChipSpec, sockets: int) -> Work | None:
    """Joules `sockets` sockets spend on one step, each doing the work `cost` describes."""
    p = socket_power_w(cost, chip)
    return None if p is None else p * sockets * np.asarray(cost.time_s, dtype=float)
