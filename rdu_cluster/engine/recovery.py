"""What a fault does to a running simulation: a degraded socket or link slows its group; a
failed socket takes its replica down, which is re-planned on its healthy sockets (weights
reloaded: a recovery row in the steps table) or refuses its requests.

The faults themselves (their syntax and kinds) are engine/faults.py.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import numpy as np

from chip.memory import MemoryTiers
from rdu_cluster.backends import Backend, SocketSetup
from rdu_cluster.engine import energy, metrics
from rdu_cluster.engine import plan as plans
from rdu_cluster.engine.events import Event
from rdu_cluster.engine.faults import LINK_DETOUR_FACTOR, Fault
from rdu_cluster.engine.replica import Replica
from rdu_cluster.engine.requests import UNSERVED
from workloads.errors import ConfigError

if TYPE_CHECKING:
    from rdu_cluster.engine.simulation import Simulation


class Recovery:
    """Applies the faults of a Simulation (`sim`) and re-plans the replicas they take down."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.failed: set[int] = set()
        self.home: dict[int, tuple[int, ...]] = {}  # each replica's sockets at the start
        self.late_fault = False  # a fault came after every request was through
        # replica -> its weight reload's recovery row, recorded when the replica runs again (or
        # at the end): a failure during the reload cuts it short first
        self.reloads: dict[int, dict] = {}
        self.degradation: dict[int, list[float]] = {}

    def apply(self, f: Fault) -> list[Event]:
        """Apply fault `f` now; returns what it sends (refusals in a closed loop)."""
        if self.sim.finished.count == len(self.sim.trace):
            # Every request is through: the run is over, and a fault now changes nothing it
            # measures (applied, a failure's reload stretched the duration to the fault's time).
            self.late_fault = True
            return []
        if f.target == "link":
            factor = LINK_DETOUR_FACTOR if f.kind == "failed" else 1.0 / f.fraction
            for lay in self.sim.layouts.values():
                for stage in lay.stages:
                    if f.a in stage and f.b in stage:
                        for s in stage:
                            self._degrade(s, comm=factor)
            return []
        if f.kind == "degraded":
            self._degrade(f.a, compute=1.0 / f.fraction)
            return []
        return self._fail_socket(f.a)

    def _degrade(self, s: int, compute: float | None = None, comm: float | None = None) -> None:
        d = self.degradation.setdefault(s, [1.0, 1.0])
        d[0] = compute if compute is not None else d[0]
        d[1] = max(d[1], comm) if comm is not None else d[1]
        if s not in self.failed:  # a fault comes as the run runs: its backend started
            cast(Backend, self.sim.backend).set_fault(s, d[0], d[1], False)

    def work_end(self) -> float:
        """When the run's work ended: its last step (a recovery row's reload included) or its
        last refusal."""
        return max([self.sim.refused_s, *(max(rep.window_end, rep.down_until)
                                          for rep in self.sim.replicas)])

    def _fail_socket(self, s: int) -> list[Event]:
        # Sockets failing at the same instant fail together: the group is re-planned once on
        # what survives them all (one by one, each re-plan reloaded weights onto a socket
        # failing at that instant, in recovery rows overlapping in time).
        sim = self.sim
        for x in [s, *(g.a for g in sim.faults if g.time_s == sim.now and g.target == "socket"
                       and g.kind == "failed")]:
            if x not in self.failed:
                self.failed.add(x)
                cast(Backend, self.sim.backend).set_fault(x, 1.0, 1.0, True)  # started
        out = []
        for rep in self.sim.replicas:
            if s in rep.sockets:
                out += self._route_around(rep)
        return out

    def _route_around(self, rep: Replica) -> list[Event]:
        """Re-plan the replica on its healthy sockets, or refuse its requests; returns what the
        refusals send (closed loop)."""
        # The healthy sockets of those the replica started on: a second failure re-plans over
        # them all, not only over the smaller group the first one left.
        healthy = tuple(x for x in self.home[rep.index] if x not in self.failed)
        new = self.smaller_plan(len(healthy))
        rep.drop_all_kv()
        if new is None:
            rep.refused = "a socket of its replica failed and no plan fits the remaining sockets"
            return [e for r in rep.refuse_all(rep.refused) for e in self.sim.refused(r)]
        sim = self.sim
        lay = sim.build.with_draft(plans.layouts(sim.model, sim.cluster, new, sim.config.options,
                                                 sim.config.execution_model,
                                                 sockets=healthy[: new.group])[0])
        setups = sim.build.setups(lay, new)
        backend = cast(Backend, sim.backend)  # a fault comes as the run runs: started
        for s, setup in setups.items():
            backend.reprogram(s, setup)
            d = self.degradation.get(s)
            if d:
                backend.set_fault(s, d[0], d[1], False)
        sim.layouts[rep.index] = lay
        rep.sockets, rep.kv = list(lay.sockets), sim.build.kv(lay)
        out = []
        for r in list(rep.waiting):
            if sim.refusal(rep, r):
                rep.waiting.remove(r)
                r.state, r.reason = UNSERVED, sim.refusal(rep, r)
                out += sim.refused(r)
        self._recovery(rep, setups)
        return out

    def smaller_plan(self, healthy: int) -> plans.PlanSpec | None:
        """The widest plan of half, a quarter, ... of the run's tensor-parallel degree that
        fits `healthy` sockets (None: none does, or the plan has pipeline stages)."""
        plan = self.sim.plan
        if plan.pp > 1:
            return None  # re-staging a pipeline is left to partitioning/
        tp = plan.tp // 2
        while tp >= 1:
            if tp <= healthy:
                cand = replace(plan, tp=tp, ep=math.gcd(plan.ep, tp), adp=math.gcd(plan.adp, tp))
                try:
                    if not self.sim.build.footprint(cand, check=False)[1]:
                        return cand
                except ConfigError:  # a degree the model does not divide: try the next
                    pass
            tp //= 2
        return None

    def _recovery(self, rep: Replica, setups: dict[int, SocketSetup]) -> None:
        """The re-planned group reloads its weights: a recovery row in the steps table."""
        mem = MemoryTiers.of(self.sim.cluster.chip)
        weights = max(op[3] for s in setups.values() for op in s.weights)
        reload_s = mem.copy_time(weights, self.sim.build.swap_tier(), "hbm")
        start = max(self.sim.now, rep.window_end)
        self.record_reload(rep.index, start)  # a reload still running stops where this starts
        rep.down_until = start + reload_s
        cols = {f.name: np.zeros(1) for f in metrics.STEPS}
        cols.update({"replica": np.array([rep.index]), "step": np.array([rep.step]),
                     "window": np.array([self.sim.windows]), "phase": np.array(["recovery"]),
                     "start_s": np.array([start]), "time_s": np.array([reload_s]),
                     "straggler_socket": np.array([-1]), "expert_load_max": np.ones(1),
                     "expert": np.array([-1]), "sockets": np.array([len(setups)])})
        for name in ("batch", "prefill_tokens", "decode_tokens", "emitted_tokens"):
            cols[name] = np.zeros(1, dtype=np.int64)
        # The reloading sockets draw idle power (the copy's energy beyond idle is not modelled).
        cols.update(energy.step_columns(self.sim.rates, None, len(setups), cols["time_s"]))
        self.reloads[rep.index] = cols

    def record_reload(self, index: int, until: float) -> None:
        """Record replica `index`'s pending recovery row, cut at `until` if its reload was still
        running then (another failure re-planned the group: recorded whole, the two reloads'
        rows overlapped in time, and their idle energy was counted twice); a reload cut before
        it began leaves no row."""
        cols = self.reloads.pop(index, None)
        if cols is None:
            return
        start, reload_s = float(cols["start_s"][0]), float(cols["time_s"][0])
        if until < start + reload_s:
            if until <= start:
                return
            cols["time_s"] = np.array([until - start])
            cols.update(energy.step_columns(self.sim.rates, None, int(cols["sockets"][0]),
                                            cols["time_s"]))
        self.sim.rec.add_steps(index, cols)
        for obs in self.sim.observers:  # a timeline draws the reload (output/timeline.py)
            if hasattr(obs, "recovery"):
                obs.recovery(self.sim, index, float(cols["start_s"][0]),
                             float(cols["time_s"][0]))

