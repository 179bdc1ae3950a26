"""Shortest prompt first: continuous batching (engine/schedulers/continuous.py) that admits
the waiting requests in order of their prompt length, shortest first (arrival order among
equals), where the continuous policy admits them first come, first served. It lowers the mean
time to first token under a queue of mixed prompts (the shortest-job-first rule; vLLM's
priority scheduling can express it), at the cost of long prompts, which wait while shorter
ones keep arriving.

Its plans are saturated (StepPlan.saturated) only where no arrival could change them: the
batch is full, or nothing more will arrive. A plan stopped by the token budget or the free KV
blocks is not, unlike FCFS: a shorter prompt arriving would be admitted before the longer ones
it planned, or fit where the next one did not."""

from __future__ import annotations

from dataclasses import replace

from rdu_cluster.engine.schedulers import Limits, StepPlan, View, register
from rdu_cluster.engine.schedulers.continuous import Continuous


@register
class ShortestPromptFirst:
    name = "shortest-prompt-first"
    lockstep = True  # its decode steps decode every running sequence not prefilling

    def __init__(self, limits: Limits):
        self.limits = limits
        self.inner = Continuous(limits)

    def step(self, view: View) -> StepPlan:
        order = sorted(view.waiting, key=lambda r: (r.prompt_len, r.arrival_s, r.id))
        plan = self.inner.step(replace(view, waiting=order))
        if plan.preempt or plan.swap_in:
            return plan  # no new request joins such a step
        full = len(view.running) >= self.limits.max_batch
        return replace(plan, saturated=full or not view.more_arrivals)
