"""Serving metrics: per request, per step, per socket over time, per link; Arrow tables with
units in the column names and a schema version in their metadata.

Steps are recorded a window at a time as numpy columns (never a Python dict per step); request
times are resolved at the end from the step indices the engine recorded (admission, first token,
completion) and each replica's step start / end times. Energy and cost columns (energy_j,
cost_usd; null where the chip has no [power] or the cluster no [cost] table): engine/energy.py.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa

import rdu_cluster
from chip.cost import CAUSES
from rdu_cluster.engine.requests import Request

# 2: energy_j / cost_usd in requests, steps and sockets; steps.sockets
# 3: requests.prefill_replica, kv_transfer_s, kv_transfer_bytes (disaggregated serving)
# 4: prefix caching (requests: session, prefix_<tier>_tokens, prefix_copy_s; steps:
# prefix_hit_tokens, prefix_copy_s, prefix_exposed_s)
# 5: steps.prefetch_stall_s (the RDU's SRAM-bound prefetch stall, chip/tile_array.py)
SCHEMA_VERSION = "5"
PHASES = ("decode", "prefill", "mixed", "recovery")

REQUESTS = pa.schema([
    ("request_id", pa.int64()), ("replica", pa.int64()), ("model", pa.string()),
    ("state", pa.string()), ("arrival_s", pa.float64()), ("prompt_len", pa.int64()),
    ("output_len", pa.int64()), ("generated_tokens", pa.int64()), ("queue_s", pa.float64()),
    ("ttft_s", pa.float64()), ("tpot_s", pa.float64()), ("e2e_s", pa.float64()),
    ("finish_s", pa.float64()), ("preemptions", pa.int64()), ("swaps", pa.int64()),
    ("reason", pa.string()), ("expert", pa.int64()), ("switch_wait_s", pa.float64()),
    ("energy_j", pa.float64()), ("cost_usd", pa.float64()),
    # the replica that ran its prefill (itself when aggregated) and the KV hand-over to the
    # decode replica (0 when aggregated): engine/disagg/tables.py
    ("prefill_replica", pa.int64()), ("kv_transfer_s", pa.float64()),
    ("kv_transfer_bytes", pa.float64()),
    ("session", pa.int64()), ("prefix_hbm_tokens", pa.int64()),
    ("prefix_ddr_tokens", pa.int64()), ("prefix_host_tokens", pa.int64()),
    ("prefix_copy_s", pa.float64()),
])
PREFIX_TIERS = ("hbm", "ddr", "host")  # tiers a prefix cache block can be found in
REQUEST_FIELDS = tuple(REQUESTS.names)
STEPS = pa.schema(
    [("replica", pa.int64()), ("step", pa.int64()), ("window", pa.int64()),
     ("phase", pa.string()), ("start_s", pa.float64()), ("time_s", pa.float64()),
     ("batch", pa.int64()), ("prefill_tokens", pa.int64()), ("decode_tokens", pa.int64()),
     ("kv_used_bytes", pa.float64())]
    + [(f"{c}_s", pa.float64()) for c in CAUSES]
    + [("kv_swap_s", pa.float64()), ("expert_load_max", pa.float64()),
       ("straggler_socket", pa.int64()), ("straggler_s", pa.float64()),
       ("emitted_tokens", pa.int64()), ("expert", pa.int64()), ("switch_s", pa.float64()),
       ("sockets", pa.int64()), ("energy_j", pa.float64()), ("cost_usd", pa.float64()),
       ("prefix_hit_tokens", pa.int64()), ("prefix_copy_s", pa.float64()),
       ("prefix_exposed_s", pa.float64())]
)
TIERS = ("sram", "hbm", "ddr", "host")
SOCKETS = pa.schema(
    [("socket", pa.int64()), ("replica", pa.int64()), ("node", pa.int64()),
     ("window", pa.int64()), ("time_s", pa.float64()), ("window_s", pa.float64()),
     ("busy_s", pa.float64()), ("busy_fraction", pa.float64()), ("sent_bytes", pa.float64()),
     ("switches", pa.int64()), ("switch_s", pa.float64()), ("energy_j", pa.float64()),
     ("cost_usd", pa.float64())]
    + [(f"{t}_used_bytes", pa.float64()) for t in TIERS]
)
LINKS = pa.schema([
    ("src", pa.int64()), ("dst", pa.int64()), ("bytes", pa.float64()),
    ("bandwidth_bytes_per_s", pa.float64()), ("utilization", pa.float64()),
])


@dataclass
class StepColumns:
    """One window's steps, as columns (arrays of equal length)."""

    cols: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.cols["phase"])


# Streaming (Recorder.sink): rows go to the table writer in chunks of this many, and of the
# steps only the columns the run's summary reads are kept (summary.summary, energy.summary).
CHUNK_ROWS = 16_384
SUMMARY_STEP_COLUMNS = ("phase", "time_s", "sockets", "energy_j", "decode_tokens",
                        "emitted_tokens")
# A run whose summary is all that is read (Simulation.summary_only) keeps these of its steps:
# the summary's, and the start times the requests' chunk times are resolved from.
LEAN_STEP_COLUMNS = (*SUMMARY_STEP_COLUMNS, "start_s")
OCCUPANCY = {f"{t}_used_bytes": t for t in TIERS}
SOCKET_NULLABLE = ("energy_j", "cost_usd", *OCCUPANCY)  # None: no [power] / [cost], no tier
COMPACT_EVERY = 64  # windows' step arrays joined into one chunk (a window's are a few steps)
# The summary's step figures are summed over blocks of this many steps (step_totals), streamed
# or not, so a streamed run keeps at most one block's summary columns and gives the figures of
# an unstreamed one bit for bit. At most 10,000: above that OpenBLAS (numpy's) runs a dot
# product on its threads, which then spin for ~50 ms after each call, taking CPU from the run
# (measured: 60 calls on 16,384 values cost 3 s of CPU), and the sum's order would follow the
# thread count.
TOTALS_ROWS = 8192


class Growing:
    """A numeric column appended to as a run goes, in one numpy buffer that grows by `factor`
    when full (amortized O(1) per value, 8 bytes a value): a replica's step times. Values
    before `first` may be dropped (drop_before) once nothing reads them: index i of view() is
    value first + i, so a light-load run holds the steps of its requests in flight."""

    def __init__(self, dtype=np.float64, factor: float = 2.0) -> None:
        self.buf = np.empty(64, dtype=dtype)
        self.n = 0
        self.first = 0  # the index (over every value appended) of buf[0]
        self.factor = factor

    def __len__(self) -> int:
        return self.first + self.n

    def extend(self, values: np.ndarray) -> None:
        k = len(values)
        if self.n + k > len(self.buf):
            grown = np.empty(max(int(self.factor * len(self.buf)), self.n + k),
                             dtype=self.buf.dtype)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        self.buf[self.n : self.n + k] = values
        self.n += k

    def drop_before(self, index: int) -> None:
        """Forget the values before `index`, once they are at least half of the buffer (so
        the move costs O(1) a value), into a buffer sized to what is left."""
        k = min(index, len(self)) - self.first
        if k <= 0 or 2 * k < len(self.buf):
            return
        kept = self.buf[k : self.n]
        self.buf = np.empty(max(64, 2 * len(kept)), dtype=self.buf.dtype)
        self.buf[: len(kept)] = kept
        self.n, self.first = len(kept), self.first + k

    def view(self) -> np.ndarray:
        return self.buf[: self.n]

    def values(self, index: int, n: int) -> np.ndarray:
        """Values index .. index + n - 1 (a view); dropped ones are an error, never others'."""
        i = index - self.first
        if i < 0:
            raise RuntimeError(f"Growing.values: value {index} was dropped (first kept: "
                               f"{self.first})")
        return self.buf[i : i + n]


class SocketRows:
    """The sockets table's rows (one per socket per window), kept as typed arrays: 8 bytes a
    value, where a dict per row took ~1 kB, so a light-load trace (a window per arrival) does
    not grow by a dict per socket per window. A tier occupancy the backend fills in later (Ray:
    when the reply is collected, at most its queue length of windows later) is read as soon as
    it is ready, so only the unread ones are held."""

    def __init__(self) -> None:
        # int ("q") or float ("d") columns, as the schema types them
        self.cols: dict[str, array[Any]] = {
            f.name: array("q" if pa.types.is_integer(f.type) else "d") for f in SOCKETS}
        self.null = {name: array("b") for name in SOCKET_NULLABLE}
        self.pending: deque = deque()  # (row, occupancy) not read yet
        self.taken = 0  # rows handed on (take): row numbers count them

    def __len__(self) -> int:
        return self.taken + len(self.cols["socket"])

    def ready(self) -> int:
        """Rows held whose occupancies are all read (the first pending one's row onward are
        not)."""
        return (self.pending[0][0] if self.pending else len(self)) - self.taken

    def add_window(self, cols: dict, occupancies: list) -> None:
        """A window's rows, one per socket: each column a value for all of them or one value
        a socket (None: null); every column but the tiers' occupancy, given as a mapping tier
        -> bytes a socket (read once the backend has filled it in)."""
        k, first = len(occupancies), len(self)
        for name, col in self.cols.items():
            v: Any = cols.get(name)  # Any: mypy cannot see that `many` implies not None
            many = v is not None and not np.isscalar(v)
            if name in self.null:
                self.null[name].extend([v is None] * k)
                v = 0.0 if v is None else v
            col.extend(v.tolist() if isinstance(v, np.ndarray) else v if many else [v] * k)
        self.pending.extend((first + i, occ) for i, occ in enumerate(occupancies))
        self.settle(ready_only=True)

    def settle(self, ready_only: bool = False) -> None:
        """Read the occupancies filled in so far (all of them: after the backend's sync)."""
        while self.pending:
            i, occ = self.pending[0]
            if ready_only and getattr(occ, "values", occ) is None:
                return
            self.pending.popleft()
            i -= self.taken
            for name, tier in OCCUPANCY.items():
                v = occ.get(tier)
                self.null[name][i] = v is None
                self.cols[name][i] = 0.0 if v is None else v

    def columns(self) -> dict[str, pa.Array]:
        self.settle()
        return self.take(len(self) - self.taken)

    def take(self, k: int) -> dict[str, pa.Array]:
        """The first k rows held, as Arrow columns, dropped from here (they must be ready)."""
        out = {}
        for f in SOCKETS:
            values = np.frombuffer(self.cols[f.name], dtype=np.int64 if
                                   pa.types.is_integer(f.type) else np.float64)[:k]
            mask = (np.frombuffer(self.null[f.name], dtype=np.int8)[:k].astype(bool)
                    if f.name in self.null else None)
            out[f.name] = pa.array(values, type=f.type, mask=mask)
        for held in (self.cols, self.null):  # new arrays: Arrow may share the old buffers
            for name, col in held.items():
                held[name] = col[k:]
        self.taken += k
        return out


@dataclass
class Recorder:
    steps: list[StepColumns] = field(default_factory=list)
    sockets: SocketRows = field(default_factory=SocketRows)
    link_bytes: dict[tuple[int, int], float] = field(default_factory=dict)
    ends: dict[int, Growing] = field(default_factory=dict)  # replica -> step end times
    starts: dict[int, Growing] = field(default_factory=dict)
    # replica -> end times of its steps with decodes (what Request.emits' decode runs index)
    decode_ends: dict[int, Growing] = field(default_factory=dict)
    switch_s: dict[tuple[int, int], float] = field(default_factory=dict)  # (replica, step)
    # energy_j / cost_usd per request id, only the configured ones (engine/energy.py)
    split: dict[str, dict[int, float]] = field(default_factory=dict)
    loose: int = 0  # windows in self.steps not joined into a chunk yet (_compact)
    # Streaming: sink(name, Arrow table) takes the steps and sockets rows in chunks of
    # chunk_rows as they are recorded (None: all kept for the tables); of the steps handed
    # on, the summary's columns are kept in `kept` (TOTALS_ROWS at most), then in `totals`.
    sink: Callable[[str, pa.Table], None] | None = None
    chunk_rows: int = CHUNK_ROWS
    meta: dict = field(default_factory=dict)
    kept: list[dict] = field(default_factory=list)
    kept_rows: int = 0
    totals: list[dict] = field(default_factory=list)  # step_totals of TOTALS_ROWS each
    held_rows: int = 0  # step rows in self.steps
    sent: set = field(default_factory=set)  # tables the sink got a chunk of
    # the steps' columns kept (None: every one of STEPS; LEAN_STEP_COLUMNS: summary_only)
    fields: tuple[str, ...] | None = None

    def add_steps(self, replica: int, cols: dict[str, np.ndarray],
                  ends: np.ndarray | None = None) -> None:
        """A window's step rows (`ends`: their end times, when the caller has them: each
        start plus its time, as the start of the next step)."""
        if self.fields is not None:
            cols = {k: cols[k] for k in self.fields}
        self.steps.append(StepColumns(cols))
        if ends is None:
            ends = np.concatenate([cols["start_s"][1:],
                                   [cols["start_s"][-1] + cols["time_s"][-1]]])
        phase = cols["phase"]
        decodes = cols["decode_tokens"] > 0
        if len(phase) and phase[0] == "recovery":  # recovery rows are not engine steps
            keep = phase != "recovery"
            starts, ends, decodes = cols["start_s"][keep], ends[keep], decodes[keep]
        else:  # a window's steps: never a recovery row
            starts = cols["start_s"]
        self.starts.setdefault(replica, Growing()).extend(starts)
        self.ends.setdefault(replica, Growing()).extend(ends)
        self.decode_ends.setdefault(replica, Growing()).extend(ends[decodes])
        self._compact()
        self.held_rows += len(phase)
        if self.sink is not None and self.held_rows >= self.chunk_rows:
            self.flush_steps()

    def finish(self) -> None:
        """Streaming: hand on every row left; a table that got no rows gets an empty chunk
        (its file is written with its schema all the same)."""
        self.flush_steps()
        self.flush_sockets(final=True)
        for name, schema in (("steps", STEPS), ("sockets", SOCKETS)):
            if name not in self.sent:
                self.send(name, table(schema, {f.name: [] for f in schema}, self.meta))

    def send(self, name: str, tbl: pa.Table) -> None:
        self.sent.add(name)
        # only a streaming run sends (finish, flush_steps, flush_sockets): it has a sink
        cast("Callable[[str, pa.Table], None]", self.sink)(name, tbl)

    def flush_steps(self) -> None:
        """Hand the steps held to the sink (one chunk), keeping the summary's columns."""
        if not self.steps:
            return
        cols = steps_columns(self)
        self.kept.append({k: cols[k] for k in SUMMARY_STEP_COLUMNS})
        self.kept_rows += len(cols["phase"])
        if self.kept_rows >= TOTALS_ROWS:  # whole blocks to totals, the rest kept
            joined = _joined(self.kept, SUMMARY_STEP_COLUMNS)
            whole = self.kept_rows - self.kept_rows % TOTALS_ROWS
            self.totals.extend(_blocks({k: v[:whole] for k, v in joined.items()}))
            self.kept = [{k: v[whole:].copy() for k, v in joined.items()}]
            self.kept_rows -= whole
        self.send("steps", table(STEPS, cols, self.meta))
        self.steps, self.loose, self.held_rows = [], 0, 0

    def flush_sockets(self, final: bool = False) -> None:
        """Hand the sockets rows whose occupancies are read to the sink, once a chunk's worth
        is ready (all of them: at the end, after the backend's sync)."""
        if final:
            self.sockets.settle()
        k = self.sockets.ready()
        if k and (final or k >= self.chunk_rows):
            self.send("sockets", table(SOCKETS, self.sockets.take(k), self.meta))

    def step_totals(self) -> dict:
        """The run's step figures (step_totals) over all its steps, streamed or not."""
        if self.sink is None:
            return step_totals(steps_columns(self))
        return _added([*self.totals, *_blocks(_joined(self.kept, SUMMARY_STEP_COLUMNS))])

    def _compact(self) -> None:
        """Join each COMPACT_EVERY windows' arrays into one chunk per column (the same values
        in the same order: the tables concatenate them all at the end either way), so memory
        per window is its rows' bytes, not a few dozen small arrays' headers."""
        self.loose += 1
        if self.loose >= COMPACT_EVERY:
            tail = self.steps[-self.loose:]
            self.steps[-self.loose:] = [StepColumns({k: np.concatenate(
                [t.cols[k] for t in tail]) for k in tail[0].cols})]
            self.loose = 0

    def step_times(self, replica: int) -> tuple[np.ndarray, np.ndarray, int]:
        """The replica's step start and end times kept (views: no copy), and the step of
        their first value (the ones before are dropped: drop_steps_before)."""
        if replica not in self.starts:
            return np.zeros(0), np.zeros(0), 0
        return self.starts[replica].view(), self.ends[replica].view(), self.ends[replica].first

    def drop_steps_before(self, replica: int, step: int, decode_step: int) -> None:
        """No request yet to be recorded reads the replica's steps before `step`, nor its
        decode steps before `decode_step`."""
        if replica in self.starts:
            self.starts[replica].drop_before(step)
            self.ends[replica].drop_before(step)
            self.decode_ends[replica].drop_before(decode_step)


def request_row(q: Request, rep: int, rec: Recorder) -> tuple:
    """A request's row of the requests table (REQUESTS' fields in order), from the step
    indices it recorded and its replica's step times; the per-request energy and cost totals
    it took are dropped from the recorder (a request is recorded once, when it is through).
    Built as the tuple it is (_ROW: the fields in that order), not as a dict of every field:
    each request of a run takes this once."""
    starts, ends, first = rec.step_times(rep)
    if 0 <= q.admit_step < first or 0 <= q.first_token_step < first:
        raise RuntimeError(f"request_row: request {q.id}'s steps were dropped (first kept: "
                           f"{first})")
    queue = ttft = tpot = e2e = finish = None
    if q.admit_step >= 0:
        queue = float(starts[q.admit_step - first] - q.arrival_s)
    if q.first_token_step >= 0:
        ttft = float(ends[q.first_token_step - first] - q.arrival_s)
    if q.done_step >= 0:
        finish = float(ends[q.done_step - first])
        e2e = finish - q.arrival_s
        if q.output_len > 1:
            tpot = (finish - float(ends[q.first_token_step - first])) / (q.output_len - 1)
    energy, cost = rec.split.get("energy_j"), rec.split.get("cost_usd")  # None: no table
    return (q.id, rep, q.model, q.state, q.arrival_s, q.prompt_len, q.output_len, q.generated,
            queue, ttft, tpot, e2e, finish, q.preemptions, q.swaps, q.reason, q.expert,
            rec.switch_s.get((rep, q.switch_step), 0.0),
            None if energy is None else energy.pop(q.id, 0.0),
            None if cost is None else cost.pop(q.id, 0.0), rep, 0.0, 0.0, q.session,
            *map(q.prefix_tokens.get, PREFIX_TIERS, _NONE_FOUND), q.prefix_copy_s)


# request_row's fields, in its tuple's order: REQUESTS' own
_ROW = ("request_id", "replica", "model", "state", "arrival_s", "prompt_len", "output_len",
        "generated_tokens", "queue_s", "ttft_s", "tpot_s", "e2e_s", "finish_s", "preemptions",
        "swaps", "reason", "expert", "switch_wait_s", "energy_j", "cost_usd",
        "prefill_replica", "kv_transfer_s", "kv_transfer_bytes", "session",
        *(f"prefix_{tier}_tokens" for tier in PREFIX_TIERS), "prefix_copy_s")
_NONE_FOUND = (0,) * len(PREFIX_TIERS)
if _ROW != REQUEST_FIELDS:  # a field added to REQUESTS is added to request_row too
    raise ImportError("metrics.request_row: its fields are not REQUESTS' in order")


def table(schema: pa.Schema, columns: dict, metadata: dict) -> pa.Table:
    meta = {b"rdu_cluster.schema_version": SCHEMA_VERSION.encode(),
            b"rdu_cluster.code_version": rdu_cluster.__version__.encode()}
    meta.update({f"rdu_cluster.{k}".encode(): str(v).encode() for k, v in metadata.items()})
    arrays = [_array(columns[f.name], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema.with_metadata(meta))


def _array(values, kind: pa.DataType) -> pa.Array:
    """A column as Arrow: a numeric numpy column of the field's kind straight from its buffer
    (the same values as through a list, without a Python object per value at table time)."""
    if isinstance(values, pa.Array):
        return values
    if isinstance(values, np.ndarray):
        if ((pa.types.is_floating(kind) and values.dtype.kind == "f")
                or (pa.types.is_integer(kind) and values.dtype.kind in "iu")):
            return pa.array(values, type=kind)
        values = values.tolist()
    return pa.array(values, type=kind)


def steps_columns(rec: Recorder) -> dict:
    names = rec.fields or STEPS.names
    if not rec.steps:
        return {k: [] for k in names}
    return {k: np.concatenate([s.cols[k] for s in rec.steps]) for k in names}


def _joined(chunks: list[dict], names: tuple[str, ...]) -> dict:
    if not chunks:
        return {k: np.zeros(0) for k in names}
    return {k: np.concatenate([c[k] for c in chunks]) for k in names}


def step_totals(steps: dict) -> dict:
    """What the run's summary reads of its steps (SUMMARY_STEP_COLUMNS): engine steps and
    decode steps (recovery rows are no engine steps), socket-seconds held in steps, their
    energy (NaN without a [power] table), decode tokens and tokens emitted; each block of
    TOTALS_ROWS steps reduced on its own and the blocks' figures added in order."""
    return _added(_blocks(steps))


def _blocks(steps: dict) -> list[dict]:
    n = len(steps["phase"])
    return [_block_totals({k: steps[k][i : i + TOTALS_ROWS] for k in SUMMARY_STEP_COLUMNS})
            for i in range(0, max(n, 1), TOTALS_ROWS)]


def _added(parts: list[dict]) -> dict:
    out = dict(parts[0])
    for p in parts[1:]:
        for k in out:
            out[k] += p[k]
    return out


def _block_totals(steps: dict) -> dict:
    phase = np.asarray(steps["phase"]) if len(steps["phase"]) else np.zeros(0, dtype=str)
    return {"steps": int(np.sum(phase != "recovery")),
            "decode_steps": int(np.sum(phase == "decode")),
            "socket_s": float(np.dot(np.asarray(steps["time_s"], dtype=float),
                                     np.asarray(steps["sockets"], dtype=float))),
            "energy_j": float(np.sum(np.asarray(steps["energy_j"], dtype=float))),
            "decode_tokens": int(np.sum(steps["decode_tokens"])),
            "emitted_tokens": int(np.sum(steps["emitted_tokens"]))}


def sockets_columns(rec: Recorder) -> dict:
    return rec.sockets.columns()


def percentiles(values, qs=(50, 90, 99)) -> dict[int, float]:
    """np.percentile of the values that are not None (a float array has none: taken as it is,
    without a Python object a value)."""
    v = (values if isinstance(values, np.ndarray) and values.dtype.kind == "f"
         else np.asarray([x for x in values if x is not None], dtype=float))
    return {q: (float(np.percentile(v, q)) if len(v) else float("nan")) for q in qs}
