"""Where a capacity question's CPU goes: every engine run its verification makes (bench_capacity.py's
questions, the same command), logged with its deployment, weights, request count, what asked
for it and its CPU seconds, then summed by kind (pair or system), phase and request count.

The phases (scenarios/capacity/steady.py):
- search: the boundary's bisection at the question's request count;
- doubling: the boundary row served again with twice the requests (a pair's run goes on from
  its kept run at half the count: verification._pair_served), the row's own run at half the
  count where it was found at the longer one, and the search going on there where a verdict
  changed;
- one fewer: the boundary's other side at the steady count (steady._one_fewer);
- interval ends: the row's interval, its ends searched on the same runs (intervals.with_ends).
A run stopped once certain to miss is counted where it stopped. CPU is each run's own
(time.process_time in the process that served it); the question's wall and CPU as
bench_capacity.py prints them are those of the whole command.

    python benchmarks/capacity_runs.py [--only NAME] [--runs] [-- extra capacity args]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import sys
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the rdu-cluster command sets it
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_capacity import COMMON, JOBS, PAIR_ARGS, QUESTIONS

_LOG: dict = {"file": None}  # the question's run log, open while it runs


def _instrument() -> None:
    """Wrap capacity's engine run (candidates.verify) and the steps that call it, so that each
    run appends a line to the open log (the candidates' forked workers inherit the wrappers and
    the file; a line is written at once, with O_APPEND)."""
    from rdu_cluster.scenarios.capacity import candidates, intervals, steady

    phase = ["main"]
    verify = candidates.verify

    def logged(dep, model, ref, traffic, slo, fabric, backend, stop=None):
        t = time.process_time()
        res = verify(dep, model, ref, traffic, slo, fabric, backend, stop)
        _LOG["file"].write(json.dumps({
            "deployment": " + ".join(map(str, dep.pools)), "weights": ref[1],
            "pair": dep.disaggregated, "requests": traffic.n_requests(traffic.rate or 0.0),
            "seed": traffic.seed, "phase": phase[-1], "stopped": bool(res.decided),
            "meets": res.meets_slo, "cpu_s": time.process_time() - t}) + "\n")
        return res

    def tagged(fn, tag: str):
        def run(*args, **kwargs):
            phase.append(tag)
            try:
                return fn(*args, **kwargs)
            finally:
                phase.pop()
        return run

    candidates.verify = logged
    steady._one_fewer = tagged(steady._one_fewer, "one fewer")
    intervals.with_ends = tagged(intervals.with_ends, "interval ends")


def question(name: str, extra: list[str], show_runs: bool) -> None:
    from rdu_cluster.cli import main

    args = ["capacity", *QUESTIONS[name], *COMMON, *PAIR_ARGS, *JOBS, *extra]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "runs.jsonl")
        t, c0 = time.perf_counter(), _cpu()
        with open(path, "a", buffering=1) as _LOG["file"], \
                contextlib.redirect_stdout(io.StringIO()):
            try:
                main.main(args, prog_name="rdu-cluster", standalone_mode=False)
            except SystemExit as e:
                if e.code not in (0, 1, None):
                    raise
        wall, cpu = time.perf_counter() - t, _cpu() - c0
        with open(path) as f:
            runs = [json.loads(line) for line in f]
    # a run the boundary's search or settle made: at the question's own count (the least any
    # run has), the search; at a longer one, a doubling (and the search going on there)
    base = min((r["requests"] for r in runs), default=0)
    for r in runs:
        if r["phase"] == "main":
            r["phase"] = "search" if r["requests"] == base else "doubling"
    print(f"\n== {name}: rdu-cluster {' '.join(args)}")
    if show_runs:
        for r in runs:
            print(f"  {r['weights'] or '':5} {r['deployment']:<40} {r['requests']:>6}  "
                  f"{r['phase']:<13} {'stopped' if r['stopped'] else '':<7} "
                  f"{'meets' if r['meets'] else 'misses':<6} {r['cpu_s']:6.2f} s")
    groups: dict[tuple, list] = defaultdict(lambda: [0, 0.0])
    for r in runs:
        g = groups[("pairs" if r["pair"] else "systems", r["phase"], r["requests"])]
        g[0] += 1
        g[1] += r["cpu_s"]
    print(f"{'kind':<8} {'phase':<14} {'requests':>8} {'runs':>5} {'CPU s':>7}")
    order = ("search", "doubling", "one fewer", "interval ends")
    for (kind, ph, n), (k, s) in sorted(groups.items(),
                                       key=lambda kv: (kv[0][0], order.index(kv[0][1]),
                                                       kv[0][2])):
        print(f"{kind:<8} {ph:<14} {n:>8,} {k:>5} {s:>7.1f}")
    for kind in ("pairs", "systems"):
        mine = [r for r in runs if (r["pair"] if kind == "pairs" else not r["pair"])]
        print(f"{kind}: {len(mine)} runs, {sum(r['cpu_s'] for r in mine):.1f} s of CPU")
    print(f"{name}: {len(runs)} runs, {sum(r['cpu_s'] for r in runs):.1f} s of CPU in runs; "
          f"the command: wall {wall:.1f} s, CPU {cpu:.1f} s (this process and its workers), "
          f"{os.cpu_count()} CPUs")


def _cpu() -> float:
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=tuple(QUESTIONS), action="append")
    ap.add_argument("--runs", action="store_true", help="list every run, in the order it ended")
    ap.add_argument("extra", nargs="*", help="more capacity arguments (after --)")
    a = ap.parse_args()
    _instrument()
    for name in a.only or QUESTIONS:
        question(name, a.extra, a.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
