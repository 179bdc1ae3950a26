"""Static batching (FasterTransformer-style): a batch is admitted only when the previous one has
completely finished, prefilled in one step, then decoded until its last sequence ends. KV blocks
for prompt + output are reserved at admission, so a static batch is never preempted. The
baseline continuous batching is measured against; a plug-in in one file."""

from __future__ import annotations

from rdu_cluster.engine.schedulers import Limits, StepPlan, View, register
from workloads.errors import ConfigError


@register
class Static:
    name = "static"
    lockstep = True  # its decode steps decode every running sequence not prefilling

    def __init__(self, limits: Limits):
        if limits.chunked_prefill:
            # A static batch prefills in one step: a prompt over the token budget, no longer
            # refused as it arrives when prompts may be chunked, was never admitted (every
            # request left 'waiting', no reason, exit 0).
            raise ConfigError("--chunked-prefill: not with --scheduler static (a static batch "
                              "prefills its prompts in one step; continuous and coe chunk them)")
        self.limits = limits

    def step(self, view: View) -> StepPlan:
        if view.running:
            return StepPlan(decode=tuple(view.running), saturated=True)
        budget, free, admit = self.limits.token_budget, view.kv.free, []
        saturated = True
        for r in view.waiting:
            tokens = r.uncached
            need = view.kv.blocks_for(r.prompt_len + r.output_len)
            if len(admit) == self.limits.max_batch or tokens > budget or need > free:
                break
            admit.append(r)
            budget, free = budget - tokens, free - need
        else:
            saturated = len(admit) == self.limits.max_batch or not view.more_arrivals
        prefill = tuple((r, r.uncached) for r in admit)
        return StepPlan(prefill=prefill, admit=tuple(admit), saturated=saturated,
                        reserve_output=True)
