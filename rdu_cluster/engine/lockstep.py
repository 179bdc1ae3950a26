"""The sequences a lockstep policy decodes, in aggregate: what a decode span needs of its batch
without a pass over it.

Under a lockstep policy (schedulers.Scheduler.lockstep) with one token a step (no speculation),
every decoding sequence writes one token at every decode step of its replica. A sequence that
started decoding at decode step `since` with `c0` cached tokens holds c0 + (D - since) at decode
step D, so three figures stay fixed while it decodes, and the batch's are sums of them:

- its offset c0 - since: the batch's context sum at D is the offsets' sum plus D times the batch;
- its completion step since + (output_len - generated): the batch's least remaining output is
  the least of these (a heap) less D;
- its phase (c0 - since) mod block_tokens: it holds the blocks of its cached tokens
  (KVManager.grow), so it takes a block exactly at the decode steps D with D + phase a multiple
  of the block size; a span's KV growth follows from how many sequences have each phase.

A sequence that holds blocks beyond its cached tokens (static batching reserves its output; a
disaggregated hand-over's last block) is kept apart, with its own (cached, held), until the step
at which it writes into a block it does not hold; from then on it has a phase like the others.
A decoding sequence's own counts are not moved step by step either: its `cached` and
`generated` stand at its Request.synced_at, and the decode steps since are added where they are
read (`bring`): as it stops decoding, before a policy reads them (schedulers.View.fresh), and for
those that complete in a span, found from the heap of completion steps (`due`).

The replica's KVManager counts the blocks in aggregate (`used`); a sequence's own entry is
brought up to date when it stops decoding, and where the sockets' KV regions follow the growth
as a window ends (KVManager.blocks reads it between).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from rdu_cluster.engine.requests import Request


def bring(r: Request, at: int) -> None:
    """A lockstep decode's counts brought to decode step `at`: one token a step since
    Request.synced_at."""
    k = at - r.synced_at
    if k:
        r.cached += k
        r.generated += k
        r.synced_at = at


def bring_all(running: Iterable[Request], at: int) -> None:
    """`bring` every decoding sequence of `running` to `at`."""
    for r in running:  # bring, inline: a pass over the batch
        k = at - r.synced_at
        if k and r.synced_at >= 0:
            r.cached += k
            r.generated += k
            r.synced_at = at


class Lockstep:
    def __init__(self, block_tokens: int):
        self.bt = block_tokens
        self.count = 0
        self.offsets = 0  # sum of c0 - since
        self.phases = [0] * block_tokens  # sequences per phase, those kept apart not counted
        # id -> (the decode step it first takes a block, phase, c0 - since, blocks held)
        self.apart: dict[int, tuple[int, int, int, int]] = {}
        self.runs: dict[int, int] = {}  # id -> its run (a heap entry is live where it matches)
        self.ends: list[tuple[int, int, Request]] = []  # (completion step, run, request)
        self.run = 0

    def join(self, r: Request, since: int, held: int) -> None:
        """r decodes from decode step `since`, holding `held` blocks."""
        off = r.cached - since
        phase = off % self.bt
        self.count += 1
        self.offsets += off
        if held > -(-r.cached // self.bt):
            self.apart[r.id] = (since + held * self.bt - r.cached, phase, off, held)
        else:
            self.phases[phase] += 1
        r.synced_at = since
        self.run += 1
        self.runs[r.id] = self.run
        heapq.heappush(self.ends, (since + r.output_len - r.generated, self.run, r))

    def due(self, at: int, decode: Sequence[Request]) -> list[Request]:
        """The sequences of the batch that complete by decode step `at` (their last token
        sampled at its step at - 1), in the order of `decode`, their counts brought to `at`."""
        ends, runs, out = self.ends, self.runs, []
        while ends and ends[0][0] <= at:
            _, run, r = heapq.heappop(ends)
            if runs.get(r.id) == run:
                bring(r, at)
                out.append(r)
        if len(out) > 1:  # ties: in the batch's order, as a pass over it meets them
            out.sort(key=decode.index)
        return out

    def leave(self, r: Request, at: int) -> None:
        """r stops decoding at decode step `at` (its counts brought there)."""
        bring(r, at)
        r.synced_at = -1
        off = r.cached - at
        self.count -= 1
        self.offsets -= off
        del self.runs[r.id]
        if self.apart.pop(r.id, None) is None:
            self.phases[off % self.bt] -= 1

    def context(self, at: int) -> int:
        """The batch's cached tokens at decode step `at`."""
        return self.offsets + self.count * at

    def least_remaining(self, at: int) -> int:
        """The fewest decode steps after `at` before a sequence of the batch completes."""
        ends, runs = self.ends, self.runs
        while runs.get(ends[0][2].id) != ends[0][1]:
            heapq.heappop(ends)
        return ends[0][0] - at

    def growth(self, at: int, n: int) -> int:
        """Blocks the batch takes in decode steps at .. at + n - 1."""
        bt, phases = self.bt, self.phases
        out = n // bt * (self.count - len(self.apart))  # each counted by phase, once a cycle
        r = n % bt
        if r:  # steps at .. at + r - 1 take phases s, s - 1, ... (mod bt): at most two slices
            s = -at % bt
            out += (sum(phases[s - r + 1 : s + 1]) if r <= s + 1
                    else sum(phases[: s + 1]) + sum(phases[bt - (r - s - 1) :]))
        for need, phase, _, _ in self.apart.values():
            lo = max(at, need)
            if lo < at + n:  # steps lo <= D < at + n with D + phase a multiple of bt
                out += (at + n - 1 + phase) // bt - (lo - 1 + phase) // bt
        return out

    def settle(self, at: int) -> None:
        """Sequences kept apart that took their first block before decode step `at` now hold
        the blocks of their cached tokens."""
        for rid in [rid for rid, kept in self.apart.items() if kept[0] < at]:
            self.phases[self.apart.pop(rid)[1]] += 1

    def at_open(self, at: int) -> tuple[list[int], list[int], tuple[int, ...]]:
        """(cached, held) of those kept apart, and the phase counts, as a span opens at `at`
        (replica._kv_per_step)."""
        cached = [off + at for _, _, off, _ in self.apart.values()]
        held = [h for _, _, _, h in self.apart.values()]
        return cached, held, tuple(self.phases)
