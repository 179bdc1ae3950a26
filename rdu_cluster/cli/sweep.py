"""`rdu-cluster sweep SPEC`: expand a TOML sweep spec and run it into a Parquet dataset."""

from __future__ import annotations

from pathlib import Path

import click

from rdu_cluster.cli import options as o
from rdu_cluster.output.report import text_table
from rdu_cluster.sweep import dataset
from rdu_cluster.sweep.execute import LocalExecutor, RayExecutor, run_sweep
from rdu_cluster.sweep.spec import DEFAULT_MAX_POINTS, Expansion, Spec, expand, load_spec
from workloads.errors import ConfigError


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@click.option(
    "--out",
    "out_dir",
    default=None,
    help="Dataset folder (created; resumed if it holds this spec).",
)
@click.option(
    "--dry-run", is_flag=True, help="Print the number of points and the first few; run nothing."
)
@click.option("--show", default=5, show_default=True, type=o.TOP, help="Points --dry-run prints.")
@click.option(
    "--backend",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="local: in this process; ray: Ray tasks (embedded instance unless --address).",
)
@click.option(
    "--address", default=None, help="Ray cluster to join [default: $RAY_ADDRESS or embedded]."
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Ray tasks in flight [all CPUs]; with --backend local, processes in a pool [1].",
)
@click.option(
    "--max-points",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_POINTS,
    show_default=True,
    help="Refuse a grid larger than this.",
)
@click.option(
    "--points-per-task", type=click.IntRange(min=1), default=None, help="Task size [auto]."
)
@click.option(
    "--force", is_flag=True, help="Discard a dataset of another spec in --out and start anew."
)
@click.option("--no-progress", is_flag=True, help="No progress line on stderr.")
def sweep(
    spec_path,
    out_dir,
    dry_run,
    show,
    backend,
    address,
    workers,
    max_points,
    points_per_task,
    force,
    no_progress,
) -> None:
    """Run the sweep SPEC (TOML: [sweep], [base], [[axes]], [filters]) into --out.

    Kinds: simulate (the analytic estimate), plan (the best plan per point), serve (a serving
    simulation per point). Rerunning the same command
    skips finished points; see docs/sweeps.md for the format.
    """
    if backend == "local" and address:
        raise ConfigError("--address: only with --backend ray")
    ctx = click.get_current_context()
    if dry_run and (unused := o.given(ctx, "out_dir", "backend", "address", "workers",
                                      "points_per_task", "force", "no_progress")):
        raise ConfigError(f"{'/'.join(unused)}: not with --dry-run (it counts and shows the "
                          "points; it runs and writes nothing)")
    if not dry_run and o.given(ctx, "show"):
        raise ConfigError("--show: only with --dry-run (the points it prints)")
    spec = load_spec(spec_path)
    exp = expand(spec, max_points)
    if dry_run:
        click.echo(_dry_run(spec, exp, show))
        return
    if not out_dir:
        raise ConfigError("--out: required (a dataset folder), unless --dry-run")
    if not exp.points:
        raise ConfigError(f"{spec.source}: filters leave no points")
    engine = RayExecutor(address, workers) if backend == "ray" else LocalExecutor(workers)
    try:
        summary = run_sweep(
            spec, exp.points, out_dir, engine, force, points_per_task, progress=not no_progress
        )
    except KeyboardInterrupt:
        done = len(dataset.read_manifest(out_dir).finished)
        click.echo(
            f"interrupted: {done:,} of {len(exp.points):,} points finished in {out_dir}; "
            "rerun the same command to resume",
            err=True,
        )
        raise
    finally:
        engine.close()
    click.echo(_summary(spec, exp, summary, Path(out_dir)))


def _dry_run(spec: Spec, exp: Expansion, show: int) -> str:
    axes = " x ".join(a.describe() for a in spec.axes) or "no axes (the base point)"
    head = (
        f"{spec.name}: {spec.kind}, {len(exp.points):,} points "
        f"({exp.grid_size:,} in the grid, {exp.filtered_out:,} filtered out"
        + (f", {exp.duplicates:,} duplicates" if exp.duplicates else "")
        + f"), spec hash {spec.hash}\naxes: {axes}"
    )
    pts = exp.points[: max(show, 0)]
    if not pts:
        return head
    names = sorted({k for p in pts for k in p.fields})
    rows = [[p.id[:12], *(_cell(p.fields.get(n)) for n in names)] for p in pts]
    return f"{head}\nfirst {len(pts)}:\n" + text_table(["point", *names], rows)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _summary(spec: Spec, exp: Expansion, s, out: Path) -> str:
    return (
        f"{spec.name}: {s.points:,} points ({exp.grid_size:,} in the grid, "
        f"{exp.filtered_out:,} filtered out) -> {out}\n"
        f"ran {s.ran:,} now, {s.skipped:,} finished before; dataset: {s.rows:,} rows, "
        f"{s.infeasible:,} of them infeasible (feasible = false, with infeasible_reason)\n"
        f"{s.backend} backend, {s.workers} worker(s), {s.tasks} tasks, {s.seconds:.2f} s, "
        f"{s.points_per_s:,.0f} points/s"
    )
