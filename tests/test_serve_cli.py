"""`rdu-cluster serve`: tables and summary, bad input as one line and exit code 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rdu_cluster.cli import main
from workloads import catalog

ARGS = ["serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-16", "--requests", "20",
        "--rate", "20", "--prompt-len", "uniform:32:512", "--output-len", "16"]


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_serve_writes_tables_and_prints_a_summary(tmp_path):
    r = run(*ARGS, "--out", str(tmp_path / "out"))
    assert r.exit_code == 0, r.output
    for name in ("requests", "steps", "sockets", "links"):
        tbl = pq.read_table(tmp_path / "out" / f"{name}.parquet")
        assert tbl.schema.metadata[b"rdu_cluster.schema_version"] == b"5"
        assert tbl.schema.metadata[b"rdu_cluster.seed"] == b"0"
    assert pq.read_table(tmp_path / "out" / "requests.parquet").num_rows == 20
    for metric in ("TTFT", "TPOT", "ITL ", "E2EL"):
        assert f"{metric} ms  mean" in r.output
    assert "p99" in r.output and "output tokens/s" in r.output and "overloaded" not in r.output


VLLM_KEYS = {  # what `vllm bench serve --save-result` writes (lists of per-request values aside)
    "duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "request_goodput", "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
    "max_concurrent_requests", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms",
    "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "model_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency"}


def test_serve_json_has_vllm_keys_and_is_saved(tmp_path):
    import json

    r = run(*ARGS, "--json", "--metric-percentiles", "50,99.9", "--goodput", "ttft:1000 tpot:50",
            "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert VLLM_KEYS - {"p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms"} <= set(doc)
    assert "p99.9_itl_ms" in doc and "p50_ttft_ms" in doc
    assert doc == json.loads((tmp_path / "o" / "summary.json").read_text())
    assert doc["completed"] == 20 and doc["request_goodput"] == doc["request_throughput"]
    assert doc["total_output_tokens"] == 20 * 16
    # TPOT = (E2EL - TTFT) / (output - 1) for every request; the means agree
    assert doc["mean_tpot_ms"] == pytest.approx((doc["mean_e2el_ms"] - doc["mean_ttft_ms"]) / 15)


def test_percentiles_0_and_100_are_the_least_and_largest(tmp_path):
    """vLLM passes --metric-percentiles to np.percentile, which takes [0, 100]."""
    r = run(*ARGS, "--json", "--metric-percentiles", "0,100", "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    ttft = pq.read_table(tmp_path / "o" / "requests.parquet").column("ttft_s").to_numpy() * 1e3
    assert doc["p0_ttft_ms"] == pytest.approx(ttft.min(), rel=1e-12)
    assert doc["p100_ttft_ms"] == pytest.approx(ttft.max(), rel=1e-12)


def test_one_token_outputs_give_vllms_zero_tpot(tmp_path):
    # vLLM's calculate_metrics: np.mean(tpots or 0) and so on, 0 when no request has a TPOT
    r = run("serve", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--requests", "4",
            "--rate", "5", "--prompt-len", "64", "--output-len", "1", "--json", "--out",
            str(tmp_path / "o"), "--no-progress")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["completed"] == 4 and doc["mean_ttft_ms"] > 0
    for stat in ("mean", "median", "std", "p99"):
        assert doc[f"{stat}_tpot_ms"] == 0.0 and doc[f"{stat}_itl_ms"] == 0.0


def test_serve_closed_loop_and_dtypes(tmp_path):
    import json

    r = run("serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--requests", "24",
            "--concurrency", "4", "--output-len", "8", "--weights", "fp8", "--kv-dtype", "fp8",
            "--json", "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["max_concurrency"] == 4 and doc["request_rate"] == "inf"
    assert doc["completed"] == 24


def test_overload_warns(tmp_path):
    r = run("serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--plan", "tp8",
            "--requests", "120", "--rate", "400", "--prompt-len", "2048", "--output-len", "64",
            "--max-batch", "4", "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert "warning: overloaded" in r.output


def test_serve_reads_a_trace_file(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_len,output_len\n0,100,8\n0.01,200,4\n")
    r = run("serve", "--model", "llama-3.1-8b", "--trace", str(trace), "--out", str(tmp_path))
    assert r.exit_code == 2 and "holds 't.csv', not written by this command" in r.stderr
    r = run("serve", "--model", "llama-3.1-8b", "--trace", str(trace), "--out",
            str(tmp_path / "out"))
    assert r.exit_code == 0, r.output
    assert "2/2 requests served" in r.output


def test_goodput_takes_its_bounds_as_vllm_does(tmp_path):
    """`vllm bench serve --goodput ttft:1000 tpot:50` (argparse nargs="+"): the words after
    the option's value are more of its values, as one quoted word or the option repeated; a
    word that is no bound is refused as one (o.SpreadValues)."""
    docs = []
    for i, goodput in enumerate((["ttft:1000", "tpot:0.01"], ["ttft:1000 tpot:0.01"],
                                 ["ttft:1000", "--goodput", "tpot:0.01"],
                                 ["ttft:1000", "tpot:0.01", "--json"])):
        r = run(*ARGS, "--goodput", *goodput, *([] if "--json" in goodput else ["--json"]),
                "--out", str(tmp_path / f"o{i}"))
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        docs.append((doc["request_goodput"], doc["request_throughput"]))
    assert docs[0][0] == 0.0 < docs[0][1]  # the TPOT bound is met by none: both bounds read
    assert len(set(docs)) == 1
    r = run(*ARGS, "--goodput", "ttft:1000", "tpot", "--out", str(tmp_path / "bad"))
    assert r.exit_code == 2 and "--goodput: 'tpot'" in r.output
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("args, spread", [
    (["--goodput", "a:1", "b:2", "--json"], ["--goodput", "a:1", "--goodput", "b:2", "--json"]),
    (["--goodput=a:1", "b:2"], ["--goodput=a:1", "--goodput", "b:2"]),
    (["--json", "--goodput", "a:1"], ["--json", "--goodput", "a:1"]),
    (["--goodput", "a:1", "--", "b:2"], ["--goodput", "a:1", "--", "b:2"]),
    (["--model", "x", "y"], ["--model", "x", "y"]),  # another option's word: click refuses it
])
def test_spread_values(args, spread):
    from rdu_cluster.cli.options import spread_values

    assert spread_values(args, ("--goodput",)) == spread


@pytest.mark.parametrize("extra, message", [
    (["--scheduler", "fifo"], "--scheduler: unknown 'fifo'"),
    (["--rate", "0"], "Invalid value for '--rate': '0': expected a positive finite number or inf"),
    (["--rate", "-3"], "Invalid value for '--rate'"),
    (["--plan", "tp3"], "--plan: tp x pp = 3 must divide"),
    (["--fault", "socket:99@1"], "--fault 'socket:99@1': socket out of range"),
    (["--prompt-len", "normal:5"], "--prompt-len"),
    (["--goodput", "ttfb:5"], "--goodput: 'ttfb:5'"),
    (["--metric-percentiles", "50,x"], "--metric-percentiles: 'x' is not a number"),
    (["--routing", "random"], "--routing: unknown 'random'"),
    (["--concurrency", "0"], "--concurrency: must be a positive"),
    (["--weights", "fp7"], "--weights"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, extra, message):
    args = list(ARGS)
    if extra[0] in args:
        i = args.index(extra[0])
        args[i + 1] = extra[1]
        extra = []
    r = run(*args, *extra, "--out", str(tmp_path))
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.output


def test_bad_trace_file_and_missing_trace(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("when,prompt_len,output_len\n0,1,1\n")
    r = run("serve", "--trace", str(bad), "--out", str(tmp_path))
    assert r.exit_code == 2 and "missing column 'arrival_s'" in r.output
    r = run("serve", "--out", str(tmp_path))
    assert r.exit_code == 2 and "give --trace FILE, or --requests N and --rate R" in r.output


def test_serve_speculative_prints_tokens_per_step(tmp_path):
    r = run(*ARGS, "--draft", "llama-3.2-1b", "--spec-k", "3", "--acceptance", "0.8",
            "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert "speculative:" in r.output and "tokens per sequence per step" in r.output


@pytest.mark.parametrize("extra, message", [
    (["--draft", "llama-3.2-1b", "--spec-k", "3", "--acceptance", "1.5"], "acceptance"),
    (["--draft", "llama-3.2-1b", "--spec-k", "0", "--acceptance", "0.8"], "spec-k"),
    (["--spec-k", "3"], "only with --draft"),
])
def test_serve_speculative_bad_input_is_one_line(tmp_path, extra, message):
    r = run(*ARGS, *extra, "--out", str(tmp_path))
    assert r.exit_code == 2 and message in r.output


def test_serve_tree_speculation_with_a_separate_draft(tmp_path):
    r = run("serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--plan", "tp4",
            "--requests", "8", "--rate", "inf", "--prompt-len", "128", "--output-len", "64",
            "--draft", "llama-3.2-1b", "--tree", "3,2,1", "--spec-k", "3", "--acceptance", "0.7",
            "--draft-placement", "separate", "--draft-sockets", "4", "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert "8/8 requests served" in r.output and "tokens per sequence per step" in r.output
    assert "(draft llama-3.2-1b on 4 sockets of its own, tree 3,2,1, acceptance" in r.output
    sockets = pq.read_table(tmp_path / "sockets.parquet").column("socket").to_pylist()
    assert set(sockets) == set(range(8))  # 4 draft sockets and the tp4 target


@pytest.mark.parametrize("extra, message", [
    (["--draft", "llama-3.2-1b", "--tree", "3,2", "--spec-k", "3"], "tree: 2 branching factors"),
    (["--draft", "llama-3.2-1b", "--tree", "3,x"], "tree: '3,x' not understood"),
    (["--tree", "3,2,1"], "--tree: only with --draft"),
    (["--draft-placement", "separate"], "--draft-placement/--draft-sockets: only with --draft"),
    (["--draft", "llama-3.2-1b", "--draft-placement", "separate", "--draft-sockets", "16",
      "--spec-k", "2"], "--draft-sockets: 16 must divide the 16 sockets and leave room"),
])
def test_serve_tree_and_placement_bad_input_is_one_line(tmp_path, extra, message):
    r = run(*ARGS, *extra, "--out", str(tmp_path))
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and message in lines[0], r.output


def test_serve_disaggregated_pools(tmp_path):
    import json

    r = run("serve", "--model", "llama-3.1-8b", "--requests", "12", "--rate", "4",
            "--prefill-pool", "dgx-h100:tp8:1", "--decode-pool", "sn40l-16:tp16:1", "--json",
            "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["completed"] == 12 and "ib-ndr" in doc["cluster"]
    req = pq.read_table(tmp_path / "requests.parquet").to_pydict()
    assert min(req["kv_transfer_s"]) > 0


@pytest.mark.parametrize("extra, message", [
    (["--prefill-pool", "dgx-h100:tp8:1"], "--prefill-pool/--decode-pool: give both"),
    (["--prefill-pool", "dgx-h100:tp8:1", "--decode-pool", "sn40l-16:tp16:1", "--plan", "tp8"],
     "--plan: not with --prefill-pool"),
    (["--prefill-pool", "sn40l-8:tp2dp2:1", "--decode-pool", "sn40l-8:tp8:1"],
     "--plan: 'tp2dp2': serve takes tp, ep, pp and adp degrees only (the replicas are --replicas"),
    (["--cluster", "sn40l-8", "--plan", "tp2dp2"], "serve takes tp, ep, pp and adp degrees only"),
    (["--cluster", "sn40l-8", "--plan", "tp1dp2", "--replicas", "8"],
     "serve takes tp, ep, pp and adp degrees only"),
    (["--cluster", "sn40l-8", "--plan", "tp2dp1"], "serve takes tp, ep, pp and adp degrees only"),
    (["--prefill-pool", "dgx-h100:tp8:1", "--decode-pool", "sn40l-16:tp16:1", "--fabric",
      "nvlink9"], "unknown fabric 'nvlink9'"),
])
def test_bad_pools_are_one_line(tmp_path, extra, message):
    r = run("serve", "--model", "llama-3.1-8b", "--requests", "4", "--rate", "4", *extra,
            "--out", str(tmp_path))
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.output


SMALL = ["serve", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--requests", "4",
         "--rate", "2", "--prompt-len", "64", "--output-len", "8"]
POOLS = ["--prefill-pool", "sn40l-8:tp8:1", "--decode-pool", "sn40l-8:tp8:1"]


def _trace(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_len,output_len\n0,64,8\n1,64,8\n")
    return str(trace)


def _config(tmp_path, **fields):
    """The catalog's llama-3.2-1b as a config.json (without the catalog's own key)."""
    doc = catalog.model_config("llama-3.2-1b")
    doc.pop("_rdu")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**doc, **fields}))
    return str(path)


@pytest.mark.parametrize("extra, message", [
    # options that would have no effect: refused, as --turns without --sessions
    ([*POOLS, "--sockets", "4"],
     "--sockets/--set sockets: not with --prefill-pool/--decode-pool (its replicas set"),
    (["--fabric", "nope"], "--fabric: only with --prefill-pool/--decode-pool or --replicas"),
    (["--think-time", "30"], "--think-time: only with --sessions"),
    (["--system-prompt", "100000"], "--system-prompt: only with --sessions"),
    (["--burstiness", "3"], "--burstiness: only with --arrival bursty"),
    (["--arrival", "fixed", "--burstiness", "3"], "--burstiness: only with --arrival bursty"),
    (["--sessions", "2", "--turns", "2", "--arrival", "bursty", "--burstiness", "3"],
     "--burstiness: not with --sessions"),
    (["--draft", "llama-3.2-1b", "--draft-sockets", "4"],
     "--draft-sockets: only with --draft-placement separate"),
    (["--coe-experts", "2", "--coe-distribution", "uniform:3"],
     "distribution: 'uniform:3': uniform takes no argument"),
    # impossible inputs
    (["--draft", "qwen2.5-7b", "--spec-k", "2"], "a draft must share the target's tokenizer"),
    (["--goodput", "tpot:5", "--goodput", "tpot:10"], "--goodput: tpot given twice"),
    (["--goodput", "tpot:5 ttft:9 tpot:10"], "--goodput: tpot given twice"),
    (["--prefix-block", "100000000000"], "'--prefix-block': 100000000000 is not in the range"),
    (["--concurrency", "10000000000000"], "'--concurrency': 10000000000000 is not in the range"),
])
def test_options_with_no_effect_and_impossible_values_are_refused(tmp_path, extra, message):
    args = [a for a in SMALL if not (extra[0] == "--sessions" and a in ("--requests", "4"))]
    r = run(*args, *extra, "--out", str(tmp_path / "out"))
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and message in lines[0], r.output
    assert not (tmp_path / "out").exists()


def test_synthetic_workload_options_are_refused_with_a_trace(tmp_path):
    trace = _trace(tmp_path)
    for extra, flags in ((["--prompt-len", "100000", "--output-len", "5000"],
                          "--prompt-len/--output-len"),
                         (["--arrival", "bursty", "--burstiness", "4"], "--arrival/--burstiness")):
        r = run("serve", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--trace", trace,
                *extra, "--out", str(tmp_path / "out"))
        assert r.exit_code == 2 and f"error: {flags}: not with --trace" in r.output, r.output


def test_a_fabric_is_checked_where_it_is_used(tmp_path):
    r = run(*SMALL, "--replicas", "1", "--plan", "tp8", "--fabric", "nope",
            "--out", str(tmp_path / "out"))
    assert r.exit_code == 2 and "unknown fabric 'nope'" in r.output, r.output


def test_the_draft_context_holds_every_request(tmp_path):
    draft = _config(tmp_path, max_position_embeddings=2048)
    args = [*SMALL, "--draft", draft, "--spec-k", "2", "--out", str(tmp_path / "out")]
    r = run(*args[:args.index("64")], "4000", *args[args.index("64") + 1:])
    assert r.exit_code == 2, r.output
    assert ("error: --draft: prompt 4,000 + output 8 tokens exceed the 2,048-token context of"
            in r.output)
    assert run(*args).exit_code == 0  # 64 + 8 tokens fit


def test_a_link_fault_names_two_linked_sockets(tmp_path):
    ring = [*SMALL[:3], "--cluster", "sn40l-16-ring", *SMALL[5:]]
    r = run(*ring, "--fault", "link:0-8@0", "--out", str(tmp_path / "out"))
    assert r.exit_code == 2 and ("--fault 'link:0-8@0': no link 0-8 in sn40l-16-ring's ring "
                                 "network; a link joins neighbours") in r.output, r.output
    r = run(*ring, "--fault", "link:15-0@0", "--out", str(tmp_path / "out"))
    assert r.exit_code == 0, r.output  # the ring wraps around


def test_timeline_is_refused_on_an_input_file(tmp_path):
    trace, config = _trace(tmp_path), _config(tmp_path)
    before = {p: Path(p).read_text() for p in (trace, config)}
    r = run("serve", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--trace", trace,
            "--timeline", trace, "--out", str(tmp_path / "out"))
    assert r.exit_code == 2 and "is the --trace file (it would be overwritten)" in r.output
    r = run("serve", "--model", config, *SMALL[3:], "--timeline", config, "--out",
            str(tmp_path / "out"))
    assert r.exit_code == 2 and "is the --model file (it would be overwritten)" in r.output
    assert {p: Path(p).read_text() for p in (trace, config)} == before


@pytest.mark.parametrize("routing", ["round-robin", "least-outstanding"])
def test_a_closed_loop_goes_on_through_a_fault_that_refuses_a_replica(tmp_path, routing):
    """--fault with --concurrency: a request refused at the fault frees its client's slot (its
    next request is sent), so every request is accounted for. It was refused outright for
    want of that."""
    fail = [a for s in range(4) for a in ("--fault", f"socket:{s}@0.02")]
    r = run("serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--plan", "tp4",
            "--requests", "30", "--prompt-len", "100", "--output-len", "40", "--concurrency",
            "4", "--routing", routing, *fail, "--out", str(tmp_path / "a"))
    assert r.exit_code == 0, r.output
    req = pq.read_table(tmp_path / "a" / "requests.parquet").to_pydict()
    assert req["request_id"] == list(range(30))
    served = [s == "done" for s in req["state"]]
    assert 0 < sum(served) < 30  # the healthy replica served some, the failed one refused some
    assert all(g == 40 for g, ok in zip(req["generated_tokens"], served) if ok)


def _peak(send, e2el):
    import numpy as np

    from rdu_cluster.engine import bench, spill

    send, e2el = np.asarray(send, float), np.asarray(e2el, float)
    m = bench.Measured(send, e2el / 2, e2el, np.full(len(send), 2), np.ones(len(send)),
                       spill.Spill.of(e2el / 2), spill.Spill.of(send + e2el))
    return bench._peaks(m)["max_concurrent_requests"]


def test_max_concurrent_requests_is_vllms_exact_peak():
    """vLLM's calculate_metrics (vllm/benchmarks/serve.py, after issue #56653): the peak of
    requests in flight over half-open [send, completion) intervals, not one-second buckets."""
    assert _peak([0.0, 1.0], [1.0, 1.0]) == 1  # adjacent: the first ends as the second starts
    assert _peak([0.0, 0.3, 0.6], [0.2, 0.2, 0.2]) == 1  # three in one second, never together
    assert _peak([0.0, 1.0], [1.5, 1.0]) == 2  # overlapping
    assert _peak([0.0, 0.1, 0.2, 5.0], [1.0, 1.0, 1.0, 0.5]) == 3


def test_closed_loop_peak_concurrency_is_at_most_the_clients(tmp_path):
    """N clients never have more than N requests in flight, and the summary says so (it said 20
    for 4 clients, counting every request that touched a busy second)."""
    import numpy as np

    r = run("serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--plan", "tp4",
            "--requests", "60", "--concurrency", "4", "--prompt-len", "64", "--output-len", "8",
            "--json", "--no-progress", "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    req = pq.read_table(tmp_path / "o" / "requests.parquet").to_pandas()
    t = np.concatenate([req.finish_s, req.arrival_s])
    d = np.concatenate([-np.ones(len(req)), np.ones(len(req))])
    exact = int(np.cumsum(d[np.lexsort((d, t))]).max())
    assert exact == 4
    assert doc["max_concurrent_requests"] == exact


@pytest.mark.parametrize("given, noted", [
    ({}, True),  # identical requests, every client at 0: they stay in step
    ({"--ramp-up": "0.5"}, False),  # starts spread: they mix
    ({"--output-len": "uniform:4:12"}, False),  # lengths differ: they disperse
    ({"--requests": "4"}, False),  # one request a client: no loop to stay in step
])
def test_clients_started_together_with_identical_requests_are_noted(tmp_path, given, noted):
    """A closed loop of identical requests whose clients all start at once stays in step
    (docs/capacity.md, "Ramp"): serve says so on stderr, and its JSON on stdout is whole."""
    opts = {"--requests": "24", "--concurrency": "4", "--prompt-len": "64", "--output-len": "8",
            **given}
    r = run("serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--plan", "tp4",
            *[w for kv in opts.items() for w in kv], "--json", "--no-progress",
            "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    assert ("4 clients of identical requests started at once stay in step" in r.stderr) == noted
    assert json.loads(r.stdout)["max_concurrency"] == 4


def test_swap_preemptions_are_in_the_summary(tmp_path):
    """--preemption swap: the summary counted recompute preemptions only and said '0
    preemptions' while requests were swapped out; it now carries swaps, the requests' total."""
    args = ["serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--plan", "tp4",
            "--requests", "120", "--rate", "100", "--kv-fraction", "0.01", "--preemption",
            "swap", "--no-progress"]
    r = run(*args, "--json", "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    swaps = int(pq.read_table(tmp_path / "o" / "requests.parquet").column("swaps").to_numpy()
                .sum())
    assert swaps > 0 and doc["swaps"] == swaps and doc["preemptions"] == 0
    text = run(*args, "--out", str(tmp_path / "t"))
    assert text.exit_code == 0, text.output
    assert f"0 preemptions, {swaps} swapped out" in text.output


@pytest.mark.slow  # seconds: end to end
def test_summary_burstiness_is_vllms_gamma_shape(tmp_path):
    """summary.json's `burstiness` is vLLM's (the gamma shape of the gaps, CV 1 / sqrt(shape));
    --burstiness here is the gaps' coefficient of variation, and the summary wrote it as it
    was: 3 for gaps of CV 3, which vLLM's key reads as CV 0.58."""
    import numpy as np

    base = ["serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--plan", "tp4",
            "--prompt-len", "32", "--output-len", "2", "--json", "--no-progress"]
    r = run(*base, "--requests", "600", "--rate", "50", "--arrival", "bursty",
            "--burstiness", "3", "--out", str(tmp_path / "b"))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["burstiness"] == pytest.approx(1 / 9)
    gaps = np.diff(pq.read_table(tmp_path / "b" / "requests.parquet").column("arrival_s")
                   .to_numpy())
    cv = gaps.std() / gaps.mean()
    assert 2 < cv < 4  # the gaps' CV is --burstiness: vLLM's shape for it is 1 / 9
    r = run(*base, "--requests", "20", "--rate", "50", "--arrival", "fixed", "--out",
            str(tmp_path / "f"))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["burstiness"] == "inf"
    r = run(*base, "--requests", "20", "--rate", "50", "--out", str(tmp_path / "p"))
    assert json.loads(r.stdout)["burstiness"] == 1.0
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_len,output_len\n0,32,2\n0.5,32,2\n")
    r = run("serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--plan", "tp4",
            "--trace", str(trace), "--json", "--no-progress", "--out", str(tmp_path / "t"))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["burstiness"] is None


def test_a_pairs_draft_k_is_chosen_on_its_decode_pool(tmp_path):
    """serve --prefill-pool/--decode-pool --draft: k (not given) is the fastest on the decode
    pool's cluster and plan, where the drafts and verification run, as an aggregated run there
    chooses it."""
    common = ["serve", "--model", "llama-3.1-8b", "--requests", "8", "--rate", "4",
              "--draft", "llama-3.2-1b", "--no-progress"]
    lines = {}
    for name, where in (("pair", ["--prefill-pool", "dgx-h100:tp1:1", "--decode-pool",
                                  "sn40l-8:tp4:1"]),
                        ("alone", ["--cluster", "sn40l-8", "--plan", "tp4"])):
        r = CliRunner().invoke(main, [*common, *where, "--out", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        lines[name] = next(x for x in r.stdout.splitlines() if "speculative:" in x)
    k = lambda line: re.search(r"k=(\d+)", line).group(1)
    assert k(lines["pair"]) == k(lines["alone"])
