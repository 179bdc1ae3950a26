"""A prefix-cache block's key: a hash chained over the token prefix the block ends
(block_hashes), memoized per chunk for the process (CHAINS)."""

from __future__ import annotations

# block_hashes' memo (chunk id -> the hashes a chunk ends behind a given prefix), one for the
# process: a chunk's hashes depend on the chunk id, its length and the prefix's state alone,
# so the runs of one trace (capacity's candidates, its searches' runs) hash each chunk once;
# 14% of the sessions question's CPU was hashing, each run again. Forgotten all at once past
# CHAINS_MOST chunks (about 1 KB each for a 2,048-token chunk of 16-token blocks).
CHAINS_MOST = 50_000
CHAINS: dict[int, dict] = {}


def block_hashes(content: tuple, tokens: int, block_tokens: int, root: int = 0,
                 memo: dict | None = None) -> list[int]:
    """Hashes of the full blocks among the first `tokens` tokens of `content` ((id, tokens)
    chunks): block k's hash covers block k-1's hash and the (id, start, end) pieces of block k;
    block 0's covers `root` (the model that computed the KV: a CoE expert's index). Tuples of
    ints hash the same in every process. `memo` (CHAINS): chunk id -> the hashes a chunk
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
