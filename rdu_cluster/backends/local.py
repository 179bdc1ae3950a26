"""LocalBackend: the sockets as plain objects in the driver's process.

Sockets whose programs have equal keys share one cost memo (a pure function of the program and
the step shape), and a command whose spans and expert loads equal another socket's in the same
call is costed once: sockets of a tensor-parallel group are symmetric. Sockets that differ only
in their expert loads (an expert-parallel group) are costed in one evaluation of the execution
model (CostTables.windows: its points cost what they cost alone).

Sockets whose memory is equal (the same tiers, regions and KV scale: the sockets of a replica,
or of every replica, at the start) hold one MemoryTiers object and apply a command's region ops
once: a command sends the same ops to every socket it names, so they stay equal. A socket
named in a command that another holder of its memory is not gets a copy of its own first
(`_split`), so every socket's memory is still its own in what it reports.
"""

from __future__ import annotations

import copy
from array import array
from collections import OrderedDict
from dataclasses import dataclass, replace

from chip.cost_tables import CostTables, Spans
from chip.memory import MemoryTiers
from chip.socket import Socket
from rdu_cluster.backends import SocketSetup

# Cost tables are a pure function of the chip, the program and its collectives' times (each
# table holds the same values however it was filled: chip/cost_tables.py), so the backends of one
# process share them: a capacity search serves the same replica tens of times (its runs at each
# request count, its replicas alike), each run otherwise costing its steps anew. Kept: the
# most recently used, at most SHARED_TABLES, and those past the newest only while they hold
# under SHARED_BYTES (a CostTables bounds its own tables, at up to ~340 MB: with ~190 MB each,
# kept eight, a capacity worker grew to 2.3 GB).
SHARED_TABLES = 4
SHARED_BYTES = 256e6
_shared: OrderedDict[tuple, CostTables] = OrderedDict()


def shared_tables(setup: SocketSetup) -> CostTables:
    """The process's cost tables of `setup`'s chip and program (their every figure: a
    program's key names its model, and one model's bf16 and fp8 weights share a name) and
    collectives (CommTime functions are cached per layout: equal layouts give the same one)."""
    key = (repr(setup.chip), repr(replace(setup.program, group=())), setup.comm_time)
    tables = _shared.get(key)
    if tables is None:
        tables = _shared[key] = CostTables(setup.chip, setup.program, setup.comm_time)
        tables.warm()
        while len(_shared) > SHARED_TABLES or (
                len(_shared) > 1 and sum(map(_nbytes, _shared.values())) - _nbytes(tables)
                > SHARED_BYTES):
            _shared.popitem(last=False)
    _shared.move_to_end(key)
    return tables


def _nbytes(t: CostTables) -> float:
    """About the memory `t`'s tables and kept points hold, its steps under drawn loads too (a
    time row: 8 bytes an entry in an array, a float object and a pointer in a list)."""
    arrays = sum(a.nbytes for d in (t.decode, t.prefill, t.extra, t.points) for a in d.values())
    arrays += sum(ld.nbytes + rows.nbytes for e in (t.loaded.entries, t.loaded_prefills.entries)
                  for ld, rows in e.values())
    return arrays + sum((8.0 if isinstance(v, array) else 32.0) * len(v)
                        for v in t.times.values())


@dataclass(frozen=True)
class _Layout:
    """A command's sockets as LocalBackend.run serves them: each memory's socket that applies
    its region ops and the others holding it (in the command's order); each socket with that
    lead and its cost kind (sockets of one kind cost alike but for their expert loads)."""

    memories: list[tuple[int, list[int]]]
    sockets: list[tuple[int, int, int]]  # (socket, its memory's lead, its cost kind)
    failed: int | None  # the first failed socket named (a command to it raises)


class LocalBackend:
    name = "local"
    workers = 1
    # a window's command may come again under its sequence number with its last span longer
    # (engine/windows.py WindowExecutor._costed): its ops were applied the first time only
    # (Socket.advance), its spans are costed as given
    reruns = True

    def __init__(self) -> None:
        self.run_sockets: int | None = None  # (nothing to share out: the sockets are objects)
        self.sockets: dict[int, Socket] = {}
        self.memo: dict[tuple, CostTables] = {}  # (chip, program key) -> tables, shared
        # id(memory) -> (the memory, the sockets holding it)
        self.holders: dict[int, tuple[MemoryTiers, list[int]]] = {}
        self._layouts: dict[tuple, _Layout] = {}  # the sockets of a command -> its _layout

    def __deepcopy__(self, memo: dict) -> LocalBackend:
        """A copy whose sockets' memories are copies too (engine/checkpoint.py), `holders`
        keyed by the copies (the cost tables are shared where `memo` holds them)."""
        out = LocalBackend.__new__(LocalBackend)
        memo[id(self)] = out
        held = self.holders
        out.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items()
                             if k not in ("holders", "_layouts")})
        out._layouts = {}
        out.holders = {}
        for mem, sockets in held.values():
            new = copy.deepcopy(mem, memo)
            out.holders[id(new)] = (new, list(sockets))
        return out

    def start(self, setups: dict[int, SocketSetup]) -> None:
        for index, setup in setups.items():
            self._create(index, setup)
        self._share()

    def _create(self, index: int, setup: SocketSetup) -> None:
        key = (setup.chip.name, setup.program.key())
        tables = self.memo.get(key)
        if tables is None:
            tables = self.memo[key] = shared_tables(setup)
        sock = Socket(index, setup.chip, setup.program, setup.comm_time, tables,
                      setup.kv_scale)
        sock.apply(setup.weights)
        self.sockets[index] = sock

    def _share(self) -> None:
        """Sockets of equal memory (tiers, regions, KV scale, last command) hold one."""
        groups: dict[tuple, list[int]] = {}
        for i, sock in self.sockets.items():
            m = sock.memory
            key = (repr(m.tiers), sock.kv_scale, sock.seq,
                   tuple(tuple(r) for r in m.state()))
            groups.setdefault(key, []).append(i)
        self.holders = {}
        self._changed()
        for held in groups.values():
            mem = self.sockets[held[0]].memory
            for i in held:
                self.sockets[i].memory = mem
            self.holders[id(mem)] = (mem, held)

    def _split(self, sockets) -> None:
        """Each socket of this command whose memory a socket outside it holds too gets a copy
        of its own (with the others of the command that hold it): the ops apply to them only."""
        count: dict[int, int] = {}
        for i in sockets:
            m = id(self.sockets[i].memory)
            count[m] = count.get(m, 0) + 1
        for m, k in count.items():
            mem, held = self.holders[m]
            if k == len(held):
                continue
            inside = set(sockets)
            self._changed()
            copy = mem.clone()
            mine = [i for i in held if i in inside]
            for i in mine:
                self.sockets[i].memory = copy
            self.holders[m] = (mem, [i for i in held if i not in inside])
            self.holders[id(copy)] = (copy, mine)

    def _leave(self, index: int) -> None:
        mem = self.sockets[index].memory
        _, held = self.holders.pop(id(mem))
        held.remove(index)
        if held:
            self.holders[id(mem)] = (mem, held)

    def run(self, seq: int, ops: list, spans: Spans, loads: dict | None, sockets) -> dict:
        lay = self._layout(sockets)
        if lay.failed is not None:
            self.sockets[lay.failed].cost(spans)  # raises: a failed socket runs nothing
        n = len(spans.kind)
        occ: dict[int, dict] = {}  # lead socket -> its memory's occupancy after the ops
        for lead, followers in lay.memories:  # the memory's region ops, once
            first = self.sockets[lead]
            first.advance(seq, ops, n)  # (its moves: last_moves)
            occ[lead] = first.occupancy()
            for i in followers:
                sock = self.sockets[i]
                sock.seq, sock.last_moves = first.seq, first.last_moves
        done: dict[tuple, list] = {}  # cost key -> [rows, moves of its first socket]
        drawn: dict[int, list] = {}  # sockets costed together: differing only in their loads
        out: dict[int, tuple] = {}
        for i, lead, kind in lay.sockets:
            load = loads.get(i) if loads else None
            key = (kind, None if load is None else load.tobytes())
            if key not in done:
                sock = self.sockets[i]
                done[key] = [None, sock.last_moves]
                if load is None:
                    done[key][0] = sock.cost(spans)
                else:
                    drawn.setdefault(kind, []).append((key, sock, load))
            out[i] = (done[key], occ[lead])
        for group in drawn.values():
            rows = group[0][1].costs(spans, [load for _, _, load in group])
            for (key, _, _), r in zip(group, rows):
                done[key][0] = r
        return {i: (got[0], got[1], o) for i, (got, o) in out.items()}

    def _layout(self, sockets) -> _Layout:
        """How a command to `sockets` runs: which socket applies each memory's ops, and
        which cost alike (kept while no memory is split or shared anew, no socket
        reprogrammed or degraded: `_changed`), the first failed socket named (`failed`)."""
        key = tuple(sockets)
        lay = self._layouts.get(key)
        if lay is not None:
            return lay
        self._split(sockets)
        memories: dict[int, tuple[int, list[int]]] = {}  # id(memory) -> (lead, followers)
        kinds: dict[tuple, int] = {}
        rows, failed = [], None
        for i in sockets:
            sock = self.sockets[i]
            if sock.failed and failed is None:
                failed = i
            lead, followers = memories.setdefault(id(sock.memory), (i, []))
            if lead != i:
                followers.append(i)
            kind = kinds.setdefault((id(sock.tables), sock.degradation, sock.comm_degradation),
                                    len(kinds))
            rows.append((i, lead, kind))
        lay = self._layouts[key] = _Layout(list(memories.values()), rows, failed)
        return lay

    def _changed(self) -> None:
        self._layouts.clear()

    def reprogram(self, index: int, setup: SocketSetup) -> None:
        self._changed()
        old = self.sockets[index]
        self._leave(index)
        self._create(index, setup)
        new = self.sockets[index]
        self.holders[id(new.memory)] = (new.memory, [index])
        new.seq = old.seq
        new.set_degradation(old.degradation, old.comm_degradation, old.failed)

    def set_fault(self, index: int, degradation: float, comm: float, failed: bool) -> None:
        self._changed()
        self.sockets[index].set_degradation(degradation, comm, failed)

    def sync(self) -> None:
        """Nothing is owed: every reply came back in `run`."""

    def evaluations(self) -> int:
        return sum(t.evaluations for t in self.memo.values())

    def close(self) -> None:
        self._changed()
        self.sockets.clear()
        self.holders.clear()

