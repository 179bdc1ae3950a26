"""The findable blocks as a radix tree of runs: Run (a chain's blocks i..j in one tier with the
same users), Tree (the runs by their first block's hash, a request's cached blocks a path of
them)."""

from __future__ import annotations


class Run:
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


class Tree:
    """The findable blocks as a radix tree of runs (Run), each found by its first block's
    hash: a request's cached blocks are a path of runs from the root (its block 0)."""

    def __init__(self) -> None:
        self.heads: dict[int, Run] = {}  # a run by its first block's hash
        self.version = 0  # bumped whenever the findable blocks change (peek's memo)

    def path(self, hashes: list[int], i: int, end: int) -> list[tuple[Run, int]]:
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

    def grow(self, hashes: list[int], users: int, tier: str) -> Run:
        """New findable blocks, a run."""
        run = self.heads[hashes[0]] = Run(hashes, users, tier)
        self.version += 1
        return run

    def split(self, run: Run, k: int) -> Run:
        """Run's first k blocks as a run of their own (returned); `run` keeps the rest, and its
        place in its tier's order."""
        head = self.heads[run.hashes[0]] = Run(run.hashes[:k], run.users, run.tier)
        run.hashes = run.hashes[k:]
        self.heads[run.hashes[0]] = run
        return head

    def cut(self, run: Run, n: int) -> Run:
        """Run's deepest n blocks as a run of their own (returned): they leave run's tier."""
        part = self.heads[run.hashes[-n]] = Run(run.hashes[-n:], run.users, run.tier)
        del run.hashes[-n:]
        return part

    def forget(self, runs: list) -> None:
        """Runs (and Dead counts, skipped) are not found any more."""
        for run in runs:
            if type(run) is Run:
                del self.heads[run.hashes[0]]
                self.version += 1

    @property
    def entries(self) -> dict[int, int]:
        """The findable blocks: hash -> requests using it (built on demand)."""
        return {h: run.users for run in self.heads.values() for h in run.hashes}

    def blocks(self, tier: str) -> int:
        return sum(len(run.hashes) for run in self.heads.values() if run.tier == tier)
