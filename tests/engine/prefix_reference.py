"""The per-block prefix cache that engine/prefix_cache/ replaced (one entry and one LRU key per
block, a Python loop per block), kept as the reference model the tests compare the run-based cache
against: same lookups, claims, tiers and evictions, operation by operation and table by table."""

from __future__ import annotations

from dataclasses import dataclass

from rdu_cluster.engine import evictions
from rdu_cluster.engine.prefix_cache import HBM, Claim, block_hashes
from rdu_cluster.engine.requests import Request
from workloads.trace_formats import own_chunk


@dataclass
class _Entry:
    tier: str
    users: int = 0


class ReferenceCache:
    """One replica's cache. `lower`: the tier below HBM (None under `hbm`); `lower_blocks`: its
    capacity in blocks; `copy_s_per_block`: seconds to bring one block up from it;
    `kv_block_tokens`: tokens per KV-manager block (HBM room is counted in those)."""

    def __init__(self, block_tokens: int, kv_block_tokens: int, lower: str | None,
                 lower_blocks: int, copy_s_per_block: float,
                 eviction: str = evictions.DEFAULT):
        self.block_tokens, self.kv_block_tokens = block_tokens, kv_block_tokens
        self.lower, self.lower_blocks = lower, lower_blocks
        self.copy_s_per_block = copy_s_per_block
        self.eviction = eviction
        self.entries: dict[int, _Entry] = {}
        self.evictable = self._policies()
        self.refs: dict[int, list[int]] = {}  # request id -> hashes it uses, in order
        self.hashes: dict[int, list[int]] = {}  # request id -> its full blocks' hashes
        self.version = 0  # bumped on every change that can change a lookup
        self._peeked: dict[int, tuple[int, int, int]] = {}

    def _policies(self) -> dict:
        tiers = (HBM, self.lower) if self.lower else (HBM,)
        return {t: evictions.get(self.eviction) for t in tiers}

    # -- lookups --------------------------------------------------------------------------
    def _blocks(self, r: Request) -> list[int]:
        h = self.hashes.get(r.id)
        if h is None:
            content = r.content or ((own_chunk(r.id), r.prompt_len + r.output_len),)
            # KV is the model's: under CoE each expert's blocks are its own
            h = self.hashes[r.id] = block_hashes(content, r.prompt_len + r.output_len,
                                                 self.block_tokens, root=r.expert + 2)
        return h

    def _match(self, r: Request) -> list[int]:
        """The hashes of r's longest cached prefix, leaving its last prompt token to compute."""
        limit = (r.prompt_len + r.generated - 1) // self.block_tokens
        out = []
        for h in self._blocks(r)[:limit]:
            if h not in self.entries:
                break
            out.append(h)
        return out

    def peek(self, r: Request) -> int:
        """Cached tokens r would find now (memoized until the cache changes)."""
        key = (self.version, r.generated)
        memo = self._peeked.get(r.id)
        if memo is not None and memo[:2] == key:
            return memo[2]
        hit = len(self._match(r)) * self.block_tokens
        self._peeked[r.id] = (*key, hit)
        return hit

    def lookup(self, r: Request) -> dict[str, int]:
        """Cached tokens r would find now, per tier (a router's look: nothing changes)."""
        out: dict[str, int] = {}
        for h in self._match(r):
            tier = self.entries[h].tier
            out[tier] = out.get(tier, 0) + self.block_tokens
        return out

    # -- state changes --------------------------------------------------------------------
    def claim(self, r: Request) -> Claim:
        """r is admitted: it uses its cached prefix; blocks below HBM come up (copied)."""
        claim = Claim({HBM: 0, **({self.lower: 0} if self.lower else {})})
        refs = self.refs.setdefault(r.id, [])
        for h in self._match(r):
            e = self.entries[h]
            claim.tokens[e.tier] += self.block_tokens
            self._touch(e, h)
            if e.tier != HBM:
                claim.copy_s += self.copy_s_per_block
                e.tier = HBM
            e.users += 1
            refs.append(h)
        self.version += 1
        return claim

    def computed(self, r: Request, tokens: int) -> None:
        """r holds the KV of its first `tokens` tokens: its full blocks become findable (used
        by r until it releases them)."""
        refs = self.refs.setdefault(r.id, [])
        for h in self._blocks(r)[len(refs): tokens // self.block_tokens]:
            e = self.entries.get(h)
            if e is None:
                e = self.entries[h] = _Entry(HBM)
            else:
                self._touch(e, h)
                e.tier = HBM  # r computed its own copy in HBM: a lower one is not needed
            e.users += 1
            refs.append(h)
        self.version += 1

    def release(self, r: Request, tokens: int) -> None:
        """r leaves the HBM KV cache (finished or preempted) holding `tokens` tokens: its blocks
        stay cached, evictable, deepest first in eviction order."""
        self.computed(r, tokens)
        for h in reversed(self.refs.pop(r.id, [])):
            e = self.entries[h]
            e.users -= 1
            if e.users == 0:
                self.evictable[e.tier].add([h])
        if r.state == "done":
            self.hashes.pop(r.id, None)
            self._peeked.pop(r.id, None)
        self.version += 1

    def fit(self, free_kv_blocks: int) -> None:
        """Keep the evictable HBM blocks within the KV manager's free blocks: demote (tiered) or
        drop (hbm) the policy's victims."""
        room = free_kv_blocks * self.kv_block_tokens // self.block_tokens
        hbm = self.evictable[HBM]
        while len(hbm) > room:
            (h,) = hbm.victims(1)
            hbm.drop([h])
            self._demote(h)
            self.version += 1

    def _demote(self, h: int) -> None:
        if not self.lower or self.lower_blocks < 1:
            del self.entries[h]
            return
        low = self.evictable[self.lower]
        if len(low) >= self.lower_blocks:
            (victim,) = low.victims(1)
            low.drop([victim])
            del self.entries[victim]
        self.entries[h].tier = self.lower
        low.add([h])

    def _touch(self, e: _Entry, h: int) -> None:
        """A request uses block h: used again in HBM, or copied up from below (it leaves)."""
        if e.tier == HBM:
            self.evictable[HBM].use([h])
        else:
            self.evictable[e.tier].drop([h])

    def clear(self) -> None:
        """Every block is lost (a failed socket: the group is re-planned)."""
        self.evictable = self._policies()
        self.entries.clear()
        self.refs.clear()
        self.version += 1

    def blocks_in(self, tier: str) -> int:
        return sum(1 for e in self.entries.values() if e.tier == tier)
