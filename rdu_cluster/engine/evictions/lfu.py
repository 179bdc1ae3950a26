"""Least frequently used: the block used the fewest times since it entered the tier goes
first, the one added longest ago among equals (SGLang's radix cache offers LFU beside LRU,
--radix-eviction-policy lfu; a block a request computed or brought into the tier counts one
use). A block that leaves the tier is forgotten: its count starts again where it arrives.

Against LRU it keeps a prefix many requests share (a system prompt, a popular document) over a
burst of blocks used once: the counts of sessions' histories grow turn by turn."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from rdu_cluster.engine.evictions import register


@register
class LFU:
    name = "lfu"
    insertion_ordered = False  # the order depends on the uses, not only on when keys came

    def __init__(self) -> None:
        self.uses: dict = {}  # key -> uses since it entered the tier (forgotten on drop)
        self.heap: list = []  # (uses, order, key) as keys were added; stale entries skipped
        self.evictable: dict = {}  # evictable key -> the order of its live heap entry
        self.order = itertools.count()

    def add(self, keys: Sequence) -> None:
        for key in keys:
            o = next(self.order)
            self.evictable[key] = o
            heapq.heappush(self.heap, (self.uses.setdefault(key, 1), o, key))
        if len(self.heap) > 2 * len(self.evictable) + 64:  # stale entries: rebuild
            self.heap = [e for e in self.heap if self.evictable.get(e[2]) == e[1]]
            heapq.heapify(self.heap)

    def use(self, keys: Sequence) -> None:
        for key in keys:
            self.evictable.pop(key, None)
            self.uses[key] = self.uses.get(key, 1) + 1

    def drop(self, keys: Sequence) -> None:
        for key in keys:
            self.evictable.pop(key, None)
            self.uses.pop(key, None)

    def victims(self, n: int) -> list:
        heap, live = self.heap, []  # type: list, list
        while heap and len(live) < n:
            entry = heapq.heappop(heap)
            if self.evictable.get(entry[2]) == entry[1]:  # else stale: gone for good
                live.append(entry)
        for entry in live:  # they stay until dropped
            heapq.heappush(heap, entry)
        return [entry[2] for entry in live]

    def __len__(self) -> int:
        return len(self.evictable)
