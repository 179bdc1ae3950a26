"""workloads.traces: seeded generators and trace files, bad input as one-line ConfigErrors."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workloads import traces
from workloads.errors import ConfigError


def test_synthetic_is_seeded_and_columns_are_independent():
    a = traces.synthetic(200, 5.0, "poisson", seed=3)
    b = traces.synthetic(200, 5.0, "poisson", seed=3)
    c = traces.synthetic(200, 5.0, "poisson", traces.LengthDist("uniform", 10, 20), seed=3)
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert np.array_equal(a.arrival_s, c.arrival_s)  # a new prompt law leaves arrivals alone
    assert np.all(np.diff(a.arrival_s) >= 0) and a.arrival_s[0] == 0
    assert abs(np.mean(np.diff(a.arrival_s)) - 0.2) < 0.05
    assert c.prompt_len.min() >= 10 and c.prompt_len.max() <= 20


@pytest.mark.parametrize("kind", ["fixed", "poisson", "bursty"])
def test_arrival_processes_have_the_asked_rate(kind):
    t = traces.synthetic(4000, 10.0, kind, seed=1, burstiness=3.0)
    assert np.mean(np.diff(t.arrival_s)) == pytest.approx(0.1, rel=0.15)
    if kind == "bursty":
        gaps = np.diff(t.arrival_s)
        assert np.std(gaps) / np.mean(gaps) > 2.0


def test_lengths_parse_and_lognormal_mean():
    d = traces.LengthDist.parse("lognormal:500:0.6", "--prompt-len")
    x = d.sample(np.random.default_rng(0), 20000)
    assert np.mean(x) == pytest.approx(500, rel=0.03) and x.min() >= 1
    assert traces.LengthDist.parse("128", "x") == traces.LengthDist("fixed", 128.0)
    with pytest.raises(ConfigError, match="expected N"):
        traces.LengthDist.parse("gauss:1", "--prompt-len")


def test_infinite_rate_puts_every_request_at_zero():
    assert not traces.synthetic(5, float("inf"), seed=0).arrival_s.any()


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_non_positive_rate_is_a_config_error(rate):
    with pytest.raises(ConfigError, match="--rate"):
        traces.synthetic(5, rate)


def test_csv_and_parquet_round_trip(tmp_path):
    t = traces.synthetic(30, 2.0, seed=5, prompt=traces.LengthDist("uniform", 1, 99))
    traces.write_csv(t, tmp_path / "t.csv")
    back = traces.read_trace(tmp_path / "t.csv")
    assert np.array_equal(back.arrival_s, t.arrival_s)
    assert np.array_equal(back.prompt_len, t.prompt_len)
    tbl = pa.table({"arrival_time": [0.5, 0.1], "input_tokens": [10, 20],
                    "output_tokens": [3, 4], "model": ["a", "b"]})
    pq.write_table(tbl, tmp_path / "t.parquet")
    p = traces.read_trace(tmp_path / "t.parquet")
    assert list(p.arrival_s) == [0.1, 0.5] and p.model == ("b", "a")  # sorted by arrival


@pytest.mark.parametrize("text, match", [
    ("arrival_s,prompt_len\n0,1\n", "missing column 'output_len'"),
    ("arrival_s,prompt_len,output_len\n-1,1,1\n", ">= 0"),
    ("arrival_s,prompt_len,output_len\n0,0,1\n", "row 1, column .prompt_len.: 0; expected"),
    ("arrival_s,prompt_len,output_len\n0,1.5,1\n", "whole number"),
    # the first bad row is named with its value as written, not as converted or clipped
    ("arrival_s,prompt_len,output_len\n0,1,1\n0,9223372036854775808,1\n",
     "row 2, column 'prompt_len': 9.2233720"),
    ("arrival_s,prompt_len,output_len\n0,1,1\n,1,1\n", "row 2, column 'arrival_s': null"),
    ("arrival_s,prompt_len,output_len\n", "0 requests"),
    # a number under TIMESTAMP: one message, not one nested in "non-numeric value (...)"
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,1,1\n", "^--trace \\S+: column 'TIMESTAMP'"),
    # date-times outside datetime64[ns]'s 1677..2262: the span, not a cast's overflow
    (("TIMESTAMP,ContextTokens,GeneratedTokens\n1900-01-01 00:00:00,1,1\n"
      "2100-01-01 00:00:00,1,1\n"), "row 2, column 'TIMESTAMP': 2100-01-01 00:00:00; expected"),
])
def test_bad_trace_files(tmp_path, text, match):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        traces.read_trace(path)


def test_date_times_past_2262_are_read(tmp_path):
    path = tmp_path / "far.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n9999-12-31 23:59:58,1,1\n"
                    "9999-12-31 23:59:59,1,1\n")
    assert list(traces.read_trace(path).arrival_s) == [0.0, 1.0]


def test_a_directory_or_fifo_is_not_called_missing(tmp_path):
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        traces.read_trace(tmp_path / "d.csv")
    os.mkfifo(tmp_path / "f.csv")
    with pytest.raises(ConfigError, match="not a regular file"):
        traces.read_trace(tmp_path / "f.csv")


def test_missing_and_unknown_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        traces.read_trace(tmp_path / "nope.csv")
    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(ConfigError, match="expected a .csv"):
        traces.read_trace(tmp_path / "t.json")
