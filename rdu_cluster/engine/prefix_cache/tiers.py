"""Each tier's evictable blocks in eviction order and their counts (Tiers), the blocks no request
can find any more as one count (Dead), and the demotion of blocks evicted from HBM to the tier
below."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rdu_cluster.engine import evictions
from rdu_cluster.engine.prefix_cache.config import HBM
from rdu_cluster.engine.prefix_cache.tree import Run

if TYPE_CHECKING:
    from rdu_cluster.engine.prefix_cache.tree import Tree


class Dead:
    """Evictable blocks of one tier that no request can find any more, as one count: they only
    take room and a place in the eviction order (see Liveness). `key`: the hash of one such
    block where the policy keys each by its hash (while it moves between tiers)."""

    __slots__ = ("blocks", "key")

    def __init__(self, blocks: int = 0, key: int | None = None) -> None:
        self.blocks, self.key = blocks, key


class Tiers:
    """Each tier's evictable blocks in eviction order (a policy from engine/evictions per tier)
    and counts: findable runs of `tree`, and dead blocks (Dead). Where the policy orders by
    insertion alone (`runs`) one key stands for a run, findable or dead; else each block is its
    own key, its hash (an evictable Run is then one block)."""

    def __init__(self, eviction: str, tree: Tree, lower: str | None, lower_blocks: int):
        self.tree, self.lower, self.lower_blocks = tree, lower, lower_blocks
        tiers = (HBM, lower) if lower else (HBM,)
        self.evictable = {t: evictions.get(eviction) for t in tiers}
        self.runs = self.evictable[HBM].insertion_ordered
        self.dead_keys: dict[str, set] = {t: set() for t in tiers}  # else: dead blocks' hashes
        self.size = dict.fromkeys(tiers, 0)  # evictable blocks per tier
        self.dead = dict.fromkeys(tiers, 0)  # of which no request can find
        self.tail: dict[str, Dead | None] = dict.fromkeys(tiers)  # the last key, if dead

    def add(self, tier: str, runs: list[Run]) -> None:
        """Findable runs (no users, in `tier`) join the tier's order last, in order, each
        deepest first; a run per block where the policy keys blocks."""
        if self.runs:
            self.evictable[tier].add(runs)
            self.size[tier] += sum(len(run.hashes) for run in runs)
        else:
            keys: list = []
            for run in runs:
                got = run.hashes
                keys += got[::-1]
                if len(got) > 1:
                    for h in got[1:]:
                        self.tree.heads[h] = Run([h], 0, tier)
                    del got[1:]
            self.evictable[tier].add(keys)
            self.size[tier] += len(keys)
        self.tail[tier] = None

    def add_dead(self, tier: str, n: int, keys: list) -> None:
        """n dead blocks join the tier's order last: the run added last grows, if it is dead;
        where the policy keys blocks, each is its own key (`keys`, their hashes, deepest
        first)."""
        if not self.runs:
            self.dead_keys[tier].update(keys)
            self.evictable[tier].add(keys)
        else:
            run = self.tail[tier]
            if run is None:
                run = self.tail[tier] = Dead()
                self.evictable[tier].add([run])
            run.blocks += n
        self.size[tier] += n
        self.dead[tier] += n

    def evict(self, tier: str, n: int) -> list:
        """The tier's next n evictable blocks leave it, in eviction order: returned as Runs
        (findable blocks, still found) and Dead counts (dead blocks)."""
        policy = self.evictable[tier]
        keys = policy.victims(n)
        self.size[tier] -= n
        if not self.runs:
            return self._evict_keys(tier, keys, n)
        out: list = []
        i = 0  # keys before i are gone
        while n:
            if i == len(keys):
                raise RuntimeError(f"prefix cache: {tier} counts {n} evictable blocks more "
                                   "than it holds")
            key = keys[i]
            if type(key) is Dead:
                take = min(n, key.blocks)
                key.blocks -= take
                self.dead[tier] -= take
                out.append(Dead(take))
                n -= take
                if key.blocks:  # partly evicted: it stays the victim
                    break
                if self.tail[tier] is key:
                    self.tail[tier] = None
            elif n < len(key.hashes):  # its deepest n go; it stays the victim
                out.append(self.tree.cut(key, n))
                break
            else:
                out.append(key)
                n -= len(key.hashes)
            i += 1
        policy.drop(keys[:i])
        return out

    def _evict_keys(self, tier: str, keys: list, n: int) -> list:
        """evict where every block is its own key (dead ones by their hash)."""
        if len(keys) < n:
            raise RuntimeError(f"prefix cache: {tier} counts {n - len(keys)} evictable blocks "
                               "more than it holds")
        dead_keys, heads, out = self.dead_keys[tier], self.tree.heads, []  # type: set, dict, list
        for key in keys:
            if key in dead_keys:
                dead_keys.discard(key)
                self.dead[tier] -= 1
                out.append(Dead(1, key))
            else:
                out.append(heads[key])
        self.evictable[tier].drop(keys)
        return out

    def below(self, runs: list) -> None:
        """Blocks evicted from HBM (evict's runs) are demoted to the lower tier, the newest
        last, evicting its victims as they arrive; all of them are dropped under `hbm`."""
        if not self.lower or self.lower_blocks < 1:
            self.tree.forget(runs)
        elif self.runs:
            self._arrive(runs)
        else:  # one block at a time: each may be the lower tier's next victim once it is full
            low, i = self.lower, 0
            while i < len(runs):
                room = self.lower_blocks - self.size[low]
                if room < 1:  # over by 1 - room with the next
                    self.tree.forget(self.evict(low, min(1 - room, self.size[low])))
                    room = 1
                self._store_blocks(low, runs[i:i + room])
                i += room

    def _store_blocks(self, tier: str, runs: list) -> None:
        """Blocks (one-block Runs and Dead(1, hash)) join the tier's order last, in order,
        where the policy keys blocks."""
        keys = []
        for run in runs:
            if type(run) is Run:
                run.tier = tier
                keys.append(run.hashes[0])
            else:
                keys.append(run.key)
                self.dead_keys[tier].add(run.key)
                self.dead[tier] += 1
        self.evictable[tier].add(keys)
        self.size[tier] += len(keys)

    def _arrive(self, runs: list) -> None:
        """Blocks arrive below HBM in this order, the same as one by one where the tier's order
        is by insertion (the arrivals go last): the oldest blocks of the tier and then of the
        arrivals go first, as many as they overflow it."""
        low = self.lower
        assert low is not None  # only below calls it, with a lower tier
        over = self.size[low] - self.lower_blocks + sum(
            len(run.hashes) if type(run) is Run else run.blocks for run in runs)
        if over > 0 and self.size[low]:
            evicted = min(over, self.size[low])
            self.tree.forget(self.evict(low, evicted))
            over -= evicted
        i = 0
        while over > 0:  # arrivals that the next arrivals evict at once
            run = runs[i]
            if type(run) is Run:
                take = min(over, len(run.hashes))
                done = take == len(run.hashes)  # else its deepest go
                self.tree.forget([run if done else self.tree.cut(run, take)])
            else:
                take = min(over, run.blocks)
                run.blocks -= take
                done = not run.blocks
            over -= take
            i += done
        for run in runs[i:]:  # the rest join its order last, in order
            if type(run) is Run:
                run.tier = low
                self.add(low, [run])
            else:
                self.add_dead(low, run.blocks, [] if run.key is None else [run.key])
