"""Milliseconds a decode-table fill takes (chip/cost_tables.py: one batch size's step costs at the
CHUNK + 1 whole-token contexts of a chunk, one evaluation of the cost model), for the decode
pools of the capacity questions (bench_capacity.py): a capacity worker fills nearly every batch
size from 1 to the stack's cap once per plan, 3,701 fills in question 2 and 2,939 in question 3.

Each plan's tables for batches 1..BATCHES are filled in a fresh CostTables, first as a worker
meets them (`first`: the memo of the context-independent blocks empty for that batch), then
again in another (`again`: those blocks memoized), CPU time (time.process_time) per fill, best
of `--repeat` passes; the digest is of the first pass's tables (the same bits before and after
a change to the cost model's code is what a speed-up must keep).

    python benchmarks/bench_table_fill.py [--repeat N] [--batches B]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the rdu-cluster command sets it

from chip import dataflow
from chip.cost_tables import CostTables
from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.config import load_cluster
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from workloads import traces
from workloads.catalog import load_model
from workloads.dtypes import DType, Precision

# (cluster, plan, weights): decode pools and systems the capacity questions search
PLANS = (("sn40l-16", "tp8", "fp8"), ("sn40l-16", "tp16", "bf16"),
         ("dgx-h100", "tp4", "bf16"), ("hgx-h200", "tp2", "fp8"))


def _setup(cluster: str, plan: str, weights: str) -> tuple:
    """The chip and socket setup of the plan's first replica (a one-request run lays it out)."""
    trace = traces.synthetic(1, 1.0, "poisson", traces.LengthDist("fixed", 16),
                             traces.LengthDist("fixed", 4))
    model = load_model("llama-3.1-70b", Precision(weights=DType(weights)))
    sim = Simulation(model, load_cluster(cluster), trace, ServeConfig(plan=plan), LocalBackend())
    sim.run()
    setup = next(iter(sim.build.setups(sim.layouts[0], sim.plan).values()))
    return sim.cluster.chip, setup


def _pass(chip, setup, batches: int, digest=None) -> float:
    """CPU seconds a fill, over batches 1..`batches` in a fresh CostTables."""
    tables = CostTables(chip, setup.program, setup.comm_time)
    tables.warm()
    t0 = time.process_time()
    for b in range(1, batches + 1):
        table = tables._fill(b, 0)
        if digest is not None:
            digest.update(table.tobytes())
    return (time.process_time() - t0) / batches


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a positive whole number")
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=_positive, default=3)
    ap.add_argument("--batches", type=_positive, default=200)
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"llama-3.1-70b decode-table fills, batches 1-{args.batches}, best of {args.repeat}, "
          f"one process, {cores} cores visible")
    print(f"{'plan':24} {'first ms':>9} {'again ms':>9}  digest")
    for cluster, plan, weights in PLANS:
        chip, setup = _setup(cluster, plan, weights)
        digest = hashlib.sha1()
        first, again = [], []
        for k in range(args.repeat):
            dataflow._MEMOS.clear()  # a worker's first fill of a batch finds no block memoized
            first.append(_pass(chip, setup, args.batches, digest if k == 0 else None))
            again.append(_pass(chip, setup, args.batches))
        print(f"{cluster}:{plan} {weights:5} {min(first) * 1e3:>9.2f} {min(again) * 1e3:>9.2f}"
              f"  {digest.hexdigest()[:12]}")


if __name__ == "__main__":
    main()
