"""Wall and CPU time of `rdu-cluster calibrate`'s fit (in-process) and of the command
`rdu-cluster validate --json` (every row plus the leave-one-out refits; with `--no-loo` the
rows alone, what the tests' shared validate report runs), each a fresh process: over --jobs
processes (default: the cores this process may use) and in one. CPU time counts the worker
processes. Prints the load average beside them: the figures move with the machine's load.

    python benchmarks/bench_validate.py [--jobs N] [--skip-serial]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial

from rdu_cluster import processes
from rdu_cluster.validation import calibration, fit
from rdu_cluster.validation import published as v


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the pool's workers, once joined
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(run: Callable[[], object]) -> tuple[object, float, float]:
    t, c = time.perf_counter(), _cpu()
    out = run()
    return out, time.perf_counter() - t, _cpu() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=processes.available_cores())
    ap.add_argument("--skip-serial", action="store_true", help="Not validate --jobs 1.")
    args = ap.parse_args()
    rows = v.load_cases()
    n_cal = sum(r["role"] == "calibrate" for r in rows)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with calibration.use(None), v.memoised():
        _, wall, cpu = _timed(lambda: fit.fit(rows))
    print(f"calibrate (the fit): {wall:.1f} s wall, {cpu:.1f} s CPU ({n_cal} calibrate rows)")
    runs = [("--no-loo", args.jobs), ("", args.jobs)] + ([] if args.skip_serial else [("", 1)])
    for flag, jobs in runs:
        cmd = [sys.executable, "-c", "from rdu_cluster.entry import run; run()", "validate",
               "--json", "--jobs", str(jobs), *([flag] if flag else [])]
        done, wall, cpu = _timed(partial(subprocess.run, cmd, check=False, capture_output=True,
                                         text=True))
        assert isinstance(done, subprocess.CompletedProcess) and done.returncode in (0, 1), done
        rep = json.loads(done.stdout)
        print(f"validate {flag + ' ' if flag else ''}--jobs {jobs}: {wall:.1f} s wall, "
              f"{cpu:.1f} s CPU ({len(rep['rows'])} rows, {len(rep['leave_one_out'])} "
              "leave-one-out refits)")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
