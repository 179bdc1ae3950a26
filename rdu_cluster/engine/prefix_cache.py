"""Prefix caching across memory tiers (vLLM automatic prefix caching, SGLang's radix cache;
spilled to a lower tier as LMCache and Mooncake do).

Blocks of `block_tokens` tokens are keyed by a hash of the token prefix they end (a chain: the
previous block's hash and this block's content, from traces.Trace.content), so a block matches
only behind the same prefix. Only full blocks are cached, and a hit leaves at least the prompt's
last token to compute (vLLM's rule: the step needs its logits).

Tiers (`mode`): `hbm` keeps blocks in the HBM the KV cache leaves free; `tiered` spills blocks
evicted from HBM to the chip's lower tier (DDR on an RDU, host memory behind PCIe on a GPU: chip
TOML `[tiers.ddr]` / `[tiers.host]`, whose figures name their sources) instead of dropping them.
A block lives in one tier at a time (exclusive tiers).

Capacity, shared with what else the tiers hold:
- HBM: the cache holds only blocks no running request uses, in the blocks the KV manager has
  free (KVManager: 0.9 x (HBM - weights)); whenever running sequences take blocks, the cache's
  least valuable blocks go first (demoted, or dropped under `hbm`). Admission counts them as
  free, as vLLM does.
- The lower tier: its capacity less what the replica's sockets keep there (CoE experts; with
  swap preemption, room for the whole HBM KV cache swapped out).
Blocks used by running requests are counted in each request's KV blocks: requests running at the
same time that share a prefix share its compute, not its memory (an overestimate of memory).

A hit skips the prefill compute of the cached tokens (the step is costed with them as a cached
prefix). Blocks found in the lower tier are copied to HBM at min(lower, HBM) bandwidth
(MemoryTiers.copy_time), layer by layer while the step computes (LMCache's layer-wise
pipelined retrieval; both chips copy with DMA engines beside their compute units): see
`exposed`. Demotions from HBM are write-backs off the critical path and cost no step time.
Eviction order per tier: a policy from engine/evictions (LRU to start).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rdu_cluster.engine import evictions
from rdu_cluster.engine.requests import Request
from workloads.errors import ConfigError
from workloads.trace_formats import own_chunk

MODES = ("off", "hbm", "tiered")
HBM = "hbm"


@dataclass(frozen=True)
class PrefixConfig:
    mode: str | None = None  # None: tiered where the chip has a lower tier, else hbm
    block_tokens: int | None = None  # None: the KV cache's block (vLLM hashes KV blocks)
    eviction: str = "lru"

    def check(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise ConfigError(f"--prefix-cache: unknown {self.mode!r}; accepted: "
                              f"{', '.join(MODES)}")
        if self.block_tokens is not None and self.block_tokens < 1:
            raise ConfigError(f"--prefix-block: must be positive, got {self.block_tokens}")
        evictions.get(self.eviction)

    def resolved(self, lower: str | None) -> str:
        """The mode on a chip whose lower tier is `lower` (None: it has none)."""
        if self.mode is None:
            return "tiered" if lower else HBM
        if self.mode == "tiered" and not lower:
            raise ConfigError("--prefix-cache tiered: the chip has no tier below HBM")
        return self.mode


def block_hashes(content: tuple, tokens: int, block_tokens: int, root: int = 0) -> list[int]:
    """Hashes of the full blocks among the first `tokens` tokens of `content` ((id, tokens)
    chunks): block k's hash covers block k-1's hash and the (id, start, end) pieces of block k;
    block 0's covers `root` (the model that computed the KV: a CoE expert's index). Tuples of
    ints hash the same in every process."""
    full = tokens // block_tokens
    out: list[int] = []
    h, piece, fill = root, (), 0
    for cid, n in content:
        off = 0
        while off < n and len(out) < full:
            take = min(n - off, block_tokens - fill)
            piece += (cid, off, off + take)
            fill, off = fill + take, off + take
            if fill == block_tokens:
                h = hash((h, *piece))
                out.append(h)
                piece, fill = (), 0
        if len(out) >= full:
            break
    return out


@dataclass
class Claim:
    """What an admission found: tokens per tier and the copy seconds to HBM."""

    tokens: dict[str, int] = field(default_factory=dict)
    copy_s: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.tokens.values())


@dataclass
class _Entry:
    tier: str
    users: int = 0


class PrefixCache:
    """One replica's cache. `lower`: the tier below HBM (None under `hbm`); `lower_blocks`: its
    capacity in blocks; `copy_s_per_block`: seconds to bring one block up from it;
    `kv_block_tokens`: tokens per KV-manager block (HBM room is counted in those)."""

    def __init__(self, block_tokens: int, kv_block_tokens: int, lower: str | None,
                 lower_blocks: int, copy_s_per_block: float, eviction: str = "lru"):
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
            if e.users == 0:
                self.evictable[e.tier].remove(h)
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
            elif e.users == 0:
                self.evictable[e.tier].remove(h)
                e.tier = HBM  # r computed its own copy in HBM: the lower one is not needed
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
                self.evictable[e.tier].add(h)
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
            h = hbm.victim()
            hbm.remove(h)
            self._demote(h)
            self.version += 1

    def _demote(self, h: int) -> None:
        if not self.lower or self.lower_blocks < 1:
            del self.entries[h]
            return
        low = self.evictable[self.lower]
        if len(low) >= self.lower_blocks:
            victim = low.victim()
            low.remove(victim)
            del self.entries[victim]
        self.entries[h].tier = self.lower
        low.add(h)

    def clear(self) -> None:
        """Every block is lost (a failed socket: the group is re-planned)."""
        self.evictable = self._policies()
        self.entries.clear()
        self.refs.clear()
        self.version += 1

    def blocks_in(self, tier: str) -> int:
        return sum(1 for e in self.entries.values() if e.tier == tier)


def exposed(copy_s: np.ndarray, compute_s: np.ndarray, layers: int) -> np.ndarray:
    """Step time a copy adds when it runs layer by layer beside the step's compute: a two-stage
    pipeline over `layers` stages lasts max(copy, compute) + min(copy, compute) / layers, so the
    copy adds that less the compute (the first layer's copy is never hidden)."""
    total = np.maximum(copy_s, compute_s) + np.minimum(copy_s, compute_s) / max(layers, 1)
    return np.where(copy_s > 0, total - compute_s, 0.0)


def build(config: PrefixConfig, mode: str, chip, kv, lower: str | None,
          lower_reserved: float) -> PrefixCache:
    """A replica's cache under `mode` on `chip`, beside the replica's KV manager `kv`; the lower
    tier keeps `lower_reserved` bytes per socket for other things."""
    from chip.memory import MemoryTiers

    bt = config.block_tokens or kv.config.block_tokens
    block_bytes = bt * kv.config.bytes_per_token
    if mode != "tiered":
        return PrefixCache(bt, kv.config.block_tokens, None, 0, 0.0, config.eviction)
    free = chip.tier(lower).capacity_bytes - lower_reserved
    return PrefixCache(bt, kv.config.block_tokens, lower, max(0, int(free // block_bytes)),
                       MemoryTiers.of(chip).copy_time(block_bytes, lower, HBM),
                       config.eviction)


def summary(requests: list[Request], mode: str, lower: str | None) -> dict:
    """Share of the prompt tokens admitted that the cache served, overall and per tier."""
    admitted = sum(r.admitted_tokens for r in requests)
    tiers = [HBM] + ([lower] if lower and mode == "tiered" else [])
    by_tier = {t: sum(r.prefix_tokens.get(t, 0) for r in requests) for t in tiers}
    rate = lambda n: n / admitted if admitted else 0.0
    return {"prefix_cache": mode,
            "prefix_cache_hit_rate": rate(sum(by_tier.values())),
            "prefix_cache_hit_rate_by_tier": {t: rate(n) for t, n in by_tier.items()},
            "prefix_copy_s": sum(r.prefix_copy_s for r in requests)}
