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

Bookkeeping is per run of blocks, not per block, where no lookup can tell the difference
(PrefixCache, Liveness): the findable blocks are a radix tree of runs (a chain's blocks i..j in
one tier with the same users, found by their first block's hash), so a request's claim,
release and eviction cost per run on its path (about one a turn of a session), not per block;
where the policy orders by insertion alone, an evictable run is one key of its tier's order. A
running request's own blocks (no other request's content reaches them) are a count, entries
only once it leaves unfinished; blocks no request yet to finish can find are one count per run
of a tier's eviction order. So the cache's memory follows the requests in flight and the blocks
that can still be found, not the trace, and a decode step costs it nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np

from rdu_cluster.engine import evictions
from rdu_cluster.engine.requests import DONE, Request
from workloads.errors import ConfigError
from workloads.trace_formats import own_chunk

MODES = ("off", "hbm", "tiered")
HBM = "hbm"


# The finest prefix-cache block. The cache's work is per block: a block of 1 token (SGLang's
# radix tree at page size 1) made a 100-session, 10-turn run 4x slower than blocks of 16 (31 s
# against 8 s) and 200 sessions x 30 turns 13x, for hits that differ by under a block a request
# (at most 15 tokens of a prompt of thousands). 16 is vLLM's KV block, the default.
MIN_BLOCK_TOKENS = 16
# block_hashes' memo (chunk id -> the hashes a chunk ends behind a given prefix), one for the
# process: a chunk's hashes depend on the chunk id, its length and the prefix's state alone,
# so the runs of one trace (capacity's candidates, its searches' runs) hash each chunk once;
# 14% of the sessions question's CPU was hashing, each run again. Forgotten all at once past
# CHAINS_MOST chunks (about 1 KB each for a 2,048-token chunk of 16-token blocks).
CHAINS_MOST = 50_000
_CHAINS: dict[int, dict] = {}


@dataclass(frozen=True)
class PrefixConfig:
    mode: str | None = None  # None: tiered where the chip has a lower tier, else hbm
    block_tokens: int | None = None  # None: the KV cache's block (vLLM hashes KV blocks)
    eviction: str = evictions.DEFAULT

    def check(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise ConfigError(f"--prefix-cache: unknown {self.mode!r}; accepted: "
                              f"{', '.join(MODES)}")
        if self.block_tokens is not None and self.block_tokens < MIN_BLOCK_TOKENS:
            raise ConfigError(f"--prefix-block: at least {MIN_BLOCK_TOKENS} tokens (the KV "
                              f"block vLLM hashes), got {self.block_tokens}")
        if self.mode == "off" and self.block_tokens is not None:
            raise ConfigError("--prefix-block: not with --prefix-cache off (there is no prefix "
                              "cache to size)")
        evictions.get(self.eviction)

    def resolved(self, lower: str | None) -> str:
        """The mode on a chip whose lower tier is `lower` (None: it has none)."""
        if self.mode is None:
            return "tiered" if lower else HBM
        if self.mode == "tiered" and not lower:
            raise ConfigError("--prefix-cache tiered: the chip has no tier below HBM")
        return self.mode


def block_hashes(content: tuple, tokens: int, block_tokens: int, root: int = 0,
                 memo: dict | None = None) -> list[int]:
    """Hashes of the full blocks among the first `tokens` tokens of `content` ((id, tokens)
    chunks): block k's hash covers block k-1's hash and the (id, start, end) pieces of block k;
    block 0's covers `root` (the model that computed the KV: a CoE expert's index). Tuples of
    ints hash the same in every process. `memo` (_CHAINS): chunk id -> the hashes a chunk
    ends behind a given prefix, kept across calls, so a request whose content extends an
    earlier one's (a session's next turn), or the same request in another run, hashes only
    its new chunks."""
    full = tokens // block_tokens
    out: list[int] = []
    state: tuple = (root, (), 0)  # the last full block's hash, the open block's pieces, fill
    for cid, n in content:
        if len(out) >= full:
            break
        if memo is None:
            hashes, state = _chunk(state, cid, n, block_tokens)
        else:
            seen = memo.get(cid)
            if seen is None:
                if len(memo) >= CHAINS_MOST:
                    memo.clear()
                seen = memo[cid] = {}
            got = seen.get((state, n, block_tokens))
            if got is None:
                got = seen[state, n, block_tokens] = _chunk(state, cid, n, block_tokens)
            hashes, state = got
        out += hashes
    del out[full:]
    return out


def _chunk(state: tuple, cid: int, n: int, block_tokens: int) -> tuple[tuple, tuple]:
    """The hashes of the blocks chunk `cid` of `n` tokens completes behind `state`, and the
    state after it."""
    h, piece, fill = state
    out = []
    off = 0
    if fill:  # the open block first
        off = min(n, block_tokens - fill)
        piece += (cid, 0, off)
        fill += off
        if fill == block_tokens:
            h = hash((h, *piece))
            out.append(h)
            piece, fill = (), 0
    for start in range(off, n - block_tokens + 1, block_tokens):  # blocks of this chunk alone
        h = hash((h, cid, start, start + block_tokens))
        out.append(h)
        off = start + block_tokens
    if off < n:
        piece += (cid, off, n)
        fill += n - off
    return tuple(out), (h, piece, fill)


@dataclass
class Claim:
    """What an admission found: tokens per tier and the copy seconds to HBM."""

    tokens: dict[str, int] = field(default_factory=dict)
    copy_s: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.tokens.values())


class _Dead:
    """Evictable blocks of one tier that no request can find any more, as one count: they only
    take room and a place in the eviction order (see Liveness). `key`: the hash of one such
    block where the policy keys each by its hash (while it moves between tiers)."""

    __slots__ = ("blocks", "key")

    def __init__(self, blocks: int = 0, key: int | None = None) -> None:
        self.blocks, self.key = blocks, key


class Liveness:
    """Which content other requests share and which a request yet to finish can still ask for,
    trace-wide (shared by the replicas' caches). A block covers chunks of content, and a request
    that finds it has those chunks too. So a request's blocks are its own (no other request can
    find them) from the first block covering a chunk no other request of the trace has, and a
    block can never be found again once every request with one of its chunks has finished.
    `content`: Trace.content (None: every request's tokens are its own, traces.Trace)."""

    def __init__(self, content: tuple | None):
        self.left: dict[int, int] | None = None  # chunk id -> requests holding it, unfinished
        self.shared: set[int] = set()  # chunk ids more than one request of the trace has
        if content is not None:
            self.left = {}
            for chunks in content:
                for cid in {c for c, _ in chunks}:
                    self.left[cid] = self.left.get(cid, 0) + 1
            self.shared = {cid for cid, n in self.left.items() if n > 1}

    def own_from(self, r: Request, block_tokens: int) -> int | None:
        """r's first block that no other request can have (None: every block may be shared)."""
        return self._first(r, block_tokens, lambda cid: cid not in self.shared)

    def dead_from(self, r: Request, block_tokens: int) -> int | None:
        """r's first block no request yet to finish can find (None: none)."""
        # _first calls `pick` only past its test that self.left is a dict (mypy does not
        # carry that narrowing into the lambda)
        return self._first(r, block_tokens,
                           lambda cid: cid not in self.left)  # type: ignore[operator]

    def _first(self, r: Request, block_tokens: int, pick) -> int | None:
        if not r.content:  # its own chunk (own_chunk): no other request has it
            return 0
        if self.left is None:
            return None
        off = 0
        for cid, n in r.content:
            if pick(cid):
                return off // block_tokens
            off += n
        return None

    def finish(self, r: Request) -> None:
        """r finished: it asks for nothing more."""
        if self.left is None or not r.content:
            return
        for cid in {c for c, _ in r.content}:
            left = self.left[cid] - 1
            if left:
                self.left[cid] = left
            else:
                del self.left[cid]


class _Run:
    """Findable blocks one after another in a chain (blocks i..j of the requests that have
    them), in one tier, with the same number of users: a node of the cache's radix tree, found
    by the hash of its first block. An evictable run (no users) is one key of its tier's order
    where the policy orders by insertion alone: its blocks leave deepest first."""

    __slots__ = ("hashes", "tier", "users")

    def __init__(self, hashes: list[int], users: int, tier: str) -> None:
        self.hashes, self.users, self.tier = hashes, users, tier


def _common(run: list[int], hashes: list[int], i: int, n: int) -> int:
    """How many of run's first n blocks are hashes[i:]'s, given that the first is and the n-th
    is not: a block's hash covers the blocks before it (a chain), so they agree up to a point."""
    lo, hi = 1, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if run[mid - 1] == hashes[i + mid - 1]:
            lo = mid
        else:
            hi = mid
    return lo


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


class _Tree:
    """The findable blocks as a radix tree of runs (_Run), each found by its first block's
    hash: a request's cached blocks are a path of runs from the root (its block 0)."""

    def __init__(self) -> None:
        self.heads: dict[int, _Run] = {}  # a run by its first block's hash
        self.version = 0  # bumped whenever the findable blocks change (peek's memo)

    def path(self, hashes: list[int], i: int, end: int) -> list[tuple[_Run, int]]:
        """The runs holding blocks i.. of a request (`hashes`) up to `end`, while they are
        findable: (run, k), run's first k blocks being the request's next k. Block i is a
        run's first or not findable (the runs holding the blocks before it end there)."""
        heads, out = self.heads, []
        while i < end:
            run = heads.get(hashes[i])
            if run is None:
                break
            got = run.hashes
            k = len(got)
            if k > 1:
                k = min(k, end - i)
                if got[k - 1] != hashes[i + k - 1]:  # the request goes another way in the run
                    k = _common(got, hashes, i, k)
            out.append((run, k))
            i += k
        return out

    def grow(self, hashes: list[int], users: int, tier: str) -> _Run:
        """New findable blocks, a run."""
        run = self.heads[hashes[0]] = _Run(hashes, users, tier)
        self.version += 1
        return run

    def split(self, run: _Run, k: int) -> _Run:
        """Run's first k blocks as a run of their own (returned); `run` keeps the rest, and its
        place in its tier's order."""
        head = self.heads[run.hashes[0]] = _Run(run.hashes[:k], run.users, run.tier)
        run.hashes = run.hashes[k:]
        self.heads[run.hashes[0]] = run
        return head

    def cut(self, run: _Run, n: int) -> _Run:
        """Run's deepest n blocks as a run of their own (returned): they leave run's tier."""
        part = self.heads[run.hashes[-n]] = _Run(run.hashes[-n:], run.users, run.tier)
        del run.hashes[-n:]
        return part

    def forget(self, runs: list) -> None:
        """Runs (and _Dead counts, skipped) are not found any more."""
        for run in runs:
            if type(run) is _Run:
                del self.heads[run.hashes[0]]
                self.version += 1

    @property
    def entries(self) -> dict[int, int]:
        """The findable blocks: hash -> requests using it (built on demand)."""
        return {h: run.users for run in self.heads.values() for h in run.hashes}

    def blocks(self, tier: str) -> int:
        return sum(len(run.hashes) for run in self.heads.values() if run.tier == tier)


class _Tiers:
    """Each tier's evictable blocks in eviction order (a policy from engine/evictions per tier)
    and counts: findable runs of `tree`, and dead blocks (_Dead). Where the policy orders by
    insertion alone (`runs`) one key stands for a run, findable or dead; else each block is its
    own key, its hash (an evictable _Run is then one block)."""

    def __init__(self, eviction: str, tree: _Tree, lower: str | None, lower_blocks: int):
        self.tree, self.lower, self.lower_blocks = tree, lower, lower_blocks
        tiers = (HBM, lower) if lower else (HBM,)
        self.evictable = {t: evictions.get(eviction) for t in tiers}
        self.runs = self.evictable[HBM].insertion_ordered
        self.dead_keys: dict[str, set] = {t: set() for t in tiers}  # else: dead blocks' hashes
        self.size = dict.fromkeys(tiers, 0)  # evictable blocks per tier
        self.dead = dict.fromkeys(tiers, 0)  # of which no request can find
        self.tail: dict[str, _Dead | None] = dict.fromkeys(tiers)  # the last key, if dead

    def add(self, tier: str, runs: list[_Run]) -> None:
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
                        self.tree.heads[h] = _Run([h], 0, tier)
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
                run = self.tail[tier] = _Dead()
                self.evictable[tier].add([run])
            run.blocks += n
        self.size[tier] += n
        self.dead[tier] += n

    def evict(self, tier: str, n: int) -> list:
        """The tier's next n evictable blocks leave it, in eviction order: returned as _Runs
        (findable blocks, still found) and _Dead counts (dead blocks)."""
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
            if type(key) is _Dead:
                take = min(n, key.blocks)
                key.blocks -= take
                self.dead[tier] -= take
                out.append(_Dead(take))
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
                out.append(_Dead(1, key))
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
        """Blocks (one-block _Runs and _Dead(1, hash)) join the tier's order last, in order,
        where the policy keys blocks."""
        keys = []
        for run in runs:
            if type(run) is _Run:
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
            len(run.hashes) if type(run) is _Run else run.blocks for run in runs)
        if over > 0 and self.size[low]:
            evicted = min(over, self.size[low])
            self.tree.forget(self.evict(low, evicted))
            over -= evicted
        i = 0
        while over > 0:  # arrivals that the next arrivals evict at once
            run = runs[i]
            if type(run) is _Run:
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
            if type(run) is _Run:
                run.tier = low
                self.add(low, [run])
            else:
                self.add_dead(low, run.blocks, [] if run.key is None else [run.key])


class PrefixCache:
    """One replica's cache. `lower`: the tier below HBM (None under `hbm`); `lower_blocks`: its
    capacity in blocks; `copy_s_per_block`: seconds to bring one block up from it;
    `kv_block_tokens`: tokens per KV-manager block (HBM room is counted in those); `live`: what
    requests yet to finish can ask for (None: anything, every block kept findable).

    The work is per run of blocks, not per block: the findable blocks are a radix tree of runs
    (_Tree), a request's cached blocks a path of runs, and where the policy orders by insertion
    alone an evictable run is one key of its tier's order (_Tiers). A running request's own
    blocks are a count (entries only once it leaves unfinished), and blocks no request can find
    again one evictable count per run of the order (_Dead), so the cache's size follows the
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
        self.tree = _Tree()
        self.tiers = _Tiers(eviction, self.tree, lower, lower_blocks)
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
            memo = _CHAINS if r.content and self.live is not None else None
            # KV is the model's: under CoE each expert's blocks are its own
            s.hashes = block_hashes(content, r.prompt_len + r.output_len, self.block_tokens,
                                    root=r.expert + 2, memo=memo)
        return s.hashes

    def _findable(self, s: _Seq) -> int:
        """r's blocks that can have entries: its own ones only once it left unfinished."""
        return s.blocks if s.loose else s.own

    # -- lookups --------------------------------------------------------------------------
    def _found(self, r: Request, s: _Seq) -> list[tuple[_Run, int]]:
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

    def _use(self, path: list[tuple[_Run, int]]) -> int:
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
        self.tiers = _Tiers(self.eviction, self.tree, self.lower, self.lower_blocks)
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
