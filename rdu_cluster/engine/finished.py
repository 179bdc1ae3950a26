"""The requests table written as requests finish, so serving memory follows the requests in
flight rather than the trace.

A request is recorded once, when it is through (done, or refused): its row
(metrics.request_row), and, if it completed, its chunk times (the steps that streamed it a
token), after which its emission runs and energy totals are dropped. The table's order is the
trace's (request id); requests finish out of order, so rows wait in a buffer keyed by id until
every earlier request is recorded, then go on as the contiguous prefix (the buffer holds at most
the requests that finished while an earlier one was still in flight). Rows handed on go to the
recorder's sink in chunks of its chunk_rows (as the steps and sockets rows do), or are kept for
one table at the end when there is no sink. What the run's summary reads is kept compact: a few
numeric columns of the requests table, the chunk times and ITLs (the exact vLLM-style
percentiles need every ITL: engine/spill.py holds them in a bounded buffer, then a temporary
file), and the prefix cache's running totals.
"""

from __future__ import annotations

import array
import copy
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from rdu_cluster.engine import metrics, spill
from rdu_cluster.engine.requests import DONE, UNSERVED, Request

# The requests table's columns the run's summary reads (engine/summary.py: summary, measured).
SUMMARY_COLUMNS = ("state", "arrival_s", "queue_s", "ttft_s", "tpot_s", "e2e_s",
                   "generated_tokens", "prompt_len", "preemptions", "switch_wait_s")


class Finished:
    def __init__(self, rec: metrics.Recorder):
        self.rec = rec
        self.live: dict[int, tuple[Request, int]] = {}  # id -> (request, replica): arrived
        self.next = 0  # the lowest request id not handed on
        self.held: dict[int, tuple] = {}  # id -> what add() recorded, until its turn
        self.rows: list[tuple] = []  # rows handed on, not in a chunk yet
        self.kept: list[dict[str, np.ndarray]] = []  # SUMMARY_COLUMNS of each chunk
        # 8 bytes a token each, the run's largest figure: out of memory past spill.SPILL_VALUES
        self.chunk_s = spill.Spill()
        # None: a summary-only run's (Simulation.start), whose readers take no ITL statistic
        # (bench.Measured.lean)
        self.itl_s: spill.Spill | None = spill.Spill()
        self.chunks = array.array("q")  # chunks of each completed request, in id order
        self.admitted = 0  # prompt tokens admitted (prefix_cache.cache.summary's totals)
        self.swaps = 0  # swap preemptions of the requests recorded (the summary's)
        self.prefix_tokens: dict[str, int] = {}
        self.prefix_copy_s = 0  # summed in id order, as a sum over the requests would be
        self.trim_at = 0  # the count at which the step times no one reads are dropped next
        # called with each request completed and its row (engine/decided.py: a run that stops
        # once its verdict is certain)
        self.watch: Callable[[Request, tuple], None] | None = None

    def __deepcopy__(self, memo: dict) -> Finished:
        """A copy (engine/checkpoint.py) whose rows handed on are the original's: each is a
        tuple of numbers and strings, which nothing changes, and a summary-only run holds
        every request's until its end (question 2 of bench_capacity.py: 29,000 at a
        16,000-request checkpoint, most of the copy's time); the list is its own."""
        out = Finished.__new__(Finished)
        memo[id(self)] = out
        out.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items()
                             if k != "rows"})
        out.rows = list(self.rows)
        return out

    @property
    def count(self) -> int:
        return self.next + len(self.held)

    def recorded(self, r: Request) -> bool:
        return r.id < self.next or r.id in self.held

    def arrived(self, r: Request, replica: int) -> None:
        self.live[r.id] = (r, replica)

    def add(self, r: Request) -> None:
        """Record a request that is through (or, at the end of the run, where it stands)."""
        if self.recorded(r):
            return
        row = metrics.request_row(r, self.live.pop(r.id)[1], self.rec)
        if self.watch is not None and r.state == DONE:
            self.watch(r, row)
        self.swaps += r.swaps
        chunks = self._chunks(r) if r.state == DONE else None
        self.held[r.id] = (row, chunks, r.admitted_tokens, r.prefix_tokens, r.prefix_copy_s)
        r.emits = []  # its chunk times are recorded
        self._release()
        if self.count >= self.trim_at:
            self._trim()

    def _chunks(self, r: Request) -> np.ndarray:
        """Its chunk times: the end of each step that streamed it a token (bench.py), in the
        order of its emission runs (Request.emits: a prefill's step, or decode steps)."""
        parts = [self.rec.ends[q].values(-1 - a, 1) if a < 0
                 else self.rec.decode_ends[q].values(a, n) for q, a, n in r.emits]
        if not parts:
            return np.zeros(0)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _trim(self) -> None:
        """Drop the step times no request yet to be recorded reads: a live request reads its
        replica's steps from its admission on (request_row) and its chunks' (emits, each
        run with its replica), one yet to arrive only steps not planned yet. Run each time
        as many requests as are live have been recorded since (O(1) a request)."""
        ends, decode_ends = self.rec.ends, self.rec.decode_ends
        firsts = {rep: [len(ends[rep]), len(decode_ends[rep])] for rep in ends}
        for r, rep in self.live.values():
            for step in (r.admit_step, r.first_token_step):
                if 0 <= step < firsts.get(rep, (-1,))[0]:
                    firsts[rep][0] = step
            # Its first run of each kind, a prefill's step and decode steps (runs go on in
            # order; a request runs on one replica, and a run elsewhere before what is kept
            # would be refused by Growing.values): most often its first two.
            seen = [False, False]
            for erep, first, _n in r.emits:
                kind = 0 if first < 0 else 1
                if not seen[kind]:
                    seen[kind] = True
                    kept = firsts.get(erep)
                    if kept is not None:
                        kept[kind] = min(kept[kind], -1 - first if first < 0 else first)
                    if seen[1 - kind]:
                        break
            if r.decoding_since >= 0 and not seen[1] and rep in firsts:  # its run, still open
                firsts[rep][1] = min(firsts[rep][1], r.decoding_since)
        for rep, (step, decode_step) in firsts.items():
            self.rec.drop_steps_before(rep, step, decode_step)
        self.trim_at = self.count + max(32, len(self.live))

    def _release(self) -> None:
        while self.next in self.held:
            row, chunks, admitted, tokens, copy_s = self.held.pop(self.next)
            self.rows.append(row)
            if chunks is not None:
                self.chunks.append(len(chunks))
                self.chunk_s.extend(chunks)
                if self.itl_s is not None:
                    self.itl_s.extend(np.diff(chunks))
            self.admitted += admitted
            for tier, k in tokens.items():
                self.prefix_tokens[tier] = self.prefix_tokens.get(tier, 0) + k
            self.prefix_copy_s += copy_s
            self.next += 1
        if self.rec.sink is not None and len(self.rows) >= self.rec.chunk_rows:
            self.rec.send("requests", self._chunk(self.rec.meta))

    def _chunk(self, meta: dict) -> pa.Table:
        """The rows handed on so far as a table, their summary columns kept."""
        rows, self.rows = self.rows, []
        cols = (dict(zip(metrics.REQUEST_FIELDS, map(list, zip(*rows)))) if rows
                else {name: [] for name in metrics.REQUEST_FIELDS})
        if rows:
            self.kept.append({k: _compact(cols[k], metrics.REQUESTS.field(k).type)
                              for k in SUMMARY_COLUMNS})
        return metrics.table(metrics.REQUESTS, cols, meta)

    def close(self, meta: dict) -> pa.Table | None:
        """Record the requests not through (as they stand) and hand on the last rows: to the
        sink (returns None), or as the whole table."""
        stuck = [r for r, _ in self.live.values() if r.state not in (DONE, UNSERVED)]
        if stuck:
            # Every request that arrives is served or refused with a reason by the run's end; one
            # left waiting or running means a policy stalled (static batching once left every
            # prompt past the token budget waiting under --chunked-prefill): its rows would read
            # as neither served nor failed.
            r = min(stuck, key=lambda q: q.id)
            raise RuntimeError(f"{len(stuck)} requests neither completed nor refused at the end "
                               f"of the run (request {r.id} was {r.state}): a scheduler stalled")
        for i in sorted(self.live):
            self.add(self.live[i][0])
        if self.rec.sink is None:
            return self._chunk(meta)
        if self.rows or "requests" not in self.rec.sent:
            self.rec.send("requests", self._chunk(self.rec.meta))
        return None

    def drop(self) -> None:
        """Let the chunk times and ITLs go (their files with them), once the summary is read."""
        self.chunk_s.close()
        if self.itl_s is not None:
            self.itl_s.close()

    def summary_columns(self) -> dict[str, np.ndarray]:
        """SUMMARY_COLUMNS over every request, in id order (float columns: NaN for null)."""
        if not self.kept:
            return {k: _compact([], metrics.REQUESTS.field(k).type) for k in SUMMARY_COLUMNS}
        return {k: np.concatenate([c[k] for c in self.kept]) for k in SUMMARY_COLUMNS}


def _compact(values: list, kind: pa.DataType) -> np.ndarray:
    """A column as one numpy array of its field's kind (float: NaN for null)."""
    if pa.types.is_string(kind):
        return np.array(values, dtype=str)
    if pa.types.is_integer(kind):
        return np.array(values, dtype=np.int64)
    return np.array([np.nan if v is None else v for v in values], dtype=float)
