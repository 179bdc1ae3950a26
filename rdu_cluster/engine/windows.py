"""Window execution: plan a replica's next window, run it on the sockets, combine their
replies into step times (engine/step_times.py), cut it where an arrival or a fault changes
the plan, and record it (engine/record.py).

A window is timed as it is planned where the next arrivals are known (engine/lookahead.py):
the sockets' times must then equal the planned ones, or the run stops with an internal error.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import numpy as np

from rdu_cluster.engine import lookahead
from rdu_cluster.engine.replica import Replica, Span, Window

if TYPE_CHECKING:
    from chip.cost_tables import CostTables
    from rdu_cluster.backends import Backend
    from rdu_cluster.engine.simulation import Simulation


class WindowExecutor:
    """Runs the windows of a Simulation (`sim`: its state, backend, dispatcher and tables)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.step_s: dict[int, float] = {}  # each replica's last step time (_costed's guess)

    def horizon(self, rep: Replica, plan) -> float:
        """When `plan` could change: the next pending fault, and, for a plan that is not
        saturated, the next arrival routed to this replica."""
        sim = self.sim
        h = min((f.time_s for f in sim.faults if f.time_s > sim.now), default=math.inf)
        if not plan.saturated:
            h = min(h, sim.dispatch.next_arrival(rep, sim.now))
        return h

    def execute(self, rep: Replica, t0: float) -> float | None:
        """Run replica `rep`'s next window from t0; returns when it ends (None: nothing to
        run)."""
        sim = self.sim
        if sim.recovery.reloads:
            sim.recovery.record_reload(rep.index, math.inf)
        clock = self.clock(rep, t0) if sim.lookahead else None
        window = rep.plan_window(lambda p: self.horizon(rep, p), clock)
        if not window.spans:
            return None
        sim.seq += 1
        res, step, ends = self._costed(rep, window, t0)
        m = len(step["time_s"])
        last = window.spans[-1]
        if clock is not None:
            _check_prediction(clock.predicted(), ends)
            sim.dispatch.timed(rep, clock.until)
        if last.cut_at < math.inf:  # the window's only span (Replica.plan_window)
            m = min(last.steps, int(np.searchsorted(ends, last.cut_at, side="left")) + 1)
            rep.advance(last, m)
            step = {k: v[:m] for k, v in step.items()}
            ends = ends[:m]  # a running sum: the first m ends do not depend on the rest
        step["start_s"] = lookahead.starts(t0, ends, window.resumes)
        step["kv_blocks"] = (window.kv_blocks(rep.kv.config.block_tokens) if sim.kv_steps
                             else None)
        end = sim.recorder.record(rep, window, step, res, t0, m, ends)
        for obs in sim.observers:
            obs.window(sim, rep, window, res, step, t0, m)
        sim.spawned += sim.dispatch.after_window(rep, window, ends, step["kv_blocks"])
        for r in rep.completed:
            sim.finished.add(r)
        rep.completed = []
        sim.windows += 1
        for hook in sim.hooks:
            hook(sim, sim.windows)
        return end

    def _costed(self, rep: Replica, window: Window, t0: float) -> tuple[dict, dict, np.ndarray]:
        """The sockets' replies, the step times and the steps' ends of the window. A span cut
        at an arrival (the window's only one) is planned to its natural end but runs to the
        first step boundary at or after the cut. Its steps are costed first as far as the cut
        at the replica's last step time, then four times more each round until they pass
        it (lookahead.in_rounds): in a pair's decode pool (an arrival about every step)
        a window ran 1.2 of the 32 steps it costed where expert loads are drawn (each step
        costed afresh), and a dense span planned 400 steps to its next completion filled the
        decode tables of every context chunk those steps reach. The steps costed are those a
        whole costing gives (each point costs what it costs alone, and the loads of a span's
        first k steps are the first k rows of its draw: expert_loads.ExpertLoadSampler), so
        the run is the same; only on a backend that takes a window's command again, longer,
        without applying its ops twice (`reruns`)."""
        sim = self.sim
        last = window.spans[-1]
        backend = cast("Backend", sim.backend)  # started with the run (Simulation.start)

        def cost() -> tuple[dict, dict, np.ndarray]:
            loads, load_max = self._loads(rep, window)
            res = backend.run(sim.seq, window.ops, window.columns(), loads, rep.sockets)
            step = sim.step_times.combine(sim.layouts[rep.index], window, res, rep.sockets)
            step["expert_load_max"] = load_max
            return res, step, lookahead.ends(t0, step["time_s"], window.resumes)

        if last.cut_at < math.inf and getattr(sim.backend, "reruns", False):
            res, step, ends = lookahead.in_rounds(last, t0, last.cut_at,
                                                  self.step_s.get(rep.index), cost,
                                                  lambda out: out[2][-1])
        else:
            res, step, ends = cost()
        if len(step["time_s"]):
            self.step_s[rep.index] = float(step["time_s"][-1])
        return res, step, ends

    def clock(self, rep: Replica, t0: float) -> lookahead.Clock:
        """The window's time as it is planned (engine/lookahead.py): the predicted replies
        combined as the sockets' are; arrivals taken from the dispatcher as time passes them."""
        sim = self.sim
        lay = sim.layouts[rep.index]
        # One stage of sockets that run one program: the step time is that program's, as
        # StepTimes.combine finds it (every socket equal, nothing to add but moves and copies).
        predictor = cast(lookahead.Predictor, sim.predictor)  # made by look_ahead, with the clock
        alone = predictor.shared(rep.sockets) if len(lay.stages) == 1 else None

        def row(tables: CostTables, sp: Span) -> np.ndarray:
            return tables.span_rows(sp.kind, len(sp.decode), sp.ctx_sum, sp.steps,
                                    (len(sp.prefill), sp.pre_tokens,
                                     sp.pre_prefix))[0]

        def time_of(spans: list) -> np.ndarray:
            if alone is not None and not any(sp.prefix_copy_s for sp in spans):
                if len(spans) == 1:
                    return row(alone, spans[0])
                alone.fill_prefill((len(sp.prefill), sp.pre_tokens, sp.pre_prefix)
                                   for sp in spans if sp.prefill)  # at once, as window() does
                return np.concatenate([row(alone, sp) for sp in spans])
            w = Window(spans, [])
            replies = predictor.replies(rep.sockets, w.columns())
            return sim.step_times.combine(lay, w, replies, rep.sockets)["time_s"]

        def step_times(sp: Span) -> list[float]:
            if alone is not None and not sp.prefix_copy_s:  # most calls, as Clock.steps times
                return alone.step_times(sp.kind, len(sp.decode), sp.ctx_sum, sp.steps,
                                        (len(sp.prefill), sp.pre_tokens, sp.pre_prefix))
            return time_of([sp]).tolist()

        until, back = sim.dispatch.known_until(rep, t0)
        return lookahead.Clock(t0, time_of, lambda: sim.dispatch.known_arrival(rep),
                               lambda t: self._deliver(rep, t), step_times, until, back,
                               self.step_s.get(rep.index))

    def _deliver(self, rep: Replica, t: float) -> None:
        """The requests that reach `rep` by t join its queue now, as their arrivals would."""
        sim = self.sim
        for r in sim.dispatch.take(rep, t):
            sim.finished.arrived(r, rep.index)
            sim.spawned += sim.admit_to_queue(rep, r)

    def _loads(self, rep: Replica, window: Window):
        """Each socket's expert load per step (None without expert parallelism) and the
        busiest group's, drawn per span (seeded by replica and step)."""
        sim = self.sim
        n = window.steps
        if sim.sampler is None:
            return None, np.ones(n)
        spec = sim.config.speculation
        per_decode = 1 if spec is None else spec.verify_tokens()  # tokens through the experts
        parts = []
        for sp in window.spans:
            tokens = len(sp.decode) * per_decode + sp.pre_tokens
            parts.append(sim.sampler.loads(rep.index, sp.first_step, tokens, sp.steps))
        loads = np.concatenate(parts)  # (steps, the run's ep)
        lay = sim.layouts[rep.index]
        stages = lay.stages[1:] if lay.draft_stage else lay.stages
        shard = lay.programs[stages[0][0]].shard  # the replica's degrees: a re-planned one
        if shard.ep < loads.shape[1]:  # (Recovery.smaller_plan) holds the experts in fewer groups
            loads = loads.reshape(len(loads), shard.ep, -1).mean(axis=2)
        out = {}
        for stage in stages:
            for pos, s in enumerate(stage):
                out[s] = np.ascontiguousarray(loads[:, pos // shard.expert_tp])
        return out, loads.max(axis=1)


def _check_prediction(predicted: np.ndarray, ends: np.ndarray) -> None:
    """The sockets' step times are the ones the window was planned with (engine/lookahead.py):
    otherwise the window is not what a step-by-step loop would have done."""
    n = len(predicted)
    # as lists: a window's few steps compare in a microsecond, np.array_equal's calls take five
    if predicted.tolist() != ends[:n].tolist():
        bad = int(np.flatnonzero(predicted != ends[:n])[0])
        raise RuntimeError(f"internal error: step {bad} of a window ended at {ends[bad]!r} s, "
                           f"planned with {predicted[bad]!r} s")
