"""CostTables: the cost memo of a socket's program (chip/socket.py), pure functions of the
program, and the windows of spans it costs (Spans).

Decode cost tables. A decode step of batch b at contexts c_1..c_b is costed at the mean context
S / b, S = sum(c) (exact for every term linear in context: KV streaming and attention FLOPs of
full attention), interpolated linearly between the whole-token contexts S // b and S // b + 1
(exact for the same terms). A span adds one token to every sequence each step, so its steps
read consecutive whole-token contexts at one interpolation weight, (S % b) / b: a table of a
batch holds CHUNK + 1 consecutive whole-token contexts, ONE step_graph + step_cost evaluation
over an array of contexts, and serves CHUNK steps at that batch whatever the context sum a span
starts from. A lookup is then a slice and one blend. The value at (b, S) does not depend on
which span asked first, so results are the same in every backend and after a restart.

Per-step rows are ROWS = ("time_s", *CAUSES, "comm_bytes", "dynamic_j"): total time, its
partition by cause, the bytes this socket sends over its links in the step (not a time), and the
socket's dynamic energy in the step (not a time either): joules above idle draw, from the chip's
power model (chip/power.py), 0 when the chip has no [power] table. Idle draw is left to the
engine, which knows how long each socket is held (a step's slowest socket, swaps, copies).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chip import execution, power
from chip.cost import CAUSES, StepCost
from chip.loaded_steps import LoadedPrefills, LoadedSteps, keep
from chip.program import Program
from chip.spec import ChipSpec
from workloads import graph as graphs
from workloads import group_loads
from workloads.ops import Collective, Graph, Shard, StepShape, Work
from workloads.spec import part
from workloads.speculative import frontier, verify_tokens

CommTime = Callable[[Collective], Work]
ROWS = ("time_s", *CAUSES, "comm_bytes", "dynamic_j")
COMM_ROW = ROWS.index("communication")
SENT_ROW = ROWS.index("comm_bytes")
DYNAMIC_ROW = ROWS.index("dynamic_j")
# Whole-token mean contexts a decode table serves at its batch: CHUNK steps for one evaluation
# (the contexts of Llama 3.1 70B's 500 four-turn sessions, up to ~10k tokens, at 3 tables a
# batch; an evaluation of 4,097 points costs ~2.3x one of a point: ~1.4 against 0.6 ms)
CHUNK = 4096
# Token counts per prefill table: one evaluation of the execution model costs about as much
# for 64 token counts as for one (numpy over the counts), and a trace of varied prompt
# lengths would otherwise pay one evaluation per distinct length (benchmarks/bench_serve.py).
PREFILL_CHUNK = 64
# The tables a CostTables keeps, the oldest evicted first (pure caches: an evicted table is
# rebuilt with the same values). They would otherwise grow with the shapes a run visits, not
# with its requests in flight: chunked prefill's cached prefixes vary step to step, so its
# prefill tables (9 KB each) are mostly used once; a run visits a decode table (590 KB, and
# its time row as an array, 33 KB) for each batch it holds and CHUNK contexts its mean spans.
# A closed loop's decode pool holds every batch up to its max batch in turn (320 in the Llama
# 3.1 70B question of bench_capacity.py): 256 tables refilled 1,642 of its 3,410 fills (8.9 s
# of its ~90 s of CPU); 512 hold a program's decode tables at up to ~300 MB
# (local.SHARED_BYTES bounds the rest of the process's).
PREFILL_TABLES = 2048
DECODE_TABLES = 512
TIME_ROWS = 512
# A decode table is filled the second time it is asked for, or the first where a table of a
# batch within 4 of its own is held at the same contexts (a run whose batch stays near a level
# visits its neighbours); otherwise, the first time, its steps are evaluated as points (a
# window's together, not kept as a table). A run that changes its batch nearly every step
# (thousands of requests at once, or a closed loop's last window draining its batch a step or
# two at each batch) reads a step or two of each table, and one table costs ~2.3 point
# evaluations: 6,000 lognormal requests of Llama 3.1 8B at once, batch up to 2,048, took 2.28
# s of CPU filling every table asked for, 1.72 s so (1.62 s by context sum). The sessions
# question's dgx-h100:tp4 + sn40l-16:tp16 settle: 6.9 s filling every table, 7.9 s on the
# second ask alone, 7.0 s so. The execution model costs each point alone, bit for bit,
# whatever the batch and context of the points beside it (tests/engine/test_cost_window.py),
# so a step is the same however it was costed. ASKED: the tables asked for once, forgotten
# all at once past this many.
ASKED = 1 << 16
NEAR = tuple(d for d in range(-4, 5) if d)  # the batches next to b (_table)
GROUPED = 64  # spans in a window from which CostTables.window gathers by table, not by span
# Decode points kept (CostTables._decode_points), from evaluations of at most FEW_POINTS: a
# few hundred bytes each
POINTS, FEW_POINTS = 4096, 256

# Span kinds (a span is one row of the arrays in `Spans`).
DECODE, PREFILL, MIXED = 0, 1, 2


@dataclass(frozen=True)
class Spans:
    """A window of spans as columns. Decode spans: `batch` sequences, `steps` steps, context sum
    `ctx_sum` at the first step. Prefill spans (1 step): `pre_seqs` sequences bring `pre_tokens`
    new tokens on top of `pre_prefix` cached ones. Mixed (1 step): both parts in one step.
    `expert_load`: per step, this socket's routed-expert load / mean (empty: 1 everywhere)."""

    kind: np.ndarray
    steps: np.ndarray
    batch: np.ndarray
    ctx_sum: np.ndarray
    pre_seqs: np.ndarray
    pre_tokens: np.ndarray
    pre_prefix: np.ndarray
    expert_load: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def total_steps(self) -> int:
        return int(self.steps.sum())


def _chunk_counts(j: int) -> np.ndarray:
    """The token counts of prefill chunk j (count 0, never read, costed as 1)."""
    counts = np.arange(j * PREFILL_CHUNK, (j + 1) * PREFILL_CHUNK, dtype=np.int64)
    counts[counts < 1] = 1
    return counts


class CostTables:
    """The socket's cost memo: decode tables by batch size and context chunk, prefill tables by
    sequences, cached prefix and token chunk (each evaluated over its chunk at once)."""

    def __init__(self, chip: ChipSpec, program: Program, comm_time: CommTime):
        self.chip, self.program, self.comm_time = chip, program, comm_time
        self.decode: dict[tuple[int, int], np.ndarray] = {}
        # (k sequences, cached prefix, token chunk) -> prefill rows of PREFILL_CHUNK token counts
        self.prefill: dict[tuple[int, int, int], np.ndarray] = {}
        self.extra: dict[tuple[int, int, int], np.ndarray] = {}  # the same, of the draft, router
        # the time rows of those (step_times): a decode table's as an array('d'), which the
        # garbage collector does not walk (as lists, 2 million floats a capacity worker held
        # made each full collection ~90 ms), a prefill step's as a list of its one time
        self.times: dict[tuple, Any] = {}
        # (batch, whole-token context) -> the rows of a decode step evaluated as a point lately
        self.points: dict[tuple[int, int], np.ndarray] = {}
        self.asked: set[tuple[int, int]] = set()  # decode tables asked for once (ASKED)
        # steps under drawn expert loads (a mixed step's decodes route per_decode tokens each)
        self.per_decode = verify_tokens(program.spec_k, program.spec_tree) if program.spec_k else 1
        self.loaded = LoadedSteps(_load_support(program, self.per_decode))
        self.loaded_prefills = LoadedPrefills(_load_support(program))
        self.evaluations = 0

    def warm(self) -> None:
        """Import the execution model and cost one step (a process's first evaluation pays
        its module imports): called where a socket starts, so a run times only its steps."""
        self._rows(self.program.graph(StepShape.decode(1.0, 1.0)), 1)
        self.evaluations -= 1

    def window(self, spans: Spans) -> np.ndarray:
        """(ROWS, steps) rows of a window's spans (a decode pool's are decode spans only: no
        prefill shapes to fill, DECODE being 0)."""
        if not len(spans.expert_load):
            if spans.kind.any():
                self.fill_prefill(_prefill_shapes(spans))
            if len(spans.kind) >= GROUPED:
                return self._grouped(spans)
        parts, loads, start = [], spans.expert_load, 0
        for kind, n, batch, ctx_sum, shape in _listed(spans):
            load = loads[start : start + n] if len(loads) else None
            parts.append(self.span_rows(kind, batch, ctx_sum, n, shape, load))
            start += n
        if len(parts) == 1:  # (a span's rows can be a view of a table: the reply is a copy)
            return parts[0].copy()
        return np.concatenate(parts, axis=1) if parts else np.zeros((len(ROWS), 0))

    def _grouped(self, spans: Spans) -> np.ndarray:
        """`window` for a light-load window of hundreds of short spans: the decode steps
        gathered from their tables a table at a time (_steps), a mixed step's decode part with
        them, and the prefill parts a shape at a time, rather than numpy calls a span (the same
        table entries)."""
        steps = spans.steps.astype(np.int64)
        start = np.cumsum(steps) - steps
        out = np.empty((len(ROWS), int(steps.sum())))
        kind = spans.kind
        mixed = (kind == MIXED) & (steps == 1)
        d = np.flatnonzero((kind == DECODE) | mixed)
        if len(d):
            n = steps[d]
            b = np.repeat(spans.batch[d].astype(np.int64), n)
            k = np.arange(len(b)) - np.repeat(np.cumsum(n) - n, n)  # step within its span
            s = np.repeat(spans.ctx_sum[d].astype(np.int64), n) + b * k  # context sum
            out[:, np.repeat(start[d], n) + k] = self._steps(b, s)
        p = np.flatnonzero((kind == PREFILL) | mixed)  # one step each
        if len(p):
            shapes = np.stack([spans.pre_seqs[p], spans.pre_tokens[p], spans.pre_prefix[p]], 1)
            keys, inv = np.unique(shapes.astype(np.int64), axis=0, return_inverse=True)
            for u, (q, t, x) in enumerate(keys.tolist()):
                i = p[inv.ravel() == u]
                pre = self.prefill_step(q, t, x, None)
                out[:, start[i[~mixed[i]]]] = pre
                # a mixed step: its prefill part plus its decode part, as span_rows adds them
                at = start[i[mixed[i]]]
                out[:, at] = pre + out[:, at]
        for i in np.flatnonzero((kind != DECODE) & (kind != PREFILL) & ~mixed).tolist():
            n_i = int(steps[i])
            out[:, start[i] : start[i] + n_i] = self.span(spans, i, n_i, None)
        return out

    def _steps(self, b: np.ndarray, s: np.ndarray) -> np.ndarray:
        """(ROWS, len(b)) decode steps of b[i] sequences at context sum s[i]: each between its
        whole-token contexts (_at), blended as decode_span blends a span's."""
        c, r = np.divmod(s, b)
        part = np.flatnonzero(r)
        rows = self._at(np.concatenate([b, b[part]]), np.concatenate([c, c[part] + 1]))
        lo = rows[:, : len(b)]
        hi = lo.copy()
        hi[:, part] = rows[:, len(b) :]
        return _lerp(lo, hi, r / b)

    def _at(self, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        """(ROWS, len(b)) decode steps of b[i] sequences at whole-token mean context c[i], a
        table at a time: from the table where it is held or filled (_table), the rest as the
        points of one evaluation (_decode_points)."""
        out = np.empty((len(ROWS), len(b)))
        key = b * (1 << 32) + c // CHUNK
        order = np.argsort(key, kind="stable")
        edges = np.flatnonzero(np.diff(key[order])) + 1
        points = []
        for lo, hi in zip([0, *edges.tolist()], [*edges.tolist(), len(key)]):
            at = order[lo:hi]
            kb, kj = divmod(int(key[at[0]]), 1 << 32)
            table = self._table(kb, kj, c[at])
            if table is None:
                points.append(at)
            else:
                out[:, at] = table[:, c[at] - kj * CHUNK]
        if points:
            i = np.concatenate(points)
            out[:, i] = self._decode_points(b[i], c[i])
        return out

    def span(self, s: Spans, i: int, n: int, load: np.ndarray | None) -> np.ndarray:
        return self.span_rows(int(s.kind[i]), int(s.batch[i]), int(s.ctx_sum[i]), n,
                              (int(s.pre_seqs[i]), int(s.pre_tokens[i]), int(s.pre_prefix[i])),
                              load)

    def span_rows(self, kind: int, batch: int, ctx_sum: int, n: int,
                  prefill: tuple[int, int, int], load: np.ndarray | None = None) -> np.ndarray:
        """(ROWS, n) rows of one span: `batch` decodes from context sum `ctx_sum`, or one
        prefill step of `prefill` = (sequences, new tokens, cached prefix), or both."""
        if kind == DECODE:
            return self.decode_span(batch, ctx_sum, n, load)
        pre = self.prefill_step(*prefill, load, batch)
        if kind == PREFILL:
            return pre
        # A mixed step (chunked prefill beside decodes) is costed as its prefill part plus its
        # decode part: an upper bound, since one fused step streams the weights only once.
        return pre + self.decode_span(batch, ctx_sum, 1, load)

    def step_times(self, kind: int, batch: int, ctx_sum: int, n: int,
                   prefill: tuple[int, int, int]) -> list[float]:
        """The time row of span_rows as a list: the same floats, without a numpy call when
        the span lies in one decode table or is a prefill step (a light-load span timed as it
        is planned, lookahead.Clock)."""
        if kind == DECODE:
            c0, r = divmod(ctx_sum, batch)
            m = n + (r > 0)
            j = c0 // CHUNK
            if (c0 + m - 1) // CHUNK == j:
                times = self.times.get((batch, j))
                if times is None:
                    table = self._table(batch, j, range(c0, c0 + m))
                    if table is not None:
                        times = keep(self.times, (batch, j), array("d", table[0].tobytes()),
                                      TIME_ROWS)
                if times is not None:
                    lo = c0 - j * CHUNK
                    if not r:
                        return times[lo : lo + n].tolist()
                    w = r / batch  # _lerp over floats, without numpy calls
                    return [x + (y - x) * w for x, y in zip(times[lo : lo + n],
                                                            times[lo + 1 : lo + m])]
                return _blend(self._decode_points(np.full(m, batch), np.arange(c0, c0 + m)),
                              r / batch)[0].tolist()
        elif kind == PREFILL:
            times = self.times.get(prefill)
            if times is None:
                times = keep(self.times, prefill, self.prefill_step(*prefill, None)[0]
                              .tolist(), TIME_ROWS)
            return times
        return self.span_rows(kind, batch, ctx_sum, n, prefill)[0].tolist()

    def windows(self, spans: Spans, loads: list[np.ndarray]) -> list[np.ndarray]:
        """`window` of `spans` under each of `loads` (per step, one socket's expert load each):
        the decode steps of all the loads, of all the window's spans, from the entries of the
        steps under drawn loads (chip/loaded_steps.py: those it lacks in one evaluation, its
        points costing what they cost alone, bit for bit, whatever their batch and context:
        chip/dataflow.py, chip/tile_array.py), a prefill part's sockets in one (_prefills):
        the sockets of an expert-parallel group differ only in their loads."""
        outs: list[list[Any]] = [[None] * len(spans.kind) for _ in loads]  # socket, span
        drawn: list[tuple[int, tuple[int, int, int, int, np.ndarray]]] = []  # (span, its steps)
        mixed: set[int] = set()  # mixed steps, their prefill part in `outs` already
        start = 0
        for i in range(len(spans.kind)):
            n = int(spans.steps[i])
            part = [ld[start : start + n] for ld in loads]
            start += n
            kind = int(spans.kind[i])
            if kind != DECODE:  # a prefill or mixed step: its prefill part, every socket's
                pre = self._prefills((int(spans.pre_seqs[i]), int(spans.pre_tokens[i]),
                                      int(spans.pre_prefix[i])), [ld[0] for ld in part],
                                     int(spans.batch[i]))
                for out, rows in zip(outs, pre):
                    out[i] = rows
                if kind == PREFILL:
                    continue
                mixed.add(i)  # its decode part added below, as span_rows adds it
            b, s0 = int(spans.batch[i]), int(spans.ctx_sum[i])
            if not any(np.any(ld != 1.0) for ld in part):
                rows = self.decode_span(b, s0, n, None)  # every socket's (read, not written)
                for out in outs:
                    out[i] = rows if kind == DECODE else out[i] + rows
                continue
            # a socket at the mean load in every step is read with the drawn ones (bit for bit
            # its table's): alone, a fill more in 19% of an adp32ep32 pool's decode windows
            drawn.append((i, (b, *divmod(s0, b), n, np.stack(part))))
        got = self.loaded.rows([d for _, d in drawn], self._evaluate_points)
        for (i, _), rows in zip(drawn, got):
            for k, out in enumerate(outs):
                out[i] = out[i] + rows[k] if i in mixed else rows[k]
        return [np.concatenate(out, axis=1) if out else np.zeros((len(ROWS), 0))
                for out in outs]

    def decode_span(self, b: int, s0: int, n: int, load: np.ndarray | None) -> np.ndarray:
        """(ROWS, n) rows of n decode steps of b sequences from context sum s0: step k between
        the whole-token contexts c0 + k and c0 + k + 1 (c0 = s0 // b), weighted (s0 % b) / b;
        under per-step expert loads, the steps under drawn loads (chip/loaded_steps.py)."""
        c0, r = divmod(s0, b)
        if load is not None and np.any(load != 1.0):
            return self.loaded.rows([(b, c0, r, n, load[None, :])],
                                    self._evaluate_points)[0][0]
        m = n + (r > 0)
        j = c0 // CHUNK
        table = self.decode.get((b, j)) if (c0 + m - 1) // CHUNK == j else None
        if table is not None:  # the most frequent: a span within a held table
            lo = c0 - j * CHUNK
            return _blend(table[:, lo : lo + m], r / b)
        return _blend(self._at(np.full(m, b), np.arange(c0, c0 + m)), r / b)

    def _table(self, b: int, j: int, contexts: np.ndarray | range) -> np.ndarray | None:
        """Decode table j (whole-token contexts j CHUNK .. (j + 1) CHUNK) of batch b: held,
        or filled where it was asked for before (ASKED) or a batch within 4 of b holds its
        table j (a batch that stays near a level); None, the contexts asked then evaluated as
        points, the first time, and where the points kept hold every context asked (a span
        the clock timed, costed again by the window: not a second ask)."""
        table = self.decode.get((b, j))
        if table is not None:
            return table
        if len(contexts) <= FEW_POINTS and all((b, c) in self.points for c in (
                contexts.tolist() if isinstance(contexts, np.ndarray) else contexts)):
            return None
        if (b, j) not in self.asked and not any((b + d, j) in self.decode for d in NEAR):
            if len(self.asked) >= ASKED:
                self.asked.clear()
            self.asked.add((b, j))
            return None
        return self._fill(b, j)

    def _fill(self, b: int, j: int) -> np.ndarray:
        """Decode table j of batch b, evaluated unless held: CHUNK + 1 whole-token contexts
        (the last the next table's first: a step's upper neighbour in the same table)."""
        table = self.decode.get((b, j))
        if table is None:
            ctx = np.arange(j * CHUNK, (j + 1) * CHUNK + 1, dtype=float)
            table = keep(self.decode, (b, j), self._decode_rows(float(b), ctx, len(ctx)),
                          DECODE_TABLES)
        return table

    def _decode_points(self, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        """(ROWS, len(b)) decode steps of b[i] sequences at whole-token mean context c[i]: the
        values their tables hold, CHUNK points an evaluation at most. The points of a few
        steps are kept a while (POINTS): a span timed as it is planned (lookahead.Clock) is
        costed again by the sockets, step for step."""
        if len(b) > FEW_POINTS:
            return self._evaluate_points(b, c)
        keys = list(zip(b.tolist(), c.tolist()))
        got = {k: self.points[k] for k in keys if k in self.points}  # before new ones evict any
        new = [i for i, k in enumerate(keys) if k not in got]
        fresh = self._evaluate_points(b[new], c[new]).T.copy() if new else ()
        for i, col in zip(new, fresh):
            got[keys[i]] = keep(self.points, keys[i], col, POINTS)
        return np.stack([got[k] for k in keys], axis=1)

    def _evaluate_points(self, b: np.ndarray, c: np.ndarray,
                         load: np.ndarray | None = None) -> np.ndarray:
        """(ROWS, len(b)) decode steps of b[i] sequences at whole-token mean context c[i]
        (under expert load load[i]: chip/loaded_steps.py), CHUNK points an evaluation at most
        (the model's intermediate arrays of 32 sockets x 500 steps grew a capacity worker past
        1.8 GB); a chunk of loaded points of one batch at that batch (a point costs the same
        either way)."""
        rows = np.empty((len(ROWS), len(b)))
        for lo in range(0, len(b), CHUNK):
            at = slice(lo, lo + CHUNK)
            bb = b[at].astype(float)
            one = load is not None and bool(np.all(bb == bb[0]))
            rows[:, at] = self._decode_rows(float(bb[0]) if one else bb, c[at].astype(float),
                                            len(bb), 1.0 if load is None else load[at])
        return rows

    def _decode_rows(self, b: Work, ctx: np.ndarray, n: int, load: Work = 1.0) -> np.ndarray:
        """A decode step at mean context `ctx`. Speculative (spec_k = k): k draft steps at
        contexts ctx + d over the frontier's tokens (1 each for a chain; a tree's nodes of
        depth d), then the target verifies every drafted token plus the root in one pass. A
        socket runs the parts its `spec_part` names."""
        p = self.program
        if not p.spec_k:
            return self._rows(p.graph(StepShape.decode(_batch(b), ctx), load), n)
        rows = np.zeros((len(ROWS), n))
        if p.spec_part != "draft":
            tokens = float(verify_tokens(p.spec_k, p.spec_tree))
            rows += self._rows(p.graph(StepShape("decode", _batch(b), tokens, ctx), load), n)
        if p.spec_part != "verify":
            for d, width in enumerate(frontier(p.spec_k, p.spec_tree)):
                shape = StepShape("decode", _batch(b), float(width), ctx + d)
                rows += self._rows(p.draft_graph(shape), n)
        return rows

    def prefill_step(self, k: int, tokens: int, prefix: int, load: np.ndarray | None,
                     batch: int = 0):
        """One prefill step (beside `batch` decodes: a mixed step) of k sequences bringing
        `tokens` new tokens over `prefix` cached ones, costed at the means: column
        tokens % PREFILL_CHUNK of the (k, prefix) table of its chunk of token counts."""
        return self._prefills((k, tokens, prefix), [1.0 if load is None else load[0]], batch)[0]

    def _prefills(self, shape: tuple[int, int, int], loads: list, batch: int = 0) -> list:
        """prefill_step of `shape` = (k, tokens, prefix) under each socket's expert load: at
        a drawn one, the target's rows kept at every load the step's routing can give
        (chip/loaded_steps.py; one evaluation a step was ~80% of an adp16ep16 serve's CPU)
        plus the draft's and router's rows (which do not vary with the load); at the mean (a
        dense model's always), the table's column."""
        column = (self._prefill_column(self.prefill, self._prefill_rows, *shape)
                  if 1.0 in loads else None)
        if any(x != 1.0 for x in loads):  # (no numpy call in a dense run)
            k, tokens, prefix = shape
            step = StepShape("prefill", float(k), tokens / k, prefix / k)
            rows = self.loaded_prefills.rows(
                shape, np.array([x for x in loads if x != 1.0], dtype=float),
                batch * self.per_decode + tokens,
                lambda at: self._rows(self.program.graph(step, at), len(at)))
            rows += self._prefill_column(self.extra, self._extra_rows, k, tokens, prefix)
            drawn = iter(rows.T[:, :, None])
        return [column if x == 1.0 else next(drawn) for x in loads]

    def fill_prefill(self, shapes: Iterable[tuple[int, int, int]]) -> None:
        """Evaluate the missing prefill tables of these (sequences, tokens, prefix) shapes
        together: one evaluation a sequence count over all their token counts and prefixes
        (a window of chunked prefills brings hundreds of shapes, their cached prefixes all
        different). A table holds the same values however it was filled."""
        missing: dict[int, set] = {}
        for k, tokens, prefix in shapes:
            key = (k, prefix, tokens // PREFILL_CHUNK)
            if tokens >= 1 and key not in self.prefill:
                missing.setdefault(k, set()).add(key)
        for k, wanted in missing.items():
            keys = sorted(wanted)[-PREFILL_TABLES:]
            counts = np.concatenate([_chunk_counts(j) for _, _, j in keys])
            prefixes = np.repeat(np.array([x for _, x, _ in keys], dtype=np.int64), PREFILL_CHUNK)
            rows = self._prefill_rows(k, counts, prefixes)
            for i, key in enumerate(keys):
                keep(self.prefill, key, np.ascontiguousarray(
                    rows[:, i * PREFILL_CHUNK : (i + 1) * PREFILL_CHUNK]), PREFILL_TABLES)

    def _prefill_column(self, tables: dict, rows_of: Callable, k: int, tokens: int,
                        prefix: int) -> np.ndarray:
        """Column `tokens` of the (k, prefix) table of its chunk, evaluated on first use."""
        if tokens < 1:
            raise ValueError(f"a prefill step brings at least one token, got {tokens}")
        j = tokens // PREFILL_CHUNK
        table = tables.get((k, prefix, j))
        if table is None:
            table = keep(tables, (k, prefix, j), rows_of(k, _chunk_counts(j), prefix),
                          PREFILL_TABLES)
        col = tokens - j * PREFILL_CHUNK
        return table[:, col : col + 1]

    def _prefill_rows(self, k: int, tokens: np.ndarray, prefix: Work) -> np.ndarray:
        """Prefill steps of k sequences over `prefix` cached tokens, one a token count."""
        shape = StepShape("prefill", float(k), tokens / k, prefix / k)
        return (self._rows(self.program.graph(shape), len(tokens))
                + self._extra_rows(k, tokens, prefix))

    def _extra_rows(self, k: int, tokens: np.ndarray, prefix: Work) -> np.ndarray:
        """What else a prefill step runs besides the target: the draft prefills the prompt too
        (speculative decoding), the router routes the admitted prompts (CoE). Kept apart from
        the target, whose cost varies with the expert load."""
        p = self.program
        rows = np.zeros((len(ROWS), len(tokens)))
        if p.draft is not None:
            shape = StepShape("prefill", float(k), tokens / k, prefix / k)
            rows += self._rows(p.draft_graph(shape), len(tokens))
        if p.router is not None:
            rows += self._router_rows(k, tokens, prefix)
        return rows

    def _router_rows(self, k: int, tokens: np.ndarray, prefix: Work) -> np.ndarray:
        """CoE: the router's pass over the k sequences this step admits, one prefill of their
        new tokens and one decode step (the label), before their expert's prefill in the same
        step. A later chunk of a chunked prompt routes only its own tokens (the router's
        attention over the earlier chunks is left out: a small underestimate)."""
        p = self.program
        router = part(p.router, "CoE router")
        tp = Shard.tensor(p.shard.attn_tp)
        pre = graphs.step_graph(router, StepShape("prefill", float(k), tokens / k, 0.0), tp)
        label = graphs.step_graph(router, StepShape.decode(float(k), (tokens + prefix) / k), tp)
        return self._rows(pre, len(tokens)) + self._rows(label, len(tokens))

    def _rows(self, graph: Graph, n: int) -> np.ndarray:
        self.evaluations += 1
        cost: StepCost = execution.step_cost(
            graph, self.chip, self.comm_time, self.program.options, self.program.execution_model
        )
        rows = np.empty((len(ROWS), n))  # each row a scalar or n points (numpy broadcasts)
        rows[0] = cost.time_s
        for r, cause in enumerate(CAUSES, start=1):
            rows[r] = cost.cause(cause)
        rows[SENT_ROW] = sent_bytes(graph)
        rows[DYNAMIC_ROW] = dynamic_energy_j(cost, self.chip)
        return rows


def _prefill_shapes(s: Spans) -> Iterable[tuple[int, int, int]]:
    """(sequences, new tokens, cached prefix) of each span of the window that prefills."""
    pre = np.flatnonzero(s.kind != DECODE)
    return zip(s.pre_seqs[pre].tolist(), s.pre_tokens[pre].tolist(),
               s.pre_prefix[pre].tolist())


def _listed(s: Spans) -> Iterable[tuple[int, int, int, int, tuple[int, int, int]]]:
    """Each span's (kind, steps, batch, context sum, prefill shape) as Python ints: a window's
    few spans read as lists once, not as numpy scalars each."""
    return zip(s.kind.tolist(), s.steps.tolist(), s.batch.tolist(), s.ctx_sum.tolist(),
               zip(s.pre_seqs.tolist(), s.pre_tokens.tolist(), s.pre_prefix.tolist()))


def _load_support(program: Program, per: int = 1) -> Callable[[int], np.ndarray] | None:
    """The loads a step's expert groups can draw where it routes `per` tokens a unit (a decode
    step's sequence brings its speculative step's tokens; a prefill step's unit is a token):
    workloads/group_loads.py, the model's top-k assignments of each token over the program's
    expert groups; None without expert parallelism. A closure over the program's figures, not
    the CostTables (which would then hold itself)."""
    moe, ep = program.model.moe, program.shard.ep
    if moe is None or ep <= 1:
        return None
    return lambda units: group_loads.support(units * per, moe.top_k, ep)


def _lerp(lo: Any, hi: Any, w: Any) -> Any:
    """A decode step between the rows of its whole-token context and the next, at weight w:
    the one formula every path blends with (step_times writes it over floats), so a step is
    the same floats however it was costed."""
    return lo + (hi - lo) * w


def _blend(rows: np.ndarray, w: float) -> np.ndarray:
    """Decode steps from the rows of their consecutive whole-token contexts: each step between
    its context and the next, at weight w (the rows themselves at w = 0)."""
    return rows if not w else _lerp(rows[:, :-1], rows[:, 1:], w)


def _batch(b: Work) -> Work:
    """A decode shape's batch: a float, or one a point (CostTables._decode_points)."""
    return float(b) if np.ndim(b) == 0 else b


def dynamic_energy_j(cost: StepCost, chip: ChipSpec) -> Work:
    """Joules one socket draws above idle over the step: (socket_power_w - idle_w) * time_s
    (chip/power.py); 0 without a [power] table, and for a step of no time (no utilization)."""
    p = power.socket_power_w(cost, chip)
    t = np.asarray(cost.time_s, dtype=float)
    if p is None:
        return np.zeros_like(t)
    with np.errstate(divide="ignore", invalid="ignore"):
        dyn = (np.asarray(p, dtype=float) - power.idle_power_w(chip)) * t
    return np.where(t > 0, dyn, 0.0)


# Bytes a rank sends per payload byte, by collective, under ring algorithms (all-reduce:
# reduce-scatter + all-gather, 2(p-1)/p; all-gather, reduce-scatter, all-to-all: (p-1)/p).
def _send_factor(kind: str, p: int) -> float:
    if p <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (p - 1) / p
    if kind == "send_recv":
        return 1.0
    return (p - 1) / p


def sent_bytes(graph: Graph) -> Work:
    """Bytes one socket sends in a step, summed over the graph's collectives."""
    total: Work = 0.0
    for block, op in graph.ops():
        if op.comm is not None:
            c = op.comm
            total = total + block.repeat * _send_factor(c.kind.value, c.size) * np.asarray(c.bytes)
    return total
