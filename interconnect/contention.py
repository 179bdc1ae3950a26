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


def max_min_rates(routes: Sequence[Route], capacities: np.ndarray,
                  weights: np.ndarray | None = None) -> np.ndarray:
    """Bytes/s for each flow. A flow with an empty route (a socket to itself) gets inf.
    `weights`: a flow standing for that many identical flows (each of them at the rate).

    Sparse: the (flow, link) crossings are two index arrays, never a flows x links matrix,
    so the work grows with the crossings, not with the network's size."""
    n = len(routes)
    rates = np.full(n, np.inf)
    lengths = np.fromiter((len(r) for r in routes), dtype=np.int64, count=n)
    active = lengths > 0
    if not active.any():
        return rates
    flow = np.repeat(np.arange(n), lengths)
    link = np.fromiter((i for r in routes for i in r), dtype=np.int64, count=int(lengths.sum()))
    used_ids, link = np.unique(link, return_inverse=True)  # only the links some flow crosses
    remaining = np.asarray(capacities, dtype=float)[used_ids].copy()
    rates[active] = 0.0
    while active.any():
        live = active[flow]
        w = None if weights is None else np.asarray(weights, dtype=float)[flow[live]]
        load = np.bincount(link[live], weights=w, minlength=len(used_ids)).astype(float)
        used = load > 0
        share = np.full(len(used_ids), np.inf)
        share[used] = remaining[used] / load[used]
        inc = share.min()
        rates[active] += inc
        remaining -= inc * load
        full = used & (share <= inc * (1 + 1e-12))
        active[flow[live & full[link]]] = False  # flows crossing a full link freeze
    return rates


def link_loads(routes: Sequence[Route], rates: np.ndarray, links: int) -> np.ndarray:
    """Bytes/s each link carries under the given flow rates (for reports and checks)."""
    out = np.zeros(links)
    for r, rate in zip(routes, rates):
        for link in r:
            out[link] += rate
    return out
