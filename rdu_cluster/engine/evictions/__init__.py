"""Eviction policies of the prefix cache's tiers, by registry: a policy is one module defining a
class with a `name` that keeps the evictable blocks of one tier and names the next victim.
Adding a policy is one module in this package (the registry finds it) plus its test.

What each call means (one policy per tier; the cache makes every call, the policy decides
nothing but the order). Every call but `victims` takes a list of keys: a call per batch keeps
the work a loop in the policy, not a chain of calls per block.
- `add(keys)`: the blocks are evictable in this tier, in this order: their last user released
  them, or they just arrived here (demoted from the tier above). Blocks added together are
  added deepest first, so a policy that orders by recency evicts a sequence's tail before its
  head (vLLM's order): a block is useless once the block before it is gone.
- `use(keys)`: requests use the blocks, which stay in this tier: they are not evictable until
  added again (where keys are blocks they may be in use already: a policy that counts uses
  counts this one).
- `drop(keys)`: the blocks left this tier (evicted, demoted, or copied up to HBM for a request):
  the policy forgets everything it kept for them (an LFU its counts).
- `victims(n)`: the next n evictable keys to evict, first first (all of them if fewer); they
  stay until dropped, and the cache drops those it evicts whole. `len()`: evictable keys.
- `insertion_ordered`: True when the victims are the evictable keys in the order they were
  added, oldest first (LRU, FIFO; not MRU), and the policy keeps nothing for a key that is not
  evictable. The cache
  then stands one key for a run of blocks next to each other in the order: findable blocks of
  one chain (prefix_cache.tree.Run, evicted deepest first) or blocks no request can find any more
  (prefix_cache.tiers.Dead, a count). A key's blocks may leave it without a call: a victim partly
  evicted keeps the rest of its blocks and stays the victim, and a request that uses a run's
  shallower blocks takes them out of it, the rest keeping its place; dead blocks added next
  join the dead run added last. That is the order of one key per block, and the cache demotes
  a batch of blocks into the tier below as one arrival (the newest last). False (LFU): every
  key is one block, its hash (a block in use is passed to `use` too), and demotions arrive one
  block at a time once the tier below is full.

The cache checks each policy against the per-block cache it replaced
(tests/engine/prefix_reference.py): tests/engine/test_prefix_cache_runs.py runs every
registered policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rdu_cluster.engine.registry import Registry

DEFAULT = "lru"  # vLLM's prefix-cache eviction


class Eviction(Protocol):
    name: str
    insertion_ordered: bool

    def add(self, keys: Sequence) -> None: ...

    def use(self, keys: Sequence) -> None: ...

    def drop(self, keys: Sequence) -> None: ...

    def victims(self, n: int) -> list: ...

    def __len__(self) -> int: ...


REGISTRY = Registry("--prefix-eviction", __name__)
register = REGISTRY.register
names = REGISTRY.names


def get(name: str) -> Eviction:
    return REGISTRY.cls(name)()
