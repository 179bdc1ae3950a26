"""Disaggregated serving: prefill and decode pools of different chips, the KV cache handed
over an inter-node fabric through the interconnect model."""

from __future__ import annotations

import numpy as np
import pytest

from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.config import load_fabric
from rdu_cluster.engine import disagg
from rdu_cluster.engine.simulation import ServeConfig
from workloads import graph, traces
from workloads.catalog import load_model
from workloads.errors import ConfigError

MODEL = "llama-3.1-8b"


def _run(n=24, rate=8.0, prefill="dgx-h100:tp8:1", decode="sn40l-16:tp8:2"):
    trace = traces.synthetic(n, rate, "poisson", traces.LengthDist("uniform", 64, 2048),
                             traces.LengthDist("uniform", 2, 64), seed=7)
    d = disagg.Disaggregated(load_model(MODEL), disagg.Pool.parse(prefill, "--prefill-pool"),
                             disagg.Pool.parse(decode, "--decode-pool"), load_fabric("ib-ndr"),
                             trace, ServeConfig(), LocalBackend)
    return d, d.run()


def test_transfer_time_is_the_fabric_ports_bottleneck():
    fab = load_fabric("ib-ndr")
    nbytes = np.array([0.0, 1e9])
    t = disagg.transfer_time(fab, 8, 16, nbytes)
    # 8 sending ports of 50 GB/s are the bottleneck; one NIC -> switch -> NIC traversal
    assert t == pytest.approx([fab.latency_s, fab.latency_s + 1e9 / (8 * 50e9)])
    assert disagg.transfer_time(fab, 16, 4, nbytes)[1] == pytest.approx(
        fab.latency_s + 1e9 / (4 * 50e9))


def test_disaggregated_run_hands_each_kv_over_and_counts_it_in_ttft():
    _, t = _run()
    r = t.requests.to_pydict()
    assert set(r["state"]) == {"done"} and r["generated_tokens"] == r["output_len"]
    per_token = float(graph.kv_cache_bytes(load_model(MODEL), 1, 1))
    sent = np.asarray(r["prompt_len"]) - 1
    assert np.allclose(r["kv_transfer_bytes"], sent * per_token)
    assert all(x > 0 for x in r["kv_transfer_s"])
    assert set(r["prefill_replica"]) == {0} and set(r["replica"]) == {1, 2}
    # TTFT covers the prefill on the H100s, the hand-over and the first decode step
    assert all(tt > m for tt, m in zip(r["ttft_s"], r["kv_transfer_s"]))
    s = t.steps.to_pydict()
    pre = np.asarray(s["replica"]) == 0
    # the prefill pool only prefills; the decode pool only decodes, every token included
    assert set(np.asarray(s["phase"])[pre]) == {"prefill"}
    assert set(np.asarray(s["phase"])[~pre]) == {"decode"}
    assert int(np.sum(np.asarray(s["decode_tokens"])[~pre])) == sum(r["output_len"])
    b = t.summary["bench"]
    assert b["completed"] == 24 and b["mean_tpot_ms"] > 0
    sk = t.sockets.to_pydict()
    assert max(sk["socket"]) == 8 + 16 - 1  # 8 H100s, then 16 SN40L sockets (2 x tp8)


@pytest.mark.parametrize("text", ["dgx-h100:tp8", "dgx-h100:tp8:0", "dgx-h100:tp8:x", "::1"])
def test_bad_pool_is_a_config_error(text):
    with pytest.raises(ConfigError, match="--prefill-pool"):
        disagg.Pool.parse(text, "--prefill-pool")


def test_closed_loop_is_refused():
    trace = traces.synthetic(4, 1.0, "poisson", traces.LengthDist("fixed", 64),
                             traces.LengthDist("fixed", 4))
    with pytest.raises(ConfigError, match="--concurrency"):
        disagg.Disaggregated(load_model(MODEL), disagg.Pool.parse("dgx-h100:tp8:1", "p"),
                             disagg.Pool.parse("sn40l-16:tp16:1", "d"), load_fabric("ib-ndr"),
                             trace, ServeConfig(concurrency=2), LocalBackend)
