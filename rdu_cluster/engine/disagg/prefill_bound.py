"""The least a prefill step that completes a request takes in a pair's prefill pool
(Handover.least_prefill): a prefill not known yet ends no sooner than that after a prefill
replica's next window starts, so the frontier of the decode pool waits that much past it;
each window's steps are checked against it as the run goes (check_least)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from chip.cost_tables import PREFILL
from rdu_cluster.engine import lookahead
from rdu_cluster.engine.replica import Window
from rdu_cluster.engine.requests import Request
from rdu_cluster.engine.simulation import Simulation
from workloads.traces import Trace, per_trace


def least_prefill(sim: Simulation) -> float:
    """A lower bound on a prefill step that completes a request in the prefill pool `sim`:
    LEAST_PREFILL_SHARE of the least its cost tables give a step of k of the shortest
    prompts (with a prefix cache over the trace's content, of the fewest tokens a request
    could leave uncached: _least_uncached), or of more tokens within the token budget (k = 1,
    2, 4 ... up to the budget's count of them or --max-batch: a grid of a few evaluations
    however short the prompts); where every prompt has one length and none is cached, the
    least of the steps of k = 1, 2, 3 ... of them, the only ones that complete a request
    (EXACT_PREFILL_SHARE: a 500-client pair's decode windows, cut where a prefill could end,
    went from 1,658 to 1,069: DeepSeek-V3, hgx-h200:tp8:2 + sn40l-16:tp32:3). A replica of
    several pipeline stages runs them one after another in a step (engine/step_times.py):
    the sum of each stage's least. 0 with chunked prefill (a step may complete a prompt's
    last few tokens), or where a stage's sockets do not share one program's tables."""
    t, lim = sim.trace, sim.config.limits
    if not len(t) or lim.chunked_prefill:
        return 0.0
    cached = t.content is not None and any(q.prefix is not None for q in sim.replicas)
    shortest = _least_uncached(t) if cached else int(t.prompt_len.min())
    if shortest < 1:
        return 0.0
    budget = max(lim.token_budget, shortest)
    most = max(min(budget // shortest, lim.max_batch), 1)  # sequences a step may hold
    # every prompt the same length, none cached: a step that completes one is k of them
    exact = not cached and int(t.prompt_len.max()) == shortest
    counts = (range(1, most + 1) if exact
              else sorted({*(2 ** e for e in range(most.bit_length())), most}))  # 1, 2, 4 ...
    shapes = ([(k, k * shortest, 0) for k in counts] if exact else
              [(k, int(n), 0) for k in counts
               for n in np.unique(np.linspace(k * shortest, budget, 8).astype(int))])
    stages = sim.layouts[0].stages
    predictor = sim.predictor or lookahead.Predictor(
        {k: sim.setups[k] for stage in stages for k in stage}, getattr(sim.backend, "memo", None))
    least = 0.0
    for stage in stages:
        tables = predictor.shared(stage)
        if tables is None:
            return 0.0
        tables.fill_prefill(shapes)
        least += min(tables.step_times(PREFILL, 0, 0, 1, shape)[0] for shape in shapes)
    return (EXACT_PREFILL_SHARE if exact else LEAST_PREFILL_SHARE) * least


@per_trace()
def _least_uncached(t: Trace) -> int:
    """The fewest prompt tokens a request of `t` could find uncached: its prompt past the
    longest token prefix (Trace.content) it shares with a request other than it and its
    later turns, prompt and output (any of those may have been prefilled first; a later
    turn, sent after this one completes, cannot). Tokens are a chunk's (id, offset), as the
    prefix cache's blocks hash them (prefix_cache.hashing.block_hashes): a chunk of the same id but
    another length behind the same prefix shares the shorter one's tokens. Once a trace
    (capacity's pair runs serve one trace over and over, 35 ms each)."""
    content = t.content or ()
    after = t.after
    nexts: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (prefix, id) -> (holder, n)
    for j, chunks in enumerate(content):
        key = 0
        for cid, n in chunks:
            nexts.setdefault((key, cid), []).append((j, n))
            key = hash((key, cid, n))

    def later(j: int, i: int) -> bool:  # j follows i in its session (or is i)
        while j >= 0 and j != i:
            j = int(after[j]) if after is not None else -1
        return j == i

    least = None
    for i, chunks in enumerate(content):
        key, hit = 0, 0
        own = functools.partial(later, i=i)
        for cid, n in chunks:
            held = _held(nexts[(key, cid)], n, own)
            hit += min(held, n)
            if held != n:  # a shorter or longer chunk of that id: the tokens part ways
                break
            key = hash((key, cid, n))
        left = int(t.prompt_len[i]) - hit
        least = left if least is None else min(least, left)
    return max(least or 0, 0)


def _held(holders: list[tuple[int, int]], n: int, own: Callable[[int], bool]) -> int:
    """n where a holder not `own` holds the chunk whole (the first such one ends the search:
    a shared prefix is held by most requests), else the longest part of it one holds (0:
    none)."""
    most = 0
    for j, m in holders:
        if not own(j):
            if m == n:
                return n
            most = max(most, m)
    return most


# Half the least a grid of steps costs: a step between the grid's points, or of the same
# tokens over other sequence counts (less attention), may cost less than its neighbours, by far less
# than half on the tables (check_least stops a run where one does, rather than let it
# plan past an arrival).
LEAST_PREFILL_SHARE = 0.5
# Where the steps that complete a request are all on the grid (prompts of one length, none
# cached), the least of them, less what the absolute times' last bits may take from a step's
# length (about 1e-16 of a time; a run of days' times lose 1e-11 s, a step is milliseconds)
EXACT_PREFILL_SHARE = 1.0 - 1e-6


def check_least(least: float, window: Window, ends: np.ndarray, t0: float,
                 done: list[Request]) -> None:
    """Each step of the window that completes a request took at least `least`."""
    starts = lookahead.starts(t0, ends, window.resumes)
    first = window.spans[0].first_step
    for r in done:
        i = r.done_step - first
        if ends[i] - starts[i] < least:
            raise RuntimeError(f"internal error: a prefill step took {ends[i] - starts[i]!r} s,"
                               f" under the least the pool's frontier assumes, {least!r} s")
