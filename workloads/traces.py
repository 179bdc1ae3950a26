"""Request traces: synthetic generators (arrivals x prompt lengths x output lengths, seeded) and
files (CSV, Parquet or Arrow IPC) with one request a row.

A trace is columnar (numpy arrays), sorted by arrival time with ties kept in file / generation
order, and every request has an integer id equal to its row. Arrival processes:
- fixed: one request every 1 / rate seconds (the first at 0);
- poisson: exponential gaps of mean 1 / rate;
- bursty: gamma gaps of mean 1 / rate and coefficient of variation `burstiness` (> 1 is burstier
  than Poisson; 1 is Poisson), the arrival model of vLLM's serving benchmark;
- rate = inf: every request at time 0 (a closed batch, for throughput runs).
Length distributions: fixed N; uniform LO..HI (inclusive); lognormal with a given mean and sigma of
the underlying normal, rounded to the nearest integer and clipped to >= 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workloads.errors import ConfigError

ARRIVALS = ("fixed", "poisson", "bursty")
LENGTHS = ("fixed", "uniform", "lognormal")

# Accepted column names in trace files (first one is canonical).
COLUMNS = {
    "arrival_s": ("arrival_s", "arrival_time_s", "arrival_time", "arrival", "timestamp_s"),
    "prompt_len": ("prompt_len", "prompt_tokens", "input_len", "input_tokens", "context_tokens"),
    "output_len": ("output_len", "output_tokens", "gen_len", "generated_tokens"),
    "model": ("model", "model_name"),
}


@dataclass(frozen=True)
class Trace:
    arrival_s: np.ndarray  # float64, sorted
    prompt_len: np.ndarray  # int64 >= 1
    output_len: np.ndarray  # int64 >= 1
    model: tuple[str, ...] | None = None  # per request, when the trace names models
    source: str = ""

    def __len__(self) -> int:
        return len(self.arrival_s)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.prompt_len) != n or len(self.output_len) != n:
            raise ConfigError(f"trace {self.source}: columns have different lengths")
        if self.model is not None and len(self.model) != n:
            raise ConfigError(f"trace {self.source}: model column has a different length")


@dataclass(frozen=True)
class LengthDist:
    kind: str = "fixed"
    a: float = 1024.0  # fixed: N; uniform: LO; lognormal: mean
    b: float = 0.0  # uniform: HI; lognormal: sigma

    @classmethod
    def parse(cls, text: str, where: str) -> LengthDist:
        """'1024', 'fixed:1024', 'uniform:128:2048', 'lognormal:1024:0.5'."""
        parts = str(text).split(":")
        if len(parts) == 1:
            parts = ["fixed", parts[0]]
        kind, args = parts[0], parts[1:]
        want = {"fixed": 1, "uniform": 2, "lognormal": 2}
        if kind not in want or len(args) != want[kind]:
            raise ConfigError(
                f"{where}: {text!r}: expected N, fixed:N, uniform:LO:HI or lognormal:MEAN:SIGMA"
            )
        try:
            vals = [float(x) for x in args]
        except ValueError:
            raise ConfigError(f"{where}: {text!r}: not a number") from None
        dist = cls(kind, vals[0], vals[1] if len(vals) > 1 else 0.0)
        dist.check(where)
        return dist

    def check(self, where: str) -> None:
        if self.kind not in LENGTHS:
            raise ConfigError(f"{where}: unknown length distribution {self.kind!r}")
        if self.a < 1 or (self.kind == "uniform" and self.b < self.a):
            raise ConfigError(f"{where}: lengths must be >= 1 (and HI >= LO)")
        if self.kind == "lognormal" and self.b < 0:
            raise ConfigError(f"{where}: sigma must be >= 0")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, round(self.a), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(round(self.a), round(self.b) + 1, size=n, dtype=np.int64)
        mu = math.log(self.a) - self.b**2 / 2  # so that the mean is `a`
        return np.maximum(1, np.rint(rng.lognormal(mu, self.b, size=n))).astype(np.int64)


def arrivals(kind: str, n: int, rate: float, rng: np.random.Generator, burstiness: float = 1.0):
    if not rate > 0:
        raise ConfigError(f"--rate: must be positive, got {rate}")
    if kind not in ARRIVALS:
        raise ConfigError(f"arrivals: unknown {kind!r}; accepted: {', '.join(ARRIVALS)}")
    if math.isinf(rate):
        return np.zeros(n)
    if kind == "fixed":
        return np.arange(n) / rate
    if kind == "poisson":
        gaps = rng.exponential(1.0 / rate, size=n)
    else:
        if not burstiness > 0:
            raise ConfigError(f"--burstiness: must be positive, got {burstiness}")
        shape = 1.0 / burstiness**2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n)
    gaps[0] = 0.0  # the first request opens the trace
    return np.cumsum(gaps)


def synthetic(
    n: int,
    rate: float,
    arrival: str = "poisson",
    prompt: LengthDist = LengthDist("fixed", 1024),
    output: LengthDist = LengthDist("fixed", 256),
    seed: int = 0,
    burstiness: float = 1.0,
) -> Trace:
    """A seeded synthetic trace. Three independent streams (arrivals, prompts, outputs) are
    spawned from the seed, so changing one distribution leaves the other columns as they were."""
    if n < 1:
        raise ConfigError(f"--requests: must be positive, got {n}")
    prompt.check("--prompt-len")
    output.check("--output-len")
    r_arr, r_prompt, r_out = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    return Trace(
        arrival_s=arrivals(arrival, n, rate, r_arr, burstiness),
        prompt_len=prompt.sample(r_prompt, n),
        output_len=output.sample(r_out, n),
        source=f"synthetic({arrival}, n={n}, rate={rate}, seed={seed})",
    )


def read_trace(path: str | Path) -> Trace:
    """A trace file: .csv, .parquet or .arrow / .feather, columns as in COLUMNS."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--trace {path}: no such file")
    table = _read_table(path)
    cols = {c.lower(): c for c in table.column_names}
    found = {}
    for key, names in COLUMNS.items():
        hit = next((cols[n] for n in names if n in cols), None)
        if hit is None and key != "model":
            raise ConfigError(
                f"--trace {path}: missing column {key!r} (accepted names: {', '.join(names)})"
            )
        found[key] = hit
    return _validated(table, found, str(path))


def _read_table(path: Path):
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".csv":
            return pcsv.read_csv(path)
        if path.suffix == ".parquet":
            return pq.read_table(path)
        if path.suffix in (".arrow", ".feather", ".ipc"):
            with pa.memory_map(str(path)) as src:
                return pa.ipc.open_file(src).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise ConfigError(f"--trace {path}: unreadable ({str(e).splitlines()[0]})") from None
    raise ConfigError(f"--trace {path}: expected a .csv, .parquet or .arrow file")


def _validated(table, found: dict, where: str) -> Trace:
    try:
        arr = np.asarray(table.column(found["arrival_s"]).to_numpy(zero_copy_only=False), float)
        prompt = _ints(table, found["prompt_len"])
        out = _ints(table, found["output_len"])
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--trace {where}: non-numeric value ({e})") from None
    if len(arr) == 0:
        raise ConfigError(f"--trace {where}: no requests")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ConfigError(f"--trace {where}: arrival times must be finite and >= 0")
    for name, col in (("prompt length", prompt), ("output length", out)):
        if np.any(col < 1):
            raise ConfigError(f"--trace {where}: every {name} must be >= 1")
    order = np.argsort(arr, kind="stable")
    models = None
    if found["model"] is not None:
        names = table.column(found["model"]).to_pylist()
        models = tuple(str(names[i]) for i in order)
    return Trace(arr[order], prompt[order], out[order], models, where)


def _ints(table, column: str) -> np.ndarray:
    values = np.asarray(table.column(column).to_numpy(zero_copy_only=False), dtype=float)
    if not np.all(np.isfinite(values)) or np.any(values != np.rint(values)):
        raise ValueError(f"column {column} must hold whole numbers")
    return values.astype(np.int64)


def write_csv(trace: Trace, path: str | Path) -> None:
    """Write a trace as CSV (the format read_trace reads), for tests and hand-made traces."""
    lines = ["arrival_s,prompt_len,output_len" + (",model" if trace.model else "")]
    for i in range(len(trace)):
        row = f"{float(trace.arrival_s[i])!r},{trace.prompt_len[i]},{trace.output_len[i]}"
        lines.append(row + (f",{trace.model[i]}" if trace.model else ""))
    Path(path).write_text("\n".join(lines) + "\n")
