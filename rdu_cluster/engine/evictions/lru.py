"""Least recently used: the block used (or stored) longest ago goes first (vLLM's prefix cache,
SGLang's radix cache and LMCache all default to LRU).

The order is a plain dict's insertion order (a key used or dropped leaves it, one added again
goes last): every call is a loop in C over its keys, where an OrderedDict also links a node per
key. A dict's iteration walks past the slots its removed keys left until it is rebuilt, so it is
rebuilt once the keys removed since outnumber half the keys it holds."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import islice, repeat

from rdu_cluster.engine.evictions import register


@register
class LRU:
    name = "lru"
    insertion_ordered = True

    def __init__(self) -> None:
        self.order: dict = {}
        self.removed = 0  # keys removed since the dict was last rebuilt

    def add(self, keys: Sequence) -> None:
        order = self.order
        n = len(order)
        order.update(dict.fromkeys(keys))
        if len(order) - n != len(keys):  # some were here already: they move to the end
            for key in keys:
                del order[key]
                order[key] = None

    def use(self, keys: Sequence) -> None:
        n = len(self.order)
        deque(map(self.order.pop, keys, repeat(None)), maxlen=0)  # a loop in C
        self.removed += n - len(self.order)
        if self.removed > len(self.order) // 2 + 1024:
            self.order, self.removed = dict(self.order), 0

    drop = use  # forgotten either way: LRU keeps nothing for a block that is not evictable

    def victims(self, n: int) -> list:
        return list(islice(self.order, n))

    def __len__(self) -> int:
        return len(self.order)
