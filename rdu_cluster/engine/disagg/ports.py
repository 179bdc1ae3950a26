"""The fabric ports a pair's KV hand-overs hold (Handover.deal books them): a transfer that
finds a port of its prefill replica or of its decode replica held waits for it, so hand-overs
contend on the fabric."""

from __future__ import annotations

import bisect


class Ports:
    """When each fabric port is held by a hand-over: a transfer starts at the first time at or
    after it is ready that all its ports are free for its duration (intervals booked earlier
    stand; those over before the loop's time are forgotten)."""

    def __init__(self) -> None:
        self.held: dict[tuple, list[tuple[float, float]]] = {}

    def book(self, ports: tuple, ready: float, hold: float, now: float) -> float:
        if hold <= 0:
            return ready
        lists = [self.held.setdefault(p, []) for p in ports]
        t, moved = ready, True
        while moved:
            moved = False
            for held in lists:
                for a, b in held:
                    if a < t + hold and b > t:
                        t, moved = b, True
        for held in lists:
            bisect.insort(held, (t, t + hold))
            held[:] = [(a, b) for a, b in held if b >= now]
        return t
