"""Guaranteed no evict (TensorRT-LLM's default capacity scheduler policy, GUARANTEED_NO_EVICT:
"guarantee that a started request is never paused", TensorRT-LLM docs, "Useful Runtime
Options"; the LLM API's SchedulerConfig default): continuous batching
(engine/schedulers/continuous.py) that admits a request only where the KV of its prompt and of
its whole output fits, and reserves it at admission, so a running request never grows past
its blocks and none is ever preempted. Fewer requests run at once than under vLLM's policy
(which admits on the prompt and preempts the newest when decodes run out of blocks), and none
is recomputed. The default scheduler of the `tensorrt-llm` stacks (serving_stacks.SCHEDULERS).
"""

from __future__ import annotations

from rdu_cluster.engine.schedulers import register
from rdu_cluster.engine.schedulers.continuous import Continuous


@register
class GuaranteedNoEvict(Continuous):
    name = "guaranteed-no-evict"
    reserve = True
