"""Values a run's summary takes exact statistics of (every ITL and chunk time: one a token),
held in bounded memory: in a buffer of up to `limit` values, then in an anonymous temporary
file, so a million-request trace does not hold a quarter of a billion floats in RAM.

The statistics are those numpy gives on all the values in memory, bit for bit where the values
never left memory (one chunk) and for the order statistics always: percentiles and the median
select the values of the ranks they need out of core (a histogram pass finds the bin holding
each rank, then the bin's values are collected, or its range narrowed, in bounded memory) and
interpolate as np.percentile's default ("linear") and np.median do; mean and standard
deviation combine each chunk's (Chan et al.'s pairwise update, within 1e-12 relative of the
in-memory figures). A run that never fills the buffer holds one chunk: the in-memory case is a
spill that never spilled.
"""

from __future__ import annotations

import io
import math
import shutil
import tempfile
from collections.abc import Iterator, Sequence

import numpy as np

# Values held in memory before they go to the file (2 MB of float64); also the size of the
# chunks the file is read back in, so a statistic's memory is a few times this, whatever the run.
SPILL_VALUES = 1 << 18
BINS = 4096  # a histogram pass narrows a rank's range by about this factor


class Spill:
    """A column of float64 values appended as a run goes; `chunks()` reads them back in order.
    The file is a tempfile.TemporaryFile (no name on POSIX: gone with the file object or the
    process, whatever ends the run); close() drops it at once."""

    def __init__(self, limit: int | None = None, tmpdir: str | None = None) -> None:
        self.limit = max(int(limit or SPILL_VALUES), 1)
        self.tmpdir = tmpdir
        self.buf = np.empty(min(64, self.limit))
        self.n = 0  # values in buf
        self.file: io.BufferedRandom | None = None
        self.on_disk = 0  # values in the file
        self.closed = False

    @classmethod
    def of(cls, values: np.ndarray) -> Spill:
        """Values already in memory, as one chunk (no copy where they are float64)."""
        s = cls(limit=max(len(values), 1))
        s.buf, s.n = np.asarray(values, dtype=float), len(values)
        return s

    def __len__(self) -> int:
        return self.on_disk + self.n

    def __deepcopy__(self, memo: dict) -> Spill:
        """A copy with a file of its own (engine/checkpoint.py: a run kept to go on): the same
        values in the same chunks, so its statistics are the original's."""
        out = Spill(self.limit, self.tmpdir)
        out.buf, out.n, out.on_disk, out.closed = self.buf.copy(), self.n, self.on_disk, self.closed
        if self.file is not None:
            out.file = tempfile.TemporaryFile(dir=self.tmpdir)  # noqa: SIM115
            self.file.seek(0)
            shutil.copyfileobj(self.file, out.file)
        memo[id(self)] = out
        return out

    def extend(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=float)
        while len(values):
            room = self.limit - self.n
            if room == 0:
                self._spill()
                continue
            part, values = values[:room], values[room:]
            if self.n + len(part) > len(self.buf):  # grown by a quarter, up to the limit
                grown = np.empty(min(max(int(1.25 * len(self.buf)), self.n + len(part)),
                                     self.limit))
                grown[: self.n] = self.buf[: self.n]
                self.buf = grown
            self.buf[self.n : self.n + len(part)] = part
            self.n += len(part)

    def bounds(self) -> tuple[float, float]:
        """The least and largest value (NaN, NaN if one is NaN), in one pass: at the end
        rather than on every extend, which the run pays for each request."""
        lo, hi = math.inf, -math.inf
        for c in self.chunks():
            if len(c):
                least = float(c.min())  # NaN if any is
                if math.isnan(least):
                    return math.nan, math.nan
                lo, hi = min(lo, least), max(hi, float(c.max()))
        return lo, hi

    def _spill(self) -> None:
        if self.file is None:
            # held across the run, closed by close() (or with the object): no `with` fits
            self.file = tempfile.TemporaryFile(dir=self.tmpdir)  # noqa: SIM115
        self.file.seek(0, 2)
        # ndarray is a buffer, but numpy's stubs say so (__buffer__) only for Python >= 3.12
        self.file.write(memoryview(self.buf[: self.n]).cast("B"))  # type: ignore[arg-type]
        self.on_disk += self.n
        self.n = 0

    def chunks(self) -> Iterator[np.ndarray]:
        """The values in order, in chunks of at most `limit` (the last one a view of memory)."""
        if self.closed:
            raise RuntimeError("Spill.chunks: the values were dropped (close)")
        if self.file is not None:
            self.file.seek(0)
            left = self.on_disk
            while left:
                chunk = np.empty(min(left, self.limit))
                self.file.readinto(memoryview(chunk).cast("B"))  # type: ignore[arg-type]
                left -= len(chunk)
                yield chunk
        if self.n or not self.on_disk:
            yield self.buf[: self.n]

    def close(self) -> None:
        self.closed = True
        self.buf, self.n = np.empty(0), 0
        if self.file is not None:
            self.file.close()
            self.file = None


def select(s: Spill, counts: np.ndarray, keep: np.ndarray) -> Spill:
    """The values of the groups kept: `s` holds len(counts) groups one after another, group i
    of counts[i] values (a request's ITLs), and `keep` says which go on, in order."""
    out = Spill(limit=s.limit, tmpdir=s.tmpdir)
    mask = np.repeat(np.asarray(keep, dtype=bool), counts)  # a byte a value
    at = 0
    for chunk in s.chunks():
        out.extend(chunk[mask[at:at + len(chunk)]])
        at += len(chunk)
    return out


def moments(s: Spill, scale: float = 1.0) -> tuple[float, float]:
    """Mean and (population) standard deviation of the values times `scale`: each chunk's
    np.mean and np.var, combined pairwise (Chan, Golub and LeVeque), so one chunk gives numpy's
    figures exactly."""
    n, mean, m2 = 0, 0.0, 0.0
    parts = 0
    for chunk in s.chunks():
        if not len(chunk):
            continue
        v = chunk * scale
        k, mk, var = len(v), float(v.mean()), float(v.var())
        parts += 1
        if parts == 1:
            n, mean, m2, first_var = k, mk, var * k, var
            continue
        d = mk - mean
        total = n + k
        mean += d * k / total
        m2 += var * k + d * d * n * k / total
        n = total
    if parts == 0:
        return math.nan, math.nan
    return mean, math.sqrt(first_var if parts == 1 else m2 / n)


def order_stats(s: Spill, ranks: Sequence[int]) -> dict[int, float]:
    """The values of the given ranks (0-based, in sorted order) of the values (none NaN), exactly,
    in memory bounded by the spill's chunk size whatever their count: each pending range of
    values is histogrammed into BINS bins (a bin index monotone in the value), and the bin
    holding a rank is collected once it has at most `limit` values, else narrowed to its own
    range (its least and largest value) and histogrammed again."""
    out: dict[int, float] = {}
    # pending: (lo, hi, below, count, ranks): `count` values lie in [lo, hi], `below` under lo
    pending = [(*s.bounds(), 0, len(s), sorted(set(ranks)))]
    while pending:
        nxt = []
        for lo, hi, below, count, want in pending:
            if lo == hi:
                out.update(dict.fromkeys(want, lo))
            elif count <= s.limit:
                v = _within(s, lo, hi)
                v.partition([r - below for r in want])
                out.update({r: float(v[r - below]) for r in want})
            else:
                nxt.extend(_narrow(s, lo, hi, below, want))
        pending = nxt
    return out


def _within(s: Spill, lo: float, hi: float) -> np.ndarray:
    parts = [c[(c >= lo) & (c <= hi)] for c in s.chunks()]
    return np.concatenate(parts) if parts else np.zeros(0)


def _bin(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Each value's bin in [lo, hi]: non-decreasing in the value, lo in bin 0 and hi in the
    last, so a range always splits. Halved so hi - lo cannot overflow."""
    scale = BINS / (hi * 0.5 - lo * 0.5)
    if not 0 < scale < math.inf:
        return np.where(v > lo, BINS - 1, 0)
    return np.clip(((v * 0.5 - lo * 0.5) * scale).astype(np.int64), 0, BINS - 1)


def _narrow(s: Spill, lo: float, hi: float, below: int, want: list[int]) -> list[tuple]:
    """One histogram pass over [lo, hi], then one pass over the bins holding the ranks for
    their exact range (least, largest value) and count."""
    counts = np.zeros(BINS, dtype=np.int64)
    for c in s.chunks():
        v = c[(c >= lo) & (c <= hi)]
        counts += np.bincount(_bin(v, lo, hi), minlength=BINS)
    ends = below + np.cumsum(counts)
    bins: dict[int, list[int]] = {}
    for r in want:
        bins.setdefault(int(np.searchsorted(ends, r, side="right")), []).append(r)
    ranges = {b: [math.inf, -math.inf] for b in bins}
    for c in s.chunks():
        v = c[(c >= lo) & (c <= hi)]
        idx = _bin(v, lo, hi)
        for b, rng in ranges.items():
            in_bin = v[idx == b]
            if len(in_bin):
                rng[0], rng[1] = min(rng[0], float(in_bin.min())), max(rng[1], float(in_bin.max()))
    return [(ranges[b][0], ranges[b][1], int(ends[b] - counts[b]), int(counts[b]), rs)
            for b, rs in bins.items()]


def quantiles(s: Spill, ps: Sequence[float], scale: float = 1.0
              ) -> tuple[float, dict[float, float]]:
    """np.median(values * scale) and np.percentile(values * scale, p) for each p (default
    "linear" method), bit for bit, from one selection of the ranks they need (a few passes
    over the values however many there are)."""
    n = len(s)
    where = {}
    for p in ps:
        virtual = (n - 1) * (p / 100)
        below = math.floor(virtual)
        if virtual >= n - 1:
            where[p] = (n - 1, n - 1, virtual - below)
        else:
            where[p] = (below, below + 1, virtual - below)
    middle = (n // 2, n // 2) if n % 2 else (n // 2 - 1, n // 2)
    got = _scaled(s, {*middle, *(r for lo, hi, _ in where.values() for r in (lo, hi))}, scale)
    # np.median: the middle value, or the mean of the middle two (as np.mean adds then halves)
    med = got[middle[0]] if n % 2 else (got[middle[0]] + got[middle[1]]) / 2
    return med, {p: _lerp(got[lo], got[hi], t) for p, (lo, hi, t) in where.items()}


def percentiles(s: Spill, ps: Sequence[float], scale: float = 1.0) -> dict[float, float]:
    return quantiles(s, ps, scale)[1]


def median(s: Spill, scale: float = 1.0) -> float:
    return quantiles(s, (), scale)[0]


def _scaled(s: Spill, ranks: set[int], scale: float) -> dict[int, float]:
    """Order statistics of values * scale (scaling is monotone: select, then scale). NaN
    anywhere: NaN, as numpy gives."""
    if math.isnan(s.bounds()[0]):
        return dict.fromkeys(ranks, math.nan)
    return {r: float(np.float64(v) * scale) for r, v in order_stats(s, sorted(ranks)).items()}


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's _lerp (numpy/lib/_function_base_impl.py): from the nearer end, so t = 1 gives
    b exactly."""
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def count_within(s: Spill, lo: float, hi: float) -> int:
    """How many values are in [lo, hi], a chunk at a time."""
    return int(sum(np.count_nonzero((c >= lo) & (c <= hi)) for c in s.chunks()))


def bucket_counts(s: Spill, t0: float, buckets: int) -> np.ndarray:
    """np.bincount(floor(values - t0), minlength=buckets), a chunk at a time."""
    total = np.zeros(buckets, dtype=np.int64)
    for c in s.chunks():
        b = np.bincount(np.floor(c - t0).astype(np.int64), minlength=buckets)
        if len(b) > len(total):
            total = np.concatenate([total, np.zeros(len(b) - len(total), dtype=np.int64)])
        total[: len(b)] += b
    return total
