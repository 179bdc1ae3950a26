"""Intervals from held-out errors (rdu_cluster/validation/uncertainty.py): nested in the level,
oriented per figure, absent outside every measured regime, cross-validated coverage, and the
fields simulate / plan / serve print them in."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from rdu_cluster.validation import calibration
from rdu_cluster.validation import uncertainty as u
from tests.calibration_cases import SN40L_CHECK_ROW, SN40L_ROWS


def _samples(errors, chip="h100-sxm", kind="gpu", stack="vllm", regime="batch-1 decode",
             prefix="r", spread=0.0):
    return [u.Sample(f"{prefix}{i}", chip, kind, stack, regime, float(e), "check", spread)
            for i, e in enumerate(errors)]


def _model(samples):
    return u.Model(tuple(samples), {})


def _band(model, metric="tokens_per_s_per_request", regime="batch-1 decode", chip="h100-sxm",
          kind="gpu", stack="vllm", level=0.8):
    return model.band(metric=metric, chip=chip, kind=kind, stack=stack, regime=regime,
                      level=level)


def test_interval_widens_with_the_level():
    rng = np.random.default_rng(1)
    model = _model(_samples(rng.normal(0.05, 0.1, 40), spread=0.02))
    bands = [_band(model, level=lvl).bounds for lvl in (0.2, 0.5, 0.8, 0.9, 0.99)]
    for (lo1, hi1), (lo2, hi2) in itertools.pairwise(bands):
        assert lo2 <= lo1 < hi1 <= hi2
    assert bands[-1][0] < bands[0][0] and bands[-1][1] > bands[0][1]  # strictly, at the ends
    with pytest.raises(ValueError, match="level"):
        _band(model, level=1.0)


def test_a_time_is_the_speed_band_inverted():
    """A positive error is a simulator slower than measured: its speeds' band lies above the
    point, its times' and prices' below, each the other's reciprocal."""
    model = _model(_samples(np.linspace(0.1, 0.3, 20)))
    speed = _band(model).bounds
    for metric in ("tpot_s", "ttft_s", "cost_per_million_tokens_usd", "joules_per_token",
                   "p99_tpot_ms"):
        lo, hi = _band(model, metric=metric).bounds
        assert lo == pytest.approx(1 / speed[1]) and hi == pytest.approx(1 / speed[0])
    assert speed[0] > 1.0 and u.interval is not None
    with pytest.raises(ValueError, match="not a speed"):
        u.orientation("weight_gib")


def test_groups_fall_back_from_chip_and_stack_to_the_kind_then_to_none():
    samples = (_samples(np.zeros(8), stack="vllm")
               + _samples(np.full(8, 0.5), stack="tensorrt-llm", prefix="t")
               + _samples(np.full(8, 1.0), chip="a100-sxm-80gb", prefix="a", stack=None))
    model = _model(samples)
    assert "h100-sxm vllm batch-1 decode, 8" in _band(model).basis
    assert _band(model, stack="tensorrt-llm-0.11").bounds[0] == pytest.approx(math.exp(0.5))
    assert "h100-sxm batch-1 decode, 16" in _band(model, stack="sglang").basis
    assert "gpu chips batch-1 decode, 24" in _band(model, chip="h200-sxm").basis
    out = _band(model, chip="sn40l", kind="rdu", stack=None)
    assert out.bounds is None and "outside every measured regime" in out.basis
    prefill = _band(model, metric="ttft_s", regime="prefill")
    assert prefill.bounds is None and "prefill" in prefill.basis


def test_serving_takes_its_parts_where_it_has_too_few_rows():
    model = _model(_samples(np.full(10, 0.2), regime="large-batch decode")
                   + _samples(np.full(10, -0.1), regime="prefill", prefix="p"))
    thr = _band(model, metric="output_throughput", regime="serving")
    ttft = _band(model, metric="p99_ttft_ms", regime="serving")
    assert thr.basis.startswith("serving taken as") and "large-batch decode" in thr.basis
    assert thr.bounds[0] == pytest.approx(math.exp(0.2))
    assert ttft.bounds[0] == pytest.approx(math.exp(0.1)) and "prefill" in ttft.basis


def test_coverage_leaves_each_row_out_of_its_own_interval():
    """Nine rows of error 0 and one of 0.5: a 95% interval built with the 0.5 reaches it; built
    without it, [0, 0] misses it, and coverage counts it as missed."""
    samples = _samples([0.0] * 9 + [0.5])
    assert u.quantiles(samples, 0.95)[1] >= 0.5
    cov = u.coverage(samples, 0.95)
    whole = dict(cov["overall"])
    assert whole.pop("coverage_low") == pytest.approx(0.5958, abs=1e-4)  # Wilson, 9 of 10
    assert whole.pop("coverage_high") == pytest.approx(0.9821, abs=1e-4)
    assert whole == {"n": 10, "covered": 9, "coverage": 0.9, "no_interval": 0}
    assert cov["confidence"] == 0.95
    assert cov["by_group"]["h100-sxm batch-1 decode"]["covered"] == 9
    # a group that has too few rows once one is left out gives that row no interval
    few = u.coverage(_samples([0.0] * 8), 0.8)
    assert few["overall"]["n"] == 0 and few["overall"]["no_interval"] == 8


def test_a_coverage_figure_carries_wilsons_interval():
    """Wilson's 95% score interval: at none or all of n rows inside, its closed forms
    (z^2 / (n + z^2) and n / (n + z^2)); 4 of 6 worked by hand (centre 0.6016, half-width
    0.3016): a serving group of six with four inside is consistent with an 80% level, 133 of
    200 is not."""
    z2 = 1.959963984540054 ** 2
    assert u.wilson(0, 5) == (0.0, pytest.approx(z2 / (5 + z2)))
    assert u.wilson(5, 5) == (pytest.approx(5 / (5 + z2)), 1.0)
    lo, hi = u.wilson(4, 6)
    assert (lo, hi) == (pytest.approx(0.29999, abs=1e-5), pytest.approx(0.90323, abs=1e-5))
    assert lo < 0.8 < hi and not u.wilson(133, 200)[0] < 0.8 < u.wilson(133, 200)[1]
    assert u.wilson(2, 9) == pytest.approx(tuple(1 - x for x in reversed(u.wilson(7, 9))))
    empty = u.coverage(_samples([0.0] * 8), 0.8)["overall"]  # no row with an interval
    assert empty["coverage"] is None and empty["coverage_low"] is None


def test_validate_prints_each_coverage_with_its_interval():
    from rdu_cluster.validation.report import coverage_lines

    cov = u.coverage(_samples([0.0] * 9 + [0.5]), 0.95)
    line, = coverage_lines(cov)
    assert "with the coverage's 95% interval" in line
    assert "9/10 (90.0%, 60-98%)" in line and "batch-1 decode 9/10 (90.0%, 60-98%)" in line


def test_coverage_of_exchangeable_errors_is_near_the_level():
    rng = np.random.default_rng(7)
    samples = (_samples(rng.normal(0.0, 0.1, 150))
               + _samples(rng.standard_t(3, 150) * 0.2, chip="a100-sxm-80gb", prefix="a"))
    for level in (0.5, 0.8):
        c = u.coverage(samples, level)["overall"]["coverage"]
        assert level - 0.07 <= c <= level + 0.07


def test_columns_null_a_regime_without_rows_and_say_why(monkeypatch):
    model = _model(_samples(np.full(10, 0.1)))
    monkeypatch.setattr(u, "active_model", lambda: (model, ""))
    cols = u.columns({"tpot_s": np.array([0.01, 0.02]), "ttft_s": 0.5,
                      "tokens_per_s_per_request": np.array([100.0, 50.0])},
                     chip="h100-sxm", stack="vllm", batch=np.array([1, 64]))
    assert cols["tpot_s_low"][0] == pytest.approx(0.01 * math.exp(-0.1))
    assert math.isnan(cols["tpot_s_low"][1])  # batch 64: large-batch decode has no rows
    assert cols["ttft_s_low"] is None and "tokens_per_s_total_low" not in cols
    assert "prefill: none, outside every measured regime" in cols["interval_note"][0]
    assert "decode: h100-sxm vllm batch-1 decode" in cols["interval_note"][0]


@pytest.mark.slow
def test_calibrate_writes_the_model_beside_the_profile(sn40l_calibration):
    """The model is the command's output: held-out errors of the rows (the calibrate rows by
    leave-one-out), their parameter spread, under the profile's digest."""
    _, out = sn40l_calibration
    raw = json.loads(u.model_path(out).read_text())
    assert raw["profile_digest"] == u.digest(calibration.load(str(out)))
    assert "spread from 3 bootstrap refits" in raw["method"]  # the fixture's --resamples 3
    held = {s["id"]: s for s in raw["samples"]}
    assert set(held) >= {*SN40L_ROWS, SN40L_CHECK_ROW}
    assert {held[i]["held_out"] for i in SN40L_ROWS} == {"loo"}
    assert all(s["spread"] >= 0 for s in held.values())
    assert any(s["spread"] > 0 for s in held.values() if s["chip"] == "sn40l")


def test_the_quantile_is_numpys_to_the_last_bit():
    """uncertainty._quantile replaces np.quantile (which loads numpy.ma on every command): the
    same float for any sample size and level, the ends included."""
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 7, 16, 17, 160, 1001):
        x = np.sort(rng.normal(size=n) * rng.uniform(0.01, 10))
        for q in (0.0, 0.05, 0.1, 0.25, 0.5, 0.9, 0.95, 1.0, *rng.uniform(size=20)):
            assert u._quantile(x, float(q)) == float(np.quantile(x, q))
