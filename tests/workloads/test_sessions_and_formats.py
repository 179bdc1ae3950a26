"""Multi-turn sessions (workloads/sessions.py) and the Mooncake / Azure / BurstGPT trace formats
(workloads/trace_formats.py, traces.read_trace) on the shipped excerpts (tests/data/traces) and,
for BurstGPT, rows made in its published format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workloads import traces
from workloads.errors import ConfigError
from workloads.sessions import SYSTEM_CHUNK, SessionSpec, ThinkTime, sessions
from workloads.trace_formats import MOONCAKE_BLOCK_TOKENS

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def test_each_turn_resends_the_whole_history():
    spec = SessionSpec(3, 4, 100, traces.LengthDist("uniform", 10, 50),
                       traces.LengthDist("uniform", 5, 30), ThinkTime.parse("exponential:2"))
    t = sessions(spec, seed=3)
    assert len(t) == 12 and list(t.session) == [0] * 4 + [1] * 4 + [2] * 4
    assert list(t.after[:4]) == [-1, 0, 1, 2] and t.think_s[0] == 0 and t.think_s[1] > 0
    for i in range(12):
        chunks = t.content[i]
        assert chunks[0] == (SYSTEM_CHUNK, 100)  # every session shares the system prompt
        assert sum(n for _, n in chunks) == t.prompt_len[i] + t.output_len[i]
        if t.after[i] >= 0:  # this turn's prompt = the previous turn's prompt and answer + more
            prev = t.content[t.after[i]]
            assert chunks[: len(prev)] == prev
            assert t.prompt_len[i] == t.prompt_len[i - 1] + t.output_len[i - 1] + chunks[-2][1]
    assert np.array_equal(sessions(spec, seed=3).prompt_len, t.prompt_len)  # seeded


@pytest.mark.parametrize("text, fragment", [
    ("exponential", "expected S"), ("x:1", "expected S"), ("-1", ">= 0"),
    ("uniform:3:1", "HI >= LO"), ("fixed:abc", "not a number"),
])
def test_bad_think_times_name_the_flag(text, fragment):
    with pytest.raises(ConfigError, match="--think-time") as e:
        ThinkTime.parse(text)
    assert fragment in str(e.value)


def test_session_counts_are_checked():
    with pytest.raises(ConfigError, match="--turns: must be positive"):
        sessions(SessionSpec(2, 0))


def test_mooncake_excerpt_gives_exact_prefix_sharing():
    t = traces.read_trace(DATA / "mooncake_conversation_200.jsonl")
    assert len(t) == 200 and t.arrival_s[0] == 0.0 and t.arrival_s[-1] == 72.0
    assert (t.prompt_len[0], t.output_len[0]) == (6758, 500)  # the file's first line
    first = t.content[0]
    assert first[0] == (0, MOONCAKE_BLOCK_TOKENS) and first[-2] == (13, 6758 - 13 * 512)
    assert first[-1][0] < 0 and first[-1][1] == 500  # the answer is the request's own
    # every request of the excerpt starts with block 0: one shared 512-token prefix
    assert all(c[0][0] == 0 for c in t.content)


def test_azure_excerpt_reads_its_timestamps_as_seconds():
    t = traces.read_trace(DATA / "azure_llm_conv_2023_200.csv")
    assert len(t) == 200 and t.content is None
    assert t.arrival_s[0] == 0.0 and abs(t.arrival_s[1] - 4.314579) < 1e-9
    assert (t.prompt_len[0], t.output_len[0]) == (374, 44)


@pytest.mark.parametrize("line, fragment", [
    ("{", "malformed JSON"),
    ('{"timestamp": 0, "input_length": 10}', "missing output_length, hash_ids"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}',
     "expected 2 whole numbers"),
    ('{"timestamp": -5, "input_length": 6, "output_length": 1, "hash_ids": [1]}', "timestamp"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}', "input_length"),
    # past int64: numpy's conversion raised OverflowError (an internal error)
    (('{"timestamp": 0, "input_length": 6, "output_length": 100000000000000000000000, '
      '"hash_ids": [1]}'),
     "output_length an integer of 24 digits: expected a whole number in [1, 16,777,216]"),
])
def test_bad_mooncake_lines_are_one_line_errors(tmp_path, line, fragment):
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError) as e:
        traces.read_trace(path)
    assert fragment in str(e.value) and ":1:" in str(e.value) and "\n" not in str(e.value)


# BurstGPT's published header (HPMLL/BurstGPT; its data files are Git LFS objects this project
# could not read, so the rows are made up in its format: workloads/trace_formats.py)
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def test_a_burstgpt_csv_is_read_its_failed_requests_left_out(tmp_path):
    """BurstGPT: Timestamp seconds (replayed from the first request's), Request tokens the
    prompt, Response tokens the output; a failed request (0 response tokens) left out, as the
    authors' without_fails files do, and counted in the source; Model (the service that
    answered) not read as a model to serve."""
    path = tmp_path / "burst.csv"
    path.write_text(BURSTGPT_HEADER + "5,ChatGPT,472,18,490,Conversation log\n"
                    "118,GPT-4,417,276,693,Conversation log\n"
                    "45,ChatGPT,1087,230,1317,Conversation log\n"
                    "120,GPT-4,300,0,300,API log\n")
    t = traces.read_trace(path)
    assert list(t.arrival_s) == [0.0, 40.0, 113.0] and t.model is None
    assert list(t.prompt_len) == [472, 1087, 417] and list(t.output_len) == [18, 230, 276]
    assert t.source.endswith("(BurstGPT: 1 failed requests, 0 response tokens, left out)")
    clean = tmp_path / "clean.csv"
    clean.write_text(BURSTGPT_HEADER + "7.5,GPT-4,10,2,12,API log\n")
    assert traces.read_trace(clean).source == str(clean)


@pytest.mark.parametrize("row, fragment", [
    ("5,GPT-4,0,18,18,API log", "'Request tokens'"),  # an empty prompt: refused, not left out
    ("5,GPT-4,10,-1,9,API log", "'Response tokens'"),
    ("-5,GPT-4,10,3,13,API log", "'Timestamp'"),
])
def test_a_bad_burstgpt_row_is_a_one_line_error(tmp_path, row, fragment):
    path = tmp_path / "burst.csv"
    path.write_text(BURSTGPT_HEADER + row + "\n")
    with pytest.raises(ConfigError) as e:
        traces.read_trace(path)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_a_bad_burstgpt_row_is_named_by_its_row_in_the_file(tmp_path):
    """A failed request left out before it does not shift the row an error names."""
    path = tmp_path / "burst.csv"
    path.write_text(BURSTGPT_HEADER + "5,GPT-4,300,0,300,API log\n6,GPT-4,0,5,5,API log\n")
    with pytest.raises(ConfigError, match="row 2, column 'Request tokens': 0;"):
        traces.read_trace(path)


def test_a_burstgpt_file_of_failures_only_is_refused(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text(BURSTGPT_HEADER + "5,GPT-4,300,0,300,API log\n")
    with pytest.raises(ConfigError, match="0 requests; accepted 1"):
        traces.read_trace(path)


def test_a_numeric_timestamp_column_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("timestamp,prompt_len,output_len\n1,10,10\n")
    with pytest.raises(ConfigError, match="'timestamp' must hold date-times"):
        traces.read_trace(path)


def test_date_and_duration_arrival_columns_are_refused(tmp_path):
    # Read as numbers they would be days since 1970 or milliseconds taken for seconds.
    import pyarrow as pa
    import pyarrow.parquet as pq

    dates = tmp_path / "dates.csv"
    dates.write_text("arrival_s,prompt_len,output_len\n2024-01-01,64,8\n2024-01-02,64,8\n")
    with pytest.raises(ConfigError, match=r"column 'arrival_s' holds date32\[day\]; accepted: "
                       r"seconds as numbers \(or date-times\)$"):
        traces.read_trace(dates)
    table = pa.table({"arrival_s": pa.array([0, 1000], pa.duration("ms")),
                      "prompt_len": [64, 64], "output_len": pa.array([8, 8], pa.duration("s"))})
    pq.write_table(table, tmp_path / "d.parquet")
    with pytest.raises(ConfigError, match=r"'arrival_s' holds duration\[ms\]"):
        traces.read_trace(tmp_path / "d.parquet")
    pq.write_table(table.set_column(0, "arrival_s", pa.array([0.0, 1.0])), tmp_path / "o.parquet")
    with pytest.raises(ConfigError, match=r"'output_len' holds duration\[s\]; accepted: tokens "
                       "as numbers$"):
        traces.read_trace(tmp_path / "o.parquet")


def test_a_mooncake_file_that_is_not_text_is_refused(tmp_path):
    path = tmp_path / "binary.jsonl"
    path.write_bytes(b"\xff\xfe\x00\x01binary\n")
    with pytest.raises(ConfigError, match=r"binary.jsonl: not UTF-8 text; expected JSON lines$"):
        traces.read_trace(path)


def test_mooncake_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_text('\ufeff{"timestamp": 0, "input_length": 10, "output_length": 2, '
                    '"hash_ids": [7]}\n', encoding="utf-8")
    assert list(traces.read_trace(path).output_len) == [2]


def test_per_trace_works_a_function_out_once_for_a_traces_values():
    """traces.per_trace: the same values rebuilt (another Trace object) are not asked again;
    other content, other lengths or another argument are; past `most` traces it starts
    again."""
    from workloads.traces import Trace, per_trace

    calls = []

    @per_trace(most=2)
    def total(t: Trace, scale: int = 1) -> int:
        calls.append(1)
        return int(t.prompt_len.sum()) * scale

    def make(content=((1, 10),), prompt=10) -> Trace:
        return Trace(np.zeros(1), np.array([prompt]), np.array([1]), content=(content,))

    assert total(make()) == 10 and total(make()) == 10 and len(calls) == 1
    assert total(make(prompt=12)) == 12 and total(make(), scale=2) == 20 and len(calls) == 3
    assert total(make(content=((2, 10),))) == 10 and len(calls) == 4  # other content
    assert total(make()) == 10 and len(calls) == 5  # forgotten past two traces
