"""The `rdu-cluster` command line. Each command lives in its own module and is added here."""

from __future__ import annotations

import sys

import click

from workloads.errors import ConfigError


class Main(click.Group):
    """Bad input of any kind is one line on stderr and exit code 2, never a traceback."""

    def main(self, *args, **kwargs):  # type: ignore[override]
        kwargs["standalone_mode"] = False
        try:
            rv = self._run(*args, **kwargs)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            click.echo("aborted", err=True)
            sys.exit(130)
        except click.ClickException as e:
            hint = f" (see '{e.ctx.command_path} --help')" if getattr(e, "ctx", None) else ""
            click.echo(f"error: {e.format_message()}{hint}", err=True)
            sys.exit(2)
        except ConfigError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        sys.exit(rv if isinstance(rv, int) else 0)

    def _run(self, *args, **kwargs):
        """One command; the calibration profile its --calibration activated ends with it (an
        in-process caller, a test runner, must not inherit it)."""
        from rdu_cluster.validation import calibration

        try:
            return super().main(*args, **kwargs)
        finally:
            calibration.activate(None)


@click.group(cls=Main)
@click.version_option(package_name="rdu-cluster")
def main() -> None:
    """Simulate LLM inference on clusters of SN40L RDU sockets and GPU nodes."""


from rdu_cluster.cli.catalog import clusters, models
from rdu_cluster.cli.simulate import simulate

main.add_command(simulate)
main.add_command(models)
main.add_command(clusters)

from rdu_cluster.cli.sweep import sweep

main.add_command(sweep)

from rdu_cluster.cli.validate import validate

main.add_command(validate)

from rdu_cluster.cli.calibrate import calibrate

main.add_command(calibrate)

from rdu_cluster.cli.footprint import footprint

main.add_command(footprint)

from rdu_cluster.cli.serve import serve

main.add_command(serve)

from rdu_cluster.cli.plan import plan

main.add_command(plan)

from rdu_cluster.cli.report import report

main.add_command(report)

from rdu_cluster.cli.capacity import capacity

main.add_command(capacity)
