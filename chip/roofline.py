"""Roofline execution: each op takes max(compute, HBM traffic) at peak rates, nothing else.

The bound every other execution model is measured against ("% of roofline"): no launch,
synchronization or host cost, no efficiency loss, and no intermediate traffic (activations are
assumed to stay on chip). Collectives cost what the interconnect says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from chip.cost import StepCost
from chip.execution import CommTime, register
from chip.spec import ChipSpec
from workloads.errors import ConfigError
from workloads.ops import Graph, OpClass


class Roofline:
    name = "roofline"
    reads_params = False  # peak rates only: it runs on any chip (execution.check_runs_on)

    def check_params(self, table: Mapping[str, Any], where: str) -> None:
        if table:
            raise ConfigError(f"{where}.{min(table)}: the roofline model takes no parameters")

    def step_cost(
        self, graph: Graph, chip: ChipSpec, comm_time: CommTime, options: Any = None
    ) -> StepCost:
        bw = chip.hbm.bandwidth_bytes_per_s
        causes: dict[str, Any] = {}
        classes: dict[str, Any] = {}
        for block, op in graph.ops():
            if op.cls is OpClass.COLLECTIVE:
                t = block.repeat * np.asarray(comm_time(op.comm), dtype=float)
                _add(causes, "communication", t)
                _add(classes, op.cls.value, t)
                continue
            compute = op.flops / chip.flops(op.flop_dtype)
            streams = {
                "weight_streaming": op.weight_bytes / bw,
                "kv_streaming": (op.kv_read_bytes + op.kv_write_bytes) / bw,
            }
            memory = sum(streams.values())
            t = block.repeat * np.maximum(compute, memory)
            compute_bound = compute > memory
            _add(causes, "compute", np.where(compute_bound, t, 0.0))
            for cause, part in streams.items():
                share = np.divide(part, memory, out=np.zeros_like(t), where=memory > 0)
                _add(causes, cause, np.where(compute_bound, 0.0, t * share))
            _add(classes, op.cls.value, t)
        total = sum(classes.values(), np.zeros(()))
        return StepCost(
            time_s=total,
            by_cause=causes,
            by_class=classes,
            useful_hbm_bytes=graph.total("weight_bytes") + graph.total("kv_read_bytes"),
            flops=graph.total("flops"),
            kernels=np.zeros(()),
        )


def _add(acc: dict[str, Any], key: str, value: Any) -> None:
    acc[key] = acc.get(key, 0.0) + np.asarray(value, dtype=float)


register(Roofline())
