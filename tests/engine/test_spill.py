"""engine/spill.py: the summary's statistics of values held out of memory are numpy's on the
same values in memory (order statistics bit for bit, moments to ~1e-12), whatever the chunk."""

from __future__ import annotations

import copy
import math
import os

import numpy as np
import pytest

from rdu_cluster.engine import bench, spill

PS = (0.1, 1.0, 25.0, 50.0, 90.0, 99.0, 99.9, 99.99)


def _spilled(values: np.ndarray, limit: int, pieces: int = 7) -> spill.Spill:
    s = spill.Spill(limit=limit)
    for part in np.array_split(values, pieces):
        s.extend(part)
    return s


def _cases() -> list[np.ndarray]:
    """Sized so a chunk of one value (limit 1) still takes a few histogram passes a rank, and no
    larger: there every pass reads each value as a chunk of its own (5,001 values took 2 s)."""
    rng = np.random.default_rng(11)
    return [
        rng.random(1000),
        rng.lognormal(-4, 1.5, 1501),  # ITL-like: skewed, spread over decades
        np.round(rng.random(1000) * 5) / 7,  # a handful of values, heavily tied
        np.full(777, 0.0251),  # all equal
        np.concatenate([np.full(600, 1.0), np.nextafter(1.0, 2.0) * np.ones(600), [3.0]]),
        rng.uniform(-1, 1, 400) * 1.5e308,  # a range whose width overflows a float
        np.array([0.125]),  # a single value
        np.array([2.0, 1.0]),
    ]


def _same(a: float, b: float) -> bool:
    """Bit for bit (NaN as NaN)."""
    return np.array_equal(np.float64(a), np.float64(b), equal_nan=True)


@pytest.mark.parametrize("limit", [1, 3, 64, 10**6])
@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning",
                            "ignore:invalid value:RuntimeWarning")  # the widest case, in numpy too
def test_out_of_core_statistics_are_numpys(limit):
    for values in _cases():
        s = _spilled(values, limit)
        assert len(s) == len(values)
        assert np.array_equal(np.concatenate(list(s.chunks())), values)
        if limit < len(values):
            assert s.file is not None and all(len(c) <= limit for c in s.chunks())
        got = spill.percentiles(s, PS, 1e3)
        for p in PS:
            assert _same(got[p], np.percentile(values * 1e3, p)), (limit, p)
        assert _same(spill.median(s, 1e3), np.median(values * 1e3))
        mean, std = spill.moments(s, 1e3)
        v = values * 1e3
        want_std = float(v.std())
        if limit >= len(values):  # one chunk: numpy's figures exactly
            assert _same(mean, v.mean()) and _same(std, want_std)
        for got_m, want in ((mean, float(v.mean())), (std, want_std)):
            assert (_same(got_m, want) if not np.isfinite(want)
                    else got_m == pytest.approx(want, rel=1e-12, abs=1e-12 * abs(v).max()))
        s.close()


def test_order_statistics_of_every_rank():
    values = np.random.default_rng(3).integers(0, 50, 500).astype(float) / 3
    s = _spilled(values, 4)
    got = spill.order_stats(s, range(len(values)))
    assert [got[r] for r in range(len(values))] == np.sort(values).tolist()


def test_stats_of_no_values_and_nan():
    empty = bench._stats("itl", spill.Spill(limit=2), (50.0, 99.0))
    assert empty == bench._stats("itl", np.zeros(0), (50.0, 99.0))
    assert list(empty) == ["mean_itl_ms", "median_itl_ms", "std_itl_ms", "p50_itl_ms",
                           "p99_itl_ms"] and set(empty.values()) == {0.0}  # vLLM's `or 0`
    s = _spilled(np.array([1.0, np.nan, 2.0, 3.0]), 1, pieces=4)
    assert math.isnan(spill.percentiles(s, (50.0,))[50.0]) and math.isnan(spill.median(s))


def test_bucket_counts_are_one_bincount():
    values = np.random.default_rng(5).random(3000) * 40 + 2.5
    s = _spilled(values, 17)
    want = np.bincount(np.floor(values - 2.5).astype(np.int64), minlength=10)
    assert np.array_equal(spill.bucket_counts(s, 2.5, 10), want)


def test_a_copy_holds_the_same_chunks_in_a_file_of_its_own():
    """engine/checkpoint.py copies a run: its spills, the file included, go on apart."""
    s = _spilled(np.arange(11.0), limit=4, pieces=3)
    c = copy.deepcopy(s)
    assert c.file is not s.file and len(c) == len(s) == 11
    s.extend(np.array([100.0]))
    c.extend(np.array([-1.0]))
    got = [np.concatenate(list(x.chunks())) for x in (s, c)]
    assert got[0].tolist() == [*range(11), 100.0] and got[1].tolist() == [*range(11), -1.0]
    assert [len(x) for x in s.chunks()] == [len(x) for x in c.chunks()]


def test_the_spill_file_has_no_name_and_goes_with_close(tmp_path):
    s = spill.Spill(limit=2, tmpdir=str(tmp_path))
    s.extend(np.arange(11.0))
    assert s.file is not None and os.listdir(tmp_path) == []  # unlinked from the start
    fd = s.file.fileno()
    s.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    with pytest.raises(RuntimeError, match="dropped"):
        list(s.chunks())


def test_warmup_requests_are_left_out_and_the_throughput_is_the_steady_windows():
    """The first N requests sent are left out of every statistic (their ITLs too, selected
    from the spill by request); the throughputs are over the window from the first measured
    send to the last send."""
    send = np.array([0.0, 0.0, 1.0, 2.0])
    ttft = np.array([5.0, 5.0, 0.1, 0.1])  # the warm-up pair waited
    chunks = [np.array([5.0, 6.0]), np.array([5.0, 6.0]), np.array([1.1, 1.5, 1.9]),
              np.array([2.1, 2.5])]
    m = bench.Measured(send, ttft, np.array([6.0, 6.0, 0.9, 0.5]), np.array([2, 2, 3, 2]),
                       np.array([10, 10, 10, 10]),
                       spill.Spill.of(np.concatenate([np.diff(c) for c in chunks])),
                       spill.Spill.of(np.concatenate(chunks)),
                       np.array([len(c) for c in chunks]))
    s = bench.summary(m, 6.0, bench.MetricSpec((99.0,), (), warmup=2))
    assert s["completed"] == 2 and s["p99_ttft_ms"] == pytest.approx(100.0)
    assert s["mean_itl_ms"] == pytest.approx(400.0)  # 0.4 s gaps of the two measured only
    assert s["output_throughput"] == pytest.approx(3 / 1.0)  # 1.1, 1.5, 1.9 in [1, 2]
    assert bench.summary(m, 6.0, bench.MetricSpec((99.0,)))["p99_ttft_ms"] > 4000


def test_the_initial_transient_is_cut_where_mser5_puts_its_end():
    """MSER-5 (White 1997): a queue's decaying start is cut near where it ends, a steady series
    (constant, or noise about a level) is not cut, and the cut stays within the first half
    (past it the rule would follow the noise of the last few values)."""
    rng = np.random.default_rng(3)
    level = 0.5 + 0.01 * rng.standard_normal(1800)
    decay = np.r_[np.linspace(3.0, 0.5, 200), level]
    assert 150 <= bench.mser_cut(decay) <= 250 and bench.mser_cut(decay) % 5 == 0
    assert bench.mser_cut(np.full(1000, 0.022)) == 0
    assert bench.mser_cut(level) <= 50
    assert bench.mser_cut(np.r_[level[:100], np.full(100, 9.0)]) <= 100  # within the first half
    assert bench.mser_cut(np.ones(19)) == 0  # fewer than four batches


def test_warmup_mser_leaves_out_the_transient_after_the_warmup_and_says_how_many():
    """With MetricSpec.mser the summary's statistics start after the first `warmup` requests
    and the transient MSER-5 finds after them (TTFT here; TPOT counted the same way), and
    `warmup_requests` says how many were left out; without it the key is absent."""
    n = 600
    send = np.arange(n, dtype=float)
    ttft = np.r_[np.full(50, 9.0), np.linspace(4.0, 0.2, 100), np.full(450, 0.2)]
    chunks = [np.array([t + f, t + f + 0.01]) for t, f in zip(send, ttft)]
    m = bench.Measured(send, ttft, ttft + 0.01, np.full(n, 2), np.full(n, 10),
                       spill.Spill.of(np.full(n, 0.01)), spill.Spill.of(np.concatenate(chunks)),
                       np.full(n, 2))
    s = bench.summary(m, float(n + 10), bench.MetricSpec((99.0,), (), warmup=50, mser=True))
    assert 50 + 80 <= s["warmup_requests"] <= 50 + 120
    assert s["completed"] == n - s["warmup_requests"]
    assert s["p99_ttft_ms"] < 1000  # the tail of the transient is out
    plain = bench.summary(m, float(n + 10), bench.MetricSpec((99.0,), (), warmup=50))
    assert plain["p99_ttft_ms"] > 3000 and "warmup_requests" not in plain
