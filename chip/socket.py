"""Socket: one accelerator socket with its memory tiers, what is resident in them, and its
execution model, answering coarse commands.

Commands (the same in every backend; see rdu_cluster/backends/messages.py for the wire form):
- `apply(ops)`: load / evict / resize / move / copy named regions; returns the copy time of the
  moves and copies;
- `cost(spans)`: per-step vectors for a window of spans (each a run of steps with a fixed batch
  composition), one vectorized cost evaluation per distinct composition, never an op-by-op loop;
- `occupancy()`, `checkpoint()`, `restore(state)`, `set_degradation(factor, comm_factor)`.

Its program: chip/program.py; its cost tables (CostTables, the Spans it costs, ROWS):
chip/cost_tables.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain

import numpy as np

from chip.cost import CAUSES
from chip.cost_tables import COMM_ROW, ROWS, CommTime, CostTables, Spans
from chip.memory import MemoryTiers
from chip.program import Program
from chip.spec import ChipSpec


class Socket:
    def __init__(
        self,
        index: int,
        chip: ChipSpec,
        program: Program,
        comm_time: CommTime,
        tables: CostTables | None = None,
        kv_scale: float = 1.0,
    ):
        self.index = index
        # This socket's KV bytes per replica KV byte: the replica's commands size KV regions
        # for its target sockets; a separate draft socket caches the draft's smaller KV.
        self.kv_scale = kv_scale
        self.chip = chip
        self.program = program
        self.memory = MemoryTiers.of(chip)
        self.tables = tables or CostTables(chip, program, comm_time)
        self.degradation = 1.0  # compute/memory time multiplier (a degraded socket: > 1)
        self.comm_degradation = 1.0  # communication time multiplier (degraded or failed links)
        self.failed = False
        self.seq = -1  # last command applied: a replayed command is not applied twice
        self.last_moves = np.zeros(0)

    # -- memory ---------------------------------------------------------------------------
    def apply(self, ops: Iterable[list]) -> float:
        """Region ops: ["alloc", name, tier, bytes, kind], ["resize", name, bytes],
        ["free", name], ["move", name, tier], ["copy", name, tier, new_name]. Returns the
        seconds the moves and copies cost."""
        seconds = 0.0
        m = self.memory
        for op in ops:
            verb = op[0]
            if verb == "resize":  # the most frequent op first
                m.resize(op[1], op[2], self.kv_scale)
            elif verb == "alloc":
                m.allocate(op[1], op[2], op[3] * (self.kv_scale if op[4] == "kv" else 1.0), op[4])
            elif verb == "free":
                m.free(op[1])
            elif verb == "move":
                seconds += m.move(op[1], op[2])
            elif verb == "copy":
                seconds += m.copy(op[1], op[2], op[3])
            else:
                raise ValueError(f"unknown region op {verb!r}")
        return seconds

    def occupancy(self) -> dict[str, float]:
        return self.memory.occupancy()

    # -- execution ------------------------------------------------------------------------
    def cost(self, spans: Spans) -> np.ndarray:
        """(len(ROWS), total steps) per-step times of the window, degradation applied."""
        if self.failed:
            raise RuntimeError(f"socket {self.index} has failed")
        rows = self.tables.window(spans)
        if self.degradation != 1.0 or self.comm_degradation != 1.0:
            rows = _degrade(rows, self.degradation, self.comm_degradation)
        return rows

    def costs(self, spans: Spans, loads: list[np.ndarray]) -> list[np.ndarray]:
        """`cost` of `spans` under each of `loads` (per step, an expert load each): the
        sockets that differ from this one only in their loads, costed together."""
        if self.failed:
            raise RuntimeError(f"socket {self.index} has failed")
        out = self.tables.windows(spans, loads)
        if self.degradation != 1.0 or self.comm_degradation != 1.0:
            out = [_degrade(rows, self.degradation, self.comm_degradation) for rows in out]
        return out

    def run(self, seq: int, ops: list[list], spans: Spans) -> tuple[np.ndarray, np.ndarray]:
        """One command: ops[i] (region ops) apply at the start of span i, ops[-1] after the last
        span; then the spans are costed. Returns (rows, seconds of region moves per span). A
        command at or below the last applied sequence number is a replay: its ops are not
        applied again (their copy times are recomputed from the command, not re-counted)."""
        if not len(spans.kind) and not self.failed:  # ops only (a symmetric follower)
            self.apply_command(seq, ops)
            return _NO_ROWS, _NO_MOVES
        moves = self.advance(seq, ops, len(spans.kind))
        return self.cost(spans), moves

    def advance(self, seq: int, ops: list[list], spans: int) -> np.ndarray:
        """A command's region ops, ops[i] at the start of span i (once: a replay returns the
        first application's moves). Returns the seconds of region moves per span."""
        if seq <= self.seq:
            return self.last_moves
        moves = np.zeros(spans)
        for i, span_ops in enumerate(ops):
            if span_ops:  # at light load most spans change no region
                t = self.apply(span_ops)
                if t and i < spans:  # most ops move nothing: seconds 0
                    moves[i] = t
        self.seq = seq
        self.last_moves = moves
        return moves

    def apply_command(self, seq: int, ops: list[list]) -> None:
        """A command's region ops without costing its spans (not again for a replay)."""
        if seq > self.seq:
            self.apply(chain.from_iterable(ops))  # in order; their seconds are not asked for
            self.seq = seq
            self.last_moves = _NO_MOVES

    def set_degradation(self, factor: float, comm_factor: float, failed: bool = False) -> None:
        self.degradation, self.comm_degradation, self.failed = factor, comm_factor, failed

    # -- checkpoints ----------------------------------------------------------------------
    def checkpoint(self) -> dict:
        """Everything but the cost tables (a pure cache, rebuilt on demand)."""
        return {
            "seq": self.seq,
            "last_moves": self.last_moves.tolist(),
            "regions": self.memory.state(),
            "degradation": [self.degradation, self.comm_degradation, self.failed],
        }

    def restore(self, state: dict) -> None:
        self.seq = state["seq"]
        self.last_moves = np.asarray(state["last_moves"], dtype=float)
        self.memory.restore(state["regions"])
        self.set_degradation(*state["degradation"])


_NO_ROWS = np.zeros((len(ROWS), 0))
_NO_MOVES = np.zeros(0)


def _degrade(rows: np.ndarray, factor: float, comm_factor: float) -> np.ndarray:
    """Scale the non-communication causes by `factor` and communication by `comm_factor`;
    the total is rebuilt as their sum so the partition still holds. comm_bytes and dynamic_j
    stay: a degraded socket does the same work (same bytes, same switching energy) more slowly;
    its idle draw over the longer time is counted by the engine."""
    out = rows.copy()
    causes = out[1 : 1 + len(CAUSES)]
    comm = causes[COMM_ROW - 1].copy()
    causes *= factor
    causes[COMM_ROW - 1] = comm * comm_factor
    out[0] = causes.sum(axis=0)
    return out
