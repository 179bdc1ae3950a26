"""The boundary of a replica count: the fewest replicas whose verdict is `meets`, with one fewer
asked and missing, each count asked at most once (every ask is an engine run).

A verdict given with its margin (a miss: <= 0 meets, its size how far from the bound) is read
as a line in 1 / n: with N closed-loop users over n replicas each replica holds N / n
sequences and prefills N / n of the prompts, and a decode-bound TPOT is the weights' read plus
the KV read of its batch, linear in N / n (the Llama 3.1 70B question's hgx-h200 tp2 FP8 runs:
p99 TPOT 17.45-23.95 ms at 21-51 replicas, nine runs within 0.16 ms of 12.98 + 231.6 / n ms).
The next count asked is where the line through the two nearest asks crosses the bound: outward
at most GROWTH times the last step (a run far past the boundary queues long and costs most),
and at least a doubling where the line's own step fell short; in a bracket, the line's count,
or a bisection after a line step that did not halve the bracket. A decode-bound row is found in
5 or 6 asks where the doubling steps took 9 or 10 (tests/test_capacity.py). A queueing TTFT,
convex in 1 / n, is bracketed and bisected much as a bare verdict is. A bare verdict (a bool),
or an infinite margin (requests refused), gives no line: the steps then double outward from
the start until the verdict changes, then bisect (about 2 log2 of the distance asks).

A queueing pool's count that meets may also say where the load it carries saturates the pool
(`least`: a pair's prefill pool at the request throughput the run measured, scenarios/capacity/search.py).
Searching down from such a count, the next ask is that count, not a step, and where it meets
the count below it: a count below saturation queues without bound, and its run stops early
as certain to miss (cheap), while each count asked on the way down meets and runs to its end
(the Llama 3.1 70B question's pairs: boundaries 0.92-1.03 times the saturation count, where
the prefill search started 25-50% above it and stepped down one, two, four replicas at a
time). The hint is taken once, so a wrong one costs at most two asks.
"""

from __future__ import annotations

import math
from collections.abc import Callable

GROWTH = 4  # a step along the line is at most this many times the step before it


def boundary(miss: Callable[[int], float | bool], start: int, top: int,
             least: Callable[[int], int | None] | None = None) -> int | None:
    """The smallest n in 1..top whose `miss(n)` meets (<= 0; a bool: True meets), taking the
    verdict as monotone in n (more replicas never miss where fewer meet): from `start` (the
    analytic estimate) outward until the verdict changes, then within the bracket, so that
    n - 1 is known to miss (or n is 1). None when `top` misses. Each n is asked at most once;
    without margins, steps of 1, 2, 4 ... then bisection (about 2 log2 of the distance).
    `least(n)`, for an n that meets: the fewest replicas its run says could meet (None:
    unknown), asked next where it lies below n - 1 and nothing below n is bracketed yet, and
    one fewer next where that meets (once a search)."""
    asked: dict[int, float | None] = {}  # n -> its margin for the line (None: none)

    def ask(n: int) -> bool:
        got = miss(n)
        if isinstance(got, bool):
            asked[n] = None
            return got
        asked[n] = float(got) if math.isfinite(got) else None
        return got <= 0

    n = min(max(start, 1), top)
    lo, hi = 0, top + 1  # lo misses (0: nothing below), hi meets (top + 1: none met yet)
    step, along = 0, False  # the last step outward; whether the last step was the line's
    hinted = False  # whether n, which meets, was least's count
    while True:
        width = hi - lo
        if ask(n):
            hi = n
        else:
            lo = n
        if hi - lo <= 1:
            return hi if hi <= top else None
        if lo and hi <= top:  # bracketed: the line's count, or the middle where it fell short
            guess = None if along and 2 * (hi - lo) > width else _crossing(asked, lo, hi)
            along = guess is not None
            n = (lo + hi) // 2 if guess is None else min(max(guess, lo + 1), hi - 1)
            continue
        jump = None if lo or least is None else _hint(least, n, hinted)
        if hinted:
            least = None  # taken once (its count, then the one below it)
        hinted = jump is not None and jump not in asked
        if jump is not None and hinted:  # from there down: steps of 1, 2, 4 ...
            step, along, n = 0, False, jump
            continue
        near = sorted(asked)[:2] if lo == 0 else sorted(asked)[-2:]
        guess = _crossing(asked, *near) if len(near) == 2 else None
        want = None if guess is None else (hi - guess + 1 if lo == 0 else guess - lo)
        if want is None or want < 1:
            step, along = max(1, 2 * step), False
        else:  # the line's step, at most GROWTH times the last (a run far past the boundary
            # queues long and costs most: 1 prefill replica for 16,000 requests where the
            # boundary was 16 took 216 s), and at least a doubling where the line's own last
            # step fell short
            shortest = 2 * step if along else 1
            step = min(max(want, shortest), GROWTH * max(step, 1))
            along = step == want  # the line's step, not cut by the cap
        n = max(hi - step, 1) if lo == 0 else min(lo + step, top)


def _hint(least: Callable[[int], int | None], n: int, hinted: bool) -> int | None:
    """The count to ask below n, which meets: one fewer where n was least's own count (the
    saturation count met: the count below it should miss), least's count where it lies two or
    more below n; None: the steps and the line."""
    if hinted:
        return n - 1 if n > 1 else None
    got = least(n)
    return None if got is None or got >= n - 1 else max(got, 1)


def _crossing(asked: dict[int, float | None], a: int, b: int) -> int | None:
    """The smallest count predicted to meet on the line in 1 / n through the asks at a and b
    (a < b); None where either has no margin or the line does not fall as n grows."""
    ma, mb = asked.get(a), asked.get(b)
    if ma is None or mb is None or ma <= mb:
        return None
    xa, xb = 1.0 / a, 1.0 / b
    x0 = xb + (xa - xb) * (0.0 - mb) / (ma - mb)  # where the line crosses 0
    if x0 <= 0:
        return None
    return max(1, math.ceil(1.0 / x0 - 1e-9))
