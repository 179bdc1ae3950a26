"""`rdu-cluster validate`: the validation table, published vs simulated, with errors."""

from __future__ import annotations

import json
import sys

import click

from rdu_cluster.output.report import text_table
from rdu_cluster.validation import published as v


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per case.")
@click.option(
    "--cases", "cases_path", default=None, help="A validation TOML other than the bundled one."
)
def validate(as_json: bool, cases_path: str | None) -> None:
    """Run every validation case; exit 1 if any is outside its tolerance."""
    results = v.run(v.load_cases(cases_path))
    if as_json:
        click.echo("\n".join(json.dumps(r.as_dict(), default=float) for r in results))
    else:
        rows = [
            [
                r.id,
                v.format_value(r.published),
                v.format_value(r.simulated),
                "" if r.error is None else f"{r.error:+.1%}",
                r.tolerance,
                "ok" if r.passed else "FAIL",
            ]
            for r in results
        ]
        click.echo(text_table(["case", "published", "simulated", "error", "tolerance", ""], rows))
        failed = sum(not r.passed for r in results)
        click.echo(f"\n{len(results) - failed} of {len(results)} cases within tolerance")
    if any(not r.passed for r in results):
        sys.exit(1)
