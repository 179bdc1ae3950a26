"""`rdu-cluster calibrate`: fit the unknown parameters to the calibrate rows, write a profile."""

from __future__ import annotations

import re
from pathlib import Path

import click

from rdu_cluster import config, processes
from rdu_cluster.cli import options as o
from rdu_cluster.cli.options import calibration_options
from rdu_cluster.output import atomic
from rdu_cluster.output.progress import Progress
from rdu_cluster.output.report import text_table
from rdu_cluster.validation import calibration, fit, uncertainty
from rdu_cluster.validation import published as v
from workloads.errors import ConfigError


@click.command()
@calibration_options("none")
@click.option("--chip", default=None, help="Fit only the parameters of this chip.")
@click.option("--name", default=calibration.DEFAULT, show_default=True,
              help="Profile name: written to cluster_configs/calibration/NAME.toml.")
@click.option("--out", default=None, help="Write the profile to this path instead.")
@click.option("--cases", "cases_path", default=None, help="A measurements TOML.")
@click.option("--no-progress", is_flag=True, help="No progress on stderr (a bar on a terminal, "
              "a line every few seconds otherwise).")
@click.option("--no-uncertainty", is_flag=True, help="Write the profile only, not its "
              "uncertainty model (NAME.uncertainty.json: held-out errors and the parameter "
              "spread of --resamples bootstrap refits: most of the run). "
              "Intervals are then not given until it is rewritten.")
@click.option("--resamples", default=uncertainty.RESAMPLES, show_default=True,
              type=click.IntRange(2, 64),
              help="Bootstrap refits the uncertainty model's parameter spread is measured over "
              "(fewer: sooner and coarser; the model's `method` says how many).")
@click.option("--jobs", "n_jobs", default=None, type=click.IntRange(1, 1024),
              show_default="the cores this process may use",
              help="Processes the fits, refits and rows' runs are spread over (the same "
              "profile and model with any number).")
def calibrate(chip: str | None, name: str, out: str | None, cases_path: str | None,
              no_progress: bool, no_uncertainty: bool, resamples: int,
              n_jobs: int | None) -> None:
    """Bounded least squares on log error over each unknown parameter's declared range (from its
    middle); every other parameter at its first-principles value. Then the profile's uncertainty
    model, beside it (rdu_cluster/validation/uncertainty.py). --calibration is accepted for
    uniformity and ignored: a fit never starts from another fit."""
    path = _destination(chip, name, out)
    table = v.load_table(cases_path)
    if chip is not None and not fit.fitted_declarations(chip, table["row"]):
        chips = sorted({c for d in fit.fitted_declarations() for c in d.chips})
        raise click.BadParameter(f"{chip!r}; accepted: {', '.join(chips)} or a chip that "
                                 "extends one, simulated by a row (the chips with unknown "
                                 "parameters)", param_hint="--chip")
    _not_an_input(path, cases_path, table["row"])
    _not_an_input(uncertainty.model_path(path), cases_path, table["row"])
    where = f"--cases {cases_path}" if cases_path else "measurements.toml"
    fit.check_rows(table["row"], chip, where)
    sim = fit.Simulator(table["row"])
    jobs = n_jobs or processes.available_cores()
    with calibration.use(None), v.memoised(), Progress(0, "groups", "calibrate",
                                                       enabled=not no_progress) as bar:
        result = fit.fit(table["row"], chip=chip, sim=sim, progress=bar.set_done, jobs=jobs)
    if not result.groups:  # rows on the chips, but none moves with a parameter: nothing to write
        raise ConfigError(f"{where}: no calibrate row responds to an unknown parameter"
                          f"{f' of chip {chip}' if chip else ''}; a profile would hold none")
    text = fit.profile_text(result, table["row"], table.get("version", ""), name)
    model = None
    if not no_uncertainty:
        profile = calibration.load_text(text, path)
        with calibration.use(None), v.memoised(), Progress(0, "refits and runs",
                                                           "uncertainty model",
                                                           enabled=not no_progress) as bar:
            model = uncertainty.derive(table["row"], result, sim, profile,
                                       table.get("version", ""), resamples, jobs,
                                       progress=bar.set_done)
    atomic.atomic_write(path, text.encode())
    if model is not None:
        atomic.atomic_write(uncertainty.model_path(path), uncertainty.model_text(model).encode())
    rows = [[g_d.key, ",".join(g_d.chips), f"{result.values[(g_d.key, *g_d.chips)]:.4g}",
             f"{fit.prior(g_d):.4g}",
             f"[{calibration.bounds(g_d)[0]:.3g}, {calibration.bounds(g_d)[1]:.3g}]", len(g.rows)]
            for g in result.groups for g_d in g.params]
    click.echo(text_table(["parameter", "chips", "fitted", "first principles", "range", "rows"],
                          rows))
    click.echo(f"wrote {path}")
    if model is not None:
        cov = uncertainty.coverage([uncertainty.Sample(**s) for s in model["samples"]])
        whole = cov["overall"]
        within = ("" if whole["coverage"] is None else f" ({cov['confidence']:.0%} interval "
                  f"of the coverage {100 * whole['coverage_low']:.0f}-{whole['coverage_high']:.0%})")
        click.echo(f"wrote {uncertainty.model_path(path)}: {len(model['samples'])} held-out "
                   f"errors; {cov['level']:.0%} intervals cover {whole['covered']} of "
                   f"{whole['n']} held-out rows left out of them{within}")


# The row fields that may name a file calibrate reads (published._check_refs loads them).
REF_FIELDS = ("model", "draft", "models", "cluster", "baseline_cluster")
CLUSTER_FIELDS = ("cluster", "baseline_cluster")


def _not_an_input(path: Path, cases_path: str | None, rows: list[dict]) -> None:
    """The profile must not replace a file it is fitted from: the measurements (bundled or
    --cases), the parameter declarations, a model or cluster file a row names, or a file such
    a cluster reads (its extends chain, its chip TOML: a bundled name like sn40l-16 names no
    file itself, yet --out cluster_configs/chips/sn40l.toml replaced the chip)."""
    package = v.resources.files("rdu_cluster")
    inputs = [("--cases", cases_path or str(package.joinpath("validation/measurements.toml"))),
              ("parameters.toml", str(package.joinpath("validation/parameters.toml")))]
    for row in rows:
        for key in REF_FIELDS:
            refs = row.get(key, [])
            for r in refs if isinstance(refs, list) else [refs]:
                inputs.append((f"row {row['id']}: {key}", r))
                if key in CLUSTER_FIELDS:
                    inputs += [(f"row {row['id']}: {key} {r}: {f.name}", str(f))
                               for f in config.cluster_files(r)]
    o.check_not_inputs(str(path), "--out", inputs, ", which the fit reads; choose another file")


# A profile name is a file name in cluster_configs/calibration/ and a TOML string: no path
# separators, quotes or leading dot.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _destination(chip: str | None, name: str, out: str | None) -> Path:
    """Check the options before the fit (minutes): a plain profile name, a writable .toml
    destination (the chip is checked against the rows)."""
    if not NAME.fullmatch(name):
        raise click.BadParameter(f"{name!r}; accepted: 1 to 64 letters, digits, '.', '_' or "
                                 "'-', not starting with '.' (use --out for a path)",
                                 param_hint="--name")
    path = Path(out) if out is not None else calibration.profile_path(name)
    if path.suffix != ".toml":
        raise click.BadParameter(f"{out}: expected a .toml file name", param_hint="--out")
    return atomic.check_destination(path)
