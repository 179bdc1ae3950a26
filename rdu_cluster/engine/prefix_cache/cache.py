"""One replica's prefix cache (PrefixCache) and what an admission found (Claim); the step time a
copy from the lower tier adds (exposed), a replica's cache under a mode (build) and the share of
prompt tokens it served (summary)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np

from rdu_cluster.engine import evictions
from rdu_cluster.engine.prefix_cache.config import HBM
from rdu_cluster.engine.prefix_cache.hashing import CHAINS, block_hashes
from rdu_cluster.engine.prefix_cache.tiers import Tiers
from rdu_cluster.engine.prefix_cache.tree import Tree
from rdu_cluster.engine.requests import DONE
from workloads.trace_formats import own_chunk

if TYPE_CHECKING:
    from rdu_cluster.engine.prefix_cache.config import PrefixConfig
    from rdu_cluster.engine.prefix_cache.liveness import Liveness
    from rdu_cluster.engine.prefix_cache.tree import Run
    from rdu_cluster.engine.requests import Request


@dataclass
class Claim:
    """What an admission found: tokens per tier and the copy seconds to HBM."""

    tokens: dict[str, int] = field(default_factory=dict)
    copy_s: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.tokens.values())


@dataclass(slots=True)
class _Seq:
    """The cache's view of one request until it finishes: its blocks' hashes (computed once,
    when first needed), its full blocks, the first of its own blocks (which no other request can
    find: Liveness), the blocks it uses (its first `held`), whether its own blocks have entries
    (it left unfinished: it may find them again) and peek's memo."""

    blocks: int
    own: int
    hashes: list[int] | None = None
    held: int = 0
    loose: bool = False
    memo: tuple[int, int, int] = (-1, -1, 0)


class PrefixCache:
    """One replica's cache. `lower`: the tier below HBM (None under `hbm`); `lower_blocks`: its
    capacity in blocks; `copy_s_per_block`: seconds to bring one block up from it;
    `kv_block_tokens`: tokens per KV-manager block (HBM room is counted in those); `live`: what
    requests yet to finish can ask for (None: anything, every block kept findable).

    The work is per run of blocks, not per block: the findable blocks are a radix tree of runs
    (Tree), a request's cached blocks a path of runs, and where the policy orders by insertion
    alone an evictable run is one key of its tier's order (Tiers). A running request's own
    blocks are a count (entries only once it leaves unfinished), and blocks no request can find
    again one evictable count per run of the order (Dead), so the cache's size follows the
    requests in flight and the blocks that can still be found, not the trace; hits, tiers and
    evictions are those of one entry per block (tests/engine/prefix_reference.py)."""

    def __init__(self, block_tokens: int, kv_block_tokens: int, lower: str | None,
                 lower_blocks: int, copy_s_per_block: float, eviction: str = evictions.DEFAULT,
                 live: Liveness | None = None):
        self.block_tokens, self.kv_block_tokens = block_tokens, kv_block_tokens
        self.lower, self.lower_blocks = lower, lower_blocks
        self.copy_s_per_block = copy_s_per_block
        self.eviction = eviction
        self.live = live
        self.tree = Tree()
        self.tiers = Tiers(eviction, self.tree, lower, lower_blocks)
        self.seqs: dict[int, _Seq] = {}  # request id -> its view, until it finishes

    # -- per request ----------------------------------------------------------------------
    def _seq(self, r: Request, keep: bool = True) -> _Seq:
        """r's view; kept until r finishes when `keep` (r waits or runs here)."""
        s = self.seqs.get(r.id)
        if s is None:
            tokens = r.prompt_len + r.output_len
            if r.content:
                tokens = min(tokens, sum(n for _, n in r.content))
            blocks = tokens // self.block_tokens
            own = self.live.own_from(r, self.block_tokens) if self.live else None
            s = _Seq(blocks, blocks if own is None else min(own, blocks))
            if keep:
                self.seqs[r.id] = s
        return s

    def _hashes(self, r: Request, s: _Seq) -> list[int]:
        if s.hashes is None:
            content = r.content or ((own_chunk(r.id), r.prompt_len + r.output_len),)
            memo = CHAINS if r.content and self.live is not None else None
            # KV is the model's: under CoE each expert's blocks are its own
            s.hashes = block_hashes(content, r.prompt_len + r.output_len, self.block_tokens,
                                    root=r.expert + 2, memo=memo)
        return s.hashes

    def _findable(self, s: _Seq) -> int:
        """r's blocks that can have entries: its own ones only once it left unfinished."""
        return s.blocks if s.loose else s.own

    # -- lookups --------------------------------------------------------------------------
    def _found(self, r: Request, s: _Seq) -> list[tuple[Run, int]]:
        """The path of r's longest cached prefix, leaving its last prompt token to compute."""
        end = min((r.prompt_len + r.generated - 1) // self.block_tokens, self._findable(s))
        if end <= 0 or not self.tree.heads:
            return []
        return self.tree.path(self._hashes(r, s), 0, end)

    def peek(self, r: Request) -> int:
        """Cached tokens r would find now (memoized until the findable blocks change)."""
        if not r.content and r.id not in self.seqs:
            return 0  # its tokens are its own and it never left the cache unfinished
        s = self._seq(r)
        if s.memo[:2] == (self.tree.version, r.generated):
            return s.memo[2]
        hit = sum(k for _, k in self._found(r, s)) * self.block_tokens
        s.memo = (self.tree.version, r.generated, hit)
        return hit

    def lookup(self, r: Request) -> dict[str, int]:
        """Cached tokens r would find now, per tier, in the order its blocks meet them (a
        router's look: nothing changes)."""
        if not r.content and r.id not in self.seqs:
            return {}
        path = self._found(r, self._seq(r, keep=False))  # r may go elsewhere: nothing stays
        if not path:
            return {}
        n = sum(k for _, k in path)
        low = sum(k for run, k in path if run.tier != HBM)
        if not low:
            return {HBM: n * self.block_tokens}
        assert self.lower is not None  # blocks below HBM: there is a lower tier
        tiers = [(HBM, n - low), (self.lower, low)]
        if path[0][0].tier != HBM:
            tiers.reverse()
        return {t: k * self.block_tokens for t, k in tiers if k}

    # -- state changes --------------------------------------------------------------------
    def claim(self, r: Request) -> Claim:
        """r is admitted: it uses its cached prefix; blocks below HBM come up (copied)."""
        claim = Claim({HBM: 0, **({self.lower: 0} if self.lower else {})})
        s = self._seq(r)
        path = self._found(r, s)
        n = sum(k for _, k in path)
        if n:
            up = self._use(path)
            claim.tokens[HBM] = (n - up) * self.block_tokens
            if up:
                assert self.lower is not None  # blocks came up: there is a lower tier
                claim.tokens[self.lower] = up * self.block_tokens
                for _ in range(up):  # summed block by block, as the per-block cache did
                    claim.copy_s += self.copy_s_per_block
        s.held = n
        return claim

    def computed(self, r: Request, tokens: int) -> None:
        """r holds the KV of its first `tokens` tokens: its full blocks become findable (used
        by r until it releases them)."""
        s = self._seq(r)
        upto = min(tokens // self.block_tokens, s.blocks)
        stop = min(upto, self._findable(s))
        if s.held < stop:
            hashes, tree, i, old = self._hashes(r, s), self.tree, s.held, []
            while i < stop:
                path = tree.path(hashes, i, stop)
                if path:  # cached already: r computed its own copy, in HBM
                    old += path
                    i += sum(k for _, k in path)
                    continue
                rest = list(map(tree.heads.__contains__, hashes[i + 1:stop]))
                j = i + 1 + rest.index(True) if True in rest else stop
                tree.grow(hashes[i:j], 1, HBM)  # new blocks, used by r
                i = j
            if old:
                self._use(old)
        s.held = max(s.held, upto)

    def _use(self, path: list[tuple[Run, int]]) -> int:
        """Requests use blocks (a path's, cached): in HBM they are used again (not evictable
        until released), below HBM they come up (they leave that tier). Returns how many came
        from below."""
        tiers = self.tiers
        hbm_keys: list = []
        low_keys: list = []
        up = freed = 0
        for run, k in path:
            used = run if k == len(run.hashes) else self.tree.split(run, k)
            if used.tier != HBM:  # every block below HBM is evictable
                up += k
                if not tiers.runs:
                    low_keys += used.hashes
                elif used is run:  # else the run keeps its deeper blocks in the order
                    low_keys.append(run)
                used.tier, used.users = HBM, 1
                continue
            if not used.users:
                freed += k
                if tiers.runs and used is run:
                    hbm_keys.append(run)
            if not tiers.runs:  # a policy that counts uses counts each
                hbm_keys += used.hashes
            used.users += 1
        if up:
            assert self.lower is not None  # blocks below HBM: there is a lower tier
            tiers.size[self.lower] -= up
            tiers.evictable[self.lower].drop(low_keys)
        tiers.evictable[HBM].use(hbm_keys)
        tiers.size[HBM] -= freed
        return up

    def release(self, r: Request, tokens: int) -> None:
        """r leaves the HBM KV cache (finished or preempted) holding `tokens` tokens: its blocks
        stay cached, evictable, deepest first in eviction order; those no request can find any
        more (it finished) as a count."""
        self.computed(r, tokens)
        s = self.seqs[r.id]
        n, first = s.held, self._findable(s)
        dead = s.blocks
        if r.state == DONE:
            del self.seqs[r.id]
            if self.live is not None:
                self.live.finish(r)
                d = self.live.dead_from(r, self.block_tokens)
                dead = s.blocks if d is None else d
        if n > first:  # its own blocks, without entries yet
            if r.state == DONE:
                self.tiers.add_dead(HBM, n - first, [] if self.tiers.runs
                                    else self._hashes(r, s)[first:n][::-1])
            else:  # it may come back for them: they become findable
                self.tiers.add(HBM, [self.tree.grow(self._hashes(r, s)[first:n], 0, HBM)])
                s.loose = True
        m = min(n, first)
        if m > 0:
            self._unuse(self._hashes(r, s), m, max(0, m - dead))
        s.held = 0

    def _unuse(self, hashes: list[int], m: int, gone: int) -> None:
        """A request releases its first m blocks `hashes` (in HBM), of which the last `gone` no
        request can find any more: those no other request uses become evictable, deepest
        first."""
        free, dead = [], []
        at, cut = 0, m - gone
        for run, k in self.tree.path(hashes, 0, m):  # whole runs: the request's own path
            run.users -= 1
            if not run.users:
                if at + k <= cut:
                    free.append(run)
                elif at >= cut:
                    dead.append(run)
                else:
                    free.append(self.tree.split(run, cut - at))
                    dead.append(run)
            at += k
        if dead:
            self.tree.forget(dead)
            keys = [] if self.tiers.runs else [h for run in dead[::-1] for h in run.hashes[::-1]]
            self.tiers.add_dead(HBM, sum(len(run.hashes) for run in dead), keys)
        if free:
            self.tiers.add(HBM, free[::-1])

    def fit(self, free_kv_blocks: int) -> None:
        """Keep the evictable HBM blocks within the KV manager's free blocks: demote (tiered) or
        drop (hbm) the policy's victims."""
        room = free_kv_blocks * self.kv_block_tokens // self.block_tokens
        if self.tiers.size[HBM] > room:
            self.tiers.below(self.tiers.evict(HBM, self.tiers.size[HBM] - room))

    def clear(self) -> None:
        """Every block is lost (a failed socket: the group is re-planned)."""
        self.tree.heads.clear()
        self.tree.version += 1
        self.tiers = Tiers(self.eviction, self.tree, self.lower, self.lower_blocks)
        for s in self.seqs.values():
            s.held, s.loose = 0, False

    def blocks_in(self, tier: str) -> int:
        """Blocks held in `tier`: findable ones, dead ones and running requests' own ones."""
        own = sum(max(0, s.held - s.own) for s in self.seqs.values() if not s.loose)
        return self.tree.blocks(tier) + self.tiers.dead[tier] + (own if tier == HBM else 0)


def exposed(copy_s: np.ndarray, compute_s: np.ndarray, layers: int) -> np.ndarray:
    """Step time a copy adds when it runs layer by layer beside the step's compute: a two-stage
    pipeline over `layers` stages lasts max(copy, compute) + min(copy, compute) / layers, so the
    copy adds that less the compute (the first layer's copy is never hidden)."""
    if not copy_s.any():  # most windows copy nothing
        return np.zeros(np.shape(compute_s))
    total = np.maximum(copy_s, compute_s) + np.minimum(copy_s, compute_s) / max(layers, 1)
    return np.where(copy_s > 0, total - compute_s, 0.0)


def build(config: PrefixConfig, mode: str, chip, kv, lower: str | None,
          lower_reserved: float, live: Liveness | None = None) -> PrefixCache:
    """A replica's cache under `mode` on `chip`, beside the replica's KV manager `kv`; the lower
    tier keeps `lower_reserved` bytes per socket for other things; `live`: the trace's
    Liveness, shared by the replicas."""
    from chip.memory import MemoryTiers

    bt = config.block_tokens or kv.config.block_tokens
    block_bytes = bt * kv.config.bytes_per_token
    if mode != "tiered":
        return PrefixCache(bt, kv.config.block_tokens, None, 0, 0.0, config.eviction, live)
    lower = cast(str, lower)  # PrefixConfig.resolved gives "tiered" only with a lower tier
    free = chip.tier(lower).capacity_bytes - lower_reserved
    return PrefixCache(bt, kv.config.block_tokens, lower, max(0, int(free // block_bytes)),
                       MemoryTiers.of(chip).copy_time(block_bytes, lower, HBM),
                       config.eviction, live)


def summary(admitted: int, found: dict[str, int], copy_s: float, mode: str,
            lower: str | None) -> dict:
    """Share of the prompt tokens admitted that the cache served, overall and per tier, from
    the requests' totals (engine/finished.py): prompt tokens admitted, tokens found per tier,
    copy seconds."""
    tiers = [HBM] + ([lower] if lower and mode == "tiered" else [])
    by_tier = {t: found.get(t, 0) for t in tiers}
    rate = lambda n: n / admitted if admitted else 0.0
    return {"prefix_cache": mode,
            "prefix_cache_hit_rate": rate(sum(by_tier.values())),
            "prefix_cache_hit_rate_by_tier": {t: rate(n) for t, n in by_tier.items()},
            "prefix_copy_s": copy_s}
