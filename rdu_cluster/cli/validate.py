"""`rdu-cluster validate`: the measurement reference set, measured vs simulated, with errors,
grouped as calibrate and check rows, with leave-one-out cross-validation of the calibration."""

from __future__ import annotations

import json
import sys

import click

from rdu_cluster import processes
from rdu_cluster.cli.options import calibration_option
from rdu_cluster.output.report import text_table
from rdu_cluster.validation import published as v
from rdu_cluster.validation import report as vr


@click.command()
@calibration_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object: rows, leave-one-out, summary.")
@click.option(
    "--cases", "cases_path", default=None, help="A measurements TOML other than the bundled one."
)
@click.option("--no-loo", is_flag=True, help="Skip the leave-one-out refits.")
@click.option("--jobs", "n_jobs", type=click.IntRange(1, 1024), default=None,
              help="Processes to run the rows and refits in (default: the cores this process "
                   "may use); the same report whatever the number.")
def validate(as_json: bool, cases_path: str | None, no_loo: bool, n_jobs: int | None) -> None:
    """Run every row; exit 1 if any is outside its stated tolerance (a row's tolerance is a claim
    about the simulator, so a miss is a failure whatever its role)."""
    where = f"--cases {cases_path}" if cases_path else "measurements.toml"
    jobs = n_jobs if n_jobs is not None else processes.available_cores()
    report = vr.build(v.load_cases(cases_path), loo=not no_loo, where=where, jobs=jobs)
    if as_json:
        click.echo(json.dumps(report.as_dict(), default=float))
    else:
        for role in ("calibrate", "check"):
            rows = [
                [
                    r.id,
                    r.group,
                    v.format_value(r.published),
                    v.format_value(r.simulated),
                    "" if r.error is None else f"{r.error:+.1%}",
                    vr.loo_cell(report, r.id),
                    r.tolerance,
                    "ok" if r.passed else "FAIL",
                ]
                for r in report.results
                if r.role == role
            ]
            click.echo(f"\n{role} rows (calibration profile: {report.profile})")
            click.echo(text_table(
                ["row", "group", "measured", "simulated", "error", "loo", "tolerance", ""], rows
            ))
        for r in report.results:
            if "switch_model" in r.detail:
                click.echo(f"{r.id}: model switching costed with switch_model = "
                           f"{r.detail['switch_model']} (rdu_cluster/scenarios/coe.py)")
        failed = sum(not r.passed for r in report.results)
        click.echo(f"\n{len(report.results) - failed} of {len(report.results)} rows within tolerance")
        for line in report.summary_lines():
            click.echo(line)
    if any(not r.passed for r in report.results):
        sys.exit(1)
