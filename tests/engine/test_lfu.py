"""The LFU prefix-cache eviction policy (engine/evictions/lfu.py): a plug-in in one file. The
cache against its per-block reference model runs every policy, LFU included
(tests/engine/test_prefix_cache_runs.py)."""

from __future__ import annotations

from rdu_cluster.engine import evictions
from rdu_cluster.engine.prefix_cache import PrefixCache
from rdu_cluster.engine.requests import DONE, RUNNING, Request


def test_the_least_used_block_goes_first_and_a_block_that_leaves_is_forgotten():
    lfu = evictions.get("lfu")
    lfu.add([1, 2, 3])
    lfu.use([1])  # 1 in use again: not evictable, two uses
    assert lfu.victims(3) == [2, 3] and len(lfu) == 2
    lfu.add([1])
    lfu.drop([2])
    assert lfu.victims(2) == [3, 1]  # one use, against 1's two
    lfu.drop([3])
    assert lfu.victims(1) == [1]
    lfu.drop([1])  # left the tier: its count is forgotten
    lfu.add([1, 4])
    assert lfu.victims(2) == [1, 4] and not lfu.uses.keys() - {1, 4}


def _shared_then_a_burst(eviction: str) -> int:
    """A document read by three requests, then eight requests of their own tokens, in an HBM
    that holds 8 evictable blocks: tokens the document's fourth reader finds."""
    doc = ((7, 64),)
    cache = PrefixCache(16, 16, None, 0, 0.0, eviction)
    rid = 0
    for content in [doc] * 3 + [()] * 8:
        r = Request(rid, 0.0, 64, 1, content=content)
        rid += 1
        cache.claim(r)
        r.state = RUNNING
        cache.computed(r, 64)
        r.state = DONE
        cache.release(r, 64)
        cache.fit(8)
    return cache.peek(Request(rid, 0.0, 80, 1, content=doc + ((8, 16),)))


def test_lfu_keeps_a_shared_prefix_a_burst_of_single_use_blocks_evicts_under_lru():
    assert _shared_then_a_burst("lru") == 0
    assert _shared_then_a_burst("lfu") == 64
