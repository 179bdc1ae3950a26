"""Size-dependent efficiency: why small kernels reach less of peak bandwidth and FLOP/s.

Basis: a latency-throughput (Hockney) model. A transfer of `x` bytes (or FLOPs) through a
resource with peak rate `peak`, sustained fraction `eta` of that peak, and start-up latency
`latency` takes

    t(x) = latency + x / (eta * peak)

so the fraction of peak it reaches is

    efficiency(x) = x / (t(x) * peak) = eta * x / (x + x_half),   x_half = latency * eta * peak

It tends to `eta` for large transfers and falls as x / x_half for small ones; `x_half` (Hockney's
n_1/2) is the size that reaches half of the sustained rate. The latency is what a kernel pays
before its stream runs at full rate (DRAM latency, ramp-up of thread blocks or pipeline
stages, the tail of the last wave): by Little's law a stream needs latency x rate bytes in flight,
which a small kernel never has. Both execution models use this one curve; their chip TOMLs give
`eta` and `latency` with their sources.
"""

from __future__ import annotations

import numpy as np

from workloads.ops import Work


def stream_time(amount: Work, peak: float, eta: float, latency: float = 0.0) -> np.ndarray:
    """Seconds to move `amount` bytes (or do `amount` FLOPs) at `eta` x `peak` after `latency`.
    Zero work costs nothing: an op that moves no bytes pays no memory latency."""
    x = np.asarray(amount, dtype=float)
    return np.where(x > 0, latency + x / (eta * peak), 0.0)


def efficiency(amount: Work, peak: float, eta: float, latency: float = 0.0) -> np.ndarray:
    """Fraction of `peak` a transfer of `amount` reaches: eta * x / (x + x_half)."""
    x = np.asarray(amount, dtype=float)
    return eta * x / (x + half_size(peak, eta, latency))


def half_size(peak: float, eta: float, latency: float) -> float:
    """Hockney's n_1/2: the transfer size that reaches half of the sustained rate."""
    return latency * eta * peak
