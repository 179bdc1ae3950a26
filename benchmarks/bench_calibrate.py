"""The whole `rdu-cluster calibrate` as the README runs it (the fit, then the uncertainty model:
every held-out row, the leave-one-out and bootstrap refits), in a fresh process writing to a
temporary folder, with `--jobs N` for each N given (default: 1 and the cores this process may
use). Prints, per run, the wall time, the CPU time of the process and its workers (user +
system: on a shared machine the wall time includes waiting for a CPU, the CPU time does not),
the load average before and after, and whether the profile and the model it wrote are the
shipped ones (cluster_configs/calibration/default.*) but for their date and code version.

Target (issue 33): under a minute of wall time on 2 cores. Exits 1 if a run writes other
values than the shipped ones.

    python benchmarks/bench_calibrate.py [--jobs N ...]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = ("from rdu_cluster.entry import run; import sys; "
       "sys.argv = ['rdu-cluster', *sys.argv[1:]]; run()")
SHIPPED = Path(__file__).resolve().parents[1] / "cluster_configs" / "calibration"
# What differs between two runs of the same code on the same rows on another day or commit.
STAMPS = re.compile(r'^\s*"?(date|code_version)"?\s*[=:].*$', re.MULTILINE)


def once(jobs: int, folder: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one calibrate writing folder/default.toml."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", RUN, "calibrate", "--no-progress", "--jobs",
                    str(jobs), "--out", str(folder / "default.toml")], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def same_as_shipped(folder: Path) -> bool:
    return all(STAMPS.sub("", (folder / name).read_text())
               == STAMPS.sub("", (SHIPPED / name).read_text())
               for name in ("default.toml", "default.uncertainty.json"))


def main() -> None:
    cores = len(os.sched_getaffinity(0))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, action="append",
                        help=f"processes (repeatable; default: 1 and {cores})")
    args = parser.parse_args()
    ok = True
    for jobs in args.jobs or sorted({1, cores}):
        with tempfile.TemporaryDirectory() as tmp:
            load = os.getloadavg()[0]
            wall, cpu = once(jobs, Path(tmp))
            same = same_as_shipped(Path(tmp))
            ok &= same
            print(f"calibrate --jobs {jobs}: wall {wall:.1f} s, CPU {cpu:.1f} s on {cores} cores "
                  f"(load average {load:.2f} before, {os.getloadavg()[0]:.2f} after); "
                  f"profile and model {'identical to' if same else 'DIFFER from'} the shipped "
                  "ones but for date and code version")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
