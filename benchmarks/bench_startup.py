"""CLI start-up (issue #36): `rdu-cluster --help` and a default `rdu-cluster simulate`, each run
as a fresh process (python -m rdu_cluster.entry's console-script path) several times.

Targets, on 2 cores: --help under 0.3 s, a default simulate under 0.5 s. Prints, per command,
the median wall time, the median CPU time of the process (user + system: on a machine shared
with other work the wall time includes waiting for a CPU, the CPU time does not), the summed
`python -X importtime` of the top-level imports (what the command loads), and the machine's
core count. Exits 1 if a median CPU time misses its target.

    python benchmarks/bench_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time

RUN = ("from rdu_cluster.entry import run; import sys; "
       "sys.argv = ['rdu-cluster', *sys.argv[1:]]; run()")
# As installed: bytecode cached (a PYTHONDONTWRITEBYTECODE=1 shell recompiles every module on
# every run, ~0.4 s of a simulate); the first run of each command writes the cache, untimed.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
COMMANDS = {"--help": (["--help"], 0.3), "simulate": (["simulate"], 0.5)}


def once(args: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", RUN, *args], check=True, stdout=subprocess.DEVNULL,
                   env=ENV)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def import_seconds(args: list[str]) -> float:
    """The top-level imports' cumulative times, summed (python -X importtime)."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", RUN, *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    return sum(int(m) for m in re.findall(r"^import time:\s+\d+ \|\s+(\d+) \| \S",
                                           r.stderr, re.MULTILINE)) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    runs = ap.parse_args().runs
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}, runs: {runs}")
    missed = False
    for name, (args, target) in COMMANDS.items():
        once(args)  # writes the bytecode cache
        times = [once(args) for _ in range(runs)]
        wall = statistics.median(w for w, _ in times)
        cpu = statistics.median(c for _, c in times)
        imports = statistics.median(import_seconds(args) for _ in range(max(1, runs // 2)))
        ok = cpu <= target
        missed |= not ok
        print(f"rdu-cluster {name:9s} wall {wall:.3f} s  cpu {cpu:.3f} s  imports {imports:.3f} s"
              f"  target {target} s: {'ok' if ok else 'MISSED'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
