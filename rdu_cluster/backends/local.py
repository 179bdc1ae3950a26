"""LocalBackend: the sockets as plain objects in the driver's process.

Sockets whose programs have equal keys share one cost memo (a pure function of the program and
the step shape), and a command whose spans and expert loads equal another socket's in the same
call is costed once: sockets of a tensor-parallel group are symmetric. Each socket still applies
its own region ops, so every socket's memory is its own.
"""

from __future__ import annotations

import numpy as np

from chip.socket import CostTables, Socket, Spans
from rdu_cluster.backends import SocketSetup


class LocalBackend:
    name = "local"
    workers = 1

    def __init__(self) -> None:
        self.sockets: dict[int, Socket] = {}
        self.memo: dict[tuple, CostTables] = {}  # (chip, program key) -> tables, shared

    def start(self, setups: dict[int, SocketSetup]) -> None:
        for index, setup in setups.items():
            self._create(index, setup)

    def _create(self, index: int, setup: SocketSetup) -> None:
        key = (setup.chip.name, setup.program.key())
        tables = self.memo.get(key)
        if tables is None:
            tables = self.memo[key] = CostTables(setup.chip, setup.program, setup.comm_time)
            tables.warm()
        sock = Socket(index, setup.chip, setup.program, setup.comm_time, tables,
                      setup.kv_scale)
        sock.apply(setup.weights)
        self.sockets[index] = sock

    def run(self, seq: int, ops: list, spans: Spans, loads: dict | None, sockets) -> dict:
        out, done = {}, {}
        for i in sockets:
            sock = self.sockets[i]
            load = loads.get(i) if loads else None
            key = (id(sock.tables), sock.degradation, sock.comm_degradation,
                   None if load is None else load.tobytes())
            s = spans if load is None else _with_load(spans, load)
            if key in done:
                sock.run(seq, ops, _EMPTY)  # state only; the cost is the same
                rows, moves = done[key]
            else:
                rows, moves = done[key] = sock.run(seq, ops, s)
            out[i] = (rows, moves, sock.occupancy())
        return out

    def reprogram(self, index: int, setup: SocketSetup) -> None:
        old = self.sockets[index]
        self._create(index, setup)
        self.sockets[index].seq = old.seq
        self.sockets[index].set_degradation(old.degradation, old.comm_degradation, old.failed)

    def set_fault(self, index: int, degradation: float, comm: float, failed: bool) -> None:
        self.sockets[index].set_degradation(degradation, comm, failed)

    def sync(self) -> None:
        """Nothing is owed: every reply came back in `run`."""

    def evaluations(self) -> int:
        return sum(t.evaluations for t in self.memo.values())

    def close(self) -> None:
        self.sockets.clear()


def _with_load(spans: Spans, load: np.ndarray) -> Spans:
    from dataclasses import replace

    return replace(spans, expert_load=load)


_Z = np.zeros(0, dtype=np.int64)
_EMPTY = Spans(_Z, _Z, _Z, _Z, _Z, _Z, _Z)  # no spans: a follower's command applies its ops only

