"""Where a pair's run goes: a capacity row's serve_args (a prefill pool handing over to a
decode pool in a closed loop, as `capacity` verifies it: summary-only) run in this process,
each run's CPU split by pool, with each pool's windows, steps a window and mean batch at a
window's end, and a digest of the summary (the same digest: the same figures, so two code
versions can be compared run for run). The pairs' runs are most of bench_capacity.py's
questions 2 and 3 (capacity_runs.py: 70 and 57 of their runs, ~80% of their CPU).

- q2: question 2's BF16 `dgx-h100:tp4:9 + sn40l-16:tp8:3` row, 4,000 requests of 2,048 /
  400 tokens from 500 clients;
- q3: question 3's FP8 `dgx-h100:tp2:19 + sn40l-16:tp4:13` row, 500 sessions of 4 turns
  (a 1,024-token system prompt, 2,048 / 400 tokens a turn, 5 s think time).
Both as `capacity` printed their serve_args (the same command: bench_capacity.py).

The first run of a process fills the cost tables (what a capacity worker does once); the runs
after it are what each further run of a search costs. On a shared machine the CPU seconds move
by 30-50% from minute to minute; `--instructions` instead counts the instructions of one warm
run (valgrind's callgrind: a process of two runs less a process of one, 4-7 minutes a pair),
which the machine's load does not move. `--sample` prints where the warm runs' CPU went by
function, from a sample of the stack each millisecond of CPU or as often as the kernel's timer
ticks (SIGPROF; ~6 ms here): a profiler that times every call (cProfile) overstates the small
functions this loop is made of. It splits them by pool too: the samples taken in a prefill
window, in a decode window, and between windows (the coupled loop, the hand-overs, the run's
start and its tables), each pool's share and what ran inside it (q2 at 4b4f30e: decode 42.8%,
prefill 34.5%, between 22.8%).

    python benchmarks/bench_pair.py [--pair q2|q3] [--runs N] [--instructions] [--sample]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

COMMON = ("--fabric", "ib-ndr", "--seed", "0", "--metric-percentiles", "50,99", "--goodput",
          "ttft:1500 tpot:25", "--stack", "sglang", "--no-progress")
PAIRS = {
    "q2": ("--model", "llama-3.1-70b", "--weights", "bf16", "--prefill-pool", "dgx-h100:tp4:9",
           "--decode-pool", "sn40l-16:tp8:3", "--requests", "4000", "--prompt-len", "2048",
           "--output-len", "400", "--max-batch", "192", "--concurrency", "500", "--ramp-up",
           "8.38797", "--warmup-requests", "500", "--warmup-mser"),
    "q3": ("--model", "llama-3.1-70b", "--weights", "fp8", "--prefill-pool", "dgx-h100:tp2:19",
           "--decode-pool", "sn40l-16:tp4:13", "--sessions", "500", "--turns", "4",
           "--system-prompt", "1024", "--think-time", "5", "--prompt-len", "2048",
           "--output-len", "400", "--max-batch", "32", "--ramp-up", "13.6926",
           "--warmup-requests", "500"),
}


def _instrument() -> dict:
    """Each run's figures: the CLI's run made summary-only (as capacity's verification runs
    it) and timed, each window's CPU counted by the pool it ran in."""
    from rdu_cluster.cli import serve as cli_serve
    from rdu_cluster.engine import windows

    # pool -> [windows, steps, batches at their ends, CPU, empty executions, their CPU]
    got: dict = {"pools": collections.defaultdict(lambda: [0, 0, 0, 0.0, 0, 0.0])}
    make = cli_serve._simulation

    def summary_only(*args, **kw):
        sim = make(*args, **kw)
        sim.summary_only = True
        run = sim.run

        def timed():
            got["pools"].clear()
            t = time.process_time()
            out = run()
            got["cpu"] = time.process_time() - t
            got["digest"] = hashlib.sha1(json.dumps(out.summary, sort_keys=True,
                                                    default=str).encode()).hexdigest()[:12]
            return out

        sim.run = timed
        return sim

    execute = windows.WindowExecutor.execute

    def counted(self, rep, t0):
        before, t = rep.step, time.process_time()
        end = execute(self, rep, t0)
        pool = got["pools"][_pool(self.sim)]
        cpu = time.process_time() - t
        pool[3] += cpu
        if end is None:  # nothing to run: a replica woken at a horizon with no work
            pool[4], pool[5] = pool[4] + 1, pool[5] + cpu
        else:
            pool[0], pool[1], pool[2] = pool[0] + 1, pool[1] + rep.step - before, \
                pool[2] + len(rep.running)
        return end

    cli_serve._simulation = summary_only
    windows.WindowExecutor.execute = counted
    return got


class _Sampler:
    """Counts, at each SIGPROF, the function running (self) and each function on the stack
    (inclusive), named by file and function; and the pool whose window was running (the
    WindowExecutor.execute on the stack; "between" where none was: the coupled loop, the
    hand-overs, the run's start and tables), with each pool's inclusive counts."""

    def __init__(self) -> None:
        self.own: collections.Counter = collections.Counter()
        self.pools: collections.Counter = collections.Counter()  # samples a pool
        self.in_pool: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter)  # pool -> function -> samples (inclusive)
        self.n = 0

    def __call__(self, sig, frame) -> None:
        self.n += 1
        self.own[_name(frame)] += 1
        stack = list(_stack(frame))
        pool = next((_pool(f.f_locals["self"].sim) for f in stack if _executes(f)), "between")
        self.pools[pool] += 1
        self.in_pool[pool].update({_name(f) for f in stack})

    @contextlib.contextmanager
    def on(self):
        old = signal.signal(signal.SIGPROF, self)
        signal.setitimer(signal.ITIMER_PROF, 0.001, 0.001)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0, 0)
            signal.signal(signal.SIGPROF, old)

    def print(self, top: int = 25) -> None:
        within = sum(self.in_pool.values(), collections.Counter())
        for title, counts in (("self", self.own), ("inclusive", within)):
            print(f"{self.n} samples, {title}:")
            shown = [(k, v) for k, v in counts.most_common() if v < self.n]  # not the callers'
            for k, v in shown[:top]:
                print(f"  {100 * v / self.n:5.1f}% {k}")
        for pool, n in self.pools.most_common():
            print(f"{100 * n / self.n:.1f}% of the samples in {pool}, inclusive:")
            shown = [(k, v) for k, v in self.in_pool[pool].most_common() if v < n]
            for k, v in shown[:top // 2]:
                print(f"  {100 * v / self.n:5.1f}% {k}")


def _executes(f) -> bool:
    """Whether `f` is a frame of WindowExecutor.execute (a window of a pool running)."""
    return f.f_code.co_name == "execute" and f.f_code.co_filename.endswith(
        os.path.join("engine", "windows.py"))


def _pool(sim) -> str:
    """The pool a pair's Simulation `sim` is: its dispatcher's kind (prefill, decode)."""
    return type(sim.dispatch).__name__.removesuffix("Side").lower()


def _name(f) -> str:
    """file:function; a dataclass's generated __init__ by its class."""
    name = f"{os.path.relpath(f.f_code.co_filename)}:{f.f_code.co_name}"
    if f.f_code.co_filename == "<string>" and "self" in f.f_locals:
        name += f" [{type(f.f_locals['self']).__name__}]"
    return name


def _stack(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


def _runs(name: str, n: int, sample: bool = False) -> None:
    from rdu_cluster.entry import run as cli

    got = _instrument()
    sampler = _Sampler()
    for i in range(n):
        with tempfile.TemporaryDirectory() as d:
            sys.argv = ["rdu-cluster", "serve", *PAIRS[name], *COMMON, "--out", f"{d}/out"]
            with open(os.devnull, "w") as null, (sampler.on() if sample and i
                                                  else contextlib.nullcontext()):
                out, sys.stdout = sys.stdout, null
                try:
                    cli()
                except SystemExit as e:
                    if e.code:
                        raise
                finally:
                    sys.stdout = out
        parts = []
        for pool, (w, steps, batch, cpu, idle, idle_cpu) in got["pools"].items():
            parts.append(f"{pool} {w:,} windows x {steps / max(w, 1):.2f} steps (batch at its "
                         f"end {batch / max(w, 1):.1f}), {cpu:.2f} s, of which {idle} empty "
                         f"{idle_cpu:.2f} s")
        print(f"{name} run {i + 1}{' (cold)' if i == 0 else ''}: {got['cpu']:.2f} s CPU; "
              f"{'; '.join(parts)}; summary {got['digest']}", flush=True)
    if sample:  # the warm runs': the first fills the cost tables
        sampler.print()


def _instructions(name: str) -> None:
    """The instructions of one warm run: callgrind's count of a process of two runs less
    that of a process of one (string hashing seeded alike, so that sets and dicts iterate
    alike: the counts of one code version then agree to ~0.1%)."""
    if shutil.which("valgrind") is None:
        sys.exit("--instructions: valgrind is not installed")
    counts = []
    for n in (1, 2):
        with tempfile.TemporaryDirectory() as d:
            proc = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/cg", sys.executable,
                 os.path.abspath(__file__), "--pair", name, "--runs", str(n)],
                capture_output=True, text=True, check=True,
                env={**os.environ, "PYTHONHASHSEED": "0"})  # the same dict orders each time
        counts.append(int(re.search(r"Collected : (\d+)", proc.stderr).group(1)))
        print(proc.stdout.strip().splitlines()[-1])
    print(f"{name}: one warm run {counts[1] - counts[0]:,} instructions (callgrind)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", choices=sorted(PAIRS), action="append")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--instructions", action="store_true")
    ap.add_argument("--sample", action="store_true")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error(f"--runs: must be a positive number of runs, got {a.runs}")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the rdu-cluster command sets it
    for name in a.pair or sorted(PAIRS):
        if a.instructions:
            _instructions(name)
        else:
            _runs(name, a.runs, a.sample)


if __name__ == "__main__":
    main()
