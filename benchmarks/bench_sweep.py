"""Sweep throughput: 10,000 analytic decode points (examples/sweeps/decode-10k.toml).

1. Local backend, end to end as a user runs it (`rdu-cluster sweep ... --out`, a fresh process):
   must finish in under 10 s.
2. Ray, one embedded instance with 2 CPUs: points per second with 1 and with 2 tasks in flight,
   the same task size for both, actors warmed first (a cold worker's imports are start-up, not
   throughput); 5 runs each, interleaved, and the best of each counts: the machine is shared
   (other jobs take a core at times) and the best run is the one least disturbed. Parallel
   efficiency = rate(2) / (2 * rate(1)), must be >= 80% (rate(2) >= 1.6 x rate(1)).

    python benchmarks/bench_sweep.py [--points-per-task N] [--repeats N] [--no-check]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rdu_cluster.sweep import RayExecutor, count_rows, expand, load_spec, run_sweep

SPEC = ROOT / "examples" / "sweeps" / "decode-10k.toml"
LOCAL_LIMIT_S = 10.0
MIN_SPEEDUP = 1.6


def bench_local(tmp: Path) -> float:
    out = tmp / "local"
    entry = "from rdu_cluster.cli import main; main()"
    cmd = [sys.executable, "-c", entry, "sweep", str(SPEC), "--out", str(out)]
    start = time.perf_counter()
    subprocess.run([*cmd, "--no-progress"], check=True, cwd=ROOT, env=_env(), capture_output=True)
    wall = time.perf_counter() - start
    print(
        f"local: 10,000 points end to end (new process, CLI): {wall:.2f} s "
        f"({count_rows(out):,} rows)"
    )
    return wall


def bench_ray(tmp: Path, points_per_task: int, repeats: int) -> tuple[float, float]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        spec = load_spec(SPEC)
        points = expand(spec).points
        backend = RayExecutor()
        # Warm both actors on every (cluster, model) group: imports and config caches are
        # start-up cost, paid once per sweep, not throughput.
        _run(spec, points[::3], tmp / "warm", backend, 2, 250)
        rates: dict[int, list[float]] = {1: [], 2: []}
        for i in range(repeats):  # interleaved, so a slow spell of the machine hits both
            for workers in (1, 2):
                s = _run(spec, points, tmp / f"ray{workers}-{i}", backend, workers, points_per_task)
                rates[workers].append(s.points_per_s)
        for workers, r in rates.items():
            print(
                f"ray: {workers} worker(s): median {statistics.median(r):,.0f} points/s, best "
                f"{max(r):,.0f} (of {repeats}: {', '.join(f'{x:,.0f}' for x in r)})"
            )
        return max(rates[1]), max(rates[2])
    finally:
        ray.shutdown()


def _run(spec, points, out: Path, backend, workers: int, ppt: int):
    backend.workers = workers
    shutil.rmtree(out, ignore_errors=True)
    return run_sweep(spec, points, out, backend, points_per_task=ppt, progress=False)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points-per-task", type=int, default=625)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-check", action="store_true", help="report only, never fail")
    args = ap.parse_args()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load}; spec {SPEC.relative_to(ROOT)}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        wall = bench_local(tmp)
        r1, r2 = bench_ray(tmp, args.points_per_task, args.repeats)
    speedup = r2 / r1
    print(
        f"ray: speedup (best vs best) {speedup:.2f}x with 2 workers, parallel efficiency {speedup / 2:.0%}"
    )
    failed = []
    if wall >= LOCAL_LIMIT_S:
        failed.append(f"local {wall:.2f} s >= {LOCAL_LIMIT_S} s")
    if speedup < MIN_SPEEDUP:
        failed.append(f"speedup {speedup:.2f} < {MIN_SPEEDUP}")
    if failed and not args.no_check:
        print("FAIL: " + "; ".join(failed))
        return 1
    print("ok" if not failed else "below target: " + "; ".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
