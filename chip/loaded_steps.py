"""Decode and prefill steps under drawn expert loads. Decode steps are kept by (batch,
whole-token context) at every load drawn at the batch so far and every load the routing can
give there; prefill steps by shape (LoadedPrefills).

An expert-parallel decode pool's step costs its sockets' drawn loads (engine/expert_loads.py: a
group's routed assignments over the mean group's), so it has no table over contexts alone, and
each window was one evaluation of the execution model for its few steps: a pair's decode pool
gets a hand-over about every step, so its windows are a step or two (DeepSeek-V3's adp32ep32
pool of bench_capacity.py question 1: 807 evaluations for 2,000 requests, ~2.5 ms each, two
thirds of that pool's CPU). The loads are few values: a group's count of the batch's b x top_k
assignments over their mean, an integer count (135 values within six standard deviations at a
batch of 500), and a closed loop's mean context stays within a band at each batch. So an entry
of (batch, context) holds the rows of every load drawn at that batch so far and of the
routing's support there (workloads/group_loads.py), filled where a window asks for one it
lacks (the window's missing entries in one evaluation), and a window whose every entry holds
its loads is a lookup: over the four runs of that pool's settle, 536 of its 3,023 windows
filled entries. The execution model costs each point alone, bit for bit,
whatever the points beside it (tests/engine/test_cost_window.py), so a step is the same however
it was costed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

T = TypeVar("T")

# Entries kept, the oldest evicted first (a pure cache: an evicted entry is evaluated again with
# the same values): the pool above visited 2,534 (batch, context) entries over its four runs,
# ~15 KB each at its 135 loads.
ENTRIES = 4096
# Loads kept a batch, beyond which an entry is filled with the loads its windows ask for alone:
# drawn loads are counts over a mean (a batch of 4,096 sequences at top-8 of 32 groups: 379
# values within six standard deviations), and loads of any other kind (a test's uniform draws)
# would otherwise make every fill an evaluation of every load seen.
LOADS_A_BATCH = 1024
# Prefill shapes kept, the oldest evicted first (a pure cache, as ENTRIES): a shape holds up to
# ~1,000 loads (a step of 8,192 tokens at top-8 of 8 groups), ~80 KB.
PREFILL_SHAPES = 256

Evaluate = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


class LoadedSteps:
    """A CostTables' decode steps under drawn loads (its `loaded`). `support(batch)`: the loads
    a group's count can give at that batch (workloads/group_loads.py; None: not known), held
    by an entry from its first fill with the loads drawn (without it, an entry asked at a load
    first drawn after it was filled is filled again: 1,135 refills of 2,534 entries over the
    four runs of question 1's H200 pair's settle, 934 evaluations where 536)."""

    def __init__(self, support: Callable[[int], np.ndarray | None] | None = None) -> None:
        self.entries: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        # batch -> the loads drawn at it (sorted); None past LOADS_A_BATCH (not a few values)
        self.seen: dict[int, np.ndarray | None] = {}
        self.support = support

    def rows(self, spans: list[tuple[int, int, int, int, np.ndarray]], evaluate: Evaluate
             ) -> list[np.ndarray]:
        """Each decode span's (sockets, rows, steps): `spans` of (batch b, whole-token context
        c0, the context sum's remainder r, steps n, loads (sockets, n)); step k between its
        contexts c0 + k and c0 + k + 1 at weight r / b, as CostTables.decode_span blends.
        `evaluate(batch, context, load)`: the (rows, points) of decode points, one evaluation
        of the execution model (the caller's, CHUNK points at a time; passed, not held: a
        CostTables holding its own method would be freed only by the collector)."""
        got = self._fill(spans, evaluate)
        return [_span(got, b, c0, r, n, loads) for b, c0, r, n, loads in spans]

    def _fill(self, spans: list[tuple[int, int, int, int, np.ndarray]], evaluate: Evaluate
              ) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
        """The entries the spans read, the loads they lack evaluated in one evaluation: each
        such entry at every load drawn at its batch and its support too, so that later
        windows find theirs."""
        got: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        wanted: dict[tuple[int, int], np.ndarray] = {}
        for b, c0, r, n, loads in spans:
            drawn = self._seen(b, loads)
            for c, need in _needs(c0, r, n, loads):
                held = got.get((b, c)) or self.entries.get((b, c)) or (_NONE, _NONE)
                got[(b, c)] = held
                if (b, c) not in wanted and _all_in(need, held[0]):
                    continue
                ask = np.union1d(wanted.get((b, c), _NONE), need)
                wanted[(b, c)] = np.setdiff1d(ask if drawn is None else np.union1d(ask, drawn),
                                              held[0], assume_unique=True)
        keys = [k for k, v in wanted.items() if len(v)]
        if keys:
            sizes = [len(wanted[k]) for k in keys]
            rows = evaluate(np.repeat(np.array([float(b) for b, _ in keys]), sizes),
                            np.repeat(np.array([float(c) for _, c in keys]), sizes),
                            np.concatenate([wanted[k] for k in keys]))
            at = 0
            for key, m in zip(keys, sizes):
                got[key] = self._merge(key, got[key], wanted[key], rows[:, at : at + m])
                at += m
        return got

    def _seen(self, b: int, loads: np.ndarray) -> np.ndarray | None:
        """The loads drawn at batch b so far, these with them, and the batch's support (None:
        past LOADS_A_BATCH)."""
        if b in self.seen:
            prior = self.seen[b]
            if prior is None:
                return None
        else:
            prior = None if self.support is None else self.support(b)
        drawn = np.union1d(_NONE if prior is None else prior, loads)
        self.seen[b] = drawn if len(drawn) <= LOADS_A_BATCH else None
        return self.seen[b]

    def _merge(self, key: tuple[int, int], held: tuple[np.ndarray, np.ndarray],
               loads: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The entry with these loads' rows added in load order, kept (ENTRIES)."""
        return keep(self.entries, key, _merged(held, loads, rows), ENTRIES)


class LoadedPrefills:
    """A CostTables' prefill steps under drawn loads (its `loaded_prefills`), kept by shape
    (sequences, new tokens, cached prefix) at every load drawn at it so far and every load
    the step's routing can give. An expert-parallel prefill pool's step costs its sockets'
    drawn loads, so it had no table: each step was one evaluation of the execution model
    (DeepSeek-V3's `hgx-h200:adp8ep8:2` prefill pool of bench_capacity.py question 1: 556
    evaluations for 2,000 requests, ~2.6 ms each, a third of the pair's CPU). A closed loop's
    prompts come in few shapes (8 there), and an evaluation over a shape's whole support (361
    to 1,017 loads) costs what one of its 8 sockets' loads costs (2.1-4.1 ms against 2.1-3.6
    ms, kernel-by-kernel), so a shape asked again is evaluated over its support once, and
    every later step is a lookup. The execution model costs each point alone, bit for bit,
    so a step is the same however it was costed."""

    def __init__(self, support: Callable[[int], np.ndarray] | None = None) -> None:
        self.entries: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.support = support  # routed tokens -> the loads a group's count can give

    def rows(self, shape: tuple[int, int, int], loads: np.ndarray, routed: int,
             evaluate: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """(rows, len(loads)) of the prefill step `shape` at each of `loads`, a step that
        routes `routed` tokens through the experts; `evaluate(loads)`: the target's rows at
        those loads, one evaluation of the execution model (passed, not held, as in
        LoadedSteps.rows). The first time a shape is asked, and at loads not of the routing's
        support (a test's uniform draws), only the loads asked are evaluated."""
        have, held = self.entries.get(shape, (_NONE, _NONE))
        if not _all_in(loads, have):
            # a shape asked again: its support too (a shape asked once, as chunked prompts of
            # every length bring, is not made to cost ~1,000 loads)
            support = None if self.support is None or not len(have) else self.support(routed)
            ask = np.union1d(loads, support if support is not None and _all_in(
                loads, support) else _NONE)
            new = np.setdiff1d(ask, have, assume_unique=True)
            have, held = keep(self.entries, shape, _merged((have, held), new, evaluate(new)),
                               PREFILL_SHAPES)
        return held[:, np.searchsorted(have, loads)]


_NONE = np.zeros(0)


def _needs(c0: int, r: int, n: int, loads: np.ndarray):
    """(context, the loads the span's steps read it at): step k reads c0 + k, and c0 + k + 1
    where the context sum has a remainder (r)."""
    for c in range(c0, c0 + n + (r > 0)):
        steps = [k for k in (c - c0, c - c0 - 1) if 0 <= k < n and (k == c - c0 or r)]
        yield c, loads[:, steps].ravel()


def _span(got: dict, b: int, c0: int, r: int, n: int, loads: np.ndarray) -> np.ndarray:
    """(sockets, rows, n) of a span from its entries (held: LoadedSteps._fill)."""
    lo = np.stack([_at(got[(b, c0 + k)], loads[:, k]) for k in range(n)], axis=2)
    if not r:
        return lo
    hi = np.stack([_at(got[(b, c0 + k + 1)], loads[:, k]) for k in range(n)], axis=2)
    return lo + (hi - lo) * (r / b)  # CostTables' blend (_lerp) over the same floats


def _at(entry: tuple[np.ndarray, np.ndarray], loads: np.ndarray) -> np.ndarray:
    """(sockets, rows) of an entry at each socket's load (one it holds)."""
    have, rows = entry
    return rows[:, np.searchsorted(have, loads)].T


def keep(entries: dict, key: tuple, entry: T, most: int) -> T:
    """entries[key] = entry as the newest, the oldest evicted first when `most` are held:
    the bound of every cost memo here and in chip/cost_tables.py."""
    entries.pop(key, None)
    if len(entries) >= most:
        del entries[next(iter(entries))]
    entries[key] = entry
    return entry


def _merged(held: tuple[np.ndarray, np.ndarray], loads: np.ndarray, rows: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """An entry (loads, rows) with these loads' rows added, in load order."""
    if len(held[0]):
        loads, rows = np.concatenate([held[0], loads]), np.concatenate([held[1], rows], 1)
        order = np.argsort(loads, kind="stable")
        loads, rows = loads[order], rows[:, order]
    return loads, np.ascontiguousarray(rows)


def _all_in(values: np.ndarray, sorted_values: np.ndarray) -> bool:
    """Whether every one of `values` is in `sorted_values`."""
    if not len(sorted_values):
        return not len(values)
    i = np.minimum(np.searchsorted(sorted_values, values), len(sorted_values) - 1)
    return bool(np.all(sorted_values[i] == values))
