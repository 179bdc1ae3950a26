"""Plan search speed: plans evaluated per second (footprint + per-stage decode cost on the
chip's execution model + collectives on the topology), cold (every cache of the evaluator
cleared first) and warm (the same search again: what a second query of a session costs).

    .venv/bin/python benchmarks/bench_plan_search.py [--cpu]

--cpu times the searches in this process's CPU seconds instead of wall seconds: on a machine
shared with other work, what the search itself costs.
"""

from __future__ import annotations

import sys
import time

from partitioning.evaluate import clear_caches, search_plans
from partitioning.footprint import Placement
from partitioning.scenario import Scenario
from rdu_cluster.config import load_cluster
from workloads.catalog import FP8_WEIGHTS, load_model

CASES = (  # model, precision, cluster
    ("llama-3.1-405b", None, "sn40l-16"),
    ("deepseek-v3", FP8_WEIGHTS, "sn40l-16"),
    ("qwen3-next-80b-a3b", None, "sn40l-16"),
    ("nemotron-h-56b", None, "sn40l-16"),
    ("llama-3.1-70b", None, "dgx-h100-2node"),
)


def main() -> None:
    clock = time.process_time if "--cpu" in sys.argv[1:] else time.perf_counter
    print(f"{'model':<20} {'cluster':<16} {'plans':>6} {'fit':>5} {'cold/s':>8} {'warm/s':>8}"
          + ("  (CPU seconds)" if clock is time.process_time else ""))
    total_n = total_t = 0.0
    for model, precision, cluster_name in CASES:
        spec, cluster = load_model(model, precision), load_cluster(cluster_name)
        speeds = []
        clear_caches()
        for _ in range(2):
            t = clock()
            r = search_plans(Scenario(spec, cluster, batch=1, prompt_len=8192, gen_len=256,
                                      placement=Placement()), "latency")
            dt = clock() - t
            speeds.append(r.evaluated / dt)
        total_n += r.evaluated
        total_t += r.evaluated / speeds[0]
        print(f"{model:<20} {cluster_name:<16} {r.evaluated:>6} {len(r.ranked):>5} "
              f"{speeds[0]:>8.0f} {speeds[1]:>8.0f}")
    print(f"overall (cold): {total_n / total_t:.0f} plans/s")


if __name__ == "__main__":
    main()
