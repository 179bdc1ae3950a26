"""Intervals on the simulator's figures, from its own errors on measurements it was not fitted to.

The uncertainty model of a calibration profile (cluster_configs/calibration/NAME.uncertainty.json,
written by `rdu-cluster calibrate` beside NAME.toml, never by hand: `derive`) holds
- the held-out errors: each `value` row of measurements.toml that measures a figure the tool
  prints (decode and end-to-end tokens/s, TTFT, serving output throughput), as log(measured /
  simulated) on a row the profile was not fitted to: a check row under the profile, a calibrate
  row under the profile refitted without it (leave-one-out), with its chip, stack and regime.
  Errors are kept in speed orientation (a time's or a cost's error negated): a positive error is
  a simulator slower than measured;
- the parameter spread: for each held-out error, the standard deviation of log(simulated) of its
  (chip, regime) over profiles refitted on bootstrap resamples of the calibrate rows (`spread`).
An interval at level L for a figure of chip C, stack S and regime R takes the first of these
groups of held-out errors with at least MIN_ROWS: (C, S, R), (C, R), (C's kind, R); it is the
value times exp of the group's (1-L)/2 and (1+L)/2 quantiles, each error smeared by its
parameter spread (a normal of that deviation, on fixed quantiles). A
point whose regime no group covers gets no interval (`Band.bounds` None, `Band.basis` says why).
`coverage` cross-validates the method: each held-out row against the interval built without it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from chip import serving_stacks
from rdu_cluster.validation import calibration

LEVEL = 0.8
REGIMES = ("batch-1 decode", "large-batch decode", "prefill", "serving")
# Decode at batch <= SMALL_BATCH is batch-1 decode: the measured decode rows are at batch 1 and
# at 16 and more (measurements.toml), and 4 is their geometric middle.
SMALL_BATCH = 4
# Fewest held-out errors a group needs to give an interval: with 8, the 10% and 90% quantiles
# of an 80% interval lie between the two smallest and the two largest errors, not on one row.
MIN_ROWS = 8
# A serving run is batched decode steps and prefills: where no chip of its kind has MIN_ROWS
# serving rows, its speeds take the large-batch decode errors and its first-token times the
# prefill errors (the basis says so).
SERVING_PARTS = {"speed": "large-batch decode", "first_token": "prefill"}
# Row metrics the model learns from: metric -> regime (None: decode, by the row's batch).
ROW_METRICS = {"tokens_per_s": None, "e2e_tokens_per_s": None, "ttft_ms": "prefill",
               "serve_output_tokens_per_s": "serving"}
# The figures `simulate`, `plan` and sweeps print with an interval (results.py) and their regime
# kind: a decode figure's regime follows the batch, a first-token figure's is prefill.
FIGURES = {"tokens_per_s_per_request": "decode", "tokens_per_s_total": "decode",
           "tpot_s": "decode", "ttft_s": "prefill", "cost_per_million_tokens_usd": "decode",
           "joules_per_token": "decode"}
BOUND_COLUMNS = tuple(f"{k}_{end}" for k in FIGURES for end in ("low", "high"))
# Normal quantiles each held-out error is smeared over by its parameter spread.
_Z = np.array([statistics.NormalDist().inv_cdf((k + 0.5) / 16) for k in range(16)])
SUFFIX = ".uncertainty.json"
RESAMPLES = 8  # bootstrap refits of the parameter spread (calibrate --resamples)


def orientation(metric: str) -> int:
    """+1 for a speed (tokens/s, throughput), -1 for a time or a price per token (TPOT, TTFT,
    ITL, E2EL, $/Mtok, J/token): its error is the speed's, negated."""
    m = metric.lower()
    if any(t in m for t in ("tokens_per_s", "throughput")):
        return 1
    if any(t in m for t in ("tpot", "ttft", "itl", "e2e", "latency", "_time", "cost_per",
                            "usd_per", "joules_per", "_ms")):
        return -1
    raise ValueError(f"metric {metric!r}: not a speed, time or price per token")


def first_token(metric: str) -> bool:
    return "ttft" in metric.lower()


def regime_of(metric: str, batch: float = 1, *, serving: bool = False) -> str:
    """The regime of a figure: "serving" for a serving run's figures (serve, capacity),
    "prefill" for a first-token time, else decode by the batch (batch-1 decode up to
    SMALL_BATCH sequences, large-batch decode past it)."""
    if serving:
        return "serving"
    if first_token(metric) or metric == "ttft_ms":
        return "prefill"
    return "batch-1 decode" if batch <= SMALL_BATCH else "large-batch decode"


def stack_family(stack: str | None) -> str | None:
    """A stack's project, without its version (tensorrt-llm-0.11 -> tensorrt-llm)."""
    return None if stack is None else re.sub(r"-\d+(\.\d+)*$", "", stack)


@dataclass(frozen=True)
class Sample:
    """One held-out error: log(measured / simulated) of a row in speed orientation."""

    id: str
    chip: str
    kind: str  # the chip's kind: "gpu" | "rdu"
    stack: str | None  # its family (stack_family)
    regime: str
    error: float
    held_out: str  # "check" or "loo"
    spread: float = 0.0  # the parameter spread of its (chip, regime)


@dataclass(frozen=True)
class Band:
    """An interval (bounds; None outside every measured regime) and its basis or reason."""

    bounds: tuple[float, float] | None
    basis: str


@dataclass(frozen=True)
class Model:
    samples: tuple[Sample, ...]
    meta: Mapping[str, Any]

    def group(self, chip: str, kind: str, stack: str | None, regime: str,
              exclude: str | None = None) -> tuple[list[Sample], str]:
        """The held-out errors an interval rests on, and their label ([] and the reason where
        none has MIN_ROWS)."""
        stack = stack_family(stack)
        pool = [s for s in self.samples if s.regime == regime and s.id != exclude]
        tiers = [(f"{chip} {stack}", lambda s: s.chip == chip and s.stack == stack),
                 (chip, lambda s: s.chip == chip), (f"{kind} chips", lambda s: s.kind == kind)]
        for label, keep in tiers[0 if stack else 1:]:
            chosen = [s for s in pool if keep(s)]
            if len(chosen) >= MIN_ROWS:
                return chosen, f"{label} {regime}, {len(chosen)} held-out rows"
        n = sum(s.kind == kind for s in pool)
        return [], (f"outside every measured regime: {n} held-out {regime} rows on {kind} chips "
                    f"(fewer than {MIN_ROWS})")

    def errors(self, metric: str, chip: str, kind: str, stack: str | None, regime: str,
               exclude: str | None = None) -> tuple[list[Sample], str]:
        """`group`, with a serving figure's fallback to its part (SERVING_PARTS)."""
        chosen, label = self.group(chip, kind, stack, regime, exclude)
        if not chosen and regime == "serving":
            part = SERVING_PARTS["first_token" if first_token(metric) else "speed"]
            chosen, label = self.group(chip, kind, stack, part, exclude)
            label = f"serving taken as {label}" if chosen else label
        return chosen, label

    def band(self, *, metric: str, chip: str, kind: str, stack: str | None, regime: str,
             level: float = LEVEL, exclude: str | None = None) -> Band:
        """The factors (low, high) a figure is multiplied by for its interval."""
        check_level(level)
        chosen, label = self.errors(metric, chip, kind, stack, regime, exclude)
        if not chosen:
            return Band(None, label)
        lo, hi = quantiles(chosen, level)
        if orientation(metric) < 0:
            lo, hi = -hi, -lo
        return Band((math.exp(lo), math.exp(hi)), label)


def check_level(level: float) -> None:
    if not (isinstance(level, (int, float)) and 0.0 < level < 1.0):
        raise ValueError(f"level: {level!r}; accepted: a fraction in (0, 1), e.g. 0.8")


def quantiles(samples: Sequence[Sample], level: float) -> tuple[float, float]:
    """The (1-level)/2 and (1+level)/2 quantiles of the errors, each smeared by its spread.
    Not widened further for a small group (split-conformal levels, (n + 1) / n): the held-out
    errors already carry this fit's parameter error once, and with the spread on top the
    cross-validated coverage of 80% intervals was 92% (docs/uncertainty.md)."""
    errors = np.array([s.error for s in samples])
    spread = np.array([s.spread for s in samples])
    points = np.sort((errors[:, None] + spread[:, None] * _Z[None, :]).ravel())
    hi = (1.0 + level) / 2.0
    return _quantile(points, 1.0 - hi), _quantile(points, hi)


def _quantile(ordered: np.ndarray, q: float) -> float:
    """np.quantile(x, q) of sorted x, its default (linear) method step for step, so the same
    float: np.quantile's np.unique loads numpy.ma, a twentieth of a plain simulate's start-up."""
    n = ordered.size
    virtual = (n - 1) * q
    if virtual >= n - 1 or virtual < 0:  # np.quantile takes the end
        return float(ordered[-1] if virtual >= 0 else ordered[0])
    below = math.floor(virtual)
    gamma = virtual - below
    a, b = ordered[below], ordered[below + 1]
    diff = b - a
    return float(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)


# ---- the model of the active profile ---------------------------------------------------------

_CACHE: dict[tuple[str, int], Model] = {}


def model_path(profile_path: str | Path) -> Path:
    p = Path(profile_path)
    return p.with_name(p.name.removesuffix(".toml") + SUFFIX)


def digest(profile: calibration.Profile) -> str:
    """What the model was derived under: the profile's fitted values."""
    text = json.dumps(sorted((c, k, f"{v:.6g}") for (c, k), v in profile.values.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load(path: str | Path) -> Model:
    path = Path(path)
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _CACHE:
        raw = json.loads(path.read_text())
        samples = tuple(Sample(**s) for s in raw["samples"])
        _CACHE[key] = Model(samples, {k: v for k, v in raw.items() if k != "samples"})
    return _CACHE[key]


def active_model() -> tuple[Model | None, str]:
    """The model of the active calibration profile, or None and why."""
    profile = calibration.active()
    if profile is None:
        return None, "no uncertainty model without a calibration profile (--calibration none)"
    path = model_path(profile.path or calibration.profile_path(profile.name))
    if not path.is_file():
        return None, f"no uncertainty model for calibration {profile.name} ({path.name})"
    model = load(path)
    if model.meta.get("profile_digest") != digest(profile):
        return None, (f"the uncertainty model {path.name} was derived under other values than "
                      f"calibration {profile.name}'s; rerun `rdu-cluster calibrate`")
    return model, ""


def band(*, metric: str, chip, stack: str | None, regime: str, level: float = LEVEL) -> Band:
    """The interval factors of a figure under the active profile's model (chip: a ChipSpec or
    a chip name)."""
    model, why = active_model()
    if model is None:
        return Band(None, why)
    name, kind = _chip(chip, model)
    return model.band(metric=metric, chip=name, kind=kind, stack=stack, regime=regime,
                      level=level)


def interval(value: float, *, metric: str, chip, stack: str | None, regime: str,
             level: float = LEVEL) -> tuple[float, float] | None:
    """(low, high) around `value` at `level`, or None outside every measured regime (the
    caller says so: `band(...).basis` gives the reason)."""
    b = band(metric=metric, chip=chip, stack=stack, regime=regime, level=level)
    if b.bounds is None:
        return None
    return value * b.bounds[0], value * b.bounds[1]


def _chip(chip, model: Model) -> tuple[str, str]:
    if not isinstance(chip, str):
        # a chip that `extends` a measured one takes its nearest measured relative's errors, as
        # it takes its calibration (ChipSpec.family, validation/calibration.py)
        measured = {x.chip for x in model.samples}
        name = next((n for n, _ in chip.family if n in measured), chip.name)
        return name, chip.kind
    for s in model.samples:
        if s.chip == chip:
            return chip, s.kind
    from rdu_cluster.config import load_chip
    from workloads.errors import ConfigError

    try:
        return chip, load_chip(chip).kind
    except ConfigError:  # a chip known only by a name: no kind, so no group of its kind either
        return chip, "unknown"


# ---- record columns (results.py, speculative.py) ---------------------------------------------


def columns(values: Mapping[str, Any], *, chip, stack: str | None, batch: Any,
            level: float = LEVEL) -> dict[str, Any]:
    """`<key>_low`, `<key>_high` for each figure of FIGURES in `values` (None where the value
    is, or where its regime has no band; NaN for a sweep's points outside every regime while
    others have one), and `interval_note`: the level and the groups the bands rest on, or why
    there is none. Vectorized over `batch` (a sweep's points)."""
    small = np.asarray(batch, dtype=float) <= SMALL_BATCH
    out: dict[str, Any] = {}
    notes: dict[str, tuple[Band, Band]] = {}
    for key, kind in FIGURES.items():
        if key not in values:
            continue
        regimes = ("prefill", "prefill") if kind == "prefill" else ("batch-1 decode",
                                                                     "large-batch decode")
        one, many = (band(metric=key, chip=chip, stack=stack, regime=r, level=level)
                     for r in regimes)
        notes.setdefault(kind, (one, many))
        v = values.get(key)
        if v is None or (one.bounds is None and many.bounds is None):
            out[f"{key}_low"] = out[f"{key}_high"] = None
            continue
        lo, hi = (np.where(small, *(np.nan if b.bounds is None else b.bounds[i]
                                    for b in (one, many))) for i in (0, 1))
        v = np.asarray(v, dtype=float)
        out[f"{key}_low"], out[f"{key}_high"] = v * lo, v * hi
    out["interval_note"] = _note(notes, small, level)
    return out


# The figures of a serving run's summary (vllm bench serve's names) that get an interval.
_SERVING_KEY = re.compile(r"(request|output|total_token)_throughput|(mean|median|p[0-9.]+)_"
                          r"(ttft|tpot|itl|e2el)_ms|joules_per_token|cost_per_million_tokens_usd")


# A disaggregated run's pools, prefill first: the pool whose chip a serving figure's band is
# taken from (pool_of), as capacity's rows take theirs (scenarios/capacity/intervals.py).
PREFILL_POOL, DECODE_POOL = 0, 1
_POOL_KINDS = ("first token (prefill pool)", "per token and throughput (decode pool)")
MIXED = ("a figure of both pools of a disaggregated run (E2E latency, energy, price): no "
         "interval model for it")


def pool_of(metric: str) -> int | None:
    """The pool of a prefill -> decode pair that sets a serving figure: the first-token
    figures the prefill pool's (it prefills each prompt for its first token), the per-token
    figures and the throughputs the decode pool's (it emits the output tokens); None for a
    figure of both (E2E latency, energy and price per token), which gets no interval."""
    m = metric.lower()
    if first_token(m):
        return PREFILL_POOL
    if any(t in m for t in ("tpot", "itl", "throughput")):
        return DECODE_POOL
    return None


def pools_of(clusters: Sequence[Any], options: Sequence[Any]) -> list[tuple[Any, str | None]]:
    """A disaggregated run's pools as serving_columns takes them: each one's chip and the
    serving stack it ran with its `options` (None off a GPU), prefill first."""
    return [(c.chip, serving_stacks.stack_of(c.chip, o)) for c, o in zip(clusters, options)]


def serving_columns(summary: Mapping[str, Any], *, chip, stack: str | None,
                    level: float = LEVEL, why_not: str = "",
                    keys: Collection[str] | None = None,
                    pools: Sequence[tuple[Any, str | None]] | None = None) -> dict[str, Any]:
    """`<key>_low`, `<key>_high` for each figure of a serving summary (serve --json, its
    summary.json: vllm bench serve's names; or the `keys` given) and `interval_note`;
    `why_not`: the run has none, and why (the bounds null). `pools`: a disaggregated run's
    (chip, stack) of each pool, prefill first (`chip` and `stack` unused): a figure takes the
    band of the pool that sets it (pool_of), none where both do."""
    out: dict[str, Any] = {}
    notes: dict[str, Band] = {}
    for key, v in summary.items():
        wanted = key in keys if keys is not None else _SERVING_KEY.fullmatch(key)
        if not (wanted and isinstance(v, (int, float)) and not isinstance(v, bool)):
            continue
        kind = "first token" if first_token(key) else "speeds and times"
        if why_not:
            b = Band(None, why_not)
        elif pools is None:
            b = band(metric=key, chip=chip, stack=stack, regime="serving", level=level)
        else:
            i = pool_of(key)
            kind = "E2E, energy and price (both pools)" if i is None else _POOL_KINDS[i]
            b = Band(None, MIXED) if i is None else band(
                metric=key, chip=pools[i][0], stack=pools[i][1], regime="serving", level=level)
        out[f"{key}_low"], out[f"{key}_high"] = ((v * b.bounds[0], v * b.bounds[1])
                                                 if b.bounds is not None else (None, None))
        notes.setdefault(kind, b)
    out["interval_note"] = _note({k: (b, b) for k, b in notes.items()}, True, level)
    return out


def scalar_columns(cols: Mapping[str, Any]) -> dict[str, Any]:
    """`columns` of one point as plain JSON values: floats, None for NaN, the note a string."""
    out: dict[str, Any] = {}
    for k, v in cols.items():
        if k == "interval_note":
            out[k] = str(v)
        else:
            x = None if v is None else float(np.ravel(np.asarray(v, dtype=float))[0])
            out[k] = None if x is None or math.isnan(x) else x
    return out


def _note(notes: Mapping[str, tuple[Band, Band]], small, level: float):
    """Per point: the level, then each regime kind's basis (or why it has no interval)."""
    def text(i: int) -> str:
        reasons = {pair[i].basis for pair in notes.values() if pair[i].bounds is None}
        if len(reasons) == 1 and all(pair[i].bounds is None for pair in notes.values()):
            return f"no intervals: {reasons.pop()}"
        parts = [f"{level:.0%} intervals"]
        for kind, pair in notes.items():
            b = pair[i]
            parts.append(f"{kind}: {b.basis}" if b.bounds else f"{kind}: none, {b.basis}")
        return "; ".join(parts)

    one, many = text(0), text(1)
    if np.ndim(small) == 0:
        return one if small else many
    return np.where(small, one, many).astype(object)


# ---- coverage (validate) -----------------------------------------------------------------------


# The confidence of the interval on each coverage figure (binomial: a group of 6 rows with 4
# inside is consistent with an 80% level, one of 200 with 133 is not)
COVERAGE_CONFIDENCE = 0.95


def wilson(k: int, n: int, confidence: float = COVERAGE_CONFIDENCE) -> tuple[float, float]:
    """Wilson's score interval for a proportion, k of n (n > 0): unlike the normal
    approximation it stays within [0, 1] and keeps its level for the few rows a group has."""
    z = statistics.NormalDist().inv_cdf((1.0 + confidence) / 2.0)
    p, zz = k / n, z * z / n
    mid = (p + zz / 2.0) / (1.0 + zz)
    half = z / (1.0 + zz) * math.sqrt(p * (1.0 - p) / n + zz / (4.0 * n))
    return max(0.0, mid - half), min(1.0, mid + half)


def coverage(samples: Sequence[Sample], level: float = LEVEL) -> dict[str, Any]:
    """How many held-out errors fall inside the interval built without them (each row out in
    turn: the interval model itself cross-validated), overall, per regime and per group
    (chip, regime), each with its binomial interval at COVERAGE_CONFIDENCE (`coverage_low`,
    `coverage_high`: what the rows say the level could be). A row whose interval is None
    without it counts in `no_interval`."""
    model = Model(tuple(samples), {})
    tally: dict[str, list[int]] = {}
    for s in samples:
        chosen, _ = model.errors("tokens_per_s", s.chip, s.kind, s.stack, s.regime, s.id)
        hit = None
        if chosen:
            lo, hi = quantiles(chosen, level)
            hit = lo <= s.error <= hi
        for name in ("overall", s.regime, f"{s.chip} {s.regime}"):
            t = tally.setdefault(name, [0, 0, 0])
            t[0 if hit is None else 1] += 1
            t[2] += bool(hit)
    def entry(t: list[int]) -> dict[str, Any]:
        low, high = wilson(t[2], t[1]) if t[1] else (None, None)
        return {"n": t[1], "covered": t[2], "coverage": t[2] / t[1] if t[1] else None,
                "coverage_low": low, "coverage_high": high, "no_interval": t[0]}

    return {"level": level, "confidence": COVERAGE_CONFIDENCE,
            "overall": entry(tally.get("overall", [0, 0, 0])),
            "by_regime": {r: entry(tally[r]) for r in REGIMES if r in tally},
            "by_group": {k: entry(v) for k, v in sorted(tally.items())
                         if k != "overall" and k not in REGIMES}}


# ---- deriving the model (calibrate) ----------------------------------------------------------


def sample(row: Mapping[str, Any], simulated: float, held_out: str) -> Sample | None:
    """A row's held-out error, if it measures a printed figure (ROW_METRICS, kind value)."""
    if row["metric"] not in ROW_METRICS or row["kind"] != "value" or not simulated > 0:
        return None
    from chip.serving_stacks import DEFAULT_STACK, STACKS

    chip, kind = _row_chip(row["cluster"])
    regime = ROW_METRICS[row["metric"]] or regime_of("tpot_s", row.get("batch", 1))
    options = row.get("options", "default")
    # a GPU row naming no options runs the default stack (chip/serving_stacks.py)
    stack = (options if options in STACKS
             else DEFAULT_STACK if options == "default" and kind == "gpu" else None)
    error = orientation(row["metric"]) * math.log(row["value"] / simulated)
    return Sample(row["id"], chip, kind, stack_family(stack), regime, error, held_out)


@functools.lru_cache(maxsize=256)
def _row_chip(cluster: str) -> tuple[str, str]:
    from rdu_cluster.config import load_cluster

    with calibration.use(None):
        chip = load_cluster(cluster).chip
    return chip.name, chip.kind


def held_out(rows: Sequence[Mapping[str, Any]], check: Mapping[str, float],
             loo: Mapping[str, float]) -> list[Sample]:
    """The held-out samples of `rows`: check rows' simulated values (`check`, under the
    profile) and calibrate rows' leave-one-out ones (`loo`)."""
    out = []
    for row in rows:
        source, role = (check, "check") if row["role"] == "check" else (loo, "loo")
        if row["id"] in source:
            s = sample(row, source[row["id"]], role)
            if s is not None:
                out.append(s)
    return out


def with_spread(samples: Sequence[Sample], spread: Mapping[tuple[str, str], float]) -> list[Sample]:
    """Each sample with its (chip, regime)'s parameter spread (0 where none was measured)."""
    from dataclasses import replace

    return [replace(s, spread=spread.get((s.chip, s.regime), 0.0)) for s in samples]


def resample_ids(full, resamples: int = RESAMPLES, seed: int = 0) -> list[list[list[str]]]:
    """Per bootstrap resample, per group of the fit `full`, its calibrate rows drawn with
    repeats (seeded: the same draws in any number of processes)."""
    rng = np.random.default_rng(seed)
    return [[[g.rows[i] for i in rng.integers(0, len(g.rows), len(g.rows))]
             for g in full.groups] for _ in range(resamples)]


def spread_rows(samples: Sequence[Sample], per_group: int = 3) -> dict[tuple[str, str], list[str]]:
    """(chip, regime) -> up to `per_group` of its held-out rows, spread over them by id: the
    rows the parameter spread is measured on."""
    cells: dict[tuple[str, str], list[str]] = {}
    for s in sorted(samples, key=lambda s: s.id):
        cells.setdefault((s.chip, s.regime), []).append(s.id)
    return {cell: [ids[round(i)] for i in np.linspace(0, len(ids) - 1, min(per_group, len(ids)))]
            for cell, ids in cells.items()}


def parameter_spread(samples: Sequence[Sample], profiles: Sequence[Mapping], sim,
                     per_group: int = 3, jobs: int = 1,
                     progress=None) -> dict[tuple[str, str], float]:
    """(chip, regime) -> the standard deviation of log(simulated) over `profiles` (the fit
    refitted on bootstrap resamples: `derive`), measured on up to `per_group` held-out rows of
    the (chip, regime) (`spread_rows`). The rows' runs in `jobs` processes (fit.Simulator.map:
    the same figures in any number), the serving rows' first."""
    from rdu_cluster.validation import fit

    cells = spread_rows(samples, per_group)
    runs = [(rid, k) for picked in cells.values() for rid in picked for k in range(len(profiles))]
    logs = dict(zip(runs, sim.map(lambda t: math.log(sim(t[0], profiles[t[1]])), runs, jobs,
                                  progress, cost=lambda t: fit.row_cost(sim.rows[t[0]]))))
    out = {}
    for cell, picked in cells.items():
        sds = [float(np.std([logs[(rid, k)] for k in range(len(profiles))])) for rid in picked]
        out[cell] = float(np.sqrt(np.mean(np.square(sds))))
    return out


def _refit_tasks(draws) -> list[tuple[int, list[str]]]:
    """(group index, its draw) of every resample in turn."""
    return [(gi, ids) for draw in draws for gi, ids in enumerate(draw)]


def _refit(full, sim, gi: int, ids: Sequence[str]) -> dict:
    """Group `gi` refitted on the draw `ids`, from the full fit."""
    from rdu_cluster.validation import fit

    return fit.fit_group(full.groups[gi], sim, start=full.values, ids=ids)


def _profiles(full, draws, fitted: Sequence[dict]) -> list[dict]:
    """Each resample's profile: the full fit with its groups' refits (`fitted`, in
    `_refit_tasks` order)."""
    out, it = [], iter(fitted)
    for draw in draws:
        values = dict(full.values)
        for _ in draw:
            values.update(next(it))
        out.append(values)
    return out


def derive(rows: Sequence[Mapping[str, Any]], full, sim, profile: calibration.Profile,
           measurements_version: str, resamples: int = RESAMPLES, jobs: int = 1,
           progress=None) -> dict[str, Any]:
    """The model of `profile` (the fit `full`, `sim` its fit.Simulator) as the JSON object
    `rdu-cluster calibrate` writes. The held-out rows' runs, the leave-one-out refits and the
    bootstrap refits in one map over `jobs` processes (the rows' runs then the spread's in a
    second); `progress(done, total)` over both."""
    from rdu_cluster.validation import fit

    scope = [r for r in rows if r["metric"] in ROW_METRICS and r["kind"] == "value"]
    checks = [r["id"] for r in scope if r["role"] == "check"]
    loos = [(g, rid) for g in full.groups for rid in g.rows]
    draws = resample_ids(full, resamples)
    boots = _refit_tasks(draws)
    tasks = ([("check", rid) for rid in checks] + [("loo", *t) for t in loos]
             + [("refit", *t) for t in boots])

    def run(task):
        kind, *args = task
        if kind == "check":
            return sim(args[0], full.values)
        return fit.left_out(full, *args, sim) if kind == "loo" else _refit(full, sim, *args)

    def cost(task) -> float:
        kind, *args = task
        if kind == "check":
            return fit.row_cost(sim.rows[args[0]])
        return fit.group_cost(args[0] if kind == "loo" else full.groups[args[0]])

    first = len(tasks)  # then the spread's runs: the total grows when they are known
    out = sim.map(run, tasks, jobs, progress, cost=cost)
    check = dict(zip(checks, out[: len(checks)]))
    loo = {rid: v for (_, rid), v in zip(loos, out[len(checks) : len(checks) + len(loos)])}
    profiles = _profiles(full, draws, out[len(checks) + len(loos) :])
    samples = held_out(scope, check, loo)
    later = (lambda n, total: progress(first + n, first + total)) if progress else None
    spread = parameter_spread(samples, profiles, sim, jobs=jobs, progress=later)
    samples = with_spread(samples, spread)
    return {
        "profile": profile.name,
        "profile_digest": digest(profile),
        "date": date.today().isoformat(),
        "code_version": fit.code_version(),
        "measurements_version": str(measurements_version),
        "method": ("held-out log errors (check rows; calibrate rows left out of the fit), "
                   "grouped by chip, stack and regime; parameter spread from "
                   f"{resamples} bootstrap refits; see rdu_cluster/validation/uncertainty.py"),
        "min_rows": MIN_ROWS,
        "small_batch": SMALL_BATCH,
        "spread": [{"chip": c, "regime": r, "sigma": v} for (c, r), v in sorted(spread.items())],
        "samples": [asdict(s) for s in samples],
    }


def model_text(model: Mapping[str, Any]) -> str:
    return json.dumps(model, indent=1, allow_nan=False) + "\n"
