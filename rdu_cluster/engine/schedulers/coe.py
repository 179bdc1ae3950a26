"""Composition of Experts: a step runs one expert, so a batch holds requests of one expert only.

The expert in use is that of the running (or swapped) sequences; when none is running, the next
expert is that of the oldest waiting request (FIFO over the router's verdicts, as [MICRO24]'s
serving loop), and every waiting request of it is admitted together (within the limits). The
engine brings it into HBM first (a region copy on every socket, rdu_cluster/scenarios/coe.py
ExpertResidency) and the step waits for the copy. While an expert runs, its newly routed
requests join the batch (continuous batching) only as long as no request of another expert is
waiting: then the batch drains and the oldest waiting request's expert comes next, so a popular
expert cannot starve the others. Within the chosen expert, the plan is the continuous policy's.
"""

from __future__ import annotations

from dataclasses import replace

from rdu_cluster.engine.schedulers import Limits, StepPlan, View, register
from rdu_cluster.engine.schedulers.continuous import Continuous


@register
class CoE:
    name = "coe"

    def __init__(self, limits: Limits):
        self.limits = limits
        self.inner = Continuous(limits)

    def step(self, view: View) -> StepPlan:
        expert = _expert(view)
        if expert < 0:
            return StepPlan(saturated=False)  # nothing to run: an arrival would change that
        busy = bool(view.running or view.swapped)
        mine = tuple(r for r in view.waiting if r.expert == expert)
        others = len(mine) < len(view.waiting)
        if busy and others:  # drain: admit nothing more of this expert, whatever arrives
            plan = self.inner.step(replace(view, waiting=(), more_arrivals=False))
        else:
            plan = self.inner.step(replace(view, waiting=mine))
            if busy and plan.admit and view.more_arrivals:
                # a request of another expert arriving would start the drain: this plan's
                # admissions would not be made (StepPlan.saturated)
                plan = replace(plan, saturated=False)
        return replace(plan, expert=expert)


def _expert(view: View) -> int:
    for group in (view.running, view.swapped, view.waiting):
        if group:
            return group[0].expert
    return -1
