"""Serving metrics as `vllm bench serve` reports them, so a simulated run can be set beside a
real one (vLLM's vllm/benchmarks/serve.py, `calculate_metrics` and the result JSON it saves).

Per completed request, as vLLM measures them at the client:
- TTFT: first token's time minus the request's send time;
- E2EL: last token's time minus the send time;
- TPOT: (E2EL - TTFT) / (output tokens - 1), for requests of more than one output token
  (goodput counts TPOT as 0 for the others, as vLLM does);
- ITL: the gaps between successive streamed chunks. The engine streams one chunk per step a
  request takes part in, so a speculative step that accepts several drafts is one chunk and
  one ITL (vLLM's client sees it the same way), and a recompute preemption's wait is inside
  the gap that spans it.
Run-wide: duration (first send to last completion: 0 to the makespan), request_throughput
(completed / duration), output_throughput, total_token_throughput (prompt + output tokens of
the completed requests / duration), request_goodput (completed requests meeting every bound of
--goodput, per second), max_output_tokens_per_s (as vLLM computes it over one-second buckets
from the first send: chunks per bucket) and max_concurrent_requests (vLLM's exact peak of
requests in flight: a sweep over the half-open intervals [send, completion), a completion
before a send at the same instant; vLLM replaced its one-second buckets, which counted a
request in every bucket it touched, by this sweep, vllm-project/vllm issue #56653).
Statistics are in ms: mean_, median_, std_ and p<P>_ with P from --metric-percentiles
(vLLM's p_word: 99 -> "p99", 99.9 -> "p99.9"); each is 0 where no value was measured (no
request of more than one output token for TPOT, none completed), as vLLM's `np.mean(tpots or
0)` and the like give.

Warm-up: the first --warmup-requests sent are left out of every statistic (vLLM's
--num-warmups). With --warmup-mser the initial transient after them is left out too, where the
MSER-5 rule puts its end (White 1997, "An effective truncation heuristic for bias reduction in
simulation output"; batch means of 5, White, Cobb & Spratt 2000): the first d requests sent
whose removal minimizes the marginal standard error of the mean of the rest, of TTFT and of
TPOT in send order (the larger d), d within the first half. A closed loop started over a ramp
queues its first rounds: a p99 over a count-based window keeps that queue's tail until the run
is many times longer (Llama 3.1 70B FP8, 500 users, H100 tp2 x 9 -> SN40L-16 tp4 x 5: p99 TTFT
1,774, 1,602, 1,446 ms at 2,000, 4,000, 8,000 requests with the first 500 out; 753, 644, 655
ms with the transient out too).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from rdu_cluster.engine import spill
from workloads import checks
from workloads.errors import ConfigError

METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_KEYS = ("ttft", "tpot", "e2el")  # vLLM's --goodput keys, bounds in ms
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)  # vLLM's default is 99 alone; the issue asks these
PERCENTILES_TEXT = ",".join(f"{p:g}" for p in DEFAULT_PERCENTILES)  # as --metric-percentiles


@dataclass(frozen=True)
class MetricSpec:
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    goodput: tuple[tuple[str, float], ...] = ()  # (key, bound in ms)
    # the first `warmup` requests sent are warm-up (serve --warmup-requests): left out of every
    # statistic, the duration starting at the first one measured
    warmup: int = 0
    mser: bool = False  # and the initial transient after them (serve --warmup-mser: MSER-5)

    @classmethod
    def parse(cls, percentiles: str | None, goodput: Sequence[str] = (),
              flag: str = "--goodput") -> MetricSpec:
        """`--metric-percentiles 50,90,99` and `--goodput ttft:500 tpot:50` (vLLM's syntax)."""
        ps = DEFAULT_PERCENTILES if percentiles is None else tuple(
            _number(p, "--metric-percentiles") for p in percentiles.split(","))
        for p in ps:
            if not 0 <= p <= 100:  # np.percentile's range, which vLLM passes them to
                raise ConfigError(f"--metric-percentiles: {p:g} must be in [0, 100]")
        bounds = tuple(_goodput(g, flag) for g in goodput)
        keys = [k for k, _ in bounds]
        twice = next((k for k in keys if keys.count(k) > 1), None)
        if twice is not None:  # one bound per key: a second would replace the first unseen
            raise ConfigError(f"{flag}: {twice} given twice; give each key once")
        return cls(ps, bounds)


def _number(text: str, flag: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not a number") from None


def _goodput(item: str, flag: str) -> tuple[str, float]:
    key, _, ms = item.partition(":")
    if key not in GOODPUT_KEYS or not ms:
        raise ConfigError(f"{flag}: {item!r}; accepted: KEY:MS with KEY one of "
                          f"{', '.join(GOODPUT_KEYS)}")
    bound = _number(ms, flag)
    if not 0 < bound < math.inf:
        raise ConfigError(f"{flag}: {item!r}: the bound must be a positive finite number (ms)")
    return key, bound


def p_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


@dataclass
class Measured:
    """Per completed request: send time, TTFT, E2EL, output tokens, prompt tokens (s, arrays),
    and every ITL (s) with each chunk's time (one a token: a Spill, held out of memory past
    its bound)."""

    send_s: np.ndarray
    ttft_s: np.ndarray
    e2el_s: np.ndarray
    output_len: np.ndarray
    prompt_len: np.ndarray
    itl_s: spill.Spill | None  # None: not kept (a summary-only run), its statistics None
    chunk_s: spill.Spill  # a lean run's after its warm-up: empty (no figure reads it)
    chunks: np.ndarray | None = None  # chunks of each request (its ITLs: one fewer)

    @property
    def lean(self) -> bool:
        """A summary-only run's (Simulation.summary_only): its ITLs are not kept and its peak
        figures not taken (None), which its readers (capacity's verdict, validate's
        throughput) do not read (the ITLs were 9% of the sessions question's CPU)."""
        return self.itl_s is None

    def after_warmup(self, n: int) -> tuple[Measured, float]:
        """Without the first n requests sent (ties in request order): the rest, and when the
        first of them was sent."""
        keep = np.ones(len(self.send_s), dtype=bool)
        keep[np.argsort(self.send_s, kind="stable")[:n]] = False
        counts = cast(np.ndarray, self.chunks)  # every run's Measured has them (summary.py)
        itl = self.itl_s
        m = Measured(self.send_s[keep], self.ttft_s[keep], self.e2el_s[keep],
                     self.output_len[keep], self.prompt_len[keep],
                     None if itl is None else spill.select(itl, np.maximum(counts - 1, 0), keep),
                     spill.Spill() if itl is None else spill.select(self.chunk_s, counts, keep),
                     counts[keep])
        return m, float(m.send_s.min()) if keep.any() else 0.0


def summary(m: Measured, duration: float, spec: MetricSpec) -> dict:
    """vLLM's result keys (the lists of per-request values left out); with MetricSpec.mser
    also `warmup_requests`, the requests left out."""
    window = None
    warmup = spec.warmup + (transient(m, spec.warmup) if spec.mser else 0)
    if warmup:
        window = _steady_window(m, warmup)
        m, first = m.after_warmup(warmup)
        duration -= first
    n = len(m.ttft_s)
    tpot = _tpots(m)
    per = {"ttft": m.ttft_s, "tpot": tpot[m.output_len > 1], "itl": m.itl_s, "e2el": m.e2el_s}
    out_tokens = int(m.output_len.sum())
    rate = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    res = {
        "duration": duration, "completed": n,
        "total_input_tokens": int(m.prompt_len.sum()), "total_output_tokens": out_tokens,
        "request_throughput": rate(n),
        "request_goodput": rate(_good(m, tpot, spec)) if spec.goodput else None,
        "output_throughput": rate(out_tokens),
        "total_token_throughput": rate(out_tokens + int(m.prompt_len.sum())),
        **_peaks(m),
    }
    if window is not None:
        res.update(window)
    for name in METRICS:
        res.update(_stats(name, per[name], spec.percentiles))
    if spec.mser:
        res["warmup_requests"] = warmup
    return res


PEAKS = ("max_output_tokens_per_s", "max_concurrent_requests")  # vLLM's peak figures
MSER_BATCH = 5  # MSER-5: the rule over means of 5 successive observations (White et al. 2000)


def transient(m: Measured, skip: int) -> int:
    """The requests after the first `skip` sent that the MSER-5 rule leaves out: the larger
    truncation of the TTFT and the TPOT series in send order (TPOT of requests of more than one
    output token, its cut counted in all requests)."""
    order = np.argsort(m.send_s, kind="stable")[skip:]
    several = np.flatnonzero(m.output_len[order] > 1)
    k = mser_cut(_tpots(m)[order][several])
    return max(mser_cut(m.ttft_s[order]), int(several[k]) if k else 0)


def _tpots(m: Measured) -> np.ndarray:
    """Each request's TPOT (s): (E2EL - TTFT) / (output tokens - 1); 0 for one token."""
    return np.where(m.output_len > 1, (m.e2el_s - m.ttft_s) / np.maximum(m.output_len - 1, 1),
                    0.0)


def mser_cut(x: np.ndarray) -> int:
    """MSER-5's truncation of series x: the d (a multiple of 5, in its first half) that
    minimizes the marginal standard error of the mean of x[d:], var(x[d:]) / (n - d) over
    batch means; 0 for a series of fewer than four batches."""
    k = len(x) // MSER_BATCH
    if k < 4:
        return 0
    z = np.asarray(x[: k * MSER_BATCH], dtype=float).reshape(k, MSER_BATCH).mean(axis=1)
    z = z - z.mean()  # centred: a steady series' variance is not lost to rounding
    rest = np.arange(k, 0, -1, dtype=float)  # batches from d on
    mean = np.cumsum(z[::-1])[::-1] / rest
    var = np.maximum(np.cumsum((z * z)[::-1])[::-1] / rest - mean * mean, 0.0)
    se = (var / rest)[: k // 2 + 1]
    return int(np.flatnonzero(se <= se.min() * (1 + 1e-9))[0]) * MSER_BATCH  # ties: the least


def _steady_window(m: Measured, warmup: int) -> dict | None:
    """With warm-up requests: the throughputs over the steady window, from the first request
    measured's send to the last send (then a closed loop's clients run out one by one): the
    tokens streamed in it (any request's) and the requests completed in it, over its length.
    None where the window is empty (every request sent at once)."""
    order = np.sort(m.send_s)
    if len(order) <= warmup:
        return None
    lo, hi = float(order[warmup]), float(order[-1])
    if hi <= lo:
        return None
    done = m.send_s + m.e2el_s
    completed = int(np.count_nonzero((done >= lo) & (done <= hi)))
    sent = (m.send_s >= lo) & (m.send_s <= hi)
    out = spill.count_within(m.chunk_s, lo, hi)
    return {"request_throughput": completed / (hi - lo),
            "output_throughput": out / (hi - lo),
            "total_token_throughput": (out + int(m.prompt_len[sent].sum())) / (hi - lo)}


def _good(m: Measured, tpot: np.ndarray, spec: MetricSpec) -> int:
    values = {"ttft": m.ttft_s, "tpot": tpot, "e2el": m.e2el_s}
    ok = np.ones(len(m.ttft_s), dtype=bool)
    for key, ms in spec.goodput:
        ok &= values[key] <= ms / 1e3
    return int(ok.sum())


def _stats(name: str, values_s: np.ndarray | spill.Spill | None,
           percentiles: Sequence[float]) -> dict:
    """Mean, median, std and percentiles in ms: numpy's figures on the values in memory, the
    same selected out of core where they spilled (engine/spill.py); None where the values
    were not kept."""
    keys = ("mean", "median", "std", *(f"p{p_word(p)}" for p in percentiles))
    if values_s is None:
        return {f"{k}_{name}_ms": None for k in keys}
    v = values_s if isinstance(values_s, spill.Spill) else spill.Spill.of(values_s)
    if not len(v):  # vLLM: np.mean(values or 0), and so on for each statistic
        return {f"{k}_{name}_ms": 0.0 for k in keys}
    mean, std = spill.moments(v, 1e3)
    median, got = spill.quantiles(v, percentiles, 1e3)
    out = {f"mean_{name}_ms": mean, f"median_{name}_ms": median, f"std_{name}_ms": std}
    for p in percentiles:
        out[f"p{p_word(p)}_{name}_ms"] = got[p]
    return out


def _peaks(m: Measured) -> dict:
    """vLLM's peak figures: chunks per one-second bucket from the first send, and the most
    requests in flight at one instant (each in flight over [send, completion))."""
    if m.lean:
        return dict.fromkeys(PEAKS)
    if not len(m.send_s):
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    t0 = float(m.send_s.min())
    last = float((m.send_s + m.e2el_s).max())
    if not last - t0 <= 2 * checks.MAX_SECONDS:  # inputs are bounded, turns of them are not
        raise ConfigError(f"the run spans {last - t0:.3g} s of simulated time; vLLM's peak "
                          f"figures count one-second buckets over at most "
                          f"{2 * checks.MAX_SECONDS:g} s (shorter think times or gaps)")
    buckets = int(np.ceil(last - t0)) + 1
    tokens = spill.bucket_counts(m.chunk_s, t0, buckets)
    # vLLM's sweep line: events by time, a completion (-1) before a send (+1) at a tie
    n = len(m.send_s)
    times = np.concatenate([m.send_s + m.e2el_s, m.send_s])
    delta = np.concatenate([np.full(n, -1, np.int64), np.ones(n, np.int64)])
    order = np.lexsort((delta, times))
    return {"max_output_tokens_per_s": float(tokens.max()),
            "max_concurrent_requests": max(0, int(np.cumsum(delta[order]).max()))}


def overloaded(arrival_s: np.ndarray, admit_s: np.ndarray) -> bool:
    """The queue grows through the run: the number of requests waiting for admission, sampled
    at each arrival, has a larger mean in every quarter of the arrivals than in the one before,
    and the last quarter's is at least twice the first's plus one. A stable queue fluctuates
    around its mean; an overloaded one grows linearly. (A request never admitted waits to the
    end: admit_s = inf.)"""
    n = len(arrival_s)
    if n < 8:
        return False
    order = np.argsort(arrival_s, kind="stable")
    arr, adm = arrival_s[order], np.sort(admit_s)
    waiting = (np.arange(1, n + 1) - np.searchsorted(adm, arr, side="right")).astype(float)
    quarters = [q.mean() for q in np.array_split(waiting, 4)]
    rising = all(b > a for a, b in itertools.pairwise(quarters))
    return bool(rising and quarters[-1] >= 2 * quarters[0] + 1)
