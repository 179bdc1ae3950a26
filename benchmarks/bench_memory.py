"""Bounded work and memory (issue #36): each case a fresh `rdu-cluster` process, its wall time and
peak resident memory printed beside its limit.

1. A 54-point local serve sweep (3 clusters x 3 arrival rates x 3 batch limits x 2 output
   lengths, 200 requests a point, one process): rows stream to the dataset's parts, so memory
   stays flat in the points. Limit 1.5 GB.
2. `serve --timeline` on 100,000 requests (Llama 3.1 8B on dgx-h100): the trace streams to its
   file and the requests to the tables, so memory stays flat in the request count. Limit 1 GB.
3. One node of 2,048 sockets (`plan --set sockets_per_node=2048 --sockets 2048`): plan search
   answers or refuses within 10 s.

Peak memory is the process's maximum resident set (getrusage of a waited child: the largest
of the command and any process it waited for, not their sum; the local sweep here runs in one
process). Exits 1 if a case misses its limit.

    python benchmarks/bench_memory.py [--only N]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = """
[sweep]
name = "serve-54"
kind = "serve"
seed = 0

[base]
model = "llama-3.1-8b"
plan = "tp8"
requests = 200
arrival = "poisson"
prompt_len = "uniform:128:1024"
scheduler = "continuous"

[[axes]]
type = "grid"
cluster = ["sn40l-8", "dgx-h100", "dgx-a100"]
rate = [5.0, 20.0, 80.0]
max_batch = [8, 32, 128]
output_len = [64, 256]
"""


def measure(args: list[str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS in GB and exit code of `rdu-cluster ARGS` run by a fresh waiter
    (so the maximum is this command's alone)."""
    waiter = ("import resource, subprocess, sys; "
              "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
              "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)")
    entry = ("from rdu_cluster.entry import run; import sys; "
             "sys.argv = ['rdu-cluster', *sys.argv[1:]]; run()")
    cmd = [sys.executable, "-c", entry, *args]
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", waiter, *cmd], capture_output=True, text=True,
                         check=True).stdout.split()
    return time.perf_counter() - t0, int(out[0]) * 1024 / 1e9, int(out[1])


def cases(tmp: Path) -> list[tuple[str, list[str], str, float]]:
    spec = tmp / "serve-54.toml"
    spec.write_text(SWEEP)
    return [
        ("54-point local serve sweep", ["sweep", str(spec), "--out", str(tmp / "sweep"),
                                        "--no-progress"], "GB", 1.5),
        ("serve --timeline, 100,000 requests",
         ["serve", "--model", "llama-3.1-8b", "--cluster", "dgx-h100", "--plan", "tp8",
          "--requests", "100000", "--rate", "200", "--output-len", "32", "--prompt-len", "256",
          "--timeline", str(tmp / "trace.json"), "--out", str(tmp / "serve"), "--no-progress"],
         "GB", 1.0),
        ("plan on a 2,048-socket node",
         ["plan", "--model", "llama-3.1-8b", "--cluster", "dgx-h100", "--sockets", "2048",
          "--set", "sockets_per_node=2048"], "s", 10.0),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", type=int, choices=(1, 2, 3), default=None, help="run only case N")
    only = ap.parse_args().only
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}")
    missed = False
    with tempfile.TemporaryDirectory() as d:
        for i, (name, args, unit, limit) in enumerate(cases(Path(d)), 1):
            if only not in (None, i):
                continue
            wall, rss, rc = measure(args)
            figure = rss if unit == "GB" else wall
            ok = figure <= limit and (rc == 0 or unit == "s")  # a refusal in time is an answer
            missed |= not ok
            print(f"{i}. {name}: {wall:.1f} s, peak RSS {rss:.2f} GB, exit {rc} "
                  f"(limit {limit:g} {unit}: {'met' if ok else 'MISSED'})")
    return 1 if missed else 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
