"""engine/step_times.py: a window's step times from its sockets' replies; the shortcut for one
stage that sent one reply and moved nothing (StepTimes._one_reply) gives the bits of the
general combination."""

from __future__ import annotations

import numpy as np
import pytest

from rdu_cluster.engine import step_times
from tests.engine.test_lockstep import PRESSURE, _disagg

CASES = {
    "tp4": {"cluster": "sn40l-16", "plan": "tp4", "n": 40, "rate": 40.0},
    "pp2": {"cluster": "sn40l-16", "plan": "tp8pp2", "n": 30, "rate": 40.0},
    "swap": PRESSURE["swap"],  # KV swapped out and in: moves before their steps
    "disaggregated": None,
}


@pytest.mark.parametrize("case", CASES)
def test_one_reply_gives_the_general_combinations_bits(serve, case, monkeypatch):
    kw = CASES[case]
    run = _disagg if kw is None else (lambda: serve(**kw))
    combine, one = step_times.StepTimes.combine, step_times.StepTimes._one_reply
    taken = []

    def general(self, *args):
        return None

    def spy(self, lay, window, res, sockets):
        got = combine(self, lay, window, res, sockets)
        taken.append(one(self, window, res, lay.stages[0], sockets) is not None
                     and len(lay.stages) == 1 and not lay.draft_stage)
        monkeypatch.setattr(step_times.StepTimes, "_one_reply", general)
        try:
            want = combine(self, lay, window, res, sockets)
        finally:
            monkeypatch.setattr(step_times.StepTimes, "_one_reply", one)
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert np.array_equal(got[k], v) and np.ascontiguousarray(got[k]).tobytes() \
                == np.ascontiguousarray(v).tobytes(), k
        return got

    monkeypatch.setattr(step_times.StepTimes, "combine", spy)
    run()
    if case == "pp2":  # two stages: the general combination only
        assert taken and not any(taken)
    else:
        assert any(taken)
        if case == "swap":  # a swap's moves: the general one there
            assert not all(taken)
