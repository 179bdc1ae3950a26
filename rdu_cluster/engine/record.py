"""Recording a window: its steps-table rows (one per step, with the energy split over the
requests), its sockets-table rows (one per socket) and the bytes it sent over each link,
into the run's Recorder (engine/metrics.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from chip.cost import CAUSES
from chip.cost_tables import SENT_ROW
from rdu_cluster.engine import energy
from rdu_cluster.engine.replica import Replica, Window

if TYPE_CHECKING:
    from rdu_cluster.engine.simulation import Simulation

PHASE_NAMES = np.array(["decode", "prefill", "mixed"])


class WindowRecorder:
    """Records the windows of a Simulation (`sim`: its recorder, rates, layouts, count of
    windows)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self._orders: dict = {}  # replica -> its layout's socket order (_socket_order)
        # replica -> (layout, links, positions, shares, bytes so far): each window's bytes
        # added to its links' as one array (flush_links writes them to the recorder's dict)
        self._sums: dict[int, tuple] = {}

    def record(self, rep: Replica, window: Window, step: dict, res: dict, t0: float,
                m: int, ends: np.ndarray) -> float:
        spans = window.spans
        dur = step["time_s"]
        # every per-span count at once: one (spans, 7) array repeated over the spans' steps
        per = np.repeat(np.array(
            [(sp.kind, len(sp.decode) + len(sp.prefill), sp.pre_tokens,
              len(sp.decode), sp.emitted, sp.expert, sp.prefix_hit) for sp in spans],
            dtype=np.int64), [sp.steps for sp in spans], axis=0)
        dynamic = energy.dynamic_j(res, rep.sockets, m)
        if self.sim.summary_only:  # no cost column kept, no per-request split (start)
            cols = self._lean(rep, step, per, m)
            cols["energy_j"] = energy.step_energy(self.sim.rates, dynamic, len(rep.sockets), dur)
        else:
            cols = self._columns(rep, step, per, m, spans[0].first_step)
            cols.update(energy.step_columns(self.sim.rates, dynamic, len(rep.sockets), dur))
            energy.split_over_requests(spans, cols, self.sim.rec.split)
        self.sim.rec.add_steps(rep.index, cols, ends)
        switch = step["switch_s"]
        if switch.any():  # a CoE expert switch: most windows have none
            for i in np.flatnonzero(switch):
                self.sim.rec.switch_s[(rep.index, spans[0].first_step + int(i))] = float(
                    switch[i])
        end = float(ends[-1])
        waits = sum(t - float(ends[i - 1]) for i, t in window.resumes if 0 < i < m)
        if not self.sim.summary_only:
            self._record_sockets(rep, window, res, t0, end, m, end - t0 - waits)
        rep.window_end = end
        return end

    def _lean(self, rep: Replica, step: dict, per: np.ndarray, m: int) -> dict:
        """The columns a summary-only run keeps (metrics.LEAN_STEP_COLUMNS, energy's added)."""
        return {"phase": PHASE_NAMES[per[:, 0]], "start_s": step["start_s"],
                "time_s": step["time_s"], "decode_tokens": per[:, 3],
                "emitted_tokens": per[:, 4], "sockets": np.full(m, len(rep.sockets))}

    def _columns(self, rep: Replica, step: dict, per: np.ndarray, m: int, first: int) -> dict:
        """Every steps-table column but energy's (metrics.STEPS); `first`: the window's first
        step (spans run consecutive steps)."""
        bb = rep.kv.config.block_bytes
        cols = {
            "replica": np.full(m, rep.index), "window": np.full(m, self.sim.windows),
            "step": first + np.arange(m),
            "phase": PHASE_NAMES[per[:, 0]], "start_s": step["start_s"],
            "time_s": step["time_s"],
            "batch": per[:, 1], "prefill_tokens": per[:, 2], "decode_tokens": per[:, 3],
            "emitted_tokens": per[:, 4], "expert": per[:, 5],
            "switch_s": step["switch_s"], "prefix_copy_s": step["prefix_copy_s"],
            "prefix_exposed_s": step["prefix_exposed_s"], "prefix_hit_tokens": per[:, 6],
            "kv_used_bytes": step["kv_blocks"] * bb,
            "kv_swap_s": step["kv_swap_s"], "expert_load_max": step["expert_load_max"][:m],
            "straggler_socket": step["straggler_socket"], "straggler_s": step["straggler_s"],
        }
        for i, c in enumerate(CAUSES):
            cols[f"{c}_s"] = step["causes"][:, i]
        cols["sockets"] = np.full(m, len(rep.sockets))
        return cols

    def _record_sockets(self, rep: Replica, window: Window, res: dict, t0: float, end: float,
                        m: int, span: float) -> None:
        """One sockets-table row per socket of the replica, as columns (metrics.SocketRows):
        `span` is the time the window's steps cover (its idle waits for arrivals left out, as
        they fall between windows without lookahead)."""
        switch = np.fromiter((sp.switch for sp in window.spans), bool, len(window.spans))
        socks, nodes, links = self._socket_order(rep)
        first = res[socks[0]][0]
        rows = (np.broadcast_to(first, (len(socks), *first.shape))  # one reply: no copies
                if all(res[s][0] is first for s in socks)
                else np.stack([res[s][0] for s in socks]))  # (sockets, ROWS, steps)
        busy, sent = rows[:, 0, :m].sum(axis=1), rows[:, SENT_ROW, :m].sum(axis=1)
        switches = int(switch.sum())
        self.sim.rec.sockets.add_window({
            "socket": socks, "replica": rep.index, "node": nodes,
            "window": self.sim.windows, "time_s": end, "window_s": span, "busy_s": busy,
            # at most 1: `span` is a difference of absolute times, which loses their last
            # bits (nanoseconds, 194 days in) where busy sums the steps, so it can come out short
            "busy_fraction": np.minimum(busy / span, 1.0) if span > 0 else np.zeros(len(socks)),
            "sent_bytes": sent, "switches": switches,
            "switch_s": ([float(np.sum(np.asarray(res[s][1])[: len(switch)][switch]))
                          for s in socks]
                         if switches else 0.0),
            **energy.socket_columns(self.sim.rates, rows, m, span)},
            [res[s][2] for s in socks])  # occupancies: mappings the backend may fill later
        if self.sim.rec.sink is not None:
            self.sim.rec.flush_sockets()
        sums = self._sums.get(rep.index)
        if sums is None or sums[0] is not self.sim.layouts[rep.index]:
            sums = self._link_sums(rep, links)
        sums[4][:] += sent[sums[2]] * sums[3]  # each link's additions in window order

    def _link_sums(self, rep: Replica, links: list) -> tuple:
        """The replica's running link bytes for its current layout, from the recorder's (a
        re-planned replica's links may have been another's: every replica's are written back
        and read again)."""
        self.flush_links()
        if rep.index in self._sums:
            self._sums.clear()
        total = self.sim.rec.link_bytes
        keys = [link for _, link, _ in links]
        got = self._sums[rep.index] = (
            self.sim.layouts[rep.index], keys, np.array([i for i, _, _ in links], dtype=np.intp),
            np.array([share for _, _, share in links], dtype=float),
            np.array([total.get(k, 0.0) for k in keys], dtype=float))
        return got

    def flush_links(self) -> None:
        """Write the running link bytes into the recorder's link_bytes (the links table's)."""
        total = self.sim.rec.link_bytes
        for _, keys, _, _, sums in self._sums.values():
            total.update(zip(keys, sums.tolist()))

    def _socket_order(self, rep: Replica) -> tuple[list[int], list[int], list]:
        """The replica's sockets stage by stage, their nodes, and the links each socket's bytes
        go over, with its position and the share it sends there: what every window's sockets
        rows need, kept per layout (a re-planned replica gets a new one). On a full mesh a
        socket has a link to every other socket of its stage and the collectives spread over
        them (interconnect/collectives.py), so its bytes are split evenly over them; charged to
        the one ring link, they showed links used up to 5x their bandwidth. Elsewhere, the ring
        link to the next socket of its stage carries them all."""
        lay = self.sim.layouts[rep.index]
        got = self._orders.get(rep.index)
        if got is None or got[0] is not lay:
            socks = [s for stage in lay.stages for s in stage]
            mesh = self.sim.cluster.topology.kind == "full_mesh"
            links = [(socks.index(s), (s, t), share)
                     for stage in lay.stages if len(stage) > 1
                     for s, targets, share in _sends(stage, mesh) for t in targets]
            got = self._orders[rep.index] = (lay, socks,
                                             [self.sim.cluster.node_of(s) for s in socks], links)
        return got[1], got[2], got[3]



def _sends(stage: tuple[int, ...], mesh: bool) -> list[tuple[int, list[int], float]]:
    """(socket, the sockets its bytes go to, the share each takes) for a stage of two or
    more: on a full mesh, every other socket of the stage, evenly; else the next one, all."""
    if mesh:
        return [(s, [t for t in stage if t != s], 1.0 / (len(stage) - 1)) for s in stage]
    return [(s, [stage[(pos + 1) % len(stage)]], 1.0) for pos, s in enumerate(stage)]
