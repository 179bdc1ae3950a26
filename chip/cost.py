"""StepCost: what every execution model returns for one forward pass of one socket's program.

Times are seconds, arrays broadcast over the design-point grid of the graph. `by_cause` and
`by_class` each partition `time_s`: their values add up to it, so a breakdown never invents or
loses time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from workloads.ops import Work

# Why time is spent. Memory time is split by what is streamed: weights, KV cache (or recurrent
# state), activations (intermediates that round-trip through HBM on a GPU or spill on an RDU).
CAUSES = (
    "weight_streaming",
    "kv_streaming",
    "activations",
    "compute",
    "communication",
    "collective_latency",  # each collective's fixed latency on a layer's dependency chain
    "router_wait",  # MoE: routed experts' weights stream only after the router's result
    # RDU: the HBM stream idle during a layer's dependency chain because the SRAM kept for the
    # next layer's prefetch is full (a deeper prefetch, i.e. more SRAM, would hide it)
    "prefetch_stall",
    "launch",
    "synchronization",
    "host",
    "worker_sync",  # a multi-process host engine handing each step to its other GPUs' workers
    "pipeline_fill",
    "ddr_streaming",  # weights or KV spilled to DDR, streamed after the HBM stream
    "pipeline_bubble",  # a pipeline stage waiting for the others
)


@dataclass(frozen=True)
class StepCost:
    time_s: Work
    by_cause: Mapping[str, Work] = field(default_factory=dict)
    by_class: Mapping[str, Work] = field(default_factory=dict)  # OpClass value or "overhead"
    useful_hbm_bytes: Work = 0.0  # weight + KV bytes the step must read from HBM at least once
    flops: Work = 0.0
    kernels: Work = 0.0  # kernel launches per step (1 per fused region; informative)

    def cause(self, name: str) -> Work:
        return self.by_cause.get(name, 0.0)

    def bound(self) -> np.ndarray:
        """The cause that takes most of the time, per design point ("memory" folds the three
        streaming causes together, "overhead" the launch/sync/host/fill ones)."""
        groups = {
            "memory": (
                "weight_streaming", "kv_streaming", "activations", "ddr_streaming", "router_wait",
                "prefetch_stall",
            ),
            "compute": ("compute",),
            "communication": ("communication", "collective_latency"),
            "overhead": ("launch", "synchronization", "host", "worker_sync", "pipeline_fill",
                         "pipeline_bubble"),
        }
        names = list(groups)
        stacked = np.stack(
            [
                np.broadcast_to(
                    np.asarray(sum((self.cause(c) for c in cs), 0.0), dtype=float),
                    np.shape(self.time_s),
                )
                for cs in groups.values()
            ]
        )
        return np.asarray(names, dtype=object)[np.argmax(stacked, axis=0)]
