"""End to end: `rdu-cluster validate` runs the bundled table and exits 1 exactly when a case is
outside its tolerance; a table of cases that hold exits 0."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rdu_cluster.cli import main
from rdu_cluster.validation import published as v

REQUIRED = {"id", "source", "claim", "metric", "cluster", "kind", "published", "tolerance_basis"}


def test_bundled_cases_state_their_configuration_and_source():
    cases = v.load_cases()
    assert len({c["id"] for c in cases}) == len(cases)
    for c in cases:
        assert REQUIRED <= set(c), c["id"]
        assert ("model" in c) != ("models" in c), c["id"]
        assert c["metric"] in v.METRICS, c["id"]
        if c["kind"] in ("value", "range"):
            assert 0 < c["rtol"] < 1, c["id"]


def test_validate_json_runs_every_case_and_exit_code_matches():
    result = CliRunner().invoke(main, ["validate", "--json"])
    lines = [json.loads(line) for line in result.output.strip().splitlines()]
    assert [r["id"] for r in lines] == [c["id"] for c in v.load_cases()]
    for r in lines:
        assert {"published", "simulated", "error", "passed", "tolerance"} <= set(r)
    assert result.exit_code == (0 if all(r["passed"] for r in lines) else 1)


def test_validate_text_table_and_exit_codes(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(
        """
[[case]]
id = "weights"
source = "test"
claim = "Llama 3.1 8B weights: 14.96 GiB"
metric = "weight_gib"
model = "llama-3.1-8b"
cluster = "dgx-h100"
tp = 1
kind = "value"
published = 14.96
rtol = 0.02
tolerance_basis = "test"
"""
    )
    result = CliRunner().invoke(main, ["validate", "--cases", str(good)])
    assert result.exit_code == 0, result.output
    assert "weights" in result.output and "ok" in result.output
    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text().replace("published = 14.96", "published = 30.0"))
    result = CliRunner().invoke(main, ["validate", "--cases", str(bad)])
    assert result.exit_code == 1
    assert "FAIL" in result.output
