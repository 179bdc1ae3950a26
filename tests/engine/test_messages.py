"""backends.messages: msgpack records are bit-exact; messages route with delivery times."""

from __future__ import annotations

import numpy as np
import pytest

from chip.cost_tables import Spans
from rdu_cluster.backends import messages as wire
from rdu_cluster.config import load_cluster


def test_command_and_result_round_trip_bit_exact():
    z = np.arange(3, dtype=np.int64)
    spans = Spans(z, z + 1, z + 2, z * 100, z, z, z, np.array([1.0, np.pi, 1e-300]))
    seq, ops, back = wire.unpack_command(wire.pack_command(7, [[["free", "kv/1"]], []], spans))
    assert seq == 7 and ops == [[["free", "kv/1"]], []]
    for name in ("kind", "steps", "ctx_sum", "expert_load"):
        assert np.array_equal(getattr(back, name), getattr(spans, name))
    rows = np.random.default_rng(0).random((12, 50))
    r, _m, occ = wire.unpack_result(wire.pack_result(rows, np.zeros(2), {"hbm": 1.5}))
    assert r.tobytes() == rows.tobytes() and occ == {"hbm": 1.5}


def test_router_delivery_time_is_latency_plus_bytes_over_bandwidth():
    router = wire.Router(load_cluster("sn40l-16"))
    msg = wire.Message(0, 5, "activations", np.array([0.0, 50e9]), 1.0)
    assert wire.Message.decode(msg.encode()).kind == "activations"
    t = router.route(msg.encode())
    assert t == pytest.approx([1.0 + 1e-6, 2.0 + 1e-6])  # full mesh: one hop, 50 GB/s
