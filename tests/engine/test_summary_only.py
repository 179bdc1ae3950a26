"""A summary-only run (capacity's verification, validate's throughput rows) keeps what its
summary reads: the sockets' KV regions are sized at admission and before a swap moves them,
not at every block a sequence grows (Replica.grows_regions), and every request's times are
the whole run's."""

from __future__ import annotations

import collections

import pytest

from chip.socket import Socket
from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.config import load_cluster
from rdu_cluster.engine import bench
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from workloads import traces
from workloads.catalog import load_model

CASES = {
    # a closed loop of 4 clients: sequences grow blocks window after window
    "growth": ("llama-3.1-8b", "sn40l-16", 16, traces.LengthDist("uniform", 64, 512),
               traces.LengthDist("uniform", 64, 256),
               {"plan": "tp8", "concurrency": 4}),
    # KV swapped to host memory: a move's seconds are its region's bytes over the link
    "swap": ("llama-3.1-70b", "dgx-h100", 32, traces.LengthDist("fixed", 2048),
             traces.LengthDist("fixed", 1024),
             {"plan": "tp4", "kv_memory_fraction": 0.02,
              "limits": Limits(max_batch=64, preemption="swap")}),
}


APPLY = Socket.apply


def _served(case: str, lean: bool, monkeypatch) -> tuple[object, collections.Counter]:
    model, cluster, n, prompt, output, config = CASES[case]
    verbs: collections.Counter = collections.Counter()

    def counted(self, ops):
        ops = list(ops)
        verbs.update(op[0] for op in ops)
        return APPLY(self, ops)

    monkeypatch.setattr(Socket, "apply", counted)
    trace = traces.synthetic(n, 1000.0, "poisson", prompt, output, seed=3)
    sim = Simulation(load_model(model), load_cluster(cluster), trace,
                     ServeConfig(seed=3, **config), LocalBackend())
    sim.summary_only = lean
    return sim.run(), verbs


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_summary_only_run_does_not_grow_the_sockets_kv_regions(case, monkeypatch):
    full, grown = _served(case, False, monkeypatch)
    lean, made = _served(case, True, monkeypatch)
    assert grown["resize"] > made["resize"] and made["alloc"] == grown["alloc"] > 0
    if case == "swap":  # a region is sized before each swap moves it
        swaps = sum(full.requests.column("swaps").to_pylist())
        assert swaps > 0 and made["resize"] == made["move"] / 2 == swaps
    else:
        assert made["resize"] == 0
    energy = ("energy_j", "cost_usd")
    assert lean.requests.drop_columns(energy).equals(full.requests.drop_columns(energy))
    left_out = {k for k in full.summary["bench"] if "_itl_" in k} | set(bench.PEAKS)
    same = lambda s: {k: v for k, v in s["bench"].items() if k not in left_out}
    assert same(lean.summary) == same(full.summary)
