"""A ledger that books every second of a step twice: once by cause, once by op class.

Execution models add time only through `Ledger.add`, which books the same amount under one
cause and one class, so `by_cause` and `by_class` each add up to the total by construction.
Time no op class owns (per-step host work, pipeline fill of a whole call) is booked under the
class "overhead".
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from chip.cost import CAUSES, StepCost
from workloads.ops import Graph, Work

OVERHEAD = "overhead"


class Ledger:
    def __init__(self) -> None:
        self.by_cause: dict[str, Work] = {}
        self.by_class: dict[str, Work] = {}

    def add(self, cause: str, cls: str, seconds: Work) -> None:
        if cause not in CAUSES:
            raise ValueError(f"unknown cause {cause!r}")
        t = np.asarray(seconds, dtype=float)
        if t.ndim == 0 and t == 0:  # adds nothing to a sum: its entries made, in their order
            self.by_cause.setdefault(cause, 0.0)
            self.by_class.setdefault(cls, 0.0)
            return
        self.by_cause[cause] = self.by_cause.get(cause, 0.0) + t
        self.by_class[cls] = self.by_class.get(cls, 0.0) + t

    def add_each(self, cause: str, classes: list[str], seconds: Work) -> None:
        """`add(cause, cls, seconds)` for each of `classes` in turn: the same sums, checked
        and converted once (a fused layer books each op's stage latency so)."""
        if cause not in CAUSES:
            raise ValueError(f"unknown cause {cause!r}")
        t = np.asarray(seconds, dtype=float)
        if t.ndim == 0 and t == 0:
            for cls in classes:
                self.add(cause, cls, t)
            return
        by_cause, by_class = self.by_cause, self.by_class
        for cls in classes:
            by_cause[cause] = by_cause.get(cause, 0.0) + t
            by_class[cls] = by_class.get(cls, 0.0) + t

    def split(self, cls: str, seconds: Work, shares: Mapping[str, Work]) -> None:
        """Book `seconds` under class `cls`, split over causes in proportion to `shares`
        (any non-negative weights; where they are all zero the time goes to the first)."""
        self.book(cls, seconds, fractions(shares))

    def book(self, cls: str, seconds: Work, fracs: Mapping[str, Work]) -> None:
        """Book `seconds` under class `cls`, split over causes by `fractions(shares)` (worked
        out once where several classes split alike). A cause whose share is none anywhere
        (fractions' 0.0) is booked nothing, its entries made where they were not: adding 0
        changes no sum, and the entries keep their order (a decode table's binding resource
        is the HBM at every point: most of its causes' shares are none)."""
        t = np.asarray(seconds, dtype=float)
        for cause, frac in fracs.items():
            self.add(cause, cls, 0.0 if frac is NONE else t * frac)

    def merge(self, other: Ledger, times: float = 1.0) -> None:
        """Book everything `other` booked (a part of the step costed on its own), `times`
        times."""
        for mine, theirs in ((self.by_cause, other.by_cause), (self.by_class, other.by_class)):
            for key, t in theirs.items():
                if np.ndim(t) == 0 and t == 0:  # as add: nothing to add, the entry made
                    mine.setdefault(key, 0.0)
                else:
                    mine[key] = mine.get(key, 0.0) + times * t

    def total(self) -> np.ndarray:
        return np.asarray(sum(self.by_class.values(), np.zeros(())))

    def cost(self, graph: Graph, **fields) -> StepCost:
        weights, kv, flops = graph_totals(graph, ("weight_bytes", "kv_read_bytes", "flops"))
        return StepCost(
            time_s=self.total(),
            by_cause=dict(self.by_cause),
            by_class=dict(self.by_class),
            useful_hbm_bytes=weights + kv,  # (useful_hbm_bytes, in one pass over the graph)
            flops=flops,
            **fields,
        )


NONE = 0.0  # fractions' share of a cause with no weight anywhere (Ledger.book books nothing)


def fractions(shares: Mapping[str, Work]) -> dict[str, Work]:
    """Each cause's share of `shares` (any non-negative weights; where they are all zero the
    first cause takes all); NONE (this very object) for a cause but the first whose weight is
    a scalar 0 (its share is 0 at every point)."""
    weights = {k: np.asarray(v, dtype=float) for k, v in shares.items()}
    total = sum(weights.values(), np.zeros(()))
    first = next(iter(weights))
    out: dict[str, Work] = {}
    if total.ndim == 0:  # every weight a scalar (most of a step's kernels): floats, the same
        # quotients as numpy's (IEEE division), without its calls
        tot = float(total)
        for cause, w in weights.items():
            if cause != first and w == 0:
                out[cause] = NONE
            elif tot > 0:
                out[cause] = float(w) / tot
            else:
                out[cause] = 1.0 if cause == first else 0.0
        return out
    for cause, w in weights.items():
        if cause != first and w.ndim == 0 and w == 0:
            out[cause] = NONE
            continue
        frac = np.divide(w, total, out=np.zeros(np.broadcast(w, total).shape), where=total > 0)
        out[cause] = np.where(total > 0, frac, 1.0) if cause == first else frac
    return out


def useful_hbm_bytes(graph: Graph) -> Work:
    """The bytes a step must read from HBM at least once: weights and the KV cache (or state).
    The same definition as the roofline model, so utilizations compare."""
    return graph_total(graph, "weight_bytes") + graph_total(graph, "kv_read_bytes")


_SUMS: dict[tuple[int, tuple[str, ...]], tuple] = {}


def graph_total(graph: Graph, attr: str) -> Work:
    """graph.total(attr), the same sums in the same order, each op tuple summed once: the
    blocks of a hybrid's graphs, and of the stages of a plan search, share their op tuples
    (memoised by identity; the entry keeps the tuple alive)."""
    return graph_totals(graph, (attr,))[0]


def graph_totals(graph: Graph, attrs: tuple[str, ...]) -> tuple[Work, ...]:
    """graph_total of each of `attrs`, in one pass over the blocks."""
    totals: list[Work] = [0.0] * len(attrs)
    for block in graph.blocks:
        hit = _SUMS.get((id(block.ops), attrs))
        if hit is None or hit[0] is not block.ops:
            sums = tuple(sum((getattr(op, a) for op in block.ops), 0.0) for a in attrs)
            hit = (block.ops, sums)
            if all(np.ndim(x) == 0 for x in sums):
                if len(_SUMS) > 65536:
                    _SUMS.clear()
                _SUMS[(id(block.ops), attrs)] = hit
        for i, x in enumerate(hit[1]):
            totals[i] = totals[i] + block.repeat * x
    return tuple(totals)


def hbm_utilization(cost: StepCost, peak_bytes_per_s: float) -> np.ndarray:
    """Achieved HBM bandwidth utilization: useful bytes / (step time x peak bandwidth)."""
    return np.asarray(cost.useful_hbm_bytes) / (np.asarray(cost.time_s) * peak_bytes_per_s)
