"""Capacity-planning speed, memory and answers: three questions a capacity planner asks, each
run by `rdu-cluster capacity` (analytic pre-filter, bisection to the boundary, serving-engine
verification) in a process of its own, its wall time, CPU time and peak resident memory
printed with each system's cheapest answer.

1. deepseek-v3: DeepSeek-V3 FP8, 500 chat users (closed loop), prompt 1,024 and output 256
   tokens, p99 TTFT <= 1.5 s and p99 TPOT <= 25 ms, on SN40L-16, DGX H100 and HGX H200 and the
   pairs H100 -> SN40L-16 and H200 -> SN40L-16 (prefill pool -> decode pool).
2. llama-70b: Llama 3.1 70B at BF16 and FP8, 500 users, 2,048 / 400 tokens, the same SLO,
   systems and pairs.
3. llama-70b-sessions: the same model, dtypes, systems and pairs with 500 multi-turn sessions
   (4 turns, a 1,024-token shared system prompt, 5 s think time; each turn a 2,048-token
   message and a 400-token answer).

Target (issue #34): each question under 20 s of wall time and 1.5 GB of peak resident memory on
2 cores (capacity --jobs 2: candidates verified in two processes; the peak is the largest of
the process and its workers). On a machine shared with other work the wall time includes waiting for a CPU: the
load average is printed beside it. Exits 1 if a target is missed or a command fails. A system
with no deployment meeting the SLO within --max-nodes is an answer, not a failure.

With --reserve K, each question's answer (its cheapest row that meets) is served again from its
own serve_args with K times the requests (`rdu-cluster serve`), and the benchmark prints whether
it still meets the SLO and whether its $/Mtok (the row's price per hour over the re-served
steady output throughput) lands inside the row's interval (a sessions question is its own
workload: not re-served).

With --no-pairs the two pairs are left out (each system alone): a diagnostic of where the time
goes, not the question, so the targets count as missed.

With --repeat N each question is run N times in turn (its rows printed once: every run gives
the same bytes), each run's wall, CPU and peak RSS printed, and the question judged on the
median wall and the largest peak: on a shared 2-CPU machine one reading says little (question 1
took 15.1 and 18.4 s of wall, 29.1 and 34.9 s of CPU, back to back on 2026-12-07, the same
rows).

    python benchmarks/bench_capacity.py [--only NAME] [--reserve K] [--no-pairs] [--repeat N]
                                        [-- extra capacity args]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

TARGET_S = 20.0
TARGET_RSS_GB = 1.5
CLUSTERS = ("sn40l-16", "dgx-h100", "hgx-h200")
PAIRS = ("dgx-h100:sn40l-16", "hgx-h200:sn40l-16")
SLO = ("--slo", "ttft:1500", "--slo", "tpot:25")
PAIR_ARGS = tuple(a for p in PAIRS for a in ("--pair", p))
COMMON = (*[a for c in CLUSTERS for a in ("--cluster", c)], *SLO, "--max-nodes", "24", "--json",
          "--no-progress")  # (stderr is printed after the rows: its errors, not a progress line)
JOBS = ("--jobs", "2")  # the two cores (capacity verifies candidates in two processes)
QUESTIONS = {
    "deepseek-v3": ("--model", "deepseek-v3", "--weights", "fp8", "--concurrency", "500",
                    "--prompt-len", "1024", "--output-len", "256"),
    "llama-70b": ("--model", "llama-3.1-70b", "--weights", "bf16", "--weights", "fp8",
                  "--concurrency", "500", "--prompt-len", "2048", "--output-len", "400"),
    "llama-70b-sessions": ("--model", "llama-3.1-70b", "--weights", "bf16", "--weights", "fp8",
                           "--sessions", "500", "--turns", "4", "--system-prompt", "1024",
                           "--think-time", "5", "--prompt-len", "2048", "--output-len", "400"),
}


@dataclass(frozen=True)
class Reading:
    """One run of a question's command: its exit code, output, and what it took."""

    code: int
    out: str
    err: str
    wall_s: float
    cpu_s: float
    rss_gb: float
    load: float  # the load average at its start


def measure(args: list[str]) -> Reading:
    """The capacity command run once in a process of its own, timed."""
    load = os.getloadavg()[0]
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        proc = subprocess.Popen([sys.executable, "-c", "from rdu_cluster.entry import run; run()",
                                 *args], stdout=out_f, stderr=err_f, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (peak RSS)
        wall = time.perf_counter() - t
        out_f.seek(0), err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    return Reading(os.waitstatus_to_exitcode(status), out, err, wall,
                   usage.ru_utime + usage.ru_stime,
                   usage.ru_maxrss * 1024 / 1e9,  # Linux: kilobytes
                   load)


def run(name: str, extra: list[str], reserve: int = 0, pairs: bool = True, repeat: int = 1
        ) -> tuple[bool, float]:
    args = ["capacity", *QUESTIONS[name], *COMMON, *(PAIR_ARGS if pairs else ()), *JOBS, *extra]
    print(f"\n== {name}: rdu-cluster {' '.join(args)}")
    readings: list[Reading] = []
    for k in range(repeat):
        got = measure(args)
        readings.append(got)
        if got.code not in (0, 1):
            print(got.err.strip().splitlines()[-1] if got.err.strip() else "(no message)")
            return False, got.rss_gb
        if repeat > 1:
            print(f"run {k + 1} of {repeat}: wall {got.wall_s:.1f} s, CPU {got.cpu_s:.1f} s, "
                  f"peak RSS {got.rss_gb:.2f} GB; load average at the start {got.load:.1f}",
                  flush=True)
    first = readings[0]
    rows = [json.loads(line) for line in first.out.splitlines() if line.startswith("{")]
    same = all(r.out == first.out for r in readings)
    if not same:
        print("THE RUNS' ROWS DIFFER (the command is not deterministic)")
    _print(rows)
    answer = next((r for r in rows if r["meets_slo"]), None)
    if reserve > 1 and answer is not None and "--sessions" not in answer["serve_args"]:
        _reserve(answer, reserve)
    if first.err.strip():
        print(first.err.strip())
    wall = statistics.median(r.wall_s for r in readings)
    cpu = statistics.median(r.cpu_s for r in readings)
    rss_gb = max(r.rss_gb for r in readings)
    ok = wall < TARGET_S and rss_gb < TARGET_RSS_GB and pairs and same
    of = f" (median of {repeat})" if repeat > 1 else ""
    print(f"{name}{'' if pairs else ' WITHOUT ITS PAIRS (not the whole question)'}: wall "
          f"{wall:.1f} s{of} (target < {TARGET_S:.0f} s), CPU {cpu:.1f} s, peak RSS "
          f"{rss_gb:.2f} GB (target < {TARGET_RSS_GB} GB); load average at the start "
          f"{first.load:.1f} on {os.cpu_count()} CPUs")
    return ok, rss_gb


def _print(rows: list[dict]) -> None:
    pw = next((k[:-8] for k in (rows[0] if rows else {}) if k.endswith("_ttft_ms")), "p99")
    print(f"{'system':<24} {'nodes':>11} {'plan':<36} {'tok/s/user':>10} {'$/Mtok':>15} "
          f"{pw + ' TTFT':>9} {pw + ' TPOT':>9}  SLO")
    best: dict[tuple, dict] = {}
    for row in rows:  # ranked: the first row of a system and dtype is its cheapest
        best.setdefault((row["system"], row["weights"]), row)
    for (system, w), row in best.items():
        lo, hi = row.get("nodes_low"), row.get("nodes_high")
        end = lambda x, fmt: "?" if x is None else format(x, fmt)  # past --max-nodes
        known = lo is not None or hi is not None
        nodes = f"{row['nodes']}" + (f" ({end(lo, 'd')}-{end(hi, 'd')})" if known else "")
        usd = row["usd_per_million_tokens"]
        ulo, uhi = row.get("usd_per_million_tokens_low"), row.get("usd_per_million_tokens_high")
        usd_s = "-" if usd is None else f"{usd:.2f}" + (
            f" ({end(ulo, '.2f')}-{end(uhi, '.2f')})" if known else "")
        verdict = "meets" if row["meets_slo"] else "misses"
        if row.get("robust") is not None:
            verdict += ", robust" if row["robust"] else ", not robust"
        ttft, tpot = row.get(f"{pw}_ttft_ms"), row.get(f"{pw}_tpot_ms")
        print(f"{system + (' ' + w if w else ''):<24} {nodes:>11} {row['plan']:<36} "
              f"{_f(row['tokens_per_s_per_user'], '.1f'):>10} {usd_s:>15} "
              f"{_f(ttft, '.0f'):>9} {_f(tpot, '.2f'):>9}  {verdict}")


def _reserve(row: dict, k: int) -> None:
    """Serve the row again with k times its requests; its verdict and $/Mtok against the row's."""
    args = list(row["serve_args"])
    i = args.index("--requests")
    args[i + 1] = str(k * int(args[i + 1]))
    with tempfile.TemporaryDirectory() as out:
        t = time.perf_counter()
        doc = json.loads(subprocess.run(
            [sys.executable, "-c", "from rdu_cluster.entry import run; run()", "serve", *args,
             "--json", "--no-progress", "--out", out + "/run"],
            capture_output=True, text=True, check=True).stdout)
        wall = time.perf_counter() - t
    pw = next(k[:-8] for k in row if k.endswith("_ttft_ms"))
    ttft, tpot = doc[f"{pw}_ttft_ms"], doc[f"{pw}_tpot_ms"]
    meets = ttft <= 1500 and tpot <= 25
    usd = row["usd_per_hour"] * 1e6 / 3600 / doc["output_throughput"]
    lo, hi = row.get("usd_per_million_tokens_low"), row.get("usd_per_million_tokens_high")
    inside = ("no interval" if lo is None or hi is None
              else "inside" if lo <= usd <= hi else "OUTSIDE")
    print(f"re-served x{k} ({args[i + 1]} requests, {wall:.0f} s): {row['system']} {row['plan']}: "
          f"{pw} TTFT {ttft:.0f} ms, {pw} TPOT {tpot:.2f} ms ({'meets' if meets else 'MISSES'}; "
          f"row {row[f'{pw}_tpot_ms']:.2f} ms), $/Mtok {usd:.2f} (row "
          f"{row['usd_per_million_tokens']:.2f}, interval {_f(lo, '.2f')}-{_f(hi, '.2f')}: "
          f"{inside})")


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=tuple(QUESTIONS), action="append")
    ap.add_argument("--reserve", type=int, default=0,
                    help="re-serve each answer with this many times its requests")
    ap.add_argument("--no-pairs", action="store_true",
                    help="leave the two pairs out (the systems alone: a diagnostic, not the "
                    "question; the target then counts as missed)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run each question N times, judged on the median wall (default 1)")
    ap.add_argument("extra", nargs="*", help="more capacity arguments (after --)")
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error("--repeat: a count of 1 or more")
    results = [run(name, a.extra, a.reserve, not a.no_pairs, a.repeat)
               for name in (a.only or QUESTIONS)]
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
