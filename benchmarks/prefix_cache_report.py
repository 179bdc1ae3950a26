"""Prompt caching on multi-turn traffic: TTFT (mean, p99) and output throughput with the prefix
cache off, in HBM only and tiered (DDR on sn40l-16, host memory on dgx-h100), and the hit rate
per tier, for Llama 3.1 70B on sn40l-16 and dgx-h100. Workloads: synthetic sessions
(`serve --sessions`, defaults below) and the Mooncake conversation-trace excerpt
(tests/data/traces), and agent-like sessions whose 2,048-token tool outputs outgrow HBM.
Prints one row per run (simulated figures; the wall seconds of each run beside them).
Usage: python benchmarks/prefix_cache_report.py [SESSIONS TURNS [WORKLOAD-SUBSTRING]]

--cpu [SESSIONS ...] [--rounds R]: what the cache costs the simulator (issue #36: within 2x of
a run without it). `rdu-cluster serve --model llama-3.1-70b --cluster sn40l-16 --sessions S
--turns 10 --prefix-cache off|hbm|tiered --out DIR --no-progress`, each a fresh process
(start-up included, as a user waits for it), the user CPU seconds of each (the median of R
rounds, a round runs the three modes back to back: a shared machine's speed drifts between
runs) and each mode's ratio to off; the CPUs and the load average are printed with them.
Defaults: 200 and 2,000 sessions, 3 rounds."""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rdu_cluster.backends import make as make_backend
from rdu_cluster.config import load_cluster
from rdu_cluster.engine.prefix_cache import PrefixConfig
from rdu_cluster.engine.requests import DONE
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from workloads import traces
from workloads.catalog import load_model
from workloads.sessions import SessionSpec, ThinkTime, sessions

MODEL = "llama-3.1-70b"
CLUSTERS = ("sn40l-16", "dgx-h100")
MOONCAKE = Path(__file__).resolve().parents[1] / "tests/data/traces/mooncake_conversation_200.jsonl"


def workloads(n: int, turns: int) -> dict:
    spec = SessionSpec(n, turns, system_tokens=1024,
                       user=traces.LengthDist("lognormal", 256, 0.8),
                       output=traces.LengthDist("lognormal", 256, 0.5),
                       think=ThinkTime("exponential", 5.0), rate=2.0)
    agent = SessionSpec(n, turns, system_tokens=1024,
                        user=traces.LengthDist("lognormal", 2048, 0.5),
                        output=traces.LengthDist("lognormal", 256, 0.5),
                        think=ThinkTime("exponential", 20.0), rate=2.0)
    return {
        # a 16,384-token budget: turn 10's history can pass 8,192 tokens
        f"sessions {n}x{turns}": (sessions(spec, seed=0), Limits(token_budget=16384)),
        # histories of ~24k tokens x 200 sessions: more than the HBM left for KV
        f"agent {n}x{turns}": (sessions(agent, seed=0), Limits(chunked_prefill=True)),
        "mooncake excerpt": (traces.read_trace(MOONCAKE), Limits(chunked_prefill=True)),
    }


def run(trace, limits, cluster: str, mode: str):
    sim = Simulation(load_model(MODEL), load_cluster(cluster), trace,
                     ServeConfig(limits=limits, prefix=PrefixConfig(mode)),
                     make_backend("local"))
    t0 = time.perf_counter()
    tables = sim.run()
    wall = time.perf_counter() - t0
    req = tables.requests.to_pydict()
    ttft = np.array([v for v, s in zip(req["ttft_s"], req["state"]) if s == DONE])
    return tables.summary, ttft, wall


RUN = ("from rdu_cluster.entry import run; import sys; "
       "sys.argv = ['rdu-cluster', *sys.argv[1:]]; run()")


def serve_cpu(sessions: int, mode: str) -> float:
    """User CPU seconds of one `rdu-cluster serve` of `sessions` 10-turn sessions, fresh."""
    with tempfile.TemporaryDirectory() as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
        subprocess.run([sys.executable, "-c", RUN, "serve", "--model", MODEL, "--cluster",
                        CLUSTERS[0], "--sessions", str(sessions), "--turns", "10",
                        "--prefix-cache", mode, "--out", f"{out}/serve", "--no-progress"],
                       check=True, stdout=subprocess.DEVNULL)
        return resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before


def cpu(args: list[str]) -> None:
    rounds = 3
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        args = args[:i] + args[i + 2:]
    sizes = [int(a) for a in args] or [200, 2000]
    serve_cpu(20, "hbm")  # bytecode cached before anything is timed
    print(f"{MODEL} on {CLUSTERS[0]}, N sessions x 10 turns; user CPU seconds of "
          f"`rdu-cluster serve`, median of {rounds} rounds; {os.cpu_count()} CPUs, load "
          f"average {os.getloadavg()[0]:.1f}")
    for n in sizes:
        times: dict[str, list[float]] = {m: [] for m in ("off", "hbm", "tiered")}
        for _ in range(rounds):
            for mode, got in times.items():
                got.append(serve_cpu(n, mode))
        off = statistics.median(times["off"])
        print(f"sessions {n:>6}: " + "  ".join(
            f"{m} {statistics.median(t):6.2f} s ({statistics.median(t) / off:.2f}x)"
            for m, t in times.items()) + f"  (load average {os.getloadavg()[0]:.1f})",
            flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--cpu"]:
        cpu(sys.argv[2:])
        return
    n, turns = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (200, 10)
    only = sys.argv[3] if len(sys.argv) > 3 else ""
    print(f"{MODEL}; TTFT in ms, throughput in output tokens/s (simulated)")
    print(f"{'workload':<20} {'cluster':<9} {'cache':<7} {'served':>9} {'TTFT mean':>10} "
          f"{'TTFT p99':>9} {'tok/s':>7} {'hit':>6} {'per tier':<26} {'copy s':>7} {'wall s':>6}")
    for name, (trace, limits) in workloads(n, turns).items():
        if only not in name:
            continue
        for cluster in CLUSTERS:
            for mode in ("off", "hbm", "tiered"):
                s, ttft, wall = run(trace, limits, cluster, mode)
                tiers = " ".join(f"{t} {v:.1%}" for t, v in
                                 s["prefix_cache_hit_rate_by_tier"].items()) if mode != "off" else "-"
                print(f"{name:<20} {cluster:<9} {mode:<7} {s['served']:>4}/{s['requests']:<4} "
                      f"{ttft.mean() * 1e3:>10.1f} {s['ttft_s'][99] * 1e3:>9.1f} "
                      f"{s['tokens_per_s']:>7.0f} {s['prefix_cache_hit_rate']:>6.1%} "
                      f"{tiers:<26} {s['prefix_copy_s']:>7.3f} {wall:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
