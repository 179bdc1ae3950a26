"""The simulate runner on the real estimate: vectorized groups, infeasible points, the CLI
end to end, and the HTML report."""

from __future__ import annotations

import re

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from partitioning.estimate import estimate
from partitioning.scenario import Scenario
from rdu_cluster.cli import main
from rdu_cluster.config import load_cluster
from rdu_cluster.output import results
from rdu_cluster.sweep import LocalExecutor, expand, load_spec, read_manifest, run_sweep
from rdu_cluster.sweep.runners import run_simulate
from tests.sweep.helpers import write
from workloads.catalog import load_model
from workloads.errors import ConfigError

SPEC = """
[sweep]
name = "t"
[base]
model = "llama-3.1-8b"
gen_len = 128
[[axes]]
type = "zip"
cluster = ["sn40l-16", "dgx-h100"]
tp = [16, 8]
[[axes]]
type = "grid"
batch = [1, 4, 16]
prompt_len = [1024, 8192]
chip.tiers.hbm.bandwidth_bytes_per_s = [1.6e12, 1.8e12]
[[axes]]
type = "list"
points = [{ options.kernel_looping = true }, { options.kernel_looping = false }]
[filters]
drop = ["cluster == 'dgx-h100' and not options.kernel_looping"]
"""


def test_estimate_table_equals_records():
    est = estimate(Scenario(
        load_model("llama-3.1-8b"),
        load_cluster("sn40l-8"),
        batch=np.array([1.0, 3.0, 8.0]),
        prompt_len=np.array([512.0, 1000.0, 4096.0]),
    ))
    a = results.table(results.records(est, "sn40l", "dataflow"))
    b = results.estimate_table(est, "sn40l", "dataflow")
    assert a.equals(b)


def test_group_rows_equal_single_point_rows(tmp_path):
    points = expand(load_spec(write(tmp_path, SPEC))).points
    together = run_simulate(points, 0).table.sort_by("point_id")
    alone = [run_simulate([p], 0).table for p in points[:6]]
    for tbl in alone:
        pid = tbl.column("point_id")[0].as_py()
        row = together.filter(pc.equal(together.column("point_id"), pid))
        assert row.to_pylist() == tbl.to_pylist()


def test_nested_axes_reach_the_estimate(tmp_path):
    points = expand(load_spec(write(tmp_path, SPEC))).points
    df = run_simulate(points, 0).table.to_pandas()
    assert len(df) == 36
    assert set(df.chip_hbm_bandwidth_bytes_per_s) == {1.6e12, 1.8e12}
    fields = {p.id: p.fields for p in points}
    df["kl"] = [fields[i]["options.kernel_looping"] for i in df.point_id]
    df["bw"] = [fields[i]["chip.tiers.hbm.bandwidth_bytes_per_s"] for i in df.point_id]
    rdu = df[df.cluster == "sn40l-16"].set_index(["batch", "prompt_len", "bw", "kl"]).tpot_s
    assert (rdu.xs(False, level="kl") > rdu.xs(True, level="kl")).all()  # KL off is slower
    assert (rdu.xs(1.6e12, level="bw") > rdu.xs(1.8e12, level="bw")).all()  # less BW, slower


def test_infeasible_points_kept_as_rows_and_listed(tmp_path):
    body = """
[base]
model = "llama-3.1-70b"
cluster = "dgx-h100"
gen_len = 128
[[axes]]
type = "grid"
batch = [1, 8, 64, 256]
prompt_len = [1024, 130944]
"""
    spec = load_spec(write(tmp_path, body))
    points = expand(spec).points
    s = run_sweep(spec, points, tmp_path / "out", LocalExecutor(), progress=False)
    m = read_manifest(tmp_path / "out")
    assert s.rows == 8 and s.infeasible >= 2
    assert all("does not fit" in why for why in m.infeasible.values())
    rows = pq.read_table(tmp_path / "out").to_pandas().set_index("point_id")
    assert len(rows) == s.rows and (~rows.feasible).sum() == s.infeasible
    for p in points:  # every infeasible row is refused alone, with the manifest's reason
        out = run_simulate([p], 0)
        assert (p.id in out.infeasible) == (p.id in m.infeasible) == (not rows.feasible[p.id])
        if p.id in m.infeasible:
            assert rows.infeasible_reason[p.id] == m.infeasible[p.id]
            assert rows.tpot_s.isna()[p.id] and rows.hbm_used_bytes_per_socket[p.id] > 80e9


def test_cli_sweep_resume_and_report(tmp_path):
    path, out = write(tmp_path, SPEC), tmp_path / "out"
    r = CliRunner().invoke(main, ["sweep", str(path), "--out", str(out)])
    assert r.exit_code == 0, r.stderr
    assert "36 points" in r.output and "36 rows" in r.output
    # not a terminal: progress as plain lines (rate and ETA), the last one at 36/36
    assert re.search(r"^sweep: 36/36 points \(100%\) .*(points/s|s/points) .*ETA", r.stderr,
                     re.MULTILINE)
    assert "\r" not in r.stderr
    r = CliRunner().invoke(main, ["sweep", str(path), "--out", str(out), "--no-progress"])
    assert "ran 0 now, 36 finished before" in r.output
    changed = write(tmp_path, SPEC.replace("batch = [1, 4, 16]", "batch = [1, 4]"), "c.toml")
    r = CliRunner().invoke(main, ["sweep", str(changed), "--out", str(out)])
    assert r.exit_code == 2 and "different sweep" in r.stderr
    pytest.importorskip("plotly")
    html = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["report", str(out), "--out", str(html)])
    assert r.exit_code == 0, r.stderr
    assert "simulate dataset, 36 rows" in r.output
    drawn = re.findall(r'<div id="plot-\d+-([a-z_]+)"', html.read_text())
    # the spec varies a hardware figure (HBM bandwidth): each variant's ratio to the baseline
    assert drawn == ["roofline", "tokens_vs_batch", "ablation", "breakdown", "variant_ratio",
                     "pareto"]


def test_plan_kind_best_plan_per_point(tmp_path):
    body = """
[sweep]
kind = "plan"
[base]
model = "llama-3.1-8b"
cluster = "sn40l-8"
[[axes]]
type = "grid"
batch = [1, 4]
"""
    spec = load_spec(write(tmp_path, body))
    s = run_sweep(spec, expand(spec).points, tmp_path / "out", LocalExecutor(), progress=False)
    df = pq.read_table(tmp_path / "out").to_pandas()
    assert s.rows == 2 and sorted(df.batch) == [1, 4]
    assert (df.plans_feasible >= 1).all() and df.plan.str.len().min() > 0
    assert set(df.objective) == {"latency"}


def test_peak_flops_column_is_the_peak_the_estimate_used(tmp_path):
    """fp8 weights still multiply at the activations' dtype (bf16): the roofline's roof is that
    peak, not the fp8 one."""
    body = '[base]\nmodel = "llama-3.1-8b"\ncluster = "dgx-h100"\nweights = "fp8"\n'
    tbl = run_simulate(expand(load_spec(write(tmp_path, body))).points, 0).table
    chip = load_cluster("dgx-h100").chip
    assert chip.flops("fp8") > chip.flops("bf16")
    assert tbl.column("chip_peak_flops_per_s").to_pylist() == [chip.flops("bf16")]

@pytest.mark.parametrize("kind", ["simulate", "plan"])
def test_a_prompt_past_the_context_is_an_infeasible_point(tmp_path, kind):
    """As `simulate` and `plan --context` refuse it, and a serve sweep records it."""
    body = f"""
[sweep]
kind = "{kind}"
[base]
model = "llama-3.2-1b"
cluster = "sn40l-8"
gen_len = 8
[[axes]]
type = "grid"
prompt_len = [1024, 200000]
"""
    spec = load_spec(write(tmp_path, body))
    s = run_sweep(spec, expand(spec).points, tmp_path / "out", LocalExecutor(), progress=False)
    assert (s.rows, s.infeasible) == (2, 1)
    df = pq.read_table(tmp_path / "out").to_pandas().set_index("prompt_len")
    assert bool(df.feasible[1024]) and not df.feasible[200000]
    assert df.infeasible_reason[200000] == (
        "prompt_len: prompt 200,000 + output 8 tokens exceed the 131,072-token context of "
        "llama-3.2-1b (max_position_embeddings)")
    assert np.isnan(df.tpot_s[200000])


@pytest.mark.parametrize("extra, message", [
    ('plan = "xyz"', "base.plan: 'xyz' is not a plan; expected degrees like tp8"),
    ('plan = "tp4"\ntp = 4', "base.plan: not with tp (give one of them)"),
    # as `simulate --tp 3` refuses it: a plan the cluster cannot hold, not a point that misfits
    ("tp = 3", "base.tp: 3 does not divide the 8 sockets of sn40l-8"),
    ('plan = "tp4pp4"', ("base.plan: 'tp4pp4' uses 16 sockets, which does not divide the 8 "
     "sockets of sn40l-8")),
    ("[[axes]]\ntype = 'grid'\nsockets = [8, 6]\ntp = [4]",
     "axes[0].tp: 4 does not divide the 6 sockets of sn40l-8"),
    # the chip's [execution] table holds its own model's parameters, none of another's
    ("[[axes]]\ntype = 'grid'\nexecution_model = ['roofline', 'kernel_by_kernel']",
     ("axes[0].execution_model: 'kernel_by_kernel' reads parameters chip sn40l does not give "
      "(its [execution] table is for 'dataflow'); accepted on it: dataflow, roofline (the "
      "point with cluster 'sn40l-8': a filter can drop such points)")),
])
def test_a_plan_spec_error_is_refused_not_a_row(tmp_path, extra, message):
    body = f'[base]\nmodel = "llama-3.2-1b"\ncluster = "sn40l-8"\n{extra}\n'
    spec = load_spec(write(tmp_path, body))
    with pytest.raises(ConfigError) as e:
        run_sweep(spec, expand(spec).points, tmp_path / "out", LocalExecutor(), progress=False)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_roofline_runs_on_any_chip(tmp_path):
    """It reads no chip parameters (execution.check_runs_on): an RDU and a GPU point alike."""
    body = ('[base]\nmodel = "llama-3.2-1b"\nexecution_model = "roofline"\n[[axes]]\n'
            'type = "grid"\ncluster = ["sn40l-8", "dgx-h100"]\n')
    spec = load_spec(write(tmp_path, body))
    run_sweep(spec, expand(spec).points, tmp_path / "out", LocalExecutor(), progress=False)
    rows = pq.read_table(tmp_path / "out", columns=["feasible", "execution_model"]).to_pydict()
    assert rows["feasible"] == [True, True] and set(rows["execution_model"]) == {"roofline"}


def test_sweep_rows_carry_energy_and_cost_as_simulate_out(tmp_path):
    """A sweep's row of a point holds what `simulate --out` writes for it, the energy and cost
    columns included (they were null in every sweep row: the runner built the table without
    the cluster that prices them). Both run tp8: simulate's default is the best plan, a sweep's
    tensor parallelism over every socket, and the two need not agree."""
    spec = write(tmp_path, """
[sweep]
[base]
model = "llama-3.1-8b"
batch = 4
plan = "tp8"
[[axes]]
type = "list"
points = [{ cluster = "sn40l-8" }, { cluster = "dgx-h100" }]
""")
    out = tmp_path / "sim.parquet"
    runner = CliRunner()
    res = runner.invoke(main, ["simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-8",
                               "--cluster", "dgx-h100", "--batch", "4", "--plan", "tp8",
                               "--out", str(out)])
    assert res.exit_code == 0, res.output
    cli = {r["cluster"]: r for r in pq.read_table(out).to_pylist()}
    swept = {r["cluster"]: r for r in
             run_simulate(expand(load_spec(spec)).points, 0).table.to_pylist()}
    assert set(cli) == set(swept) == {"sn40l-8", "dgx-h100"}
    for name, row in cli.items():
        assert row["power_w"] is not None and row["cost_per_million_tokens_usd"] is not None
        for col, value in row.items():
            if isinstance(value, float):
                assert swept[name][col] == pytest.approx(value, rel=1e-12), (name, col)
            else:
                assert swept[name][col] == value, (name, col)
