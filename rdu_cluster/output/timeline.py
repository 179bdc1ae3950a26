"""`serve --timeline FILE.json`: the run as Chrome trace-event JSON, which ui.perfetto.dev and
chrome://tracing open (the format: "Trace Event Format", Google, ph "X" complete events, "C"
counters, "M" metadata; times in microseconds).

One process per socket ("socket 3 (replica 0, node 0)"), one slice per step it runs: the copies
before the step (KV swaps, CoE expert copies), then its stage's part of the step (prefill,
decode, mixed; with speculation: the draft's steps and the target's verification on their own
sockets, or "speculative decode (draft + verify)" where they share them), then, if another
socket of its stage was slower, the wait for it ("sync wait": the straggler holds the group at
its collectives). One process per link: a counter of the tensor-parallel ring's bytes/s on each
link of a stage (a new point where it moves by 1%), and a slice for each message between stages (pipeline activations, drafts and
verdicts). A replica's steps run one after another, so the slices of a socket's step add up to
the step's time in the steps table less the messages between stages (on the link tracks).

A disaggregated run (--prefill-pool/--decode-pool) draws both pools, each socket's process
named by its pool ("prefill socket 3 (replica 1, node 0)"), and each KV hand-over as a slice on
the fabric track of its prefill and decode replicas ("KV hand-over", from the first free
interval of their ports to the KV's arrival: latency and transfer; its request and bytes).

Built by an observer the Simulation calls after each window (Simulation.observers), from the
per-socket results and the per-step times the engine already computed, and after each recovery
row (weights reloaded after a failure); a pair's Handover calls it at each hand-over. The
events are written to the file as they are made (a hidden temporary file beside it,
output/atomic.StreamedFile), so memory does not grow with the run; the file appears whole at
commit(), after the run's tables.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from chip.cost_tables import DECODE, MIXED, PREFILL, SENT_ROW
from rdu_cluster.engine.record import PHASE_NAMES
from rdu_cluster.output import atomic

US = 1e6  # trace-event times are microseconds
COPIES = (("kv_swap_s", "KV swap copy"), ("switch_s", "expert copy (CoE switch)"))
# a disaggregated run's decode pool's sockets: pid POOL_PID + socket (past MAX_SOCKETS)
POOL_PID = 20_000
LINK_PID = 100_000  # link processes after the sockets' (both pools')
COUNTER_STEP = 0.01  # a link counter gets a new point when its rate moves by this fraction


class Timeline:
    def __init__(self, path: str | Path) -> None:
        self.file = atomic.StreamedFile(path, "--timeline")
        self.count = 0  # events written
        # pid -> (name prefix, socket, replica, node), last seen
        self.sockets: dict[int, tuple[str, int, int, int]] = {}
        self.links: dict[tuple[int, int], int] = {}  # (src pid, dst pid) -> pid
        self.pools: dict[int, tuple[str, int]] = {}  # id(sim) -> (pool name, pid offset)
        self.fabric: dict[tuple[int, int], int] = {}  # (prefill, decode replica) -> pid
        self.base = 0  # the pid offset of the pool whose window is being drawn

    def pool(self, sim, name: str, index: int) -> None:
        """`sim` is pool `index` (0 prefill, 1 decode) of a disaggregated run: its sockets'
        processes are named by `name`, their pids POOL_PID x index past the socket's."""
        self.pools[id(sim)] = (name, POOL_PID * index)

    # -- the observer -----------------------------------------------------------------------
    def window(self, sim, rep, window, res: dict, step: dict, t0: float, m: int) -> None:
        lay = sim.layouts[rep.index]
        name, base = self.pools.get(id(sim), ("", 0))
        for s in lay.sockets:
            self.sockets[base + s] = (name, s, rep.index, sim.cluster.node_of(s))
        self.base = base
        dur = step["time_s"]
        starts = step["start_s"]
        kinds = window.per_step(lambda sp: sp.kind)[:m]
        steps = np.concatenate([sp.first_step + np.arange(sp.steps) for sp in window.spans])[:m]
        batch = window.per_step(lambda sp: len(sp.decode) + len(sp.prefill))[:m]
        spec = sim.config.speculation is not None
        for i in range(m):
            args = {"replica": rep.index, "step": int(steps[i]), "batch": int(batch[i])}
            cursor = float(starts[i])
            for col, name in COPIES:
                c = float(step[col][i])
                if c > 0:
                    for s in lay.sockets:
                        self._slice(s, name, "copy", cursor, c, args)
                    cursor += c
            self._stages(lay, res, step, i, int(kinds[i]), cursor, spec, args)
        self._ring_counters(lay, res, starts, dur, m)

    def _stages(self, lay, res, step, i, kind, cursor, spec, args) -> None:
        """Each stage's part of step i from `cursor`: stages in turn with the messages between
        them; a separate draft's prefill runs beside the target's."""
        stage_s, hop_s = step["stage_s"][i], step["hop_s"][i]
        side = lay.draft_stage and kind == PREFILL
        base = cursor
        for k, stage in enumerate(lay.stages):
            name = _name(kind, spec, lay.draft_stage, k)
            start = base if side else cursor
            for s in stage:
                busy = float(res[s][0][0, i])
                self._slice(s, name, PHASE_NAMES[kind], start, busy, args)
                if stage_s[k] - busy > 0:
                    self._slice(s, "sync wait", "wait", start + busy, stage_s[k] - busy, args)
            cursor = start + float(stage_s[k])
            if side:
                continue
            if k < len(lay.stages) - 1 and k < len(hop_s) and hop_s[k] > 0:
                nxt = lay.stages[k + 1][0]
                what = "drafts" if lay.draft_stage else "activations"
                self._link_slice(stage[0], nxt, what, cursor, float(hop_s[k]), args)
                cursor += float(hop_s[k])
        if lay.draft_stage and not side and len(hop_s) > 1 and hop_s[1] > 0:
            self._link_slice(lay.stages[1][0], lay.stages[0][0], "verdict", cursor,
                             float(hop_s[1]), args)

    def _ring_counters(self, lay, res, starts, dur, m) -> None:
        """Bytes/s each socket sends to the next of its stage's ring, per step (the ring the
        sockets table's link bytes count)."""
        for stage in lay.stages:
            if len(stage) < 2:
                continue
            for pos, s in enumerate(stage):
                pid = self._link(s, stage[(pos + 1) % len(stage)])
                rate = res[s][0][SENT_ROW, :m] / np.where(dur > 0, dur, 1.0)
                # a point where the rate moves by 1% or more: a counter is for the eye, and a
                # point per step would double the file
                with np.errstate(divide="ignore"):
                    level = np.floor(np.log(np.maximum(rate, 1.0)) / np.log1p(COUNTER_STEP))
                keep = np.concatenate([[True], np.diff(level) != 0])
                for t, v in zip(starts[keep], rate[keep]):
                    self._emit({"name": "ring bytes/s", "ph": "C", "pid": pid,
                                "ts": float(t) * US, "args": {"bytes/s": float(v)}})

    # -- events -----------------------------------------------------------------------------
    def _emit(self, event: dict) -> None:
        self.file.write(("," if self.count else '{"traceEvents":[')
                        + json.dumps(event, separators=(",", ":")))
        self.count += 1

    def _slice(self, s: int, name: str, cat: str, start: float, seconds: float, args) -> None:
        self._emit({"name": name, "cat": cat, "ph": "X", "pid": self.base + s, "tid": 0,
                            "ts": start * US, "dur": seconds * US, "args": args})

    def _link(self, a: int, b: int) -> int:
        key = (self.base + a, self.base + b)
        return self.links.setdefault(key, LINK_PID + len(self.links) + len(self.fabric))

    def handover(self, rid: int, prefill: int, decode: int, begin: float, arrive: float,
                 nbytes: float) -> None:
        """A KV hand-over on the fabric from prefill replica `prefill` to decode replica
        `decode`: from its ports' first free interval (`begin`) to the KV's arrival."""
        pid = self.fabric.setdefault((prefill, decode),
                                     LINK_PID + len(self.links) + len(self.fabric))
        self._emit({"name": "KV hand-over", "cat": "message", "ph": "X", "pid": pid, "tid": 0,
                    "ts": begin * US, "dur": (arrive - begin) * US,
                    "args": {"request": rid, "bytes": nbytes}})

    def _link_slice(self, a: int, b: int, name: str, start: float, seconds: float,
                    args) -> None:
        self._emit({"name": name, "cat": "message", "ph": "X", "pid": self._link(a, b),
                            "tid": 0, "ts": start * US, "dur": seconds * US, "args": args})

    def recovery(self, sim, index: int, start: float, seconds: float) -> None:
        """A recovery row (weights reloaded after a failure, engine/recovery.py) on the sockets
        replica `index` was re-planned onto."""
        self.base = self.pools.get(id(sim), ("", 0))[1]
        for s in sorted(sim.replicas[index].sockets):
            self._slice(s, "weight reload (recovery)", "recovery", start, seconds,
                        {"replica": index})

    def finish(self) -> int:
        """The process names and the trace's close, written; returns the events in it (the
        file appears at commit)."""
        meta = []
        for pid, (pool, s, rep, node) in sorted(self.sockets.items()):
            name = f"{pool} socket".lstrip() + f" {s} (replica {rep}, node {node})"
            meta += _names(pid, name, pid, "steps")
        for (a, b), pid in sorted(self.links.items(), key=lambda kv: kv[1]):
            pool = next((n for n, base in self.pools.values() if base == a - a % POOL_PID), "")
            meta += _names(pid, f"{pool} link".lstrip() + f" {a % POOL_PID}->{b % POOL_PID}",
                           pid, "messages")
        for (p, d), pid in sorted(self.fabric.items(), key=lambda kv: kv[1]):
            meta += _names(pid, f"fabric: prefill replica {p} -> decode replica {d}", pid,
                           "KV hand-overs")
        for event in meta:
            self._emit(event)
        tail = {"displayTimeUnit": "ms",
                "otherData": {"source": "rdu-cluster serve --timeline", "time_unit": "us"}}
        self.file.write(("" if self.count else '{"traceEvents":[') + "],"
                        + json.dumps(tail, separators=(",", ":"))[1:])
        return self.count

    def commit(self) -> None:
        self.file.commit()

    def discard(self) -> None:
        self.file.discard()


def _names(pid: int, process: str, sort: int, thread: str) -> list[dict]:
    return [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": process}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": sort}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": thread}}]


def _name(kind: int, spec: bool, draft_stage: bool, stage: int) -> str:
    """A step's slice name on a socket of `stage`."""
    phase = str(PHASE_NAMES[kind])
    if not spec or kind not in (DECODE, MIXED):
        return phase if not (draft_stage and stage == 0) else f"draft {phase}"
    if not draft_stage:
        return f"speculative {phase} (draft + verify)"
    return f"draft ({phase})" if stage == 0 else f"verify ({phase})"
