"""chip.memory: regions per tier, capacity, moves and their copy time, checkpoints."""

from __future__ import annotations

import pytest

from chip.memory import MemoryTiers, TierError
from rdu_cluster.config import load_cluster


@pytest.fixture
def mem():
    return MemoryTiers.of(load_cluster("sn40l-16").chip)


def test_allocate_resize_free_tracks_occupancy(mem):
    mem.allocate("weights/m/layers/0-79", "hbm", 8e9, "weights")
    mem.allocate("kv/1", "hbm", 1e6, "kv")
    mem.resize("kv/1", 3e6)
    assert mem.occupancy()["hbm"] == pytest.approx(8e9 + 3e6)
    assert mem.by_kind("hbm") == {"weights": 8e9, "kv": 3e6}
    mem.free("kv/1")
    assert mem.occupancy()["hbm"] == pytest.approx(8e9)


def test_capacity_and_unknown_names_are_errors(mem):
    with pytest.raises(TierError, match="does not fit"):
        mem.allocate("too-big", "hbm", 1e12)
    with pytest.raises(TierError, match="no tier"):
        mem.allocate("x", "l3", 1.0)
    with pytest.raises(TierError, match="no region"):
        mem.free("nothing")


def test_move_costs_bytes_at_the_slower_tier(mem):
    mem.allocate("kv/7", "hbm", 2e9, "kv")
    seconds = mem.move("kv/7", "ddr")
    assert seconds == pytest.approx(2e9 / 200e9)  # DDR 200 GB/s is slower than HBM 1.8 TB/s
    assert mem.regions["kv/7"].tier == "ddr"
    assert mem.occupancy()["hbm"] == 0 and mem.occupancy()["ddr"] == 2e9


def test_checkpoint_round_trip(mem):
    mem.allocate("a", "hbm", 1.0, "kv")
    mem.allocate("b", "ddr", 2.0, "kv")
    state = mem.state()
    other = MemoryTiers(tuple(mem.tiers.values()))
    other.restore(state)
    assert other.regions == mem.regions and other.occupancy() == mem.occupancy()
