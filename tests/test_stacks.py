"""A serving stack on every path (chip/serving_stacks.py): a GPU runs a named stack, `--stack`
or the default; every result says which; an RDU cluster takes none and refuses one."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from chip import serving_stacks as stacks
from partitioning.estimate import estimate
from partitioning.scenario import Scenario
from rdu_cluster.cli import main
from rdu_cluster.config import load_cluster
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.sweep import expand, load_spec
from rdu_cluster.sweep.runners import run_plan, run_serve, run_simulate
from tests.sweep.helpers import write
from workloads.catalog import load_model
from workloads.errors import ConfigError

SIM = ["simulate", "--model", "llama-3.2-1b", "--tp", "1"]
SERVE = ["serve", "--model", "llama-3.2-1b", "--plan", "tp1", "--requests", "6", "--rate",
         "20", "--prompt-len", "128", "--output-len", "16", "--json", "--no-progress"]


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def refused(r, message: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert message in lines[0], lines[0]


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100")


def test_a_gpu_runs_a_named_stack_and_an_rdu_none(h100):
    sn = load_cluster("sn40l-8")
    assert stacks.default_stack(h100.chip) in stacks.STACKS
    assert stacks.default_stack(sn.chip) is None
    assert stacks.options_for(h100.chip, None) is stacks.stack(stacks.DEFAULT_STACK)
    assert stacks.options_for(h100.chip, "vllm") is stacks.stack("vllm")
    assert stacks.options_for(sn.chip, None) is None
    with pytest.raises(ConfigError, match="^--stack: 'vllm' is a GPU serving stack; sn40l-8 "):
        stacks.options_for(sn.chip, "vllm", system="sn40l-8")
    for bad in ("", "bogus"):
        with pytest.raises(ConfigError, match=f"^--stack: '{bad}' unknown; accepted: "):
            stacks.options_for(h100.chip, bad)
    assert stacks.stack_of(h100.chip, None) == stacks.DEFAULT_STACK
    assert stacks.stack_of(h100.chip, stacks.stack("eager")) == "eager"
    assert stacks.stack_of(sn.chip, None) is None


def test_no_options_is_the_default_stack_not_an_unnamed_mix(h100):
    """The GPU execution model given no options costs the default stack's step, exactly; a
    different stack costs a different one (so the default is not a no-op)."""
    s = Scenario(load_model("llama-3.1-8b"), h100, "tp8", batch=4, prompt_len=512, gen_len=64)
    bare, named = estimate(s), estimate(s.but(options=stacks.stack(stacks.DEFAULT_STACK)))
    assert float(bare.tpot_s) == float(named.tpot_s) and bare.stack == stacks.DEFAULT_STACK
    other = next(n for n in stacks.STACKS if n != stacks.DEFAULT_STACK)
    assert float(estimate(s.but(options=stacks.stack(other))).tpot_s) != float(bare.tpot_s)


def test_simulate_names_the_stack_on_its_first_line_and_in_every_row(tmp_path):
    r = run(*SIM, "--cluster", "dgx-h100", "--json")
    assert json.loads(r.stdout.splitlines()[0])["stack"] == stacks.DEFAULT_STACK
    r = run(*SIM, "--cluster", "dgx-h100", "--stack", "tensorrt-llm")
    assert r.stdout.splitlines()[0].endswith("; stack tensorrt-llm"), r.output
    out = tmp_path / "r.parquet"
    r = run(*SIM, "--cluster", "dgx-h100", "--cluster", "sn40l-8", "--stack", "vllm",
            "--out", str(out))
    assert r.exit_code == 0 and "stack: dgx-h100 vllm, sn40l-8 none" in r.stdout.splitlines()[0]
    assert pq.read_table(out).column("stack").to_pylist() == ["vllm", None]


def test_an_rdu_cluster_refuses_a_stack_in_one_line():
    refused(run(*SIM, "--cluster", "sn40l-8", "--stack", "vllm"),
            "--stack: 'vllm' is a GPU serving stack; sn40l-8 runs")
    refused(run("plan", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--stack", "sglang"),
            "--stack: 'sglang' is a GPU serving stack")
    refused(run(*SERVE, "--cluster", "sn40l-8", "--out", "o", "--stack", "vllm"),
            "--stack: 'vllm' is a GPU serving stack")


def test_plan_rows_carry_the_stack_they_were_ranked_under():
    args = ["plan", "--model", "llama-3.2-1b", "--cluster", "dgx-h100", "--top", "1", "--json"]
    rows = {s: json.loads(run(*args, "--stack", s).stdout) for s in ("eager", "tensorrt-llm")}
    assert [r["stack"] for r in rows.values()] == ["eager", "tensorrt-llm"]
    assert rows["eager"]["tpot_s"] > rows["tensorrt-llm"]["tpot_s"]  # no CUDA graphs


@pytest.mark.slow  # seconds: end to end
def test_serve_runs_the_stack_and_its_summary_says_which(tmp_path):
    docs = {}
    for s in ("vllm", "tensorrt-llm", None):
        extra = ["--stack", s] if s else []
        r = run(*SERVE, "--cluster", "dgx-h100", "--out", str(tmp_path / str(s)), *extra)
        assert r.exit_code == 0, r.output
        docs[s] = json.loads(r.stdout)
    assert [d["stack"] for d in docs.values()] == ["vllm", "tensorrt-llm",
                                                     stacks.DEFAULT_STACK]
    assert docs["vllm"]["mean_tpot_ms"] != docs["tensorrt-llm"]["mean_tpot_ms"]
    rdu = run(*SERVE, "--cluster", "sn40l-8", "--out", str(tmp_path / "rdu"))
    assert json.loads(rdu.stdout)["stack"] is None
    text = run(*SERVE[:-2], "--cluster", "dgx-h100", "--out", str(tmp_path / "t"), "--stack",
               "eager").stdout.splitlines()[0]
    assert text.startswith(
        "llama-3.2-1b on dgx-h100, stack eager, max batch 128, chunked prefill ("), text


SWEEP = """
[sweep]
kind = "{kind}"
[base]
model = "llama-3.2-1b"
cluster = "dgx-h100"
{extra}
[[axes]]
type = "list"
points = [{{ stack = "eager" }}, {{ stack = "tensorrt-llm" }}, {{ cluster = "dgx-h100" }}]
"""


@pytest.mark.parametrize("kind, runner, extra, speed", [
    ("simulate", run_simulate, "tp = 1", "tpot_s"),
    ("plan", run_plan, "", "tpot_s"),
    ("serve", run_serve, ('plan = "tp1"\nrequests = 4\nrate = 20.0\nprompt_len = "64"\n'
                         'output_len = "8"'), "tpot_p50_s"),
])
def test_stack_is_a_sweep_field_and_a_row_column(tmp_path, kind, runner, extra, speed):
    spec = load_spec(write(tmp_path, SWEEP.format(kind=kind, extra=extra)))
    rows = runner(expand(spec).points, spec.seed).table.to_pylist()
    assert [r["stack"] for r in rows] == ["eager", "tensorrt-llm", stacks.DEFAULT_STACK]
    assert rows[0][speed] > rows[1][speed]


def test_a_sweep_stack_on_an_rdu_cluster_is_refused_naming_the_field(tmp_path):
    spec = write(tmp_path, SWEEP.format(kind="simulate", extra="tp = 1").replace(
        'cluster = "dgx-h100"\n', 'cluster = "sn40l-8"\n', 1))
    r = run("sweep", str(spec), "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "axes[0].stack: 'eager' is a GPU serving stack" in r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # seconds: end to end
def test_capacity_ranks_each_stack_and_serves_it_as_it_was_verified():
    """Each GPU system once per stack, an RDU system once (it takes none)."""
    r = run("capacity", "--model", "llama-3.2-1b", "--cluster", "dgx-h100", "--cluster",
            "sn40l-8", "--plan", "tp1", "--stack", "vllm", "--stack", "tensorrt-llm",
            "--concurrency", "4", "--requests", "8", "--prompt-len", "128", "--output-len",
            "16", "--slo", "tpot:50", "--shortlist", "1", "--json")
    assert r.exit_code == 0, r.output
    rows = {row["stack"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert sorted(rows, key=str) == [None, "tensorrt-llm", "vllm"]
    assert rows[None]["system"] == "sn40l-8" and "--stack" not in rows[None]["serve_args"]
    for name in ("vllm", "tensorrt-llm"):
        args = rows[name]["serve_args"]
        assert args[args.index("--stack") + 1] == name
    refused(run("capacity", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--stack", "vllm",
                "--concurrency", "4", "--slo", "tpot:50"), "--stack: 'vllm' is a GPU")


PAIR = ["serve", "--model", "llama-3.2-1b", "--requests", "6", "--rate", "20", "--prompt-len",
        "512", "--output-len", "16", "--json", "--no-progress"]


def test_a_mixed_pair_runs_the_named_stack_on_its_gpu_pool(tmp_path):
    """A GPU pool beside an RDU pool runs --stack (serving_stacks.pool_options), the RDU pool
    its own execution model; a pair with no GPU pool refuses a stack, as a cluster does."""
    docs = {}
    for s in ("vllm", "eager", None):
        r = run(*PAIR, "--prefill-pool", "dgx-h100:tp1:1", "--decode-pool", "sn40l-8:tp4:1",
                "--out", str(tmp_path / str(s)), *(["--stack", s] if s else []))
        assert r.exit_code == 0, r.output
        docs[s] = json.loads(r.stdout)
    assert [d["stack"] for d in docs.values()] == ["vllm", "eager", stacks.DEFAULT_STACK]
    # the stack times the H100 pool's prefill; the SN40L pool's decode is the same under each
    assert docs["eager"]["mean_ttft_ms"] != docs["vllm"]["mean_ttft_ms"]
    # (to the rounding of sums over steps that start at other times)
    assert docs["eager"]["mean_tpot_ms"] == pytest.approx(docs["vllm"]["mean_tpot_ms"],
                                                          rel=1e-12)
    default = run(*PAIR, "--prefill-pool", "dgx-h100:tp1:1", "--decode-pool", "sn40l-8:tp4:1",
                  "--out", str(tmp_path / "named"), "--stack", stacks.DEFAULT_STACK)
    assert json.loads(default.stdout)["mean_ttft_ms"] == docs[None]["mean_ttft_ms"]
    refused(run(*PAIR, "--prefill-pool", "sn40l-8:tp4:1", "--decode-pool", "sn40l-8:tp4:1",
                "--stack", "vllm", "--out", str(tmp_path / "rdu")),
            "--stack: 'vllm' is a GPU serving stack; sn40l-8:tp4:1 runs sn40l sockets")
    assert not (tmp_path / "rdu").exists()


def test_a_sweep_pair_point_takes_its_stack_on_the_gpu_pool(tmp_path):
    """The point's cluster (an RDU one here) is neither pool: its stack is checked and run on
    the pools."""
    body = SWEEP.format(kind="serve", extra=(
        'requests = 4\nrate = 20.0\nprompt_len = "512"\noutput_len = "8"\n'
        'prefill_pool = "dgx-h100:tp1:1"\ndecode_pool = "sn40l-8:tp4:1"')).replace(
        'cluster = "dgx-h100"\n', 'cluster = "sn40l-8"\n', 1).replace(
        '{ cluster = "dgx-h100" }', '{ seed = 0 }')
    spec = load_spec(write(tmp_path, body))
    rows = run_serve(expand(spec).points, spec.seed).table.to_pylist()
    assert [r["stack"] for r in rows] == ["eager", "tensorrt-llm", stacks.DEFAULT_STACK]
    assert rows[0]["ttft_p50_s"] != rows[1]["ttft_p50_s"]
    assert rows[0]["feasible"] and rows[0]["tpot_p50_s"] == pytest.approx(
        rows[1]["tpot_p50_s"], rel=1e-12)


@pytest.mark.slow  # seconds: end to end
def test_capacity_verifies_a_mixed_pair_under_each_stack(tmp_path):
    """A pair with a GPU pool is a candidate under each --stack (its RDU pool takes none); its
    serve_args name the stack, and serve reproduces the row from them."""
    r = run("capacity", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--pair",
            "dgx-h100:sn40l-8", "--stack", "vllm", "--stack", "eager", "--concurrency", "4",
            "--requests", "8", "--prompt-len", "512", "--output-len", "16", "--slo",
            "tpot:50", "--shortlist", "1", "--json", "--no-progress")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    pairs = {row["stack"]: row for row in rows if row["disaggregated"]}
    assert sorted(pairs) == ["eager", "vllm"]
    # the pair's systems keep their rows: each GPU one under each stack, an RDU one once
    assert sorted((row["system"], str(row["stack"])) for row in rows
                  if not row["disaggregated"]) == [("dgx-h100", "eager"), ("dgx-h100", "vllm"),
                                                   ("sn40l-8", "None")]
    row = pairs["vllm"]
    args = row["serve_args"]
    assert args[args.index("--stack") + 1] == "vllm"
    again = run("serve", *args, "--json", "--no-progress", "--out", str(tmp_path / "again"))
    assert again.exit_code == 0, again.output
    doc = json.loads(again.stdout)
    assert doc["stack"] == "vllm" and doc["output_throughput"] == pytest.approx(
        row["tokens_per_s_per_socket"] * row["sockets"], rel=1e-9)


def test_sensitivity_runs_the_stack_and_the_dtypes_it_is_given():
    """sensitivity takes --stack (a GPU's; refused on an RDU cluster), --weights and
    --kv-dtype, as simulate does, and its records say which."""
    rows = {}
    for extra in (["--stack", "vllm"], ["--stack", "eager"], ["--weights", "fp8"]):
        r = run("sensitivity", "--model", "llama-3.1-8b", "--cluster", "dgx-h100", "--json",
                *extra)
        assert r.exit_code == 0, r.output
        rows[extra[1]] = {x["key"]: x for x in map(json.loads, r.stdout.splitlines())}
    hbm = "chip.tiers.hbm.bandwidth_bytes_per_s"
    assert [rows[k][hbm]["stack"] for k in rows] == ["vllm", "eager", stacks.DEFAULT_STACK]
    assert rows["fp8"][hbm]["weights"] == "fp8" and rows["vllm"][hbm]["weights"] == "bf16"
    assert rows["vllm"][hbm]["elasticity_tpot_s"] != rows["eager"][hbm]["elasticity_tpot_s"]
    refused(run("sensitivity", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--stack",
                "vllm"), "--stack: 'vllm' is a GPU serving stack; sn40l-8 runs sn40l sockets")


def test_plan_takes_the_kv_dtype_and_with_dtypes_keeps_the_state_dtype():
    """plan's --weights/--kv-dtype are simulate's (cli/options.dtype_options, with_dtypes): an
    FP8 KV cache holds half the bytes a token; a precision's recurrent-state dtype survives a
    weights or KV change."""
    from workloads import graph
    from workloads.dtypes import DType, Precision
    from workloads.spec import with_dtypes

    hbm = {}
    for dtype in ("bf16", "fp8"):
        r = run("plan", "--model", "llama-3.1-8b", "--cluster", "dgx-h100", "--plan", "tp1",
                "--context", "8192", "--gen-len", "256", "--kv-dtype", dtype, "--json")
        assert r.exit_code == 0, r.output
        hbm[dtype] = json.loads(r.stdout)["hbm_used_bytes"]
    spec = load_model("llama-3.1-8b")
    assert hbm["bf16"] - hbm["fp8"] == float(graph.kv_cache_bytes(spec, 1, 8192 + 256)) / 2
    spec = spec.with_precision(Precision(state=DType.FP32))
    assert with_dtypes(spec, "fp8", "fp8").precision.state is DType.FP32


def test_plan_takes_the_prompt_length_as_the_other_commands_name_it():
    got = [run("plan", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", flag, "1024", "--top",
               "1", "--json") for flag in ("--context", "--prompt-len")]
    assert all(r.exit_code == 0 for r in got) and got[0].stdout == got[1].stdout
    assert json.loads(got[1].stdout)["tokens_per_s_per_request"] != json.loads(run(
        "plan", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--prompt-len", "4096",
        "--top", "1", "--json").stdout)["tokens_per_s_per_request"]


def test_a_gpu_runs_its_stacks_cap_where_no_max_batch_is_given(tmp_path):
    """serve without --max-batch runs as many sequences at once as the engine it names would
    (schedulers.max_batch_for: SGLang's request pool, vLLM's max_num_seqs by its GPU rule); an
    RDU, and a CoE run (its runtime is [MICRO24]'s), the engine's 32; a pair, its decode pool's.
    Without --token-budget, a step takes the stack's own budget (token_budget_for), and
    without --chunked-prefill prompts are chunked where the stack's scheduler chunks them
    (vLLM, Sarathi-Serve), a pair's prefill pool's. The JSON says which; a serve sweep's point
    that sets none runs and records the same."""
    from rdu_cluster.config import load_cluster
    from rdu_cluster.sweep.runners import serve as serve_runner

    def cap(*extra: str, args=SERVE, key="max_batch") -> int:
        r = run(*args, "--out", str(tmp_path / f"run{len(list(tmp_path.iterdir()))}"), *extra)
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)[key]

    assert cap("--cluster", "dgx-h100") == 4096
    assert cap("--cluster", "dgx-h100", "--stack", "vllm") == 1024
    assert cap("--cluster", "dgx-a100", "--stack", "vllm") == 256
    assert cap("--cluster", "sn40l-8") == 32
    assert cap("--cluster", "dgx-h100", "--max-batch", "8") == 8
    assert cap("--cluster", "dgx-h100", "--coe-experts", "2") == 32
    pair = [a for a in SERVE if a not in ("--plan", "tp1")]
    assert cap("--prefill-pool", "dgx-h100:tp1:1", "--decode-pool", "sn40l-8:tp2:1",
               args=pair) == 32
    assert cap("--prefill-pool", "sn40l-8:tp2:1", "--decode-pool", "dgx-h100:tp1:1",
               args=pair) == 4096
    # and the tokens a step takes: the stack's own (vLLM: 2,048 off an H100/H200), the
    # prefill pool's in a pair
    budget = lambda *extra, args=SERVE: cap(*extra, args=args, key="token_budget")
    assert budget("--cluster", "dgx-h100") == 8192 and budget("--cluster", "sn40l-8") == 8192
    assert budget("--cluster", "dgx-a100", "--stack", "vllm") == 2048
    assert budget("--cluster", "dgx-a100", "--stack", "vllm", "--token-budget", "512") == 512
    assert budget("--prefill-pool", "dgx-a100:tp1:1", "--decode-pool", "sn40l-8:tp2:1",
                  "--stack", "vllm", args=pair) == 2048
    # and whether prompts are chunked beside the decodes: as the stack's scheduler does
    chunked = lambda *extra, args=SERVE: cap(*extra, args=args, key="chunked_prefill")
    assert chunked("--cluster", "dgx-h100", "--stack", "vllm") is True
    assert chunked("--cluster", "dgx-h100") is False and chunked("--cluster", "sn40l-8") is False
    assert chunked("--cluster", "dgx-h100", "--stack", "vllm", "--no-chunked-prefill") is False
    assert chunked("--cluster", "dgx-h100", "--stack", "vllm", "--scheduler", "static") is False
    assert chunked("--prefill-pool", "dgx-a100:tp1:1", "--decode-pool", "sn40l-8:tp2:1",
                   "--stack", "vllm", args=pair) is True
    assert [n for n in stacks.STACKS if stacks.chunks_prefill(stacks.stack(n))] == [
        "vllm", "eager"]
    # and the scheduling policy: TensorRT-LLM's own (GUARANTEED_NO_EVICT), else continuous
    policy = lambda *extra, args=SERVE: cap(*extra, args=args, key="scheduler")
    assert policy("--cluster", "dgx-h100", "--stack", "tensorrt-llm") == "guaranteed-no-evict"
    assert policy("--cluster", "dgx-h100", "--stack", "tensorrt-llm-1.3") == (
        "guaranteed-no-evict")
    assert policy("--cluster", "dgx-h100") == "continuous" == policy("--cluster", "sn40l-8")
    assert policy("--cluster", "dgx-h100", "--stack", "tensorrt-llm", "--scheduler",
                  "continuous") == "continuous"
    h100 = load_cluster("dgx-h100").chip
    a100 = load_cluster("dgx-a100").chip

    def point(chip, **f):  # a serve sweep point's scheduler and limits
        return serve_runner._serve_config({"preemption": "recompute", "routing":
                                           "round-robin", **f}, chip, 0)

    assert point(h100).limits == Limits(4096, 8192, False)
    assert point(a100, stack="vllm").limits == Limits(256, 2048, True)
    assert point(h100, max_batch=8, token_budget=512, chunked_prefill=False).limits == Limits(
        8, 512, False)
    pool = {"prefill_pool": "sn40l-8:tp2:1", "decode_pool": "dgx-h100:tp1:1"}
    assert point(h100, **pool).limits == Limits(4096, 8192, False)
    assert point(h100, stack="tensorrt-llm").scheduler == "guaranteed-no-evict"
    assert point(h100).scheduler == "continuous"


def test_a_draft_on_a_gpus_default_cap_chooses_k_where_the_kv_cache_holds_the_batch(tmp_path):
    """k is chosen at the most sequences the run can hold: a stack's cap of thousands is the
    engine's, not the memory's (Llama 3.1 8B + Llama 3.2 1B on one H100 was refused 'does not
    fit' at 4,096 sequences)."""
    args = [a if a != "llama-3.2-1b" else "llama-3.1-8b" for a in SERVE]
    r = run(*args, "--cluster", "dgx-h100", "--draft", "llama-3.2-1b", "--out",
            str(tmp_path / "spec"))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["max_batch"] == 4096 and doc["completed"] == 6
