"""Guaranteed no evict, TensorRT-LLM's scheduling: its capacity scheduler's default policy
(GUARANTEED_NO_EVICT: "guarantee that a started request is never paused", TensorRT-LLM docs,
"Useful Runtime Options"; the LLM API's SchedulerConfig default) over in-flight batching.
Continuous batching (engine/schedulers/continuous.py) that admits a request only where the KV
of its prompt and of its whole output fits, and reserves it at admission, so a running request
never grows past its blocks and none is ever preempted: fewer requests run at once than under
vLLM's policy (which admits on the prompt and preempts the newest when decodes run out of
blocks), and none is recomputed. Each step decodes every running sequence and, beside them,
prefills whole prompts as far as the token budget (max_num_tokens) holds them: in-flight
batching puts context requests and generation requests in one step, and without chunked
context (its default) a prompt is not split, one that does not fit waiting for the next step
(alone where it is past the whole budget, as the continuous policy takes it). With chunked
prefill, prompts are chunked as the continuous policy chunks them. The default scheduler of
the `tensorrt-llm` stacks (serving_stacks.SCHEDULERS).
"""

from __future__ import annotations

from rdu_cluster.engine.schedulers import register
from rdu_cluster.engine.schedulers.continuous import Continuous


@register
class GuaranteedNoEvict(Continuous):
    name = "guaranteed-no-evict"
    reserve = True
    mixes = True
