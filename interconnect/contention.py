"""Bandwidth sharing among concurrent flows: max-min fairness by progressive filling.

Every flow is a route (link indices). All flows start at rate 0 and grow together; when a link
is full, the flows crossing it freeze at their current rate and the rest keep growing. The result
is the max-min fair allocation: no flow can go faster without slowing one that is no faster.
Two flows on one link get half its bandwidth each; a flow alone on its links gets the slowest
link's bandwidth. Flows are assumed long-lived and all active for the whole phase (a collective
step moves equal chunks on all its flows, so they start and end together).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from interconnect.routes import Route


def max_min_rates(routes: Sequence[Route], capacities: np.ndarray) -> np.ndarray:
    """Bytes/s for each flow. A flow with an empty route (a socket to itself) gets inf."""
    n = len(routes)
    rates = np.full(n, np.inf)
    active = np.array([len(r) > 0 for r in routes], dtype=bool)
    if not active.any():
        return rates
    incidence = np.zeros((n, len(capacities)))
    for f, r in enumerate(routes):
        for link in r:
            incidence[f, link] += 1.0  # a route crossing a link twice uses it twice
    rates[active] = 0.0
    remaining = capacities.astype(float).copy()
    while active.any():
        load = incidence[active].sum(axis=0)  # unfrozen flow crossings per link
        used = load > 0
        share = np.full(len(capacities), np.inf)
        share[used] = remaining[used] / load[used]
        inc = share.min()
        rates[active] += inc
        remaining -= inc * load
        full = used & (share <= inc * (1 + 1e-12))
        frozen = active & (incidence[:, full].sum(axis=1) > 0)
        active &= ~frozen
    return rates


def link_loads(routes: Sequence[Route], rates: np.ndarray, links: int) -> np.ndarray:
    """Bytes/s each link carries under the given flow rates (for reports and checks)."""
    out = np.zeros(links)
    for r, rate in zip(routes, rates):
        for link in r:
            out[link] += rate
    return out
