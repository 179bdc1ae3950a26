"""Eviction policies of the prefix cache's tiers, by registry: a policy is one module defining a
class with a `name` that keeps the evictable blocks of one tier and names the next victim.
Adding a policy is one module plus its name in BUILTIN.

Protocol: `add(key)` a block becomes evictable (just used, or just arrived in the tier);
`remove(key)` it is in use again or left the tier; `victim()` the block to evict next (it stays
until removed); `len()` evictable blocks. Blocks added together are added deepest first, so a
policy that orders by recency evicts a sequence's tail before its head (vLLM's order): a block
is useless once the block before it is gone.

Keys are block hashes, or a run of blocks no request can find any more (prefix_cache._Dead, a
count): the cache evicts such a run one block at a time while it is the victim, and adds further
dead blocks to the run it added last instead of adding a key. That is the order of one key per
block for any policy that orders keys by when they were added (LRU, FIFO).
"""

from __future__ import annotations

from typing import Protocol

from rdu_cluster.engine.registry import Registry

BUILTIN = ("rdu_cluster.engine.evictions.lru",)
DEFAULT = "lru"  # vLLM's prefix-cache eviction


class Eviction(Protocol):
    name: str

    def add(self, key: int) -> None: ...

    def remove(self, key: int) -> None: ...

    def victim(self) -> int: ...

    def __len__(self) -> int: ...


REGISTRY = Registry("--prefix-eviction", BUILTIN)
register = REGISTRY.register
names = REGISTRY.names


def get(name: str) -> Eviction:
    return REGISTRY.cls(name)()
