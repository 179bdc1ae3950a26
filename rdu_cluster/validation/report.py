"""validate's report: every row with its error, leave-one-out over the calibrate rows, summary."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from rdu_cluster import processes
from rdu_cluster.validation import calibration, fit, published, uncertainty
from workloads.errors import ConfigError

# The goal (issue 14): LOO and check rows, single-system speeds: median |error| <= 10%, max <= 25%;
# ratios within 15%.
GOAL = {"speed": (0.10, 0.25), "ratio": (0.15, 0.15)}
# A stack-specific row family (one serving stack on one chip, issue 33): its median |error| out
# of sample (check rows and leave-one-out) at or under this.
FAMILY_GOAL = 0.15


@dataclass(frozen=True)
class Report:
    results: list[published.Result]
    loo: dict[str, dict[str, float]]  # row id -> {"simulated", "error"}
    profile: str
    coverage: dict[str, Any] | None = None  # uncertainty.coverage of the held-out rows
    families: dict[str, str] = field(default_factory=dict)  # row id -> "stack on chip"

    def errors(self, sample: str, group: str) -> list[float]:
        if sample == "loo":
            ids = {r.id: r.group for r in self.results}
            return [abs(v["error"]) for k, v in self.loo.items() if ids[k] == group]
        role = "calibrate" if sample == "in-sample" else "check"
        return [abs(r.error) for r in self.results
                if r.role == role and r.group == group and r.error is not None]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for sample in ("in-sample", "loo", "check"):
            for group in ("speed", "ratio"):
                e = self.errors(sample, group)
                out[f"{sample}/{group}"] = {
                    "n": len(e),
                    "median": float(np.median(e)) if e else None,
                    "max": float(max(e)) if e else None,
                }
        out["coverage"] = self.coverage
        out["families"] = self.family_summary()
        return out

    def family_summary(self) -> dict[str, dict[str, Any]]:
        """Per stack-specific family (published.family_of), its value rows' |error| out of
        sample (check rows, and calibrate rows left out) and in sample, sorted by name."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.results:
            family = self.families.get(r.id)
            if family is None or r.group not in ("speed", "ratio") or r.error is None:
                continue
            f = out.setdefault(family, {"out": [], "in": []})
            if r.role == "check":
                f["out"].append(abs(r.error))
            else:
                f["in"].append(abs(r.error))
                if r.id in self.loo and not math.isnan(self.loo[r.id]["error"]):
                    f["out"].append(abs(self.loo[r.id]["error"]))
        return {name: {"n": len(f["out"]), "median": _median(f["out"]),
                       "max": max(f["out"]) if f["out"] else None,
                       "n_in_sample": len(f["in"]), "median_in_sample": _median(f["in"])}
                for name, f in sorted(out.items())}

    def summary_lines(self) -> list[str]:
        lines = []
        for group in ("speed", "ratio"):
            parts = []
            for sample in ("in-sample", "loo", "check"):
                s = self.summary()[f"{sample}/{group}"]
                parts.append(f"{sample} n={s['n']} median {_pct(s['median'])} max {_pct(s['max'])}")
            goal = GOAL[group]
            lines.append(f"{group}: " + "; ".join(parts)
                         + f"  (goal for loo and check: median <= {goal[0]:.0%}, max <= {goal[1]:.0%})")
        families = self.family_summary()
        if families:
            lines.append(f"stack families (one stack, one chip), out of sample (check rows and "
                         f"leave-one-out; goal: median <= {FAMILY_GOAL:.0%}):")
            width = max(len(name) for name in families)
            for name, f in families.items():
                over = "  over goal" if (f["median"] or 0.0) > FAMILY_GOAL else ""
                lines.append(f"  {name:<{width}}  n={f['n']} median {_pct(f['median'])} "
                             f"max {_pct(f['max'])}; in-sample n={f['n_in_sample']} median "
                             f"{_pct(f['median_in_sample'])}{over}")
        return lines + coverage_lines(self.coverage)

    def as_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "rows": [r.as_dict() for r in self.results],
            "leave_one_out": self.loo,
            "summary": self.summary(),
        }


def coverage_lines(cov: dict[str, Any] | None) -> list[str]:
    """validate's text: the intervals' coverage of held-out rows, overall and per regime."""
    if cov is None:
        return []
    def cell(e: dict[str, Any]) -> str:
        if e["coverage"] is None:
            return f"{e['covered']}/{e['n']} (n/a)"
        return (f"{e['covered']}/{e['n']} ({_pct(e['coverage'])}, "
                f"{100 * e['coverage_low']:.0f}-{e['coverage_high']:.0%})")

    lines = [f"interval coverage ({cov['level']:.0%} intervals, each held-out row against the "
             f"interval built without it, with the coverage's {cov['confidence']:.0%} "
             f"interval; goal 70-90%): {cell(cov['overall'])}; "
             + "; ".join(f"{r} {cell(e)}" for r, e in cov["by_regime"].items())]
    if cov.get("note"):
        lines.append(f"  {cov['note']}")
    return lines


def _median(errors: list[float]) -> float | None:
    return float(np.median(errors)) if errors else None


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def build(rows: list[dict[str, Any]], loo: bool = True, where: str = "measurements.toml",
          jobs: int = 1) -> Report:
    """Run every row under the active profile; leave-one-out refits its fitted groups (the
    full fit, then each refit from it). The rows (the offline serving runs first: seconds
    each) run over `jobs` forked processes while this process fits, then the refits (the
    largest groups' first: a refit re-runs its group's rows tens of times): the same report,
    in the same order, as in one process."""
    profile = calibration.active()
    _check_not_fitted(rows, profile, where)
    out: dict[str, dict[str, float]] = {}
    serve = [i for i, r in enumerate(rows) if r["metric"] == "serve_output_tokens_per_s"]
    with published.memoised():
        with processes.started(lambda i: published.run_case(rows[i]), range(len(rows)), jobs,
                               first=serve) as pending:
            if loo and profile is not None:  # the full fit here, while the rows run
                sim = fit.Simulator(rows)
                full = fit.fit(rows, sim=sim)
            results = pending.get()
        if loo and profile is not None:
            # forked after the fit: each refit starts from its values and row cache (the
            # refits share only their common start), so any --jobs gives the serial values
            by_id = {r["id"]: r for r in rows}
            for rid, value in fit.leave_one_out(rows, full, sim, jobs).items():
                out[rid] = {"simulated": value, "error": value / by_id[rid]["value"] - 1.0}
    name = profile.name if profile is not None else "none"
    families = {r["id"]: f for r in rows if (f := published.family_of(r)) is not None}
    return Report(results, out, name, interval_coverage(rows, results, out), families)


def interval_coverage(rows: list[dict[str, Any]], results: list[published.Result],
                      loo: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The coverage of the intervals (uncertainty.coverage) on this run's held-out rows, each
    error smeared by the active profile's parameter spread (none without its model)."""
    check = {r.id: r.simulated for r in results if r.role == "check"}
    samples = uncertainty.held_out(rows, check, {k: v["simulated"] for k, v in loo.items()})
    model, why = uncertainty.active_model()
    spread = {} if model is None else {(s["chip"], s["regime"]): s["sigma"]
                                       for s in model.meta["spread"]}
    cov = uncertainty.coverage(uncertainty.with_spread(samples, spread))
    if model is None:
        cov["note"] = f"no parameter spread: {why}"
    return cov


def _check_not_fitted(rows: list[dict[str, Any]], profile: calibration.Profile | None,
                      where: str) -> None:
    """A check row's error is reported as one on a row the profile was not fitted to: a row
    the profile's fit used (by id, from its `rows`) may not be a check row (a --cases file
    that marks a calibrate row `check` summarised in-sample errors as out-of-sample)."""
    fitted = profile.rows if profile is not None else frozenset()
    for r in rows:
        if r["role"] == "check" and r["id"] in fitted:  # so there is a profile
            raise ConfigError(f"{where}: row {r['id']}: role 'check', but calibration profile "
                              f"{cast(calibration.Profile, profile).name} was fitted to it; "
                              "accepted: role 'calibrate' for a row the profile was fitted to, "
                              "or --calibration none")


def loo_cell(report: Report, rid: str) -> str:
    v = report.loo.get(rid)
    return "" if v is None or math.isnan(v["error"]) else f"{v['error']:+.1%}"
