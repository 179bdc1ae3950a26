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

A module per concept, each importing at run time only those before it here: config
(PrefixConfig, the modes, HBM's tier name, the finest block), hashing (block_hashes: the blocks'
chained hashes, memoized per chunk for the process), liveness (Liveness: which content other
requests share and which a request yet to finish can still ask for), tree (the radix tree of
runs: Run, Tree), tiers (each tier's evictable blocks in eviction order, dead blocks as counts,
demotion: Tiers, Dead), cache (one replica's cache: PrefixCache, Claim; a copy's exposed step
time, build, summary). The package re-exports the names imported elsewhere.
"""

from rdu_cluster.engine.prefix_cache.cache import Claim, PrefixCache, build, exposed, summary
from rdu_cluster.engine.prefix_cache.config import HBM, MODES, PrefixConfig
from rdu_cluster.engine.prefix_cache.hashing import block_hashes
from rdu_cluster.engine.prefix_cache.liveness import Liveness

__all__ = ["HBM", "MODES", "Claim", "Liveness", "PrefixCache", "PrefixConfig", "block_hashes",
           "build", "exposed", "summary"]
