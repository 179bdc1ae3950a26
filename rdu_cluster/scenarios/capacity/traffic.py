"""The traffic a capacity question serves (closed-loop users or an open-loop rate over
synthetic lengths, a trace replayed as it is, multi-turn sessions) and the requests that verify
it."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from workloads import traces

if TYPE_CHECKING:
    from rdu_cluster.scenarios.capacity.deployment import Deployment


# Steady state (steady.py): a closed loop is verified with STEADY_START requests per user, the
# first of each left out (warm-up); the boundary row is served again with twice the requests
# until its pP TTFT, pP TPOT and output throughput move less than STEADY_TOL (a pP on the scale
# of its bound where it lies under it: steady._moved).
STEADY_START = 4
STEADY_TOL = 0.05


@dataclass(frozen=True)
class Traffic:
    concurrency: int | None
    rate: float | None
    prompt: str = "1024"
    output: str = "256"
    requests: int | None = None  # default: 2 per user (closed loop) or 2 x rate x 30 s
    seed: int = 0
    prefix_cache: str | None = None  # serve --prefix-cache (None: its default)
    # A fixed workload (a trace file, or the multi-turn sessions) replayed as it is, and the
    # serve arguments that rebuild it; None: synthetic requests of `prompt` / `output`.
    trace: traces.Trace | None = None
    workload_args: tuple[str, ...] = ()
    think_s: float = 0.0  # sessions: mean seconds a user thinks between turns
    # closed loops (clients, sessions) start over one estimated cycle (E2E and think time:
    # Deployment.ramp_s) instead of all at 0, or over ramp_s seconds where given (--ramp-up);
    # False: sessions a --rate starts
    ramp: bool = True
    ramp_s: float | None = None
    steady_tol: float | None = STEADY_TOL  # None: no doubling check (--steady-tolerance off)
    spec_args: tuple[str, ...] = ()  # the --acceptance / --tree given with --draft

    @property
    def sessions(self) -> bool:
        return self.trace is not None and self.trace.after is not None

    def ramp_of(self, dep: Deployment) -> float:
        """Seconds over which the closed loops start (0: together, or a --rate starts them)."""
        if not self.ramps:
            return 0.0
        return dep.ramp_s if self.ramp_s is None else self.ramp_s

    @property
    def ramps(self) -> bool:
        """Whether the closed loops start over the ramp (not a --rate's session starts)."""
        return self.ramp and self.concurrency is not None and (self.trace is None
                                                               or self.sessions)

    def prefill_share(self, outputs: bool = True, room: float = math.inf) -> float:
        """The share of prompt tokens prefilled (not served from the prefix cache): those past
        the longest prefix an earlier request of the trace holds (a session's turns reach the
        replica of its first: engine/dispatch.py), its output held with it or not (a pair's
        prefill pool serves each prompt for one token: the answer it never computed is
        prefilled with the next turn). Every cached prefix kept (the default): a lower bound
        on the work, which verification checks (the sessions question's H100 tp2 x 11 ->
        SN40L-16 pair: 0.348 without outputs, a hit rate of 65.1% served). With `room`, the
        tokens of its own history a session's replica keeps for it (session_room), a turn
        whose session left it more finds only what other sessions hold too. 1 without a
        cache or content."""
        if self.prefix_cache == "off" or self.trace is None or self.trace.content is None:
            return 1.0
        return self._kept(("share", outputs, room), lambda: self._prefill_share(outputs, room))

    def _prefill_share(self, outputs: bool, room: float) -> float:
        trace = cast(traces.Trace, self.trace)  # (prefill_share: it has content)
        hit, shared, held = prefix_hits(trace, outputs)
        found = np.where(held <= room, hit, shared)
        prompt = trace.prompt_len
        return float(np.maximum(prompt - found, 0).sum()) / float(prompt.sum())

    def _kept(self, key: tuple, figure: Callable[[], Any]) -> Any:
        """figure(), kept on the instance under `key`: a function of its frozen fields. The
        analytic pass sizes each of a pair's prefill plans with each decode plan and asks the
        same figures of the sessions question ~1,500 times (0.54 s of its start-up, most of
        it prefix_hits' per-trace keys; 0.14 s so)."""
        kept = self.__dict__.setdefault("_figures", {})
        if key not in kept:
            kept[key] = figure()
        return kept[key]

    def history_replicas(self, cache_tokens: float, outputs: bool = True) -> int:
        """The fewest replicas whose prefix caches (`cache_tokens` each) hold, at every turn,
        what each session's last turn left for it (its prompt, and with `outputs` its
        answer) all at once: below it an LRU cache evicts a history before its session
        returns (their reuse is cyclic) and the pool prefills it again; the sessions
        question's H100 tp2 FP8 prefill pool at 14 replicas (20 hold the histories) found
        none of its fourth turns' history and queued them ~10 s. 0 without sessions, a
        cache or content, or where a --rate starts the sessions (not all at once)."""
        if not (self.sessions and self.ramp) or self.prefill_share(outputs) == 1.0:
            return 0
        t = cast(traces.Trace, self.trace)
        most = self._kept(("history", outputs), lambda: max(
            np.bincount(turns(t), weights=prefix_hits(t, outputs)[2])))
        return math.ceil(most / cache_tokens) if most > 0 else 0

    def session_room(self, cache_tokens: float, replicas: int) -> float:
        """The tokens of its own history each session finds kept in a pool of `replicas`
        whose prefix caches hold `cache_tokens` each: the sessions, pinned to the replica of
        their first turn, share the caches evenly, and a closed loop's sessions go turn by
        turn together (they start within one cycle), so that at a turn every session's last
        turn is held, and an LRU cache too small for them all evicts each before it returns
        (its sessions' cyclic reuse). Unbounded without sessions, or where a --rate starts
        them (not all at once)."""
        if not (self.sessions and self.ramp):
            return math.inf
        ids = cast(np.ndarray, cast(traces.Trace, self.trace).session)  # sessions: both set
        count = self._kept(("sessions",), lambda: len(np.unique(ids[ids >= 0])))
        return cache_tokens * replicas / max(count, 1)

    @property
    def one_token(self) -> bool:
        """Every request has one output token, so none has a TPOT (a fixed or uniform length,
        or a lognormal of sigma 0, that rounds to 1; a trace's own lengths)."""
        if self.trace is not None:
            return bool((self.trace.output_len <= 1).all())
        d = self.dists()[1]
        top = d.b if d.kind == "uniform" else d.a if d.kind == "fixed" or d.b == 0 else math.inf
        return top < 1.5  # the largest length drawn rounds to 1

    def dists(self) -> tuple[traces.LengthDist, traces.LengthDist]:
        return (traces.LengthDist.parse(self.prompt, "--prompt-len"),
                traces.LengthDist.parse(self.output, "--output-len"))

    def mean_lengths(self) -> tuple[float, float]:
        if self.trace is not None:
            return float(self.trace.prompt_len.mean()), float(self.trace.output_len.mean())
        p, o = self.dists()
        draw = lambda d: float(np.mean(d.sample(np.random.default_rng(0), 4096)))
        return draw(p), draw(o)

    def n_requests(self, rate: float) -> int:
        if self.trace is not None:
            return len(self.trace)
        if self.requests:
            return self.requests
        if self.concurrency:
            return STEADY_START * self.concurrency
        return max(50, int(rate * 30))

    @property
    def warmup(self) -> int:
        """Requests left out of the statistics as warm-up: a closed loop's first request of
        each client or session (the ramp: serve --warmup-requests)."""
        closed = self.concurrency and (self.trace is None or self.sessions)
        return cast(int, self.concurrency) if closed else 0  # closed: it has a concurrency

    @property
    def steadies(self) -> bool:
        """Whether the runs are taken to steady state: synthetic traffic (not a trace or the
        sessions, the question's own workload) checked by doubling, measured with the initial
        transient left out (MetricSpec.mser)."""
        return self.trace is None and bool(self.steady_tol)

    @property
    def drawn(self) -> bool:
        """Whether its lengths are drawn (a distribution), so that seeds differ."""
        return self.trace is None and any(d.kind != "fixed" for d in self.dists())


def uncached_tokens(trace: traces.Trace, outputs: bool = True) -> int:
    """Prompt tokens of `trace` past the longest chunk prefix an earlier request held: its
    prompt and, with `outputs`, its output (a turn's answer is cached with it, as vLLM's
    prefix cache keeps it where it was decoded)."""
    hit = prefix_hits(trace, outputs)[0]
    return int(np.maximum(trace.prompt_len - hit, 0).sum())


@traces.per_trace()
def turns(trace: traces.Trace) -> np.ndarray:
    """Each request's turn in its session (0: the first, or a request of none)."""
    turn = np.zeros(len(trace), np.int64)
    for i in range(len(trace)):
        after = trace.follows(i)
        if after >= 0:  # a row follows an earlier one (sessions.sessions)
            turn[i] = turn[after] + 1
    return turn


@traces.per_trace()
def prefix_hits(trace: traces.Trace, outputs: bool = True
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request of `trace`: the prompt tokens a prefix cache that kept every earlier
    request finds (the longest chunk prefix one held: its prompt and, with `outputs`, its
    output); those it finds in prefixes other sessions hold too (what a cache too small for
    the session's own history still finds: a system prompt every session's use keeps warm);
    and the tokens the session's earlier request (the row it follows) left for it to find,
    0 for none. Once a trace (the analytic pass asks it of every plan: 49 times, ~10 ms
    each, for the sessions question)."""
    n = len(trace)
    hit, shared, held = (np.zeros(n, np.int64) for _ in range(3))
    # asked only of a trace with content (Traffic.prefill_share)
    content = cast("tuple[tuple[tuple[int, int], ...], ...]", trace.content)
    session = trace.session if trace.session is not None else np.full(n, -1)
    keys = [list(itertools.accumulate(ch, lambda k, c: hash((k, c)), initial=0))[1:]
            for ch in content]  # each chunk's prefix key
    kept = [_kept(trace, i, content[i], keys[i], outputs) for i in range(n)]
    owner: dict[int, int] = {}  # a prefix's key -> the session that holds it (-2: several)
    for i, held_keys in enumerate(kept):  # the whole trace's: its sessions run side by side
        for k in held_keys:
            owner[k] = int(session[i]) if owner.get(k, session[i]) == session[i] else -2
    seen: set[int] = set()
    for i, chunks in enumerate(content):
        found = list(itertools.takewhile(lambda kc: kc[0] in seen,
                                         zip(keys[i], (c[1] for c in chunks))))
        hit[i] = sum(c for _, c in found)
        me = int(session[i])
        for k, c in found:  # up to the first prefix only its own session holds
            if me >= 0 and owner[k] == me:
                break
            shared[i] += c
        after = trace.follows(i)
        if after >= 0:
            held[i] = _left(trace, after, outputs)
        seen.update(kept[i])
    return hit, shared, held


def _kept(trace: traces.Trace, i: int, chunks: tuple[tuple[int, int], ...], keys: list[int],
          outputs: bool) -> list[int]:
    """The prefix keys request i leaves in the cache: its chunks' within its prompt and, with
    `outputs`, its output."""
    keep = _left(trace, i, outputs)
    ends = itertools.accumulate(c for _, c in chunks)
    return [k for k, end in zip(keys, ends) if end <= keep]


def _left(trace: traces.Trace, i: int, outputs: bool) -> int:
    """The tokens request i leaves in the cache: its prompt and, with `outputs`, its
    output."""
    return int(trace.prompt_len[i]) + (int(trace.output_len[i]) if outputs else 0)
