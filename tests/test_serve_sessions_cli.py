"""`rdu-cluster serve` with multi-turn sessions, trace formats and the prefix cache; the serve
sweep with the same options."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rdu_cluster.cli import main
from rdu_cluster.engine import evictions
from rdu_cluster.sweep import expand, load_spec
from rdu_cluster.sweep.runners import run_serve
from tests.sweep.helpers import write
from workloads.errors import ConfigError

DATA = Path(__file__).parent / "data" / "traces"
SESSIONS = ["serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-16", "--sessions", "6",
            "--turns", "3", "--prompt-len", "64", "--output-len", "16", "--system-prompt", "200",
            "--think-time", "1", "--no-progress"]


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_sessions_print_the_hit_rate_and_json_carries_it(tmp_path):
    r = run(*SESSIONS, "--out", str(tmp_path / "a"))
    assert r.exit_code == 0, r.output
    assert "18/18 requests served" in r.output and "prefix cache tiered: hit rate" in r.output
    r = run(*SESSIONS, "--json", "--out", str(tmp_path / "b"))
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["prefix_cache"] == "tiered" and 0 < s["prefix_cache_hit_rate"] < 1
    assert set(s["prefix_cache_hit_rate_by_tier"]) == {"hbm", "ddr"}
    assert s["p99_ttft_ms"] > 0
    req = pq.read_table(tmp_path / "b" / "requests.parquet").to_pydict()
    assert sorted(set(req["session"])) == list(range(6)) and sum(req["prefix_hbm_tokens"]) > 0
    r = run(*SESSIONS, "--prefix-cache", "off", "--json", "--out", str(tmp_path / "c"))
    off = json.loads(r.output)
    assert off["prefix_cache_hit_rate"] == 0.0 and off["median_ttft_ms"] > s["median_ttft_ms"]


@pytest.mark.slow  # seconds: end to end
def test_the_mooncake_and_azure_excerpts_serve(tmp_path):
    for name in ("mooncake_conversation_200.jsonl", "azure_llm_conv_2023_200.csv"):
        r = run("serve", "--model", "llama-3.1-8b", "--trace", str(DATA / name),
                "--chunked-prefill", "--json", "--no-progress", "--out", str(tmp_path / name))
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["completed"] == 200


@pytest.mark.parametrize("extra, message", [
    (["--prefix-cache", "l3"], "'l3' is not one of"),
    (["--prefix-block", "0"], "--prefix-block: at least 16 tokens"),
    (["--prefix-block", "1"], "--prefix-block: at least 16 tokens (the KV block vLLM hashes)"),
    (["--prefix-eviction", "no-such-policy"],
     f"--prefix-eviction: unknown 'no-such-policy'; accepted: {', '.join(evictions.names())}"),
    (["--think-time", "soon"], "--think-time: 'soon': not a number"),
    (["--requests", "5"], "--sessions: not with --trace or --requests"),
])
def test_bad_session_and_cache_options_are_one_line(tmp_path, extra, message):
    args = list(SESSIONS)
    if extra[0] in args:  # set once: an option given twice is refused
        args[args.index(extra[0]) + 1], extra = extra[1], []
    r = run(*args, *extra, "--out", str(tmp_path))
    assert r.exit_code == 2
    assert message in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_turns_without_sessions_is_refused(tmp_path):
    r = run("serve", "--turns", "3", "--out", str(tmp_path))
    assert r.exit_code == 2 and "--sessions and --turns go together" in r.output


SWEEP = """
[sweep]
kind = "serve"
[base]
model = "llama-3.1-8b"
cluster = "sn40l-8"
sessions = 4
turns = 2
prompt_len = 64
output_len = 8
system_prompt = 128
think_time = "exponential:1"
[[axes]]
type = "grid"
prefix_cache = ["off", "tiered"]
"""


def test_a_serve_sweep_takes_sessions_and_cache_modes(tmp_path):
    points = expand(load_spec(write(tmp_path, SWEEP))).points
    out = run_serve(points, seed=0)
    rows = {r["prefix_cache_mode"]: r for r in out.table.to_pylist()}
    assert set(rows) == {"off", "tiered"} and rows["off"]["prefix_cache_hit_rate"] == 0.0
    assert rows["tiered"]["prefix_cache_hit_rate"] > 0 and rows["tiered"]["requests"] == 8
    assert rows["tiered"]["ttft_p50_s"] < rows["off"]["ttft_p50_s"]


@pytest.mark.parametrize("text, message", [
    (SWEEP.replace("[[axes]]", "requests = 3\n[[axes]]", 1), "base.sessions: give one workload"),
    (SWEEP.replace("turns = 2\n", ""), "base.turns: missing field"),
    (SWEEP + "[[axes]]\ntype = 'grid'\nthink_time = ['x:1']\n", "axes[1].think_time[0]: 'x:1'"),
])
def test_bad_sweep_workloads_name_the_field(tmp_path, text, message):
    from rdu_cluster.sweep.runners import check_serve

    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_serve(expand(load_spec(write(tmp_path, text))).points, {})


def test_capacity_carries_the_prefix_cache_into_serve_args():
    r = run("capacity", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--concurrency", "4",
            "--prompt-len", "256", "--output-len", "16", "--slo", "tpot:50", "--shortlist", "1",
            "--prefix-cache", "off", "--json")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout.splitlines()[0])
    i = row["serve_args"].index("--prefix-cache")
    assert row["serve_args"][i + 1] == "off"


@pytest.mark.parametrize("routing", ["round-robin", "least-kv"])
def test_a_fault_that_refuses_a_replica_still_sends_its_sessions_later_turns(tmp_path, routing):
    """Every socket of the one replica fails mid-turn: its requests are refused, and each
    refusal sends the session's next turn (refused in turn), as a refusal at admission does.
    The fault's refusals sent nothing, so the later turns were never made and the requests
    table lost them (1 row of 9, the rows after the first held back for them)."""
    fail = [a for s in range(8) for a in ("--fault", f"socket:{s}@0.01")]
    r = run("serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--plan", "tp8",
            "--sessions", "3", "--turns", "3", "--prompt-len", "20", "--output-len", "50",
            "--think-time", "0", "--routing", routing, *fail, "--no-progress",
            "--out", str(tmp_path / "a"))
    assert r.exit_code == 0, r.output
    req = pq.read_table(tmp_path / "a" / "requests.parquet").to_pydict()
    assert req["request_id"] == list(range(9))
    assert set(req["state"]) == {"unserved"}
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["failed"] == 9
