"""The intervals as the commands print them (simulate, plan, serve, validate) with the shipped
uncertainty model (cluster_configs/calibration/default.uncertainty.json)."""

from __future__ import annotations

import json
import re
from typing import cast

import pyarrow as pa
import pytest
from click.testing import CliRunner

from rdu_cluster.cli import main
from rdu_cluster.validation import calibration
from rdu_cluster.validation import uncertainty as u


def test_shipped_model_belongs_to_the_shipped_profile():
    """`rdu-cluster calibrate` writes both; a profile refitted without its model (or a model
    edited by hand) is caught here, not by intervals silently missing."""
    profile = calibration.load(calibration.DEFAULT)
    path = u.model_path(calibration.profile_path(calibration.DEFAULT))
    raw = json.loads(path.read_text())
    assert raw["profile_digest"] == u.digest(profile)
    assert raw["measurements_version"] == profile.meta["measurements_version"]
    assert len(raw["samples"]) >= 100 and raw["spread"]


def _simulate(*args):
    r = CliRunner().invoke(main, ["simulate", "--model", "llama-3.1-8b", *args])
    assert r.exit_code == 0, r.output
    return r.output


def test_simulate_json_and_arrow_carry_bounds_and_rdu_prefill_is_null(tmp_path):
    rows = [json.loads(line) for line in _simulate(
        "--cluster", "dgx-h100", "--cluster", "sn40l-16", "--tp", "8", "--json").splitlines()]
    gpu, rdu = rows
    for key in ("tokens_per_s_per_request", "tpot_s", "ttft_s", "cost_per_million_tokens_usd"):
        assert 0 < gpu[f"{key}_low"] < gpu[f"{key}_high"], key
    assert gpu["tpot_s_low"] * gpu["tokens_per_s_per_request_high"] == pytest.approx(1.0)
    assert 0 < rdu["tpot_s_low"] < rdu["tpot_s_high"]
    assert rdu["ttft_s_low"] is None and rdu["ttft_s_high"] is None
    assert "prefill: none" in rdu["interval_note"]
    out = tmp_path / "r.arrow"
    _simulate("--cluster", "dgx-h100", "--tp", "8", "--out", str(out))
    with pa.OSFile(str(out)) as f:
        tbl = pa.ipc.open_file(f).read_all()
    assert {"tpot_s_low", "tpot_s_high", "interval_note"} <= set(tbl.column_names)
    assert tbl.column("tpot_s_low")[0].as_py() == pytest.approx(gpu["tpot_s_low"])


def test_simulate_text_shows_figure_low_high_and_the_basis():
    text = _simulate("--cluster", "dgx-h100", "--cluster", "sn40l-16", "--tp", "8")
    assert re.search(r"tokens/s per request +[\d,.]+ \([\d,.]+-[\d,.]+\)", text)
    assert "intervals, sn40l-16: 80% intervals" in text and "prefill: none" in text


def test_calibration_none_gives_no_interval_and_says_so():
    row = json.loads(_simulate("--cluster", "dgx-h100", "--tp", "8", "--json",
                               "--calibration", "none"))
    assert row["tpot_s_low"] is None
    assert "--calibration none" in row["interval_note"]


def test_plan_json_and_text_carry_the_speeds_intervals():
    r = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-8b", "--cluster", "dgx-h100",
                                  "--top", "2", "--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.output.splitlines()[0])
    assert 0 < row["tokens_per_s_total_low"] < row["tokens_per_s_total_high"]
    assert row["tpot_s_low"] * row["tokens_per_s_per_request_high"] == pytest.approx(1.0)
    text = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-8b", "--cluster", "dgx-h100",
                                     "--top", "2"]).output
    assert re.search(r"[\d,.]+ \([\d,.]+-[\d,.]+\)", text) and "intervals: 80% intervals" in text


def test_serve_json_bands_every_throughput_and_latency_figure(tmp_path):
    r = CliRunner().invoke(main, ["serve", "--model", "llama-3.1-8b", "--cluster", "dgx-h100",
                                  "--plan", "tp1", "--requests", "40", "--rate", "4", "--json",
                                  "--no-progress", "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    for key in ("output_throughput", "request_throughput", "mean_ttft_ms", "p99_tpot_ms",
                "median_e2el_ms", "cost_per_million_tokens_usd"):
        assert 0 < doc[f"{key}_low"] < doc[f"{key}_high"], key
    assert "serving taken as" in doc["interval_note"]  # 6 serving rows: fewer than 8
    assert "std_ttft_ms_low" not in doc and "completed_low" not in doc
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["p99_tpot_ms_high"] == doc["p99_tpot_ms_high"]


def _pair_serve(tmp_path, decode: str) -> dict:
    r = CliRunner().invoke(main, ["serve", "--model", "llama-3.1-8b", "--prefill-pool",
                                  "dgx-h100:tp1:1", "--decode-pool", decode, "--requests", "40",
                                  "--rate", "4", "--json", "--no-progress",
                                  "--out", str(tmp_path / decode)])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_serve_pair_bands_each_figure_by_the_pool_that_sets_it(tmp_path):
    """A disaggregated run's first-token figures take the prefill pool's band, its per-token
    figures and throughputs the decode pool's (as capacity's pair rows: intervals.bands), and
    a figure of both pools (E2E, energy, price) none, saying so."""
    gpu = _pair_serve(tmp_path, "hgx-h200:tp1:1")
    def serving(key: str, chip: str) -> u.Band:  # under the profile serve ran with
        with calibration.use(calibration.load(calibration.DEFAULT)):
            return u.band(metric=key, chip=chip, stack="sglang", regime="serving")

    for key, chip in (("p99_ttft_ms", "h100-sxm"), ("mean_tpot_ms", "h200-sxm"),
                      ("p99_itl_ms", "h200-sxm"), ("output_throughput", "h200-sxm")):
        lo, hi = cast(tuple, serving(key, chip).bounds)
        assert (gpu[f"{key}_low"], gpu[f"{key}_high"]) == (gpu[key] * lo, gpu[key] * hi), key
    assert serving("p99_ttft_ms", "h100-sxm").bounds != serving("p99_ttft_ms", "h200-sxm").bounds
    for key in ("mean_e2el_ms", "joules_per_token", "cost_per_million_tokens_usd"):
        assert gpu[f"{key}_low"] is None and gpu[f"{key}_high"] is None, key
    assert "E2E, energy and price (both pools): none" in gpu["interval_note"]
    rdu = _pair_serve(tmp_path, "sn40l-16:tp4:1")  # no held-out RDU serving rows
    lo, hi = cast(tuple, serving("p99_ttft_ms", "h100-sxm").bounds)
    assert (rdu["p99_ttft_ms_low"], rdu["p99_ttft_ms_high"]) == (rdu["p99_ttft_ms"] * lo,
                                                                  rdu["p99_ttft_ms"] * hi)
    assert rdu["p99_tpot_ms_low"] is None and rdu["output_throughput_high"] is None
    assert ("per token and throughput (decode pool): none, outside every measured regime"
            in rdu["interval_note"])


def test_pool_of_names_the_pool_that_sets_each_serving_figure():
    assert [u.pool_of(k) for k in ("p99_ttft_ms", "mean_tpot_ms", "median_itl_ms",
                                   "output_throughput", "request_throughput",
                                   "total_token_throughput", "mean_e2el_ms",
                                   "joules_per_token", "cost_per_million_tokens_usd")] == [
        u.PREFILL_POOL, u.DECODE_POOL, u.DECODE_POOL, u.DECODE_POOL, u.DECODE_POOL,
        u.DECODE_POOL, None, None, None]
