"""`rdu-cluster simulate`, `models`, `clusters`: defaults, JSON interface, files, bad input."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from pyarrow import ipc

from rdu_cluster.cli import main
from workloads import catalog

PUBLIC_FIELDS = {
    "model",
    "cluster",
    "sockets",
    "batch",
    "prompt_len",
    "gen_len",
    "tokens_per_s_per_request",
    "tokens_per_s_total",
    "tpot_s",
    "ttft_s",
    "hbm_bw_utilization",
    "bound",
    "weight_bytes",
    "kv_cache_bytes",
    "flops_per_token",
    "bytes_per_token",
}


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_simulate_default_compares_sn40l16_and_dgx_h100():
    r = run("simulate")
    assert r.exit_code == 0, r.output + r.stderr
    assert "llama-3.1-70b" in r.output
    assert "sn40l-16" in r.output and "dgx-h100" in r.output
    assert "weight_streaming" in r.output


def test_simulate_json_has_public_fields():
    r = run(
        "simulate",
        "--model",
        "llama-3.1-8b",
        "--cluster",
        "sn40l-16",
        "--cluster",
        "dgx-h100",
        "--batch",
        "2",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    lines = [json.loads(x) for x in r.output.strip().splitlines()]
    assert [x["cluster"] for x in lines] == ["sn40l-16", "dgx-h100"]
    for x in lines:
        assert PUBLIC_FIELDS <= set(x)
        assert x["batch"] == 2 and x["tokens_per_s_total"] == pytest.approx(
            2 * x["tokens_per_s_per_request"] * (x["sockets"] // x["tp"])
        )


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_simulate_out_files(tmp_path, suffix):
    out = tmp_path / f"r{suffix}"
    r = run("simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--out", str(out))
    assert r.exit_code == 0, r.stderr
    tbl = pq.read_table(out) if suffix == ".parquet" else ipc.open_file(out).read_all()
    assert tbl.num_rows == 1
    assert tbl.schema.metadata[b"rdu_cluster.schema_version"] == b"5"
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--model", "gpt-5"], "unknown model"),
        (["--cluster", "sn50"], "unknown cluster"),
        (["--batch", "0"], "--batch"),
        (["--gen-len", "-3"], "--gen-len"),
        (["--model", "llama-3.1-405b", "--cluster", "dgx-h100"], "overflows"),
        (["--weights", "fp2"], "--weights"),
        (["--tp", "3", "--cluster", "sn40l-16"], "tp"),
    ],
)
def test_simulate_bad_input_one_line_exit_2_no_file(tmp_path, args, fragment):
    out = tmp_path / "r.parquet"
    r = run("simulate", *args, "--out", str(out))
    assert r.exit_code == 2
    assert fragment in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr
    assert not out.exists()


def test_simulate_malformed_config_json(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    r = run("simulate", "--model", str(bad))
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1


def test_models_and_clusters_listings():
    r = run("models", "--json")
    assert r.exit_code == 0, r.stderr
    names = {json.loads(x)["model"] for x in r.output.splitlines()}
    assert {"llama-3.1-70b", "deepseek-v3", "gpt-oss-120b", "mixtral-8x7b"} <= names
    assert len(names) >= 16
    r = run("clusters")
    assert r.exit_code == 0 and "sn40l-16" in r.output and "dgx-a100-2node" in r.output


def test_unknown_option_is_one_line():
    r = run("simulate", "--bogus")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1


def test_simulate_ablate_table():
    r = run("simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--ablate")
    assert r.exit_code == 0, r.stderr
    lines = r.output.splitlines()
    variants = [ln.split("  ")[0] for ln in lines[3:]]
    assert variants[0] == "all optimizations" and variants[-1] == "unfused baseline"
    assert lines[-1].split()[-2] == "1.00x"  # the baseline is its own reference


def test_simulate_ablate_needs_an_rdu_cluster():
    r = run("simulate", "--cluster", "dgx-h100", "--ablate")
    assert r.exit_code == 2 and "dataflow" in r.stderr


def test_simulate_plan_pipeline_pays_a_bubble_at_batch_1():
    """tp4pp4 at batch 1: one micro-batch crosses four stages in turn, so it is slower than tp16
    and the breakdown names the bubble."""
    rows = {}
    for plan in ("tp16", "tp4pp4"):
        r = run("simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-16", "--plan", plan,
                "--json")
        assert r.exit_code == 0, r.stderr
        rows[plan] = json.loads(r.output)
    assert rows["tp4pp4"]["plan"] == "tp4pp4" and rows["tp16"]["plan"] == "tp16"
    assert rows["tp4pp4"]["tpot_s"] > rows["tp16"]["tpot_s"]
    assert rows["tp4pp4"]["decode_pipeline_bubble_s"] > 0
    assert rows["tp16"]["decode_pipeline_bubble_s"] == 0


def test_simulate_default_plan_is_the_search_winner():
    r = run("simulate", "--model", "mixtral-8x7b", "--cluster", "sn40l-8", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.output)["plan"] == "tp8"  # TP over PP/EP at batch 1 on one node


@pytest.mark.parametrize("args", [["--plan", "tp3"], ["--plan", "xyz"], ["--tp", "2", "--plan",
                                                                          "tp2dp8"]])
def test_simulate_bad_plans(args):
    r = run("simulate", "--cluster", "sn40l-16", *args)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1


def test_simulate_summary_names_the_weight_dtype_and_its_origin(tmp_path):
    cfg = catalog.model_config("llama-3.1-8b")
    cfg["quantization_config"] = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = CliRunner().invoke(main, ["simulate", "--model", str(path), "--cluster", "sn40l-16"])
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]
    assert "8.0B params" in first and "weights fp8 (quantization_config fbgemm_fp8)" in first
    r = CliRunner().invoke(main, ["simulate", "--model", str(path), "--cluster", "sn40l-16",
                                  "--weights", "int4"])
    assert r.exit_code == 0 and "; weights int4, KV cache bf16" in r.output.splitlines()[0]
    r = CliRunner().invoke(main, ["simulate", "--model", "openai/GPT-OSS-20B", "--cluster",
                                  "sn40l-16"])
    assert "weights experts mxfp4 (quantization_config mxfp4)" in r.output.splitlines()[0]


SPEC = ["simulate", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--draft", "llama-3.2-1b"]


@pytest.mark.parametrize("args, message", [
    ([*SPEC, "--draft-sockets", "4"], "--draft-sockets: only with --draft-placement separate"),
    # the draft's own sockets beside the target's, as serve lays them out
    ([*SPEC, "--placement", "separate", "--draft-sockets", "8"],
     "--draft-sockets: 8 must divide the 8 sockets and leave room for the 8 of the plan tp8"),
    ([*SPEC, "--placement", "separate", "--draft-sockets", "3"],
     "--draft-sockets: 3 must divide the 8 sockets"),
    ([*SPEC, "--placement", "separate", "--draft-sockets", "4", "--tp", "8"],
     "--draft-sockets: 4 must divide the 8 sockets and leave room for the 8 of the plan tp8"),
    # the plan given, not the whole cluster: a tp8 plan leaves no room, tp4dp2 none for drafts
    ([*SPEC, "--placement", "separate", "--draft-sockets", "4", "--plan", "tp8"],
     "leave room for the 8 of the plan tp8"),
    ([*SPEC, "--placement", "separate", "--draft-sockets", "4", "--plan", "tp4dp2"],
     ("--draft-sockets: 4: the 2 replicas of plan tp4dp2, 8 sockets each with their drafts, "
      "exceed the 8 sockets of sn40l-8")),
    ([*SPEC, "--plan", "tp4pp2"], "--plan: 'tp4pp2': with --draft, tp and dp degrees only"),
    ([*SPEC, "--plan", "tp4", "--tp", "4"], "--tp and --plan: give one of them"),
    (["simulate", "--cluster", "sn40l-8", "--ablate", "--json"], "--json: not with --ablate"),
    (["simulate", "--cluster", "sn40l-8", "--ablate", "--out", "a.parquet"],
     "--out: not with --ablate"),
    (["simulate", "--cluster", "sn40l-8", "--ablate", "--plan", "tp8"],
     "--plan: not with --ablate"),
    (["simulate", "--cluster", "sn40l-8", "--objective", "throughput", "--plan", "tp8"],
     "--objective: not with --plan (it ranks the default plan search, which --plan skips)"),
    (["simulate", "--cluster", "sn40l-8", "--objective", "latency", "--tp", "8"],
     "--objective: not with --tp"),
    ([*SPEC, "--objective", "throughput"], "--objective: not with --draft"),
    (["simulate", "--coe", "--cluster", "sn40l-8", "--experts", "4", "--plan", "tp3",
      "--weights", "fp3", "--kv-dtype", "int1"], "--plan/--weights/--kv-dtype: not with --coe"),
    (["simulate", "--coe", "--cluster", "dgx-h100", "--experts", "4", "--stack", "bogus"],
     "--stack: not with --coe"),
    (["simulate", "--coe", "--cluster", "dgx-h100", "--experts", "4", "--routing", "identical"],
     "--routing: not with --coe"),
    (["simulate", "--cluster", "dgx-h100", "--routing", "hot"],
     "--routing: 'hot'; expected uniform, zipf:S (S a number) or identical"),
    (["simulate", "--coe", "--cluster", "sn40l-8", "--experts", "4", "--tp", "8", "--json"],
     "--tp/--json: not with --coe"),
    (["simulate", "--coe", "--cluster", "sn40l-8", "--experts", "4", "--prompt-len", "100000"],
     "--prompt-len: prompt 100,000 + output 20 tokens exceed the 4,096-token context"),
])
def test_simulate_refuses_what_its_mode_ignores_or_cannot_hold(args, message):
    r = run(*args)
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and message in lines[0], r.output


def test_simulate_identical_routing_reads_one_sequences_experts():
    """--routing identical (benchmark scripts that replicate one prompt): Mixtral's batch of 16
    reads the 2 experts a layer one sequence reads, not nearly all 8; a dense model is unmoved."""
    def speed(model, routing):
        r = run("simulate", "--model", model, "--cluster", "dgx-h100", "--plan", "tp4",
                "--batch", "16", "--routing", routing, "--json")
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["tokens_per_s_per_request"]
    assert speed("mixtral-8x7b", "identical") > 1.5 * speed("mixtral-8x7b", "uniform")
    assert speed("llama-3.1-8b", "identical") == speed("llama-3.1-8b", "uniform")


@pytest.mark.parametrize("plan", [["--tp", "4"], ["--plan", "tp4"]])
def test_simulate_separate_draft_beside_a_smaller_plan(plan):
    r = run(*SPEC, "--placement", "separate", "--draft-sockets", "4", *plan)
    assert r.exit_code == 0, r.output
    assert "separate (4)" in r.output


def test_simulate_tp_with_a_separate_draft_replicates_only_over_what_the_drafts_leave():
    # tp4 beside a 4-socket draft fills sn40l-8 once: one replica, not tp4dp2 (16 sockets)
    row = json.loads(run(*SPEC, "--spec-k", "3", "--tp", "4", "--placement", "separate",
                         "--draft-sockets", "4", "--json").stdout)
    assert (row["plan"], row["replicas"]) == ("tp4", 1)
    row = json.loads(run(*SPEC, "--spec-k", "3", "--tp", "2", "--placement", "separate",
                         "--draft-sockets", "2", "--json").stdout)
    assert (row["plan"], row["replicas"]) == ("tp2dp2", 2)


def test_simulate_draft_runs_the_plan_given():
    # --plan tp4 is one replica on 4 sockets, --tp 4 is tp4 replicated over the rest (tp4dp2)
    rows = {p: json.loads(run(*SPEC, "--spec-k", "3", *p, "--json").stdout)
            for p in (("--plan", "tp4"), ("--tp", "4"))}
    assert rows[("--plan", "tp4")]["plan"] == "tp4" and rows[("--tp", "4")]["plan"] == "tp4dp2"
    assert rows[("--tp", "4")]["tokens_per_s_total"] == pytest.approx(
        2 * rows[("--plan", "tp4")]["tokens_per_s_total"])
    assert "replicated over the rest" in run("simulate", "--help").output
    assert "shorthand for --plan tpN" not in run("simulate", "--help").output


def test_simulate_draft_ttft_includes_the_draft_prefill():
    # serve's prefill step with a shared draft runs the draft's prefill too
    args = ["simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--plan", "tp8",
            "--prompt-len", "2048", "--gen-len", "64", "--json"]
    plain = json.loads(run(*args).stdout)
    spec = json.loads(run(*args, "--draft", "llama-3.2-1b", "--spec-k", "3").stdout)
    assert spec["ttft_s"] > plain["ttft_s"]
    causes = [k for k in spec if k.startswith("prefill_") and k.endswith("_s")]
    assert sum(spec[k] for k in causes) == pytest.approx(spec["ttft_s"])


def test_simulate_checks_the_draft_context(tmp_path):
    doc = {k: v for k, v in catalog.model_config("llama-3.2-1b").items() if k != "_rdu"}
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps({**doc, "max_position_embeddings": 2048}))
    r = run("simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--prompt-len",
            "100000", "--gen-len", "8", "--draft", str(draft), "--spec-k", "4")
    assert r.exit_code == 2 and ("error: --draft: prompt 100,000 + output 8 tokens exceed the "
                                 "2,048-token context of") in r.stderr, r.output


def test_simulate_out_is_refused_on_the_model_file(tmp_path):
    doc = {k: v for k, v in catalog.model_config("llama-3.2-1b").items() if k != "_rdu"}
    model = tmp_path / "m.parquet"
    model.write_text(json.dumps(doc))
    r = run("simulate", "--model", str(model), "--cluster", "sn40l-8", "--out", str(model))
    assert r.exit_code == 2 and "is the --model file (it would be overwritten)" in r.stderr
    assert json.loads(model.read_text()) == doc


@pytest.mark.parametrize("extra, unused", [(["--routing", "zipf:3"], "--routing"),
                                           (["--seed", "7"], "--seed"),
                                           (["--routing", "uniform", "--seed", "1"],
                                            "--routing/--seed")])
def test_plan_refuses_routing_on_a_model_without_routed_experts(extra, unused):
    r = run("plan", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--top", "3", *extra)
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert f"{unused}: llama-3.2-1b has no routed experts" in lines[0]
    moe = run("plan", "--model", "mixtral-8x7b", "--cluster", "sn40l-8", "--top", "1", *extra)
    assert moe.exit_code == 0, moe.output


def test_plan_sizes_a_shorter_context_model_at_its_own_context():
    """The default prompt is 8,192 tokens, or the model's context less --gen-len (llama-2-7b:
    4,096 - 256); a prompt given is checked as given."""
    r = run("plan", "--model", "llama-2-7b", "--cluster", "sn40l-8", "--top", "1")
    assert r.exit_code == 0 and "context 3840, gen 256" in r.output, r.output
    r = run("plan", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--top", "1")
    assert r.exit_code == 0 and "context 8192, gen 256" in r.output, r.output
    r = run("plan", "--model", "llama-2-7b", "--cluster", "sn40l-8", "--context", "8192")
    assert r.exit_code == 2 and r.stderr.startswith("error: --context: prompt 8,192 + output")
    r = run("plan", "--model", "llama-2-7b", "--cluster", "sn40l-8", "--gen-len", "5000")
    assert r.exit_code == 2 and r.stderr.startswith("error: --gen-len: prompt 1 + output 5,000")
