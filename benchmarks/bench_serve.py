"""Serving-simulation speed: 1,000 requests (prompt 1,024, output 256, batch up to 32) of
Llama 3.1 70B on sn40l-16, on the local backend and on the Ray backend (16 socket actors).

Targets (issue #5): local >= 20,000 decode steps per wall second; Ray <= 3x the local wall time
on the same run (each the median of three runs; each Ray run starts and stops its own Ray).
Prints the figures; exits 1 if a target is missed (start-up of the Ray workers is reported
apart: it is paid once per session, not per simulated step).

    python benchmarks/bench_serve.py [--rate R] [--requests N] [--skip-ray] [--prefix-cache M]
    python benchmarks/bench_serve.py --light N [--lengths lognormal] [--chunked-prefill B]
                                                 # issue #18: light vs saturated
    python benchmarks/bench_serve.py --prefix-memory N   # issue #18: the prefix cache's memory
    python benchmarks/bench_serve.py --replicas  # issue #18: 1 against 64 replicas
    python benchmarks/bench_serve.py --moe [--requests N] [--rate R]  # expert parallelism

--moe: DeepSeek-V3 on sn40l-16 as one adp16ep16 replica (16 sockets, each step's expert loads
drawn per group: engine/expert_loads.py), the same trace at 100 requests/s: decode steps per
wall and CPU second (the median of 3) and the execution model's evaluations a run
(chip/loaded_steps.py: a group's steps under drawn loads read from kept entries, a prefill
step's sockets one evaluation).

--light N: N requests of Llama 3.1 8B on sn40l-8 (prompt 1,024, output 256) at 50 requests/s
and all at once (saturating), each at N and N/4 requests in a fresh process, written as
`serve --out` writes them (requests, steps and sockets rows streamed): wall and CPU time per request,
windows per request, peak RSS, the RSS each further request adds (the slope between the two
sizes) and the million-request bound it implies (the issue's target: light load within 2x the
saturated time per request, memory bounded by the requests in flight). The peak holds buffers
bounded by the chunk size (rows waiting for their Parquet row group: 16,384 requests' rows;
2 MB of ITLs before they spill), which fill up over the first tens of thousands of requests,
so the slope at small N overstates what a million requests add; the line after it gives the
resident memory each request adds within the larger run, between its middle and its end. The
third line of each load gives the spans it planned a request and the CPU time its replicas
spent planning them (Replica.plan_window), a request and a span: what a light run pays that a
saturated one, in lock step, does not.
`--prefix-cache off` takes the prefix cache's block entries out of the figures. `--lengths
lognormal` draws prompt and output lengths lognormal (means 1,024 and 256, sigma 0.5) instead
of fixed: thousands of distinct prefill shapes, and a saturated run no longer in lock step;
the line of each load then also gives the cost-model evaluations it made. `--chunked-prefill
B` runs both loads with chunked prefill and a token budget of B (Sarathi-Serve; vLLM V1's
default scheduling), whose cached prefixes make most prefill steps a shape of their own.
The time ratio is the median over three rounds of a light and a saturated run back to back
(a shared machine's speed drifts between runs by more than the difference measured). N =
80,000 takes about four minutes on a 2-CPU machine (all eight runs); N = 20,000 about a minute.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.config import load_cluster
from rdu_cluster.engine.prefix_cache import MODES, PrefixConfig
from rdu_cluster.engine.replica import Replica
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from workloads import traces
from workloads.catalog import load_model

LOCAL_STEPS_PER_S = 20_000
RAY_OVER_LOCAL = 3.0


def one(backend, trace, model, cluster, prefix: PrefixConfig | None = None):
    sim = Simulation(model, cluster, trace,
                     ServeConfig(limits=Limits(max_batch=32), prefix=prefix or PrefixConfig()),
                     backend)
    t = time.perf_counter()
    tables = sim.run()
    return sim, tables, time.perf_counter() - t


def serve_rate(model: str, cluster: str, plan: str, requests: int, rate: float) -> dict:
    """Decode steps per second of the local serving engine, median of 3 runs: `wall` over the
    whole call, `run` over the run and its tables (the sockets' start-up, paid once per run,
    apart), `cpu` over the process's CPU seconds (a loaded machine stretches wall time)."""
    spec, mod = load_cluster(cluster), load_model(model)
    trace = traces.synthetic(requests, rate, "poisson", traces.LengthDist("fixed", 1024),
                             traces.LengthDist("fixed", 256))
    runs = []
    for _ in range(3):
        sim = Simulation(mod, spec, trace, ServeConfig(plan=plan, limits=Limits(max_batch=32)),
                         LocalBackend())
        before = _evaluations()
        t, c = time.perf_counter(), time.process_time()
        tables = sim.run()
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        steps = tables.summary["decode_steps"]
        runs.append({"steps": steps, "wall": steps / wall, "cpu": steps / cpu,
                     "run": steps / (sim.wall["run_s"] + sim.wall["tables_s"]),
                     "start_s": sim.wall["start_s"], "windows": tables.summary["windows"],
                     "replicas": len(sim.replicas), "evaluations": _evaluations() - before})
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _evaluations() -> int:
    """The execution model's evaluations so far by the process's shared cost tables
    (backends/local.py: the local backend's sockets cost through them, run after run)."""
    from rdu_cluster.backends import local

    return sum(t.evaluations for t in local._shared.values())


def moe(requests: int, rate: float) -> int:
    """--moe: an expert-parallel replica's serving speed (no target: reported)."""
    r = serve_rate("deepseek-v3", "sn40l-16", "adp16ep16", requests, rate)
    print(f"moe: DeepSeek-V3 adp16ep16 on sn40l-16, {requests} requests, Poisson {rate}/s, "
          f"prompt 1024, output 256, max batch 32: {r['steps']:,.0f} decode steps, "
          f"{r['windows']:,.0f} windows; {r['wall']:,.0f} decode steps/s wall, {r['cpu']:,.0f} "
          f"a CPU second (medians of 3); {r['evaluations']:,.0f} evaluations of the "
          f"execution model a run")
    return 0


def replicas(model: str = "llama-3.1-8b") -> int:
    """Issue #18: `serve` with 64 replicas keeps its decode steps per second. 50 requests a
    replica (Poisson 4/s each, prompt 1,024, output 256) of `model` tp16 on sn40l-16 (one
    replica) and on 64 x SN40L-16 (benchmarks/clusters/sn40l-16x64.toml, 64 replicas)."""
    big = str(Path(__file__).resolve().parent / "clusters" / "sn40l-16x64.toml")
    one = serve_rate(model, "sn40l-16", "tp16", 50, 4.0)
    many = serve_rate(model, big, "tp16", 64 * 50, 64 * 4.0)
    for label, f in (("1 replica", one), ("64 replicas", many)):
        print(f"serve {model} tp16, {label}: {f['steps']:,.0f} decode steps, "
              f"{f['windows']:,.0f} windows; {f['run']:,.0f} decode steps/s over the run "
              f"(start-up {f['start_s']:.2f} s apart), {f['wall']:,.0f} over the whole call, "
              f"{f['cpu']:,.0f} per CPU second (median of 3)")
    ratio = many["cpu"] / one["cpu"]
    print(f"64 replicas / 1 replica, decode steps per CPU second: {ratio:.2f}x "
          f"[target >= 0.8x]; over the run: {many['run'] / one['run']:.2f}x")
    return 0 if ratio >= 0.8 else 1


LENGTHS = {"fixed": (traces.LengthDist("fixed", 1024), traces.LengthDist("fixed", 256)),
           "lognormal": (traces.LengthDist("lognormal", 1024, 0.5),
                         traces.LengthDist("lognormal", 256, 0.5))}


def light_child(n: int, rate: float, prefix: str | None, lengths: str = "fixed",
                budget: int = 0) -> None:
    """One run as `serve --out` makes it: requests, steps and sockets rows streamed into the
    result folder as they are recorded, the links table written at the end."""
    import json
    import resource
    import tempfile

    from rdu_cluster.output import atomic

    model, cluster = load_model("llama-3.1-8b"), load_cluster("sn40l-8")
    trace = traces.synthetic(n, rate, "poisson", *LENGTHS[lengths])
    limits = (Limits(max_batch=32, token_budget=budget, chunked_prefill=True) if budget
              else Limits(max_batch=32))
    config = ServeConfig(limits=limits, prefix=PrefixConfig(mode=prefix))
    resident: dict[str, tuple[int, int]] = {}  # "mid", "end": (requests recorded, RSS)

    def watch(sim: Simulation, _windows: int) -> None:
        k = sim.finished.count
        for name, at in (("mid", n // 2), ("end", n - n // 16)):
            if k >= at and name not in resident:
                resident[name] = (k, _rss_now())

    planning = _PlanningClock()
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulation(model, cluster, trace, config, LocalBackend())
        sim.hooks.append(watch)
        sim.observers.append(planning)
        t, c = time.perf_counter(), time.process_time()
        with atomic.TableFolder(Path(tmp) / "out", ()) as folder:
            tables = sim.run(sink=folder.write)
            folder.commit({"requests": tables.requests, "links": tables.links})
        wall, cpu = time.perf_counter() - t, time.process_time() - c
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    (k0, r0), (k1, r1) = resident["mid"], resident["end"]
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "rss": rss,
                      "run_slope": (r1 - r0) / max(k1 - k0, 1),
                      "windows": tables.summary["windows"], "steps": tables.summary["steps"],
                      "spans": planning.spans, "planning_s": planning.cpu_s,
                      "evaluations": sum(t.evaluations for t in sim.backend.memo.values())}))


class _PlanningClock:
    """The spans a run plans and the CPU time its replicas spend planning them
    (Replica.plan_window, timed around each call: a light run's cost is per span)."""

    def __init__(self) -> None:
        self.spans, self.cpu_s = 0, 0.0
        plan = Replica.plan_window

        def timed(rep, *args, **kwargs):
            t = time.process_time()
            try:
                return plan(rep, *args, **kwargs)
            finally:
                self.cpu_s += time.process_time() - t

        Replica.plan_window = timed  # this child process runs one simulation

    def window(self, sim, rep, window, res, step, t0, m) -> None:
        self.spans += len(window.spans)


def _rss_now() -> int:
    """Resident bytes now (Linux: /proc/self/statm, in pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _child(n: int, rate: float, prefix: str | None, lengths: str, budget: int) -> dict:
    import json
    import subprocess

    run = subprocess.run([sys.executable, __file__, "--light-child", str(n), str(rate),
                          prefix or "default", lengths, str(budget)],
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def light(n: int, prefix: str | None = None, rounds: int = 3, lengths: str = "fixed",
          budget: int = 0) -> int:
    """Each load at n and n // 4 requests, each run in a fresh process: wall and CPU time per
    request at n; memory per request as the slope of peak RSS between the two sizes (what each
    further request adds, the start-up and the caches that stop growing taken out), and the
    bound it implies for a million requests: peak RSS at n plus the slope times the rest.
    The ratio is taken per round, a light run and a saturated run one after the other, and
    the median of `rounds` rounds is the figure (on a shared machine, speed drifts between
    runs a minute apart by more than the difference to be measured)."""
    loads = (("light 50/s", 50.0), ("saturated", float("inf")))
    small = max(n // 4, 1)
    chunked = f"chunked prefill, token budget {budget:,}" if budget else "prefill first"
    print(f"prefix cache: {prefix or 'default (tiered on sn40l)'}; {lengths} lengths; "
          f"{chunked}; {rounds} rounds")
    runs = {label: [] for label, _ in loads}
    for _ in range(rounds):
        for label, rate in loads:
            runs[label].append(_child(n, rate, prefix, lengths, budget))
    for label, rate in loads:
        g = _child(small, rate, prefix, lengths, budget)
        f = runs[label][0]  # memory: the first round (peak RSS does not depend on speed)
        slope = max(f["rss"] - g["rss"], 0) / (n - small) if n > small else 0.0
        bound = f["rss"] + slope * (1_000_000 - n)
        wall = statistics.median(x["wall_s"] for x in runs[label])
        cpu = statistics.median(x["cpu_s"] for x in runs[label])
        print(f"{label:<11} {n:,} requests: {wall:.1f} s = {wall / n * 1e3:.2f} ms "
              f"per request ({cpu / n * 1e3:.2f} ms CPU; medians); {f['windows']:,} windows "
              f"({f['windows'] / n:.2f} a request), {f['steps']:,} steps; peak RSS "
              f"{f['rss'] / 1e9:.2f} GB ({small:,} requests: {g['rss'] / 1e9:.2f} GB): "
              f"{slope / 1e3:.1f} kB per further request -> a million requests ~"
              f"{bound / 1e9:.1f} GB; {f['evaluations']:,} cost-model evaluations")
        print(f"{'':<11} resident memory within the run, from request {n // 2:,} to "
              f"{n - n // 16:,}: {f['run_slope']:,.0f} bytes a request")
        plan_cpu = statistics.median(x["planning_s"] for x in runs[label])
        print(f"{'':<11} {f['spans'] / n:.2f} spans a request; planning them "
              f"{plan_cpu / n * 1e6:.1f} us of CPU a request, "
              f"{plan_cpu / max(f['spans'], 1) * 1e6:.1f} us a span (median)")
    ratio = {k: [a[k] / b[k] for a, b in zip(runs["light 50/s"], runs["saturated"])]
             for k in ("wall_s", "cpu_s")}
    wall, cpu = statistics.median(ratio["wall_s"]), statistics.median(ratio["cpu_s"])
    print(f"light / saturated time per request: {wall:.1f}x wall, {cpu:.1f}x CPU "
          f"[target <= 2x] (median of rounds: "
          f"{', '.join(f'{r:.2f}' for r in ratio['cpu_s'])} CPU)")
    return 0 if wall <= 2 else 1


def prefix_memory(n: int) -> None:
    """Python memory (tracemalloc) the prefix caches hold at the end of a light-load run (the
    --light workload at 50 requests/s) of n // 4 and of n requests, and what each further
    request adds: the cache must grow with its capacity and the requests in flight, not with
    the trace."""
    import tracemalloc

    model, cluster = load_model("llama-3.1-8b"), load_cluster("sn40l-8")
    held = {}
    for k in (max(n // 4, 1), n):
        trace = traces.synthetic(k, 50.0, "poisson", traces.LengthDist("fixed", 1024),
                                 traces.LengthDist("fixed", 256))
        tracemalloc.start()
        sim, _, _ = one(LocalBackend(), trace, model, cluster)
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, "*/engine/prefix_cache/*"),
             tracemalloc.Filter(True, "*/engine/evictions/*")])
        tracemalloc.stop()
        held[k] = sum(s.size for s in snap.statistics("filename"))
        blocks = sum(rep.prefix.blocks_in(t) for rep in sim.replicas
                     for t in rep.prefix.tiers.evictable)
        print(f"prefix cache after {k:,} light requests: {held[k] / 1e6:.2f} MB of Python "
              f"objects for {blocks:,} cached blocks")
    (a, ma), (b, mb) = held.items()
    print(f"prefix cache memory per further request: {(mb - ma) / (b - a):.1f} bytes")


def main() -> int:
    if len(sys.argv) == 7 and sys.argv[1] == "--light-child":
        mode = sys.argv[4]
        light_child(int(sys.argv[2]), float(sys.argv[3]), None if mode == "default" else mode,
                    sys.argv[5], int(sys.argv[6]))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--light", type=int, default=0, help="light vs saturated, N requests")
    ap.add_argument("--prefix-memory", type=int, default=0,
                    help="the prefix cache's memory after N light-load requests")
    ap.add_argument("--replicas", action="store_true", help="1 against 64 replicas")
    ap.add_argument("--moe", action="store_true", help="DeepSeek-V3 adp16ep16 on sn40l-16")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=100.0, help="Poisson arrivals per second")
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--lengths", choices=tuple(LENGTHS), default="fixed",
                    help="--light: prompt and output lengths, fixed or lognormal")
    ap.add_argument("--chunked-prefill", type=int, default=0, metavar="BUDGET",
                    help="--light: chunked prefill with this token budget")
    ap.add_argument("--prefix-cache", choices=MODES, default=None,
                    help="the prefix cache's mode (default: serve's, tiered on sn40l-16)")
    args = ap.parse_args()
    if args.chunked_prefill < 0:
        ap.error(f"--chunked-prefill: a token budget >= 1 (0: off), got {args.chunked_prefill}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load}")
    if args.light:
        return light(args.light, args.prefix_cache, lengths=args.lengths,
                     budget=args.chunked_prefill)
    if args.prefix_memory:
        prefix_memory(args.prefix_memory)
        return 0
    if args.replicas:
        return replicas()
    if args.moe:
        return moe(args.requests, args.rate)
    model, cluster = load_model("llama-3.1-70b"), load_cluster("sn40l-16")
    trace = traces.synthetic(args.requests, args.rate, "poisson",
                             traces.LengthDist("fixed", 1024), traces.LengthDist("fixed", 256))
    prefix = PrefixConfig(args.prefix_cache)
    runs = [one(LocalBackend(), trace, model, cluster, prefix) for _ in range(3)]
    local = runs[-1][1]
    wall = statistics.median(r[2] for r in runs)
    s = local.summary
    rate = s["decode_steps"] / wall
    print(f"trace: {args.requests} requests, Poisson {args.rate}/s, prompt 1024, output 256, "
          f"max batch 32; {s['steps']} steps ({s['decode_steps']} decode), "
          f"{s['windows']} windows")
    print(f"local: {wall:.3f} s wall (median of 3) = {rate:,.0f} decode steps/s "
          f"[target >= {LOCAL_STEPS_PER_S:,}]; simulated {s['makespan_s']:.1f} s, "
          f"{s['tokens_per_s']:.0f} tokens/s, TPOT p50 {s['tpot_s'][50] * 1e3:.1f} ms")
    ok = rate >= LOCAL_STEPS_PER_S
    if not args.skip_ray:
        from rdu_cluster.backends.ray_backend import RayBackend

        rays = [one(RayBackend(), trace, model, cluster, prefix) for _ in range(3)]
        same = all(getattr(local, n).equals(getattr(remote, n)) for _, remote, _ in rays
                   for n in ("requests", "steps", "sockets", "links"))
        runs_s = [r.wall["run_s"] + r.wall["tables_s"] for r, _, _ in rays]
        run = statistics.median(runs_s)
        local_run = statistics.median(r.wall["run_s"] + r.wall["tables_s"] for r, _, _ in runs)
        rsim, total = rays[-1][0], statistics.median(t for _, _, t in rays)
        print(f"ray:   {len(rsim.backend.setups)} actors; start-up {rsim.wall['start_s']:.2f} s, "
              f"shut-down {rsim.wall['close_s']:.2f} s, "
              f"run {run:.3f} s = {run / local_run:.2f}x local's {local_run:.3f} s "
              f"[target <= {RAY_OVER_LOCAL}x] (medians of 3; the runs: "
              f"{', '.join(f'{r / local_run:.2f}x' for r in runs_s)}); whole call {total:.2f} s "
              f"= {total / wall:.1f}x; tables identical to local: {same}")
        ok = ok and same and run / local_run <= RAY_OVER_LOCAL
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
