"""Design points per second for decode estimates of Llama 3.1 70B on sn40l-16 over a grid of
(batch, context) points, evaluated as one numpy computation (target: >= 20,000 points/s on one
core). Prints the figure for the decode cost alone (operator graph + execution model) and for
the whole `estimate` (which also costs the prefill of every point)."""

from __future__ import annotations

import os
import time

import numpy as np

from chip import execution
from partitioning.estimate import estimate, tp_comm_time
from partitioning.scenario import Scenario
from rdu_cluster.config import load_cluster
from workloads import graph as graphs
from workloads.catalog import load_model
from workloads.ops import Shard, StepShape

BATCHES = np.arange(1, 41, dtype=float)[:, None]  # 40
CONTEXTS = np.linspace(512, 32768, 50)[None, :]  # 50 -> 2,000 points


def _rate(fn, points: int, repeats: int = 20) -> float:
    fn()  # warm caches and imports
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return points / best


def main() -> None:
    model, cluster = load_model("llama-3.1-70b"), load_cluster("sn40l-16")
    points = BATCHES.size * CONTEXTS.size
    comm = tp_comm_time(cluster, cluster.sockets)
    shard = Shard.tensor(cluster.sockets)

    def decode():
        g = graphs.step_graph(model, StepShape.decode(BATCHES, CONTEXTS), shard)
        return execution.step_cost(g, cluster.chip, comm)

    def whole():
        return estimate(Scenario(model, cluster, batch=BATCHES, prompt_len=CONTEXTS, gen_len=1))

    assert np.shape(decode().time_s) == (BATCHES.size, CONTEXTS.size)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"llama-3.1-70b on sn40l-16, grid {BATCHES.size} batches x {CONTEXTS.size} contexts "
        f"= {points:,} points, one process (numpy single-threaded work), {cores} cores visible"
    )
    print(f"decode step cost:          {_rate(decode, points):>12,.0f} design points/s")
    print(f"estimate (decode+prefill): {_rate(whole, points):>12,.0f} design points/s")


if __name__ == "__main__":
    main()
