"""Least recently used: the block used (or stored) longest ago goes first (vLLM's prefix cache,
SGLang's radix cache and LMCache all default to LRU)."""

from __future__ import annotations

from collections import OrderedDict

from rdu_cluster.engine.evictions import register


@register
class LRU:
    name = "lru"
    insertion_ordered = True

    def __init__(self) -> None:
        self.order: OrderedDict[int, None] = OrderedDict()

    def add(self, key: int) -> None:
        self.order[key] = None
        self.order.move_to_end(key)

    def use(self, key: int) -> None:
        self.order.pop(key, None)

    def drop(self, key: int) -> None:
        self.order.pop(key, None)

    def victim(self) -> int:
        return next(iter(self.order))

    def __len__(self) -> int:
        return len(self.order)
