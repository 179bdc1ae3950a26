"""Fit the unknown parameters to the `calibrate` rows; leave-one-out cross-validation.

Each unknown parameter of rdu_cluster/validation/parameters.toml that some calibrate row
simulates (a row simulates the chips of its `cluster` and `baseline_cluster`) is fitted by
bounded least squares on log error, log(simulated / measured), over its declared range, starting
from its first-principles value (the chip TOML's). Parameters that share rows are fitted
together; independent groups separately, so leaving one row out refits only its group.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

import rdu_cluster
from chip import kernel_efficiency
from rdu_cluster import processes
from rdu_cluster.config import load_cluster
from rdu_cluster.validation import calibration, published
from rdu_cluster.validation.calibration import Declaration, Profile
from workloads.errors import ConfigError


@dataclass(frozen=True)
class Group:
    """Parameters fitted together and the calibrate rows that constrain them."""

    params: tuple[Declaration, ...]
    rows: tuple[str, ...]
    responds: tuple[frozenset[str], ...]  # each parameter's rows (aligned with params)


@dataclass(frozen=True)
class Fit:
    values: dict[tuple[str, ...], float]  # (key, *chips) -> fitted value
    groups: tuple[Group, ...]
    residuals: dict[str, float]  # row id -> log error at the fit


def fitted_declarations(chip: str | None = None,
                        rows: Sequence[dict[str, Any]] = ()) -> list[Declaration]:
    """The unknown parameters to fit (of `chip` only, when given). A chip no declaration lists
    but whose family (the chips it `extends`, found from the rows that simulate it) includes a
    declared chip gets that chip's declarations for itself: same range and basis, its own
    value."""
    out = [d for d in calibration.declarations()
           if d.status == "unknown" and d.chips and (chip is None or chip in d.chips)]
    if out or chip is None:
        return out
    spec = _row_chip(chip, rows)
    if spec is None:
        return []
    derived = []
    for d in calibration.declarations():
        if d.status != "unknown" or not d.chips:
            continue
        member = calibration.calibrated_member(
            spec, d.key, calibration.Profile("", {(c, d.key): 0.0 for c in d.chips}))
        if member is not None and d.key in spec.execution:
            derived.append(dataclasses.replace(d, chips=(chip,), family=member,
                                               value=float(spec.execution[d.key])))
    return derived


def _row_chip(name: str, rows: Sequence[dict[str, Any]]):
    """The chip called `name` as a row's cluster loads it (first principles), or None."""
    with calibration.use(None):
        for row in rows:
            for k in ("cluster", "baseline_cluster"):
                if k in row:
                    chip = load_cluster(row[k]).chip
                    if chip.name == name:
                        return chip
    return None


def _pid(d: Declaration) -> tuple[str, ...]:
    return (d.key, *d.chips)


def row_chips(row: dict[str, Any]) -> set[str]:
    with calibration.use(None):
        return {load_cluster(row[k]).chip.name for k in ("cluster", "baseline_cluster") if k in row}


def check_rows(rows: Sequence[dict[str, Any]], chip: str | None, where: str) -> None:
    """Refuse, before the fit, rows that leave nothing to fit: no calibrate row simulates a
    chip with unknown parameters (the profile would hold none)."""
    chips = {c for d in fitted_declarations(chip, rows) for c in d.chips}
    cal = [r for r in rows if r["role"] == "calibrate"]
    if not any(row_chips(r) & chips for r in cal):
        scope = f"chip {chip}" if chip else \
            f"the chips with unknown parameters ({', '.join(sorted(chips))})"
        raise ConfigError(f"{where}: no calibrate rows for {scope} to fit ({len(cal)} calibrate "
                          f"of {len(rows)} rows); a profile would hold no parameters")


def groups(touching: dict[tuple[str, ...], set[str]], decls: Sequence[Declaration],
           rows: Sequence[dict[str, Any]]) -> list[Group]:
    """Connected components of the parameter-row graph: a parameter and the calibrate rows that
    respond to it (`responses`). Components share no row, so fitting each on its own is the
    joint fit, and a leave-one-out refit touches only the row's own component."""
    order = [r["id"] for r in rows if r["role"] == "calibrate"]
    out, seen = [], set()
    for d in decls:
        if _pid(d) in seen or not touching[_pid(d)]:
            continue
        members, ids, grew = [d], set(touching[_pid(d)]), True
        while grew:
            grew = False
            for e in decls:
                if e not in members and touching[_pid(e)] & ids:
                    members.append(e)
                    ids |= touching[_pid(e)]
                    grew = True
        seen |= {_pid(m) for m in members}
        out.append(Group(tuple(members), tuple(r for r in order if r in ids),
                         tuple(frozenset(touching[_pid(m)]) for m in members)))
    return out


def prior(d: Declaration) -> float:
    """The first-principles value: the chip TOML's, clipped into the declared range. A serving
    stack's kernel figure starts from the chip's generic parameter it stands in for
    (chip/kernel_efficiency.py first_principles). A chip fitted as a family member of a
    declared chip (calibrate --chip NEW) starts from its own value."""
    if d.value is not None:
        v = d.value
    else:
        with calibration.use(None):
            from rdu_cluster.config import load_chip

            execution = load_chip(d.chips[0]).execution
            v = (kernel_efficiency.first_principles(execution, d.key)
                 if kernel_efficiency.is_stack_key(d.key) else float(execution[d.key]))
    lo, hi = calibration.bounds(d)
    return min(max(v, lo), hi)


def profile_of(values: dict[tuple[str, ...], float], name: str = "fit") -> Profile:
    return Profile(name, {(chip, pid[0]): v for pid, v in values.items() for chip in pid[1:]})


class Simulator:
    """Simulated value of a row under a set of parameter values, cached per row and the values
    of the parameters it depends on (a fit perturbs one parameter at a time). `map` runs tasks
    that call it in processes and keeps what they simulated, so every later task (and a
    process forked after) reuses it: one memo of row evaluations for the fit, its refits and
    the uncertainty model."""

    def __init__(self, rows: Sequence[dict[str, Any]]):
        self.rows = {r["id"]: r for r in rows}
        self.cache: dict[tuple, float] = {}
        self.chips: dict[str, set[str]] = {}
        # row id -> the parameters it responds to (`responses`), once known: a fit perturbs
        # each parameter in turn, and a row that does not respond to it need not be re-run
        self.depends: dict[str, set[tuple[str, ...]]] = {}
        self.fresh: list[tuple] | None = None  # keys added since a forked task began (`map`)

    def __call__(self, rid: str, values: dict[tuple[str, ...], float]) -> float:
        if rid not in self.chips:
            self.chips[rid] = row_chips(self.rows[rid])
        # only the parameters of the chips the row simulates can change it (pid: key, *chips)
        own = tuple(sorted((p, v) for p, v in values.items()
                           if (p in self.depends[rid] if rid in self.depends
                               else self.chips[rid] & set(p[1:]))))
        key = (rid, own)
        if key not in self.cache:
            with calibration.use(profile_of(values)):
                self.cache[key] = float(published.run_case(self.rows[rid]).simulated)
            if self.fresh is not None:
                self.fresh.append(key)
        return self.cache[key]

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any], jobs: int = 1,
            progress: Callable[[int, int], None] | None = None,
            cost: Callable[[Any], float] | None = None) -> list:
        """[fn(t) for t in tasks] over `jobs` forked processes (rdu_cluster/processes.py: the
        rows, the memo and the active profile go along), the costliest first by `cost` (so the
        last to end is a cheap one); the rows each task ran come back into this memo. A row's
        value is the same in any process, so the results are those of one process;
        `progress(done, total)` as tasks end."""
        def task(t: Any) -> tuple[Any, list[tuple[tuple, float]]]:
            self.fresh = []
            try:
                result = fn(t)
                return result, [(k, self.cache[k]) for k in self.fresh]
            finally:
                self.fresh = None

        ended = [0]

        def done(_: int, out: tuple[Any, list]) -> None:
            self.cache.update(out[1])
            ended[0] += 1
            if progress is not None:
                progress(ended[0], len(tasks))

        first = () if cost is None else sorted(range(len(tasks)), key=lambda i: -cost(tasks[i]))
        return [result for result, _ in processes.map_forked(task, tasks, jobs, first, done)]


def log_error(sim: float, row: dict[str, Any]) -> float:
    return math.log(sim / row["value"])


def fit_group(group: Group, sim: Simulator, exclude: str | None = None,
              start: dict | None = None, ids: Sequence[str] | None = None) -> dict:
    """Least squares on log error over the group's rows (but `exclude`; or `ids`, a resample
    of them, repeats allowed), from `start` (else the range's geometric middle: a prior at a
    flat end has no gradient). A parameter none of those rows responds to keeps its prior: with
    no data its value would drift to a bound."""
    ids = [r for r in group.rows if r != exclude] if ids is None else list(ids)
    free = [d for d, rows in zip(group.params, group.responds) if rows & set(ids)]
    fixed = {_pid(d): prior(d) for d in group.params if d not in free}
    if not free:  # also when no row is left: every parameter's rows are among the group's
        return fixed
    lo = np.log([calibration.bounds(d)[0] for d in free])
    hi = np.log([calibration.bounds(d)[1] for d in free])
    x0 = (lo + hi) / 2 if start is None else np.log([start[_pid(d)] for d in free])

    def values(x) -> dict:
        return {**fixed, **{_pid(d): float(math.exp(v)) for d, v in zip(free, x)}}

    def residuals(x) -> np.ndarray:
        vals = values(x)
        return np.array([log_error(sim(r, vals), sim.rows[r]) for r in ids])

    res = least_squares(residuals, x0, bounds=(lo, hi), diff_step=1e-3, xtol=1e-4, ftol=1e-6)
    return values(res.x)


# A row responds to a parameter when moving the parameter across its range moves the row by
# more than this, in log (responses): below it, the row is taken not to see the parameter.
RESPONDS = 1e-6


def responses(
    decls: Sequence[Declaration], rows: Sequence[dict[str, Any]], sim: Simulator, jobs: int = 1
) -> dict[tuple[str, ...], set[str]]:
    """Each parameter's calibrate rows that respond to it: moving the value from its prior to
    the far end of its range changes the row by > RESPONDS in log. A parameter no row responds to
    keeps its first-principles value and is not written as fitted."""
    base = {_pid(d): prior(d) for d in decls}
    cal = [r for r in rows if r["role"] == "calibrate"]
    chips = {r["id"]: row_chips(r) for r in cal}
    for r in cal:  # the memo knows them too (a forked task need not load the clusters again)
        sim.chips.setdefault(r["id"], chips[r["id"]])

    def responding(d: Declaration) -> set[str]:
        low, high = calibration.bounds(d)
        far = low if base[_pid(d)] ** 2 > low * high else high
        step = {**base, _pid(d): far}
        ids = [r["id"] for r in cal if chips[r["id"]] & set(d.chips)]
        return {i for i in ids if abs(math.log(sim(i, step) / sim(i, base))) > RESPONDS}

    return {_pid(d): ids for d, ids in zip(decls, sim.map(responding, decls, jobs))}


def fit(
    rows: Sequence[dict[str, Any]], chip: str | None = None, sim: Simulator | None = None,
    progress: Callable[[int, int], None] | None = None, jobs: int = 1,
) -> Fit:
    """`progress(done, total)` as groups are fitted (output/progress.py); the groups in `jobs`
    processes (Simulator.map: the same fit in any number)."""
    sim = sim or Simulator(rows)
    decls = fitted_declarations(chip, rows)
    touching = responses(decls, rows, sim, jobs)
    for pid, ids in touching.items():
        for rid in ids:
            sim.depends.setdefault(rid, set()).add(pid)
    gs = groups(touching, decls, rows)
    values: dict = {}
    for v in sim.map(lambda g: fit_group(g, sim), gs, jobs, progress, cost=group_cost):
        values.update(v)
    residuals = {r: log_error(sim(r, values), sim.rows[r]) for g in gs for r in g.rows}
    return Fit(values, tuple(gs), residuals)


def leave_one_out(rows: Sequence[dict[str, Any]], full: Fit, sim: Simulator, jobs: int = 1,
                  progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """Row id -> simulated value when the row's group is refitted without it, starting from the
    full fit (the optimum without one row lies near the optimum with it); the refits in `jobs`
    processes."""
    tasks = [(g, rid) for g in full.groups for rid in g.rows]
    refits = sim.map(lambda t: left_out(full, t[0], t[1], sim), tasks, jobs, progress,
                     cost=lambda t: group_cost(t[0]))
    return {rid: value for (_, rid), value in zip(tasks, refits)}


# Rough seconds of work, only to start the longest tasks first (Simulator.map's `cost`; any
# order gives the same results): a row's run, a decode step of a serving row's requests, a
# group's row evaluations in one least-squares iteration (measured on 2 cores, Dec 2026).
ROW_S, SERVED_TOKEN_S, GROUP_EVALUATION_S = 3e-3, 1e-6, 1.5e-3


def row_cost(row: dict[str, Any]) -> float:
    """A row's run in rough seconds: a serving row runs its requests' every decode step."""
    if "requests" in row and "gen_len" in row:
        return ROW_S + SERVED_TOKEN_S * row["requests"] * row["gen_len"]
    return ROW_S


def group_cost(g: Group) -> float:
    """A refit of a group in rough seconds: its rows times its parameters and one (the row
    evaluations of a least-squares iteration with a two-point Jacobian)."""
    return GROUP_EVALUATION_S * len(g.rows) * (len(g.params) + 1)


def left_out(full: Fit, group: Group, rid: str, sim: Simulator) -> float:
    """The row's simulated value when its group is refitted without it (leave_one_out's one
    refit: validate runs them in parallel processes)."""
    values = {**full.values, **fit_group(group, sim, exclude=rid, start=full.values)}
    return sim(rid, values)


# ---- the profile file ------------------------------------------------------------------------


def code_version() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            check=False,
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=5,
        ).stdout.strip()
    except OSError:
        rev = ""
    return f"{rdu_cluster.__version__}" + (f"+g{rev}" if rev else "")


def profile_text(
    result: Fit, rows: Sequence[dict[str, Any]], measurements_version: str, name: str
) -> str:
    by_id = {r["id"]: r for r in rows}
    lines = [
        "# Calibration profile written by `rdu-cluster calibrate`: the fitted values of the unknown",
        "# parameters (rdu_cluster/validation/parameters.toml), never edited by hand. Rerun it to",
        "# refresh; `--calibration none` runs without it.",
        f"name = {_q(name)}",
        f'date = "{date.today().isoformat()}"',
        f"code_version = {_q(code_version())}",
        f"measurements_version = {_q(str(measurements_version))}",
        'method = "scipy.optimize.least_squares, bounded, residual = log(simulated / measured)"',
    ]
    for g in result.groups:
        for d in g.params:
            lines += [
                "",
                "[[parameter]]",
                f"chips = [{', '.join(repr(c).replace(chr(39), chr(34)) for c in d.chips)}]",
                f'key = "{d.key}"',
                *([f"family = {_q(d.family)}"] if d.family else []),
                f"value = {result.values[_pid(d)]:.6g}",
                f"first_principles = {prior(d):.6g}",
                f"range = [{calibration.bounds(d)[0]:.6g}, {calibration.bounds(d)[1]:.6g}]",
                f"basis = {_q(d.basis)}",
                f"rows = [{', '.join(_q(r) for r in g.rows)}]",
            ]
    for rid, e in result.residuals.items():
        lines += [
            "",
            "[[residual]]",
            f"id = {_q(rid)}",
            f"measured = {by_id[rid]['value']:.6g}",
            f"simulated = {by_id[rid]['value'] * math.exp(e):.6g}",
            f"error = {math.expm1(e):+.4f}",
        ]
    return "\n".join(lines) + "\n"


def _q(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's (quote, backslash, control characters
    below U+0020); DEL is the one more TOML refuses unescaped. Any text a --cases file carries
    (its version, a row id) must come back from the profile as it went in."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
