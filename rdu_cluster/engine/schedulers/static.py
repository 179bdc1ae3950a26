"""Static batching (FasterTransformer-style): a batch is admitted only when the previous one has
completely finished, prefilled in one step, then decoded until its last sequence ends. KV blocks
for prompt + output are reserved at admission, so a static batch is never preempted. The
baseline continuous batching is measured against; a plug-in in one file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rdu_cluster.engine.schedulers import Limits, StepPlan, View, register
from workloads.errors import ConfigError

if TYPE_CHECKING:
    from rdu_cluster.engine.requests import Request


@register
class Static:
    name = "static"
    lockstep = True  # its decode steps decode every running sequence not prefilling
    chunks = False  # each prompt whole, in one step (chunked_prefill_for)

    def __init__(self, limits: Limits):
        # limits it cannot honour are refused, not ignored
        if limits.chunked_prefill:
            raise ConfigError("--chunked-prefill: not with --scheduler static (a static batch "
                              "prefills each prompt whole, in one step)")
        if limits.preemption != "recompute":
            raise ConfigError(f"--preemption {limits.preemption}: not with --scheduler static "
                              "(a static batch reserves its KV and is never preempted)")
        self.limits = limits

    def step(self, view: View) -> StepPlan:
        if view.running:
            return StepPlan(decode=tuple(view.running), saturated=True)
        admit: list[Request]
        budget, free, admit = self.limits.token_budget, view.kv.free, []
        saturated = True
        for r in view.waiting:
            tokens = r.uncached
            need = view.kv.blocks_for(r.prompt_len + r.output_len)
            # a prompt past the whole budget goes alone (why: continuous.py, above _queue)
            if len(admit) == self.limits.max_batch or (tokens > budget and admit) \
                    or need > free:
                break
            admit.append(r)
            budget, free = budget - tokens, free - need
        else:
            saturated = len(admit) == self.limits.max_batch or not view.more_arrivals
        prefill = tuple((r, r.uncached) for r in admit)
        return StepPlan(prefill=prefill, admit=tuple(admit), saturated=saturated,
                        reserve_output=True)
