"""The command-line surface as a user meets it: an option that would have no effect in a
combination is refused with one line (exit 2), not dropped unseen; an output folder that is
the current one is refused before any work; the files a --help text names exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from rdu_cluster.cli import main

ROOT = Path(__file__).resolve().parents[1]
SERVE = ["serve", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--plan", "tp8",
         "--requests", "3", "--rate", "1", "--prompt-len", "64", "--output-len", "4",
         "--no-progress"]
POOLS = ["--prefill-pool", "sn40l-8:tp8:1", "--decode-pool", "sn40l-8:tp8:1"]
SPEC = ROOT / "examples" / "sweeps" / "decode-small.toml"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(r, message: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert message in lines[0], lines[0]
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args, message", [
    # click kept the last value of an option given twice and dropped the first unseen
    (["plan", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--cluster", "dgx-h100"],
     "--cluster: given 2 times; it takes one value, give it once"),
    (["simulate", "--model", "llama-3.2-1b", "--model=llama-3.1-8b"],
     "--model: given 2 times"),
    (["simulate", "--calibration", "none", "--calibration", "default"],
     "--calibration: given 2 times"),
    (["simulate", "--model", "llama-3.1-8b", "--draft", "llama-3.2-1b", "--placement", "shared",
      "--draft-placement", "separate"], "--placement/--draft-placement: given 2 times"),
    (["footprint", "--experts", "4", "--experts", "8"], "--experts: given 2 times"),
])
def test_an_option_of_one_value_given_twice_is_refused(args, message):
    refused(run(*args), message)


@pytest.mark.parametrize("args, flag", [
    # '' was read as the option left out: a plain simulation, the model's dtype, the best plan
    (["simulate", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--draft", ""], "--draft"),
    (["simulate", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--weights", ""],
     "--weights"),
    (["plan", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--plan", ""], "--plan"),
    ([*SERVE, "--address", "", "--out", "x"], "--address"),
    ([*SERVE, "--goodput", "ttft:100", "--goodput", "", "--out", "x"], "--goodput"),
    ([*SERVE, "--out", ""], "--out"),
])
def test_an_empty_value_is_refused(tmp_path, monkeypatch, args, flag):
    monkeypatch.chdir(tmp_path)
    refused(run(*args), f"{flag}: an empty value; give one or leave the option out")
    assert list(tmp_path.iterdir()) == []


def test_flags_and_repeatable_options_may_repeat_and_help_wins():
    r = run("simulate", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--cluster",
            "dgx-h100", "--json", "--json")
    assert r.exit_code == 0 and len(r.stdout.strip().splitlines()) == 2, r.output
    r = run("simulate", "--batch", "2", "--batch", "3", "--help")
    assert r.exit_code == 0 and "Usage:" in r.stdout, r.output


def test_the_speculative_table_runs_the_serving_stack():
    import json

    args = ["simulate", "--model", "llama-3.1-8b", "--cluster", "dgx-h100", "--draft",
            "llama-3.2-1b", "--spec-k", "3", "--json"]
    rows = {s: json.loads(run(*args, "--stack", s).stdout.splitlines()[0])
            for s in ("vllm", "tensorrt-llm")}
    assert {s: r["stack"] for s, r in rows.items()} == {s: s for s in rows}
    assert rows["vllm"]["tpot_s"] != rows["tensorrt-llm"]["tpot_s"]
    refused(run(*args, "--stack", "bogus"), "--stack: 'bogus' unknown")


@pytest.mark.parametrize("extra, unused", [(["--objective", "throughput"], "--objective"),
                                           (["--top", "3"], "--top")])
def test_plan_refuses_search_options_with_one_plan(extra, unused):
    args = ["plan", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--plan", "tp8"]
    assert run(*args).exit_code == 0
    refused(run(*args, *extra), f"{unused}: not with --plan")


@pytest.mark.parametrize("extra, message", [
    (["--prefix-cache", "off", "--prefix-block", "32"],
     "--prefix-block: not with --prefix-cache off"),
    (["--prefix-cache", "off", "--prefix-eviction", "lru"],
     "--prefix-eviction: not with --prefix-cache off"),
    (["--replicas", "2", *POOLS], "--replicas: not with --prefill-pool/--decode-pool"),
])
def test_serve_refuses_options_with_no_effect(tmp_path, extra, message):
    args = [a for a in SERVE if not (POOLS[0] in extra and a in ("--plan", "tp8", "--cluster",
                                                                 "sn40l-8"))]
    refused(run(*args, *extra, "--out", tmp_path / "out"), message)
    assert not (tmp_path / "out").exists()


def test_a_tree_deeper_than_spec_k_says_what_to_give():
    refused(run("simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--draft",
                "llama-3.2-1b", "--tree", "4,2,1", "--spec-k", "2"),
            "tree: 3 branching factors make a tree of depth 3, but k (--spec-k) is 2; give k = 3 "
            "or leave it out")


def test_serve_names_turns_when_turns_meets_requests(tmp_path):
    refused(run(*SERVE, "--turns", "2", "--out", tmp_path / "out"),
            "--turns: not with --trace or --requests")


@pytest.mark.parametrize("out", [".", "./", "..", "sub/.."])
def test_serve_refuses_an_out_that_names_no_folder_of_its_own(tmp_path, monkeypatch, out):
    """`--out .` in an empty folder ran the whole simulation, then failed to swap the current
    folder for its result ('Device or resource busy')."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    refused(run(*SERVE, "--out", out), "names no folder of its own")
    assert list(here.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["here"]


@pytest.mark.parametrize("extra, message", [
    (["--dry-run", "--out", "x"], "--out: not with --dry-run"),
    (["--dry-run", "--force", "--workers", "2"], "--workers/--force: not with --dry-run"),
    (["--show", "3", "--out", "x", "--no-progress"], "--show: only with --dry-run"),
])
def test_sweep_refuses_options_with_no_effect(tmp_path, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    refused(run("sweep", SPEC, *extra), message)
    assert list(tmp_path.iterdir()) == []


def test_the_files_help_texts_name_exist():
    """A module or config path a --help text cites (serve --coe-experts cited
    rdu_cluster/coe.py, which is rdu_cluster/scenarios/coe.py)."""
    cited = set()
    for name in main.commands:
        text = " ".join(run(name, "--help").stdout.split())
        text = re.sub(r"(?<=[\w/])- (?=\w)", "-", text)  # words click wrapped at a hyphen
        cited |= set(re.findall(r"\b(?:rdu_cluster|chip|workloads|partitioning|interconnect|"
                                r"cluster_configs)/[\w/.-]*\w", text))
    assert cited
    missing = sorted(p for p in cited  # NAME.toml and the like: a placeholder, not a file
                     if not re.search(r"\b[A-Z]{2,}\b", p) and not (ROOT / p).exists())
    assert not missing, missing


def _no_constant(token: str):
    raise ValueError(f"{token} is not JSON (strict parsers reject it)")


@pytest.mark.parametrize("args", [
    ["simulate", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--cluster", "dgx-h100"],
    ["simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--draft", "llama-3.2-1b"],
    ["plan", "--model", "mixtral-8x7b", "--cluster", "sn40l-8", "--top", "3"],
    ["footprint", "--experts", "8"],
    ["models"],
    ["clusters"],
    [*SERVE[:SERVE.index("--output-len") + 1], "1", *SERVE[SERVE.index("--output-len") + 2:],
     "--out", "{d}/out"],  # one output token: no TPOT or ITL measured
    ["capacity", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--max-nodes", "1",
     "--shortlist", "1", "--concurrency", "2", "--prompt-len", "64", "--output-len", "8",
     "--slo", "tpot:50"],
])
def test_every_json_output_is_strict_json_with_its_documented_keys(tmp_path, args):
    """README: every --json is strict JSON (no NaN or Infinity), in the keys it lists."""
    r = run(*[a.replace("{d}", str(tmp_path)) for a in args], "--json")
    assert r.exit_code == 0, r.output
    text = r.stdout.strip()
    docs = ([json.loads(text, parse_constant=_no_constant)] if args[0] == "serve"
            else [json.loads(line, parse_constant=_no_constant) for line in text.splitlines()])
    assert docs
    keys = {"plan": PLAN_KEYS, "footprint": FOOTPRINT_KEYS}
    for doc in docs:
        assert keys.get(args[0], set()) <= set(doc), sorted(set(keys[args[0]]) - set(doc))


@pytest.mark.slow  # the session's one validate run (tests/conftest.py)
def test_validate_json_is_strict_json_with_its_documented_keys(validate_report):
    """As above, for `validate --json` (the session's one run over the bundled rows)."""
    _, stdout, _ = validate_report
    doc = json.loads(stdout.strip(), parse_constant=_no_constant)
    assert VALIDATE_KEYS <= set(doc), sorted(VALIDATE_KEYS - set(doc))


PLAN_KEYS = {"plan", "sockets", "tp", "pp", "ep", "dp", "mixer_tp", "tokens_per_s_per_request",
             "tokens_per_s_total", "tpot_s", "hbm_used_bytes", "ddr_used_bytes",
             "bubble_fraction", "expert_load", "bound"}
FOOTPRINT_KEYS = {"cluster", "experts", "expert_model", "placement", "nodes", "ttft_s",
                  "hbm_bytes_per_node", "tier_bytes_per_node", "tier", "infeasible_reason"}
VALIDATE_KEYS = {"profile", "rows", "leave_one_out", "summary"}


@pytest.mark.parametrize("workload", [["--sessions", "2", "--turns", "2"],
                                      ["--requests", "3", "--rate", "inf"],
                                      ["--requests", "3", "--concurrency", "2"]])
def test_serve_refuses_an_arrival_process_at_rate_inf(tmp_path, workload):
    """At rate inf (given, or the default of sessions and closed loops) every request arrives
    at 0: --arrival fixed/bursty changed nothing."""
    args = ["serve", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--prompt-len", "64",
            "--output-len", "4", "--no-progress", *workload, "--out", tmp_path / "out"]
    refused(run(*args, "--arrival", "fixed"), "--arrival: only with a finite --rate")
    assert run(*args).exit_code == 0


@pytest.mark.parametrize("extra, message", [
    (["--chunked-prefill", "--prompt-len", "10000"],
     "--chunked-prefill: not with --scheduler static"),
    (["--preemption", "swap"], "--preemption swap: not with --scheduler static"),
])
def test_static_batching_refuses_limits_it_cannot_honour(tmp_path, extra, message):
    """A static batch prefills whole prompts and is never preempted: with --chunked-prefill a
    10,000-token prompt was neither served nor refused (0 completed, 0 failed, left waiting)."""
    args = ["serve", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--scheduler", "static",
            "--requests", "2", "--rate", "1", "--no-progress", "--out", tmp_path / "out"]
    refused(run(*args, *extra), message)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # fresh interpreters that import Ray: seconds each
@pytest.mark.parametrize("command", ["serve", "sweep"])
def test_an_unreachable_ray_address_from_the_environment_is_named_as_such(tmp_path, command):
    """$RAY_ADDRESS with nothing listening was reported as '--address HOST:PORT', an option
    the user had not given. In a process of its own: a test before may have started Ray here."""
    pytest.importorskip("ray")
    import os
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, RAY_ADDRESS=f"127.0.0.1:{port}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    args = ([*SERVE, "--backend", "ray", "--out", tmp_path / "out"] if command == "serve" else
            ["sweep", SPEC, "--backend", "ray", "--out", tmp_path / "out", "--no-progress"])
    entry = "from rdu_cluster.entry import run; run()"
    for extra, named in (([], "RAY_ADDRESS="), (["--address", f"127.0.0.1:{port}"], "--address ")):
        start = time.monotonic()
        r = subprocess.run([sys.executable, "-c", entry, *map(str, args), *extra], env=env,
                           capture_output=True, text=True, timeout=120, cwd=tmp_path,
                           check=False)
        want = f"error: {named}127.0.0.1:{port}: no Ray cluster reachable there"
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(want), r.stderr
        assert time.monotonic() - start < 30  # at once: not ray.init's retries


def test_ablate_refuses_a_gpu_cluster_it_would_skip():
    """simulate --ablate --cluster sn40l-8 --cluster dgx-h100 printed sn40l-8's table alone,
    the GPU cluster dropped unseen."""
    args = ["simulate", "--ablate", "--model", "llama-3.2-1b", "--cluster", "sn40l-8"]
    assert run(*args).exit_code == 0
    refused(run(*args, "--cluster", "dgx-h100"),
            "--ablate: needs RDU (dataflow) clusters only; got dgx-h100")
    assert run("simulate", "--ablate", "--model", "llama-3.2-1b").exit_code == 0  # the defaults


@pytest.mark.parametrize("args, message", [
    # click's parser raises these without a context: the hint named no command
    (["serve", "--out"], "Option '--out' requires an argument. (see 'rdu-cluster serve --help')"),
    (["simulate", "--json=3"],
     "Option '--json' does not take a value. (see 'rdu-cluster simulate --help')"),
    (["plan", "--model", "x", "--cluster"], "(see 'rdu-cluster plan --help')"),
    (["--bogus"], "No such option '--bogus'. (see '"),  # the group's context: its own name
])
def test_a_parser_error_names_the_commands_help(args, message):
    refused(run(*args), message)


def test_help_lists_each_command_without_importing_it():
    """`rdu-cluster --help` reads each command's one-line help from its source (start-up,
    #36): the list must match what click makes from the loaded commands, and loading it must
    import no command module nor numpy, pyarrow, scipy, plotly, pandas or ray."""
    import subprocess
    import sys

    from rdu_cluster.cli import LazyCommands

    lazy = LazyCommands(main.commands.modules)
    for name in main.commands:
        assert lazy.short_help(name, 60) == main.commands[name].get_short_help_str(60), name
    probe = ("import sys; from rdu_cluster.cli import main\n"
             "try: main(['--help'])\nexcept SystemExit: pass\n"
             "heavy = ('numpy', 'pyarrow', 'scipy', 'plotly', 'pandas', 'ray', 'rdu_cluster.cli.')\n"
             "print(sorted(m for m in sys.modules if m.startswith(heavy)))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                       check=True)
    assert re.search(r"simulate +Estimate decode", r.stdout)
    assert r.stdout.strip().splitlines()[-1] == "[]"
