"""Hostile input, every command: a table of cases (per command and input kind) run in-process
through click's CliRunner. Each must end with exit code 2, exactly one line on stderr, no
traceback, nothing written (the folder it runs in, its inputs included, unchanged), and within
a time limit (a hang fails, it does not stall CI).

`python -m tests.test_hostile_input` (from the repository root) prints the number of cases by
command and input kind (`python tests/...` would import tests/interconnect for the package).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from rdu_cluster.cli import main
from workloads import catalog

ROOT = Path(__file__).resolve().parents[1]
CHIPS = ROOT / "cluster_configs" / "chips"
CLUSTERS = ROOT / "cluster_configs" / "clusters"
LIMIT_S = 20  # per case; the slowest legitimate refusal takes well under a second


@dataclass
class Case:
    command: str
    kind: str  # the input kind: hf_config, config_file, cluster_toml, chip_toml, ...
    args: list[str]  # "{d}" stands for the case's folder
    files: dict[str, object] = field(default_factory=dict)  # name -> text, bytes, dict or "DIR"
    dataset: bool = False  # copy a small finished sweep dataset into {d}/ds first
    label: str = ""  # what is hostile, for the test id

    @property
    def id(self) -> str:
        what = self.label or " ".join(self.args[-2:])
        return f"{self.command}-{self.kind}-{what[:60]}"


CASES: list[Case] = []


def add(command: str, kind: str, *args: str, files=None, dataset=False, label="") -> None:
    CASES.append(Case(command, kind, list(args), dict(files or {}), dataset, label))


# ---- HF config.json fields --------------------------------------------------------------------

class _Recorder(dict):
    """A config dict that notes every key the importer looks at."""

    def __init__(self, data, seen):
        super().__init__(data)
        self.seen = seen

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)


def fields_read(config: dict) -> list[str]:
    """The fields the importer reads from `config`: the ones worth corrupting."""
    from workloads.hf_config import from_hf_config

    seen: set[str] = set()
    from_hf_config(_Recorder(config, seen))
    return sorted(k for k in seen if k in config and k != "_rdu")


def _bad_values(value) -> list:
    """Values of the wrong type, range or size for a field that holds `value`."""
    if isinstance(value, bool):
        return ["yes", 3]
    if isinstance(value, int) or value is None:
        return ["3", -1, 10**400, [4], 2.5]
    if isinstance(value, float):
        return ["0.5", -1.0, float("nan"), float("inf")]
    if isinstance(value, str):
        return [5, ["a"]] if len(value) < 40 else [5]
    if isinstance(value, list):
        return [4, "abc", [None]]
    if isinstance(value, dict):
        return ["fp8", 5]
    return ["?"]


HF_MODELS = ("llama-3.2-1b", "llama-3.1-8b", "mistral-7b", "qwen2.5-7b", "qwen3-32b",
             "mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-20b", "minimax-m2",
             "qwen3-next-80b-a3b", "nemotron-h-56b", "deepseek-v2", "gemma-2-9b", "gemma-3-27b",
             "glm-4.5-air", "llama-4-maverick", "mistral-small-3.1-24b", "phi-3-mini-4k",
             "qwen1.5-moe-a2.7b")
# Commands that take --model (or a model path in a spec), in rotation over the cases.
MODEL_ARGS = {
    "simulate": ["simulate", "--model", "{d}/config.json", "--cluster", "sn40l-16"],
    "plan": ["plan", "--model", "{d}/config.json", "--cluster", "sn40l-16"],
    "serve": ["serve", "--model", "{d}/config.json", "--cluster", "sn40l-16", "--requests", "4",
              "--rate", "1", "--out", "{d}/out"],
    "footprint": ["footprint", "--experts", "2", "--expert-model", "{d}/config.json",
                  "--cluster", "sn40l-8"],
    "sweep": ["sweep", "{d}/spec.toml", "--out", "{d}/out"],
    "capacity": ["capacity", "--model", "{d}/config.json", "--cluster", "sn40l-16", "--rate",
                 "1", "--slo", "tpot:50"],
}
MODEL_SPEC = """[base]\nmodel = "{d}/config.json"\ncluster = "sn40l-16"\n"""


def _model_case(i: int, config, kind: str = "hf_config", label: str = "") -> None:
    command = list(MODEL_ARGS)[i % len(MODEL_ARGS)]
    files = {"config.json": config}
    if command == "sweep":
        files["spec.toml"] = MODEL_SPEC
    add(command, kind, *MODEL_ARGS[command], files=files, label=label or f"#{i}")


def _hf_cases() -> None:
    i = 0
    for name in HF_MODELS:
        base = catalog.model_config(name)
        base.pop("_rdu")
        for key in fields_read(base):
            for bad in _bad_values(base[key]):
                _model_case(i, dict(base, **{key: bad}), label=f"{name} {key}={bad!r:.20}")
                i += 1
    llama = {k: v for k, v in catalog.model_config("llama-3.1-8b").items() if k != "_rdu"}
    moe = {k: v for k, v in catalog.model_config("mixtral-8x7b").items() if k != "_rdu"}
    gpt = {k: v for k, v in catalog.model_config("gpt-oss-20b").items() if k != "_rdu"}
    shapes = [  # inconsistent shapes, each field fine alone
        dict(llama, num_key_value_heads=48),  # more KV heads than heads
        dict(llama, num_key_value_heads=5),  # not dividing 32
        dict(llama, num_attention_heads=8192, num_key_value_heads=8192),  # head_dim 0
        dict(llama, num_hidden_layers=10**6),  # past the layer bound
        dict(llama, vocab_size=2**40),
        dict(moe, num_experts_per_tok=9),  # top-k past 8 experts
        dict(moe, num_local_experts=10**9),
        dict(gpt, layer_types=["full_attention"] * 3),  # 3 types for 24 layers
        dict(gpt, layer_types=["bogus"] * 24),
        dict(llama, model_type=["llama"]),
        dict(llama, model_type="bert"),
        {k: v for k, v in llama.items() if k != "hidden_size"},
    ]
    for config in shapes:
        _model_case(i, config, "model_shape")
        i += 1


def _config_file_cases() -> None:
    llama = {k: v for k, v in catalog.model_config("llama-3.1-8b").items() if k != "_rdu"}
    nested = "[" * 100_000 + "]" * 100_000
    files = [
        b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe binary",
        "",
        "[1, 2, 3]",
        '"llama"',
        "{ not json",
        nested,
        json.dumps(llama)[:-1] + ', "x": ' + "9" * 5000 + "}",  # past Python's digit limit
        json.dumps(llama).replace('"hidden_size": 4096', '"hidden_size": NaN'),
        json.dumps(llama).replace('"hidden_size": 4096', '"hidden_size": Infinity'),
        "DIR",  # config.json is a folder
    ]
    for i, text in enumerate(files):
        _model_case(i, text, "config_file")


# ---- cluster and chip TOML --------------------------------------------------------------------

SN40L_8 = (CLUSTERS / "sn40l-8.toml").read_text().replace(
    'chip = "sn40l"', f'chip = "{CHIPS / "sn40l.toml"}"')
SN40L_CHIP = (CHIPS / "sn40l.toml").read_text()
CLUSTER_ARGS = {
    "simulate": ["simulate", "--model", "llama-3.1-8b", "--cluster", "{d}/c.toml"],
    "plan": ["plan", "--model", "llama-3.1-8b", "--cluster", "{d}/c.toml"],
    "serve": ["serve", "--model", "llama-3.1-8b", "--cluster", "{d}/c.toml", "--requests", "4",
              "--rate", "1", "--out", "{d}/out"],
    "footprint": ["footprint", "--experts", "2", "--cluster", "{d}/c.toml"],
    "sweep": ["sweep", "{d}/spec.toml", "--out", "{d}/out"],
    "capacity": ["capacity", "--model", "llama-3.1-8b", "--cluster", "{d}/c.toml", "--rate", "1",
                 "--slo", "tpot:50"],
}
CLUSTER_SPEC = """[base]\nmodel = "llama-3.1-8b"\ncluster = "{d}/c.toml"\n"""


def _cluster_case(i: int, kind: str, cluster: str, chip: str | None = None,
                  label: str = "") -> None:
    command = list(CLUSTER_ARGS)[i % len(CLUSTER_ARGS)]
    files = {"c.toml": cluster}
    if chip is not None:
        files["chip.toml"] = chip
        files["c.toml"] = cluster.replace(f'chip = "{CHIPS / "sn40l.toml"}"',
                                          'chip = "{d}/chip.toml"')
    if command == "sweep":
        files["spec.toml"] = CLUSTER_SPEC
    add(command, kind, *CLUSTER_ARGS[command], files=files, label=label or f"#{i}")


def _sub(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _cluster_cases() -> None:
    i = 0
    numeric = {"link_bandwidth_bytes_per_s = 50e9": "link_bandwidth_bytes_per_s",
               "link_latency_s = 1e-6": "link_latency_s",
               "socket_hour_usd = 4.916": "socket_hour_usd",
               "sockets = 8\n": "sockets", "sockets_per_node = 8": "sockets_per_node"}
    for line, key in numeric.items():
        huge = ("10000000000000",) if key.startswith("sockets") else ()
        for bad in ("nan", "inf", "-1", '"3"', "[1]", *huge):
            new = f"{key} = {bad}" + ("\n" if line.endswith("\n") else "")
            _cluster_case(i, "cluster_toml", _sub(SN40L_8, line, new), label=f"{key}={bad}")
            i += 1
    broken = [
        _sub(SN40L_8, 'kind = "full_mesh"', 'kind = "hypercube"'),
        _sub(SN40L_8, "sockets_per_node = 8", "sockets_per_node = 3"),
        _sub(SN40L_8, "[cost]", "cost = 5\n[costs]"),
        SN40L_8.split("[cost]")[0] + "cost = 5\n",
        SN40L_8.split("[cost]")[0] + "chip_overrides = 5\n",
        SN40L_8.split("[cost]")[0] + "[chip_overrides]\ntiers = 5\n",
        SN40L_8.split("[cost]")[0] + "[chip_overrides]\nbogus = 1\n",
        SN40L_8.split("[cost]")[0] + "[chip_overrides.tiers.hbm]\nbandwidth_bytes_per_s = nan\n",
        SN40L_8 + "\nunknown_key = 1\n",
        _sub(SN40L_8, 'name = "sn40l-8"\n', ""),
        _sub(SN40L_8, 'chip = "', 'chip = "nonexistent-'),
        _sub(SN40L_8, 'kind = "full_mesh"', 'kind = "torus2d"\ntorus_shape = 4'),
        _sub(SN40L_8, 'kind = "full_mesh"', 'kind = "full_mesh"\nlinks_per_pair = 0'),
        _sub(SN40L_8, 'kind = "full_mesh"', 'kind = "full_mesh"\nalgorithms = ["magic"]'),
        SN40L_8 + "\n[[[ malformed",
        "\x00\x01\x02 binary \xff",
        "",
    ]
    for j, text in enumerate(broken):
        _cluster_case(i, "cluster_toml", text, label=f"broken#{j}")
        i += 1
    chip_lines = {
        "bf16 = 638e12": "bf16",
        "capacity_bytes = 68719476736": "capacity_bytes",
        "bandwidth_bytes_per_s = 1.8e12": "bandwidth_bytes_per_s",
    }
    for line, key in chip_lines.items():
        for bad in ("nan", "inf", "-1", "0", '"fast"'):
            _cluster_case(i, "chip_toml", SN40L_8, _sub(SN40L_CHIP, line, f"{key} = {bad}"),
                          label=f"{key}={bad}")
            i += 1
    chips = [
        _sub(SN40L_CHIP, 'kind = "rdu"', 'kind = "tpu"'),
        _sub(SN40L_CHIP, "[tiers.ddr]", "[tiers.l4]"),
        SN40L_CHIP.split("[tiers.sram]")[0] + "tiers = 5\n",
        _sub(SN40L_CHIP, 'execution_model = "dataflow"', 'execution_model = "magic"'),
        SN40L_CHIP + "\nextra = 1\n",
        b"\xff\xfe\x00binary chip",
    ]
    for j, text in enumerate(chips):
        _cluster_case(i, "chip_toml", SN40L_8, text if isinstance(text, str) else "x",
                      label=f"chip#{j}")
        if isinstance(text, bytes):
            CASES[-1].files["chip.toml"] = text
        i += 1


# ---- sweep specs and filters ------------------------------------------------------------------

SPEC = """[sweep]
kind = "{kind}"
{head}
[base]
model = "llama-3.1-8b"
cluster = "sn40l-8"
{base}
[[axes]]
type = "grid"
batch = [1, 2]
{filters}
"""


def _spec(kind="simulate", head="", base="", filters="") -> str:
    return SPEC.format(kind=kind, head=head, base=base, filters=filters)


def _sweep_cases() -> None:
    serve_base = 'rate = 1.0\nrequests = {n}'
    specs = [
        _spec(head="seed = -1"),
        _spec(head='seed = "0"'),
        _spec(head="seed = 1e400"),
        _spec(head="points_per_task = 0"),
        _spec(head='on_infeasible = "ignore"'),
        _spec(head='kind2 = "x"'),
        _spec(kind="bogus"),
        _spec(base="batch = 0"),
        _spec(base="prompt_len = 100000000000"),
        _spec(base="gen_len = -5"),
        _spec(base='tp = "8"'),
        _spec(base="plan = 5"),
        _spec(base="nonexistent_field = 1"),
        _spec(base='weights = "fp3"'),
        _spec(kind="serve", base=serve_base.format(n=10**9)),
        _spec(kind="serve", base=serve_base.format(n=0)),
        _spec(kind="serve", base="rate = nan\nrequests = 4"),
        _spec(kind="serve", base="rate = 1.0\nrequests = 4\nseed = -3"),
        _spec(kind="serve", base="rate = 1.0\nrequests = 4\nburstiness = nan"),
        _spec(kind="serve", base='rate = 1.0\nrequests = 4\nprompt_len = "lognormal:nan:1"'),
        _spec(kind="serve", base='rate = 1.0\nrequests = 4\nfault = "socket:1@1..2"'),
        _spec(kind="serve", base='rate = 1.0\nrequests = 4\nplan = "tp0"'),
        _spec(kind="serve", base="rate = 1.0\nrequests = 4\nkv_fraction = 2.0"),
        _spec().replace("[[axes]]", "[[axes]]\ntype2 = 1"),
        _spec().replace("batch = [1, 2]", "batch = 5"),
        _spec().replace("batch = [1, 2]", "chip.tiers.hbm.bandwidth_bytes_per_s = [1e12, nan]"),
        _spec().replace("batch = [1, 2]", "topology.link_latency_s = [-1.0]"),
        _spec().replace("batch = [1, 2]", "chip.tiers.hbm.capacity_bytes = [inf]"),
        _spec().replace("batch = [1, 2]", "batch = [1, nan]"),
        _spec().replace("batch = [1, 2]", f"batch = [{', '.join(['1'] * 3)}]\ngen_len = "
                        f"[{', '.join(str(i) for i in range(1, 2001))}]\nprompt_len = "
                        f"[{', '.join(str(i) for i in range(1, 1001))}]"),  # 6M > max points
        "[sweep]\nkind = 5\n",
        "[[[ malformed",
        "",
        "sweep = 5\n",
    ]
    for text in specs:
        add("sweep", "sweep_spec", "sweep", "{d}/spec.toml", "--out", "{d}/out",
            files={"spec.toml": text})
    add("sweep", "sweep_spec", "sweep", "{d}/spec.toml", "--out", "{d}/out",
        files={"spec.toml": b"\xff\xfe\x00\x01binary spec"})
    add("sweep", "sweep_spec", "sweep", "{d}/spec.toml", "--out", "{d}/out",
        files={"spec.toml": "DIR"})
    add("sweep", "sweep_spec", "sweep", "{d}/missing.toml", "--out", "{d}/out")
    add("sweep", "sweep_spec", "sweep", "{d}/spec.toml", "--dry-run",
        files={"spec.toml": _spec(head="seed = -1")})
    chain = " + ".join(["batch"] * 20_000) + " > 0"
    filters = [
        "9**9**9**9 > batch",
        "2**2**2**30 > batch",
        "[0] * 10**11 == [batch]",
        "(batch,) * 10**9 == (1,)",
        "model * 10**11 == model",
        "'a' * 10**10 == model",
        chain,
        "(" * 5000 + "batch" + ")" * 5000 + " > 0",
        "batch ** 100000 > 1",
        "10**100 * 10**100 * 10**100 * 10**100 > batch ** 64 ** 2",
        "__import__('os').system('true')",
        "batch.__class__ == 1",
        "(lambda: 1)() == 1",
        "[x for x in range(10**9)] == []",
        "open('/etc/passwd')",
        "batch > 1e999",
        "'" + "x" * 900 + "' == model",
        "batch >",
        "",
        "nonexistent > 1",
        "batch / 0 > 1",
        "min(batch, key=1) > 0",
        "getattr(batch, 'x')",
        "{1: 2} == batch",
        "batch ** (10**6) > 1",
    ]
    for text in filters:
        table = f"[filters]\nkeep = [{json.dumps(text)}]"
        add("sweep", "sweep_filter", "sweep", "{d}/spec.toml", "--out", "{d}/out",
            files={"spec.toml": _spec(filters=table)})
    for flag in (["--max-points", "0"], ["--workers", "0"], ["--points-per-task", "-1"],
                 ["--show", "-1"], ["--backend", "mpi"], ["--bogus"]):
        add("sweep", "cli_value", "sweep", "{d}/spec.toml", "--out", "{d}/out", *flag,
            files={"spec.toml": _spec()})
    add("sweep", "cli_value", "sweep", "{d}/spec.toml", files={"spec.toml": _spec()})


# ---- traces -----------------------------------------------------------------------------------

def _trace_cases() -> None:
    header = "arrival_s,prompt_len,output_len\n"
    traces = [
        header + "0,200000,8\n",  # past llama-3.1-8b's 131072 context
        header + "0,131000,1000\n",  # prompt + output past the context
        header + '0,"abc",8\n',
        header + "0,-5,8\n",
        header + "0,0,8\n",
        header + "nan,100,8\n",
        header + "-1,100,8\n",
        header + "0,1e30,8\n",
        header + "0,100.5,8\n",
        header + "0,100,inf\n",
        header,
        "arrival_s,prompt_len\n0,100\n",
        "x,y,z\n1,2,3\n",
        "",
        b"\xff\xfe\x00binary",
        "DIR",
    ]
    for text in traces:
        add("serve", "trace", "serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8",
            "--trace", "{d}/t.csv", "--out", "{d}/out", files={"t.csv": text})
    add("serve", "trace", "serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8",
        "--trace", "{d}/t.json", "--out", "{d}/out", files={"t.json": "{}"})
    add("serve", "trace", "serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8",
        "--trace", "{d}/t.parquet", "--out", "{d}/out", files={"t.parquet": b"PAR1 broken"})
    add("serve", "trace", "serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8",
        "--trace", "{d}/t.csv", "--requests", "4", "--rate", "1", "--out", "{d}/out",
        files={"t.csv": header + "0,100,8\n"})
    add("serve", "trace", "serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8",
        "--trace", "{d}/t.csv", "--out", "{d}/out",
        files={"t.csv": "arrival_s,prompt_len,output_len\n0,'100',8\n"})


# ---- command-line values, faults and plans -----------------------------------------------------

SIM = ["simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-8"]
PLAN = ["plan", "--model", "mixtral-8x7b", "--cluster", "sn40l-8"]
SERVE = ["serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--requests", "4",
         "--rate", "1", "--out", "{d}/out"]
FOOT = ["footprint", "--cluster", "sn40l-8"]


def _cli_cases() -> None:
    simulate = [
        ["--batch", "0"], ["--batch", "-1"], ["--batch", "1" + "0" * 30], ["--batch", "abc"],
        ["--prompt-len", "1e30"], ["--prompt-len", "0"], ["--gen-len", "-4"],
        ["--prompt-len", "200000"],  # past the model's context
        ["--tp", "0"], ["--tp", "3"], ["--tp", "99999999999"], ["--tp", "8", "--plan", "tp8"],
        ["--weights", "fp3"], ["--kv-dtype", "int1"], ["--objective", "fastest"],
        ["--draft", "llama-3.2-1b", "--spec-k", "1000000000"],
        ["--draft", "llama-3.2-1b", "--spec-k", "100000"],
        ["--draft", "llama-3.2-1b", "--spec-k", "0"],
        ["--draft", "llama-3.2-1b", "--acceptance", "nan"],
        ["--draft", "llama-3.2-1b", "--acceptance", "2"],
        ["--draft", "llama-3.2-1b", "--acceptance", "beta:nan"],
        ["--draft", "llama-3.2-1b", "--acceptance", "beta:0.5:10:-1"],
        ["--draft", "llama-3.2-1b", "--acceptance", "0.9,abc"],
        ["--draft", "llama-3.2-1b", "--tree", "0,1"],
        ["--draft", "llama-3.2-1b", "--tree", "1000000000"],
        ["--draft", "llama-3.2-1b", "--tree", "4,4,4,4,4,4,4,4", "--spec-k", "8"],
        ["--draft", "nonexistent-model"],
        ["--draft", "llama-3.2-1b", "--draft-sockets", "0", "--placement", "separate"],
        ["--coe", "--experts", "1000000000"], ["--coe", "--experts", "0"],
        ["--model", "nonexistent"], ["--cluster", "nonexistent"],
        ["--model", "{d}/missing.json"], ["--cluster", "{d}/missing.toml"],
        ["--unknown-option"], ["--json", "extra-argument"],
    ]
    for extra in simulate:
        add("simulate", "cli_value", *SIM, *extra, label=" ".join(extra))
    add("simulate", "cli_value", "simulate", "--ablate", "--cluster", "dgx-h100")
    plan = [
        ["--routing", "zipf:-1"], ["--routing", "zipf:nan"], ["--routing", "zipf:1e400"],
        ["--routing", "zipf:inf"], ["--routing", "powerlaw"], ["--seed", "-1"],
        ["--seed", "1" + "0" * 30], ["--top", "-1"], ["--objective", "cheapest"],
        ["--context", "0"], ["--context", "1e30"], ["--batch", "0"], ["--weights", "fp3"],
        ["--gen-len", "nan"], ["--kv-dtype", "int1"],
    ]
    for extra in plan:
        add("plan", "cli_value", *PLAN, *extra, label=" ".join(extra))
    serve = [
        ["--seed", "-1"], ["--rate", "nan"], ["--rate", "-1"], ["--rate", "0"],
        ["--requests", "0"], ["--requests", "1000000000"], ["--prompt-len", "lognormal:nan:1"],
        ["--prompt-len", "uniform:5:1"], ["--prompt-len", "1e30"],
        ["--prompt-len", "lognormal:100:1e9"], ["--output-len", "abc"],
        ["--prompt-len", "200000"],  # past the model's context
        ["--max-batch", "0"], ["--token-budget", "-1"], ["--kv-fraction", "nan"],
        ["--kv-fraction", "2"], ["--burstiness", "nan"], ["--burstiness", "-1"],
        ["--coe-experts", "1000000000"], ["--coe-experts", "0"],
        ["--coe-distribution", "zipf:-1"], ["--coe-hbm-slots", "0"],
        ["--draft", "llama-3.2-1b", "--spec-k", "1000000000"],
        ["--spec-k", "4"], ["--scheduler", "fifo"], ["--backend", "mpi"],
        ["--address", "auto"], ["--arrival", "random"], ["--preemption", "kill"],
        ["--goodput", "tpot:nan"], ["--goodput", "tpot:inf"], ["--goodput", "ttfb:5"],
        ["--goodput", "tpot:-1"], ["--metric-percentiles", "nan"],
        ["--metric-percentiles", "50,100.5"], ["--metric-percentiles", "-1"],
    ]
    for extra in serve:
        add("serve", "cli_value", *SERVE, *extra, label=" ".join(extra))
    add("serve", "cli_value", "serve", "--model", "llama-3.1-8b", "--out", "{d}/out")
    footprint = [
        ["--experts", "0"], ["--experts", "1000000000"], ["--experts", "abc"],
        ["--experts", "10", "--latency-target", "nan"],
        ["--experts", "10", "--latency-target", "-1"],
        ["--experts", "10", "--latency-target", "inf"],
        ["--experts", "10", "--batch", "0"], ["--experts", "10", "--prompt-len", "1e30"],
        ["--experts", "10", "--expert-model", "nonexistent"],
        ["--experts", "10", "--router", "{d}/missing.json"],
        ["--experts", "10", "--cluster", "nonexistent"], [],
    ]
    for extra in footprint:
        add("footprint", "cli_value", *FOOT, *extra)
    for flag in ("--router", "--expert-model"):
        for text in (b"\xff\xfe\x00binary", "DIR", "[]", "{ not json"):
            add("footprint", "config_file", *FOOT, "--experts", "4", flag, "{d}/config.json",
                files={"config.json": text}, label=f"{flag} {text!r:.12}")
    for extra in (["--latency-target", "1e400"], ["--gen-len", "0"], ["--batch", "abc"],
                  ["--json", "extra"]):
        add("footprint", "cli_value", *FOOT, "--experts", "4", *extra)
    for extra in (["--json", "extra"], ["--bogus"], ["--no-loo=1"], ["--jobs", "0"],
                  ["--jobs", "two"]):
        add("validate", "cli_value", "validate", *extra)
    for command in ("models", "clusters"):
        for extra in (["--json=yes"], ["extra"], ["--bogus"], ["--json", "--json2"],
                      ["--help=1"]):
            add(command, "cli_value", command, *extra)
    for extra in (["--bogus"], ["--debug=1"], ["nonexistent-command"]):
        add("models", "cli_value", *extra)
    faults = ["socket:1@1..2", "socket:99@1", "socket:1@-1", "socket:1@nan", "socket:1@inf",
              "link:1-1@1", "link:0-1@1:degraded:2", "link:0-1@1:degraded:nan", "socket:x@1",
              "garbage", "socket:1@1e400", "socket:1@1:degraded:0", "link:0-99@1",
              "socket:-1@1"]
    for text in faults:
        add("serve", "fault", *SERVE, "--fault", text)
    for text in faults[:6]:
        add("sweep", "fault", "sweep", "{d}/spec.toml", "--out", "{d}/out", files={
            "spec.toml": _spec(kind="serve", base=f'rate = 1.0\nrequests = 4\nfault = "{text}"')})
    plans = ["tp16@mamba2=0", "tp0", "tp3", "tp" + "9" * 30, "pp0", "tp", "xyz",
             "tp8@bogus=2", "tp8@mamba2=999999999", "ep3", "tp16", "tp2tp2", "tp-1",
             "tp8@full_attention=x"]
    for i, text in enumerate(plans):
        command = ("simulate", "serve")[i % 2]
        args = SIM if command == "simulate" else SERVE
        add(command, "plan", *args, "--plan", text)
    for text in plans[:6]:
        add("sweep", "plan", "sweep", "{d}/spec.toml", "--out", "{d}/out", files={
            "spec.toml": _spec(kind="serve", base=f'rate = 1.0\nrequests = 4\nplan = "{text}"')})
    add("simulate", "plan", "simulate", "--model", "nemotron-h-56b", "--cluster", "sn40l-16",
        "--plan", "tp16@mamba2=0")


# ---- output paths -----------------------------------------------------------------------------

def _output_cases() -> None:
    for out in ("{d}/folder", "/proc/x.parquet", "{d}/missing/x.parquet", "{d}/x.txt",
                "{d}/afile/x.parquet", "/proc/self/x.arrow", "/"):
        add("simulate", "output_path", *SIM, "--out", out,
            files={"folder": "DIR", "afile": "text"})
    for out in ("{d}/afile", "/proc/x", "{d}/afile/sub", "{d}/full", "/proc/self/fd/x"):
        add("serve", "output_path", *SERVE[:-1], out,
            files={"afile": "text", "full": "DIR", "full/notes.txt": "mine"})
    for out in ("{d}/afile", "/proc/x", "{d}/afile/sub", "{d}/full"):
        add("sweep", "output_path", "sweep", "{d}/spec.toml", "--out", out,
            files={"spec.toml": _spec(), "afile": "text", "full": "DIR",
                   "full/notes.txt": "mine"})
    for extra in (["--out", "{d}/folder"], ["--out", "/proc/x.html"], ["--out", "{d}/r.txt"],
                  ["--out", "{d}/missing/r.html"], ["--out", "{d}/r.html", "--png-dir",
                                                    "{d}/afile"]):
        add("report", "output_path", "report", "{d}/ds", *extra,
            files={"folder": "DIR", "afile": "text"}, dataset=True)


# ---- corrupt state: resume and report ----------------------------------------------------------

def _corrupt_cases() -> None:
    damage = {
        "sweep.json": ["[1, 2]", '{"format": ', "", b"\xff\xfe"],
        "manifest/*.json": ["[]", '{"chunk": ', '{"points": 5}', b"\x00\x01",
                             ('{"chunk": "x", "points": [], "files": [], "rows": "2", '
                             '"reasons": [], "infeasible": {}}')],
    }
    for target, contents in damage.items():
        for text in contents:
            for command in ("sweep", "report"):
                args = (["sweep", "{d}/spec.toml", "--out", "{d}/ds"] if command == "sweep"
                        else ["report", "{d}/ds", "--out", "{d}/r.html"])
                add(command, "corrupt_state", *args, files={f"ds.sweep/{target}": text},
                    dataset=True)
    for text in (b"PAR1\x00truncated", b""):
        add("report", "corrupt_state", "report", "{d}/ds", "--out", "{d}/r.html",
            files={"ds/cluster=sn40l-8/model=llama-3.1-8b/part-*.parquet": text}, dataset=True)
    add("report", "corrupt_state", "report", "{d}/nowhere", "--out", "{d}/r.html")
    add("report", "corrupt_state", "report", "{d}/afile", "--out", "{d}/r.html",
        files={"afile": "text"})
    add("report", "corrupt_state", "report", "{d}/plain", "--out", "{d}/r.html",
        files={"plain": "DIR", "plain/x.parquet": b"PAR1"})


# ---- validate --cases -------------------------------------------------------------------------

CASE = """[[row]]
id = "x"
source = "s"
tier = "primary"
role = "check"
claim = "c"
metric = "weight_gib"
model = "llama-3.1-8b"
cluster = "dgx-h100"
tp = 1
kind = "value"
value = 14.9
rtol = 0.02
"""


def _case_files() -> list:
    return [
        b"\xff\xfe\x00binary", "[[[", "", "row = 5", "[[row]]\n", "[[case]]\nid = 'x'\n",
        CASE.replace('role = "check"', 'role = "judge"'),
        CASE.replace('metric = "weight_gib"', 'metric = "magic"'),
        CASE.replace("value = 14.9", "value = nan"),
        CASE.replace("value = 14.9", 'value = "14.9"'),
        CASE.replace("tp = 1", "tp = -1"), CASE.replace("tp = 1", "tp = 10000000000"),
        CASE.replace('kind = "value"', 'kind = "vibes"'),
        CASE.replace('model = "llama-3.1-8b"', 'model = "nonexistent"'),
        CASE.replace('cluster = "dgx-h100"', 'cluster = "nonexistent"'),
        CASE.replace("rtol = 0.02", "rtol = inf"), CASE.replace("rtol = 0.02\n", ""),
        CASE.replace('kind = "value"', 'kind = "range"'),
        CASE.replace('id = "x"', "id = 5"), "DIR",
    ]


def _validate_cases() -> None:
    for text in _case_files():
        add("validate", "cases_file", "validate", "--cases", "{d}/cases.toml",
            files={"cases.toml": text})
    add("validate", "cases_file", "validate", "--cases", "{d}/missing.toml")


# ---- sensitivity ------------------------------------------------------------------------------

SENS = ["sensitivity", "--model", "llama-3.1-8b"]


def _sensitivity_cases() -> None:
    for extra in (["--cluster", "no-such"], ["--model", "no-such"], ["--batch", "0"],
                  ["--plan", "tp3"], ["--plan", "tp32"], ["--plot", "{d}/t.png"],
                  ["--plot", "{d}/missing/t.html"], ["--set", "chip.tiers.sram.capacity_bytes=-1"],
                  ["--set", "chip.execution.pmus=0.5"], ["--prompt-len", "1000000000"],
                  ["--calibration", "no-such"], ["--weights", "fp7"], ["--kv-dtype", "x"],
                  ["--stack", "vllm"], ["--cluster", "dgx-h100", "--stack", "no-such"]):
        add("sensitivity", "cli_value", *SENS, *extra, label=" ".join(extra))


# ---- capacity ---------------------------------------------------------------------------------

CAP = ["capacity", "--model", "llama-3.1-8b", "--cluster", "sn40l-8"]


def _capacity_cases() -> None:
    traffic = ["--rate", "1", "--slo", "tpot:50"]
    values = [
        ["--slo", "tpot:nan"], ["--slo", "tpot:-1"], ["--slo", "tpot:0"], ["--slo", "tpot:inf"],
        ["--slo", "tpot:1e400"], ["--slo", "ttft:abc"], ["--slo", "e2e:5"], ["--slo", "tpot"],
        ["--slo", ""], ["--slo", "tpot:50", "--slo-percentile", "nan"],
        ["--slo", "tpot:50", "--slo-percentile", "0"],
        ["--slo", "tpot:50", "--slo-percentile", "100"],
        ["--slo", "tpot:50", "--slo-percentile", "-1"],
    ]
    for extra in values:
        add("capacity", "slo", *CAP, "--rate", "1", *extra, label=" ".join(extra))
    add("capacity", "slo", *CAP, "--rate", "1", label="no --slo")
    cli = [
        ["--rate", "nan"], ["--rate", "-1"], ["--rate", "0"], ["--rate", "inf"],
        ["--concurrency", "0"], ["--concurrency", "-3"], ["--concurrency", "1" + "0" * 12],
        ["--concurrency", "4", "--rate", "1"], [],
    ]
    for extra in cli:
        add("capacity", "cli_value", *CAP, "--slo", "tpot:50", *extra, label=" ".join(extra))
    options = [
        ["--max-nodes", "0"], ["--max-nodes", "1000000000"], ["--shortlist", "0"],
        ["--shortlist", "1000000000"], ["--requests", "0"], ["--requests", "1000000000"],
        ["--weights", "fp3"], ["--plan", "tp0"], ["--plan", "tp3"], ["--plan", "xyz"],
        ["--plan", "tp" + "9" * 30], ["--pair", "sn40l-8:"], ["--pair", "sn40l-8:nonexistent"],
        ["--fabric", "nonexistent"], ["--seed", "-1"], ["--prefix-cache", "bogus"],
        ["--speculative", "on"], ["--draft", "nonexistent-model"],
        ["--draft", "llama-3.2-1b", "--spec-k", "0"],
        ["--draft", "llama-3.2-1b", "--acceptance", "nan"],
        ["--draft", "llama-3.2-1b", "--speculative", "off"],
        ["--draft", "llama-3.2-1b", "--placement", "separate"],
        ["--spec-k", "4"], ["--prompt-len", "lognormal:nan:1"], ["--prompt-len", "1e30"],
        ["--prompt-len", "uniform:5:1"], ["--prompt-len", "200000"], ["--output-len", "abc"],
        ["--sessions", "0", "--turns", "2"], ["--sessions", "2"],
        ["--sessions", "2", "--turns", "2", "--think-time", "nan"],
        ["--sessions", "2", "--turns", "2", "--think-time", "-1"],
        ["--backend", "mpi"], ["--cluster", "nonexistent"], ["--cluster", "{d}/missing.toml"],
        ["--model", "nonexistent"], ["--bogus"],
    ]
    for extra in options:
        add("capacity", "cli_value", *CAP, *traffic, *extra, label=" ".join(extra))
    header = "arrival_s,prompt_len,output_len\n"
    traces = [header + "0,200000,8\n1,100,8\n", header + "0,100,8\nnan,100,8\n",
              header + "0,-5,8\n1,100,8\n", header + "0,100,8\n",  # one arrival: no rate
              header, "", b"\xff\xfe\x00binary", "DIR", "x,y,z\n1,2,3\n"]
    for text in traces:
        add("capacity", "trace", *CAP, "--slo", "tpot:50", "--trace", "{d}/t.csv",
            files={"t.csv": text})
    add("capacity", "trace", *CAP, "--slo", "tpot:50", "--trace", "{d}/t.csv",
        "--concurrency", "2", files={"t.csv": header + "0,100,8\n1,100,8\n"})
    fabric = (ROOT / "cluster_configs" / "fabrics" / "ib-ndr.toml").read_text()
    fabrics = [b"\xff\xfe\x00binary", "", "[[[", "DIR",
               *(_sub(fabric, "latency_s = 2e-6", f"latency_s = {bad}")
                 for bad in ("nan", "inf", "-1.0", '"2us"', "[1]")),
               *(_sub(fabric, "bandwidth_bytes_per_s = 50e9", f"bandwidth_bytes_per_s = {bad}")
                 for bad in ("nan", "inf", "0", "1e400")),
               _sub(fabric, 'name = "ib-ndr"\n', ""), fabric + "\nextra = 1\n"]
    for i, text in enumerate(fabrics):
        command = ("capacity", "serve")[i % 2]
        args = ([*CAP, *traffic, "--pair", "sn40l-8:dgx-h100"] if command == "capacity"
                else ["serve", "--model", "llama-3.1-8b", "--requests", "4", "--rate", "1",
                      "--out", "{d}/out", "--prefill-pool", "sn40l-8:tp8:1", "--decode-pool",
                      "sn40l-8:tp8:1"])
        add(command, "fabric_toml", *args, "--fabric", "{d}/f.toml", files={"f.toml": text},
            label=f"fabric#{i}")
    add("capacity", "fabric_toml", *CAP, *traffic, "--fabric", "nonexistent")
    for out in ("{d}/x.png", "{d}/folder", "/proc/x.html", "{d}/missing/x.html",
                "{d}/afile/x.html", "{d}/folder.html"):
        add("capacity", "output_path", *CAP, *traffic, "--plot", out,
            files={"folder": "DIR", "folder.html": "DIR", "afile": "text"})


# ---- calibrate and every --calibration --------------------------------------------------------

PROFILE = """name = "p"
[[parameter]]
chips = ["sn40l"]
key = "collective_latency_s"
value = 3e-06
"""


def _profiles() -> list:
    return [
        b"\xff\xfe\x00binary", "[[[", "parameter = 5", "[parameter]\nx = 1\n",
        "parameter = [5]", "[[parameter]]\nkey = 'collective_latency_s'\nvalue = 1e-6\n",
        PROFILE.replace("value = 3e-06", "value = nan"),
        PROFILE.replace("value = 3e-06", "value = inf"),
        PROFILE.replace("value = 3e-06", "value = -1.0"),
        PROFILE.replace("value = 3e-06", 'value = "3e-6"'),
        PROFILE.replace("value = 3e-06\n", ""),
        PROFILE.replace('chips = ["sn40l"]', 'chips = "sn40l"'),
        PROFILE.replace('chips = ["sn40l"]', "chips = [5]"),
        PROFILE.replace('chips = ["sn40l"]', 'chips = ["nonexistent-chip"]'),
        PROFILE.replace('key = "collective_latency_s"', 'key = "bogus_key"'),
        PROFILE.replace('key = "collective_latency_s"', "key = 5"),
        PROFILE.replace('name = "p"', "name = 5"), "DIR",
    ]


# A command that loads a cluster (and so applies the profile), with --calibration REF appended.
CALIBRATED = {
    "simulate": SIM, "plan": PLAN, "serve": SERVE, "footprint": [*FOOT, "--experts", "2"],
    "validate": ["validate", "--no-loo"],
    "capacity": [*CAP, "--rate", "1", "--slo", "tpot:50"],
}


def _calibration_cases() -> None:
    commands = list(CALIBRATED)
    for i, text in enumerate(_profiles()):
        command = commands[i % len(commands)]
        add(command, "calibration", *CALIBRATED[command], "--calibration", "{d}/p.toml",
            files={"p.toml": text}, label=f"profile#{i}")
    for i, ref in enumerate(("nonexistent", "{d}/missing.toml", "../../etc/passwd", "",
                             "{d}/afile")):
        command = commands[i % len(commands)]
        add(command, "calibration", *CALIBRATED[command], "--calibration", ref,
            files={"afile": "text"}, label=f"ref {ref}")
    for i, text in enumerate(_profiles()[:6]):  # a sweep's calibration field
        add("sweep", "calibration", "sweep", "{d}/spec.toml", "--out", "{d}/out",
            files={"p.toml": text, "spec.toml": _spec(base='calibration = "{d}/p.toml"')},
            label=f"profile#{i}")
    for kind in ("simulate", "serve"):
        base = 'calibration = "nonexistent"' + ("\nrate = 1.0\nrequests = 4" * (kind == "serve"))
        add("sweep", "calibration", "sweep", "{d}/spec.toml", "--out", "{d}/out",
            files={"spec.toml": _spec(kind=kind, base=base)}, label=f"{kind} nonexistent")
    for ref in ("nonexistent", "{d}/p.toml"):  # accepted and ignored, but checked
        add("calibrate", "calibration", "calibrate", "--out", "{d}/x.toml", "--calibration",
            ref, files={"p.toml": b"\xff\xfe"}, label=f"ref {ref}")
    out = ["--out", "{d}/x.toml"]
    cli = [
        ["--chip", "nonexistent", *out], ["--chip", "", *out],
        ["--name", "", "--out", "{d}/x.toml"], ["--name", "a b\nc", *out],
        ["--out", "{d}/folder"], ["--out", "/proc/x.toml"], ["--out", "{d}/missing/x.toml"],
        ["--out", "{d}/afile/x.toml"], ["--out", "/"], ["--out", "{d}/x.txt"],
        ["--name", "../../../x"], ["--name", "bad/name"], ["--bogus"],
        ["--cases", "{d}/missing.toml", *out],
        ["--jobs", "0", *out], ["--jobs", "two", *out], ["--resamples", "1", *out],
    ]
    for extra in cli:
        add("calibrate", "cli_value", "calibrate", *extra,
            files={"folder": "DIR", "afile": "text"}, label=" ".join(extra))
    for i, text in enumerate(_case_files()):
        add("calibrate", "cases_file", "calibrate", "--out", "{d}/x.toml", "--cases",
            "{d}/cases.toml", files={"cases.toml": text}, label=f"cases#{i}")


_hf_cases()
_config_file_cases()
_cluster_cases()
_sweep_cases()
_trace_cases()
_cli_cases()
_output_cases()
_corrupt_cases()
_validate_cases()
_sensitivity_cases()
_capacity_cases()
_calibration_cases()


def counts() -> dict[tuple[str, str], int]:
    return dict(sorted(collections.Counter((c.command, c.kind) for c in CASES).items()))


def format_counts() -> str:
    by_command = collections.Counter(c.command for c in CASES)
    by_kind = collections.Counter(c.kind for c in CASES)
    lines = [f"{len(CASES)} hostile-input cases"]
    lines.append("by command: " + ", ".join(f"{k} {v}" for k, v in sorted(by_command.items())))
    lines.append("by input kind: " + ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())))
    lines += [f"  {cmd:<10} {kind:<14} {n}" for (cmd, kind), n in counts().items()]
    return "\n".join(lines)


# ---- a second campaign (stop 26): cases a fresh hostile run found past the first table ---------

def _requests_table_of_other_columns() -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"batch": [1, 2], "tokens_per_s": [1.0, 2.0]}), buf)
    return buf.getvalue()


def _second_campaign_cases() -> None:
    llama = {k: v for k, v in catalog.model_config("llama-3.2-1b").items() if k != "_rdu"}
    tiny = ["--requests", "4", "--prompt-len", "64", "--output-len", "8"]
    small = ["serve", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", *tiny, "--out",
             "{d}/out"]
    # files that never end: reading them must not hang (FIFO: a reader waits for a writer)
    add("simulate", "config_file", "simulate", "--model", "{d}/fifo.json", "--cluster",
        "sn40l-8", files={"fifo.json": "FIFO"})
    add("simulate", "config_file", "simulate", "--model", "{d}/m", "--cluster", "sn40l-8",
        files={"m": "DIR", "m/config.json": "FIFO"})
    add("simulate", "config_file", "simulate", "--model", "/dev/zero", "--cluster", "sn40l-8")
    add("validate", "cases_file", "validate", "--no-loo", "--cases", "{d}/f", files={"f": "FIFO"})
    add("validate", "cases_file", "validate", "--no-loo", "--cases", "{d}/c.toml",
        files={"c.toml": CASE.replace("value = 14.9", "value = 0")})  # errors are relative
    # past the stated bounds: sockets, plan digits, seconds, a round's digits
    add("plan", "cli_value", "plan", "--model", "llama-3.1-405b", "--cluster", "dgx-h100",
        "--sockets", "65536", "--top", "1")
    add("plan", "cli_value", *PLAN, "--top", "0")
    add("serve", "cli_value", *small, "--rate", "1", "--replicas", "65536", "--plan", "tp1")
    add("serve", "cli_value", "serve", "--model", "llama-3.2-1b", *tiny, "--out", "{d}/out",
        "--rate", "1", "--prefill-pool", "sn40l-8:tp8:1000000000", "--decode-pool",
        "sn40l-8:tp8:1")
    add("simulate", "plan", *SIM, "--plan", "tp" + "1" * 5000)
    for extra in (["--rate", "1e-300"], ["--concurrency", "2", "--ramp-up", "nan"],
                  ["--concurrency", "2", "--ramp-up", "1e300"],
                  ["--rate", "1", "--timeline", "{d}/out"],
                  ["--rate", "1", "--timeline", "{d}/out/t.json"]):
        add("serve", "cli_value", *small, *extra)
    for think in ("1e300", "uniform:0:1e300"):
        add("serve", "cli_value", *small[:5], "--out", "{d}/out", "--sessions", "2", "--turns",
            "2", "--think-time", think)
    add("capacity", "cli_value", *CAP, "--prompt-len", "64", "--output-len", "8", "--rate",
        "1e-300", "--requests", "4", "--slo", "tpot:50")
    add("sweep", "sweep_filter", "sweep", "{d}/spec.toml", "--out", "{d}/o",
        files={"spec.toml": _spec(filters='[filters]\nkeep = ["round(batch, -10**9) == 0"]')})
    # hardware figures past a finite machine, and fields that were ignored
    for setting in ("topology.torus_shape=[3,3]", "chip.name=", "chip.peak_flops.fp4=1e15",
                    "chip.tiers.hbm.bandwidth_bytes_per_s=1000",
                    "chip.execution.op_latency_s=1e300"):
        add("simulate", "cluster_toml", *SIM, "--set", setting)
    for stack in ("", "bogus"):
        add("simulate", "cli_value", *SIM, "--stack", stack)
    add("serve", "hf_config", "serve", "--model", "{d}/config.json", *small[3:], "--rate", "1",
        files={"config.json": dict(llama, rope_scaling="x")}, label="rope_scaling string")
    # traces a parser would choke on
    replay = ["serve", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--out", "{d}/out"]
    add("serve", "trace", *replay, "--trace", "{d}/t.csv",
        files={"t.csv": "arrival_s,prompt_len,output_len,arrival_s\n0,64,8,1\n"})
    add("serve", "trace", *replay, "--trace", "{d}/t.jsonl",
        files={"t.jsonl": "[" * 100000 + "]" * 100000 + "\n"})
    # state: a folder where a part file belongs (resume must not drop its manifest first); a
    # report into the dataset; a serve folder whose requests table is another table
    add("sweep", "corrupt_state", "sweep", "{d}/spec.toml", "--out", "{d}/ds",
        files={"ds/cluster=sn40l-8/model=llama-3.1-8b/part-*.parquet": "DIR"}, dataset=True)
    add("report", "output_path", "report", "{d}/ds", "--out", "{d}/ds/r.html", dataset=True)
    part = "ds/cluster=sn40l-8/model=llama-3.1-8b/part-*.parquet"
    add("sweep", "corrupt_state", "sweep", "{d}/spec.toml", "--out", "{d}/ds",
        files={part: "FIFO"}, dataset=True, label="a FIFO for a part file")
    add("report", "corrupt_state", "report", "{d}/ds", "--out", "{d}/r.html",
        files={part: "FIFO"}, dataset=True, label="a FIFO for a part file")
    # an existing device, FIFO or socket is not replaced by a result; names leave room for the
    # temporaries beside them
    add("simulate", "output_path", *SIM, "--out", "{d}/f.parquet", files={"f.parquet": "FIFO"})
    add("serve", "output_path", *small, "--rate", "1", "--timeline", "{d}/t.json",
        files={"t.json": "FIFO"})
    add("serve", "output_path", *small[:-1], "{d}/" + "a" * 240, "--rate", "1")
    add("sweep", "output_path", "sweep", "{d}/spec.toml", "--out", "{d}/" + "b" * 210,
        files={"spec.toml": _spec()})
    for target, text in (("ds.sweep/manifest", "a file"), ("ds/notes.txt", "mine")):
        add("sweep", "corrupt_state", "sweep", "{d}/spec.toml", "--out", "{d}/ds",
            files={target: text}, dataset=True, label=f"{target} is a stray file")
    add("report", "corrupt_state", "report", "{d}/srv", "--out", "{d}/r.html",
        files={"srv": "DIR", "srv/requests.parquet": _requests_table_of_other_columns()})
    add("simulate", "output_path", "simulate", "--model", "a" * 300, "--cluster", "sn40l-8")
    for out in ("", "{d}/x.arrow/"):  # a name that names nothing, or a folder
        add("simulate", "output_path", *SIM, "--out", out)
    # empty values that name nothing: a bound, a percentile, a tree, an exponent
    for extra in (["--goodput", ""], ["--metric-percentiles", ""],
                  ["--draft", "llama-3.2-1b", "--tree", ""]):
        add("serve", "cli_value", *small, "--rate", "1", *extra)
    add("plan", "cli_value", *PLAN, "--routing", "zipf:")
    # a row field no one reads, an id twice; a profile value never fitted, a parameter twice
    add("validate", "cases_file", "validate", "--no-loo", "--cases", "{d}/c.toml",
        files={"c.toml": CASE + "bogus = 1\n"})
    add("validate", "cases_file", "validate", "--no-loo", "--cases", "{d}/c.toml",
        files={"c.toml": CASE + "\n" + CASE})
    for text in (PROFILE.replace("value = 3e-06", "value = 0.0"), PROFILE + "\n" +
                 PROFILE[PROFILE.index("[[parameter]]"):]):
        add("simulate", "calibration", *SIM, "--calibration", "{d}/p.toml",
            files={"p.toml": text})
    for fault in ("socket:3@1:degraded:1e-300", "socket:3@1:degraded:5e-324", "socket:3@1e300"):
        add("serve", "fault", *small, "--rate", "20", "--fault", fault)
    # options of a mode not run, refused rather than ignored (serve refuses the same)
    for extra in (["--acceptance", "0.9"], ["--tree", "4,2"], ["--draft-sockets", "4"],
                  ["--experts", "5"], ["--coe", "--draft", "llama-3.2-1b"],
                  ["--ablate", "--draft", "llama-3.2-1b"]):
        add("simulate", "cli_value", *SIM, *extra)
    for flag in ("--expert-model", "--router"):  # the default request past its context
        add("footprint", "hf_config", *FOOT, "--experts", "2", flag, "{d}/short.json",
            files={"short.json": dict(llama, max_position_embeddings=100)})
    # a sweep's base values past the command line's bounds: refused, not rows of failures
    for bad in ("burstiness = 1e300", "rate = 1e-300"):
        base = 'rate = 1.0\nrequests = 3\narrival = "bursty"\n' + bad
        add("sweep", "sweep_spec", "sweep", "{d}/spec.toml", "--out", "{d}/o",
            files={"spec.toml": _spec(kind="serve", base=base).replace(
                "rate = 1.0\n" if bad.startswith("rate") else "\0", "", 1)})


_second_campaign_cases()


def _third_campaign_cases() -> None:
    """Issue 36's root causes: each a one-line refusal before any work."""
    small = ["serve", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--requests", "4",
             "--prompt-len", "64", "--output-len", "8", "--rate", "1", "--out", "{d}/out"]
    # a node of 2,048 sockets: a full mesh past 64 sockets; a plan search past 128 a node
    node = ["--set", "sockets_per_node=2048", "--sockets", "2048"]
    add("simulate", "cluster_toml", *SIM, *node)
    add("plan", "cluster_toml", *PLAN, *node, "--set", "topology.kind=switch")
    add("simulate", "cluster_toml", *SIM, *node, "--set", "topology.kind=switch",
        label="plan search over a switched 2048-socket node")
    # finite figures no machine has (config.PLAUSIBLE)
    for setting in ("chip.peak_flops.bf16=1e308", "chip.tiers.hbm.bandwidth_bytes_per_s=1e300",
                    "chip.tiers.hbm.capacity_bytes=1e300", "chip.tiers.ddr.capacity_bytes=1e17"):
        add("simulate", "cluster_toml", *SIM, "--set", setting)
    add("serve", "cluster_toml", *small, "--set", "chip.peak_flops.bf16=1e308")
    # an integer field given as a float, in the file and on the command line
    sn40l8 = (CLUSTERS / "sn40l-8.toml").read_text()
    for old, new in (("sockets = 8\n", "sockets = 8.0\n"),
                     ("sockets_per_node = 8\n", "sockets_per_node = 8.0\n")):
        add("simulate", "cluster_toml", "simulate", "--model", "llama-3.1-8b", "--cluster",
            "{d}/c.toml", files={"c.toml": _sub(sn40l8, old, new)}, label=new.strip())
    add("simulate", "cluster_toml", *SIM, "--set", "sockets=8.0")
    # config.json fields checked across fields
    ds2 = {k: v for k, v in catalog.model_config("deepseek-v2").items() if k != "_rdu"}
    ds3 = {k: v for k, v in catalog.model_config("deepseek-v3").items() if k != "_rdu"}
    llama = {k: v for k, v in catalog.model_config("llama-3.1-8b").items() if k != "_rdu"}
    for cfg, label in (
            (dict(ds2, topk_group=ds2["n_group"] + 5), "topk_group > n_group"),
            (dict(ds2, n_group=7), "n_group not dividing the experts"),
            (dict(ds3, quantization_config=dict(ds3["quantization_config"],
                                                weight_block_size=[0, 0])),
             "fp8 weight_block_size [0, 0]"),
            (dict(llama, quantization_config={"quant_method": "mxfp4"}), "mxfp4 on a dense model")):
        add("simulate", "hf_config", "simulate", "--model", "{d}/config.json", "--cluster",
            "sn40l-16", files={"config.json": cfg}, label=label)
    # a prefix-cache block finer than the KV block (the cache's work is per block)
    add("serve", "cli_value", *small[:-2], "--sessions", "2", "--turns", "2", "--out",
        "{d}/out", "--prefix-block", "1")
    # a plan refused before Ray starts; a draft's sockets past the cluster
    add("serve", "plan", *small, "--backend", "ray", "--plan", "tp3")
    add("serve", "cli_value", *small, "--draft", "llama-3.2-1b", "--draft-placement",
        "separate", "--draft-sockets", "9", "--plan", "tp4")


_third_campaign_cases()


# ---- running a case ---------------------------------------------------------------------------

class _Hang(BaseException):
    """Raised by the alarm: not an Exception, so the CLI's last-resort handler cannot catch it."""


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    """A finished two-point simulate sweep, copied into the cases that damage one."""
    root = tmp_path_factory.mktemp("hostile-ds")
    (root / "spec.toml").write_text(_spec())
    r = CliRunner().invoke(main, ["sweep", str(root / "spec.toml"), "--out", str(root / "ds"),
                                  "--no-progress"])
    assert r.exit_code == 0, r.output + r.stderr
    return root


def _materialize(case: Case, d: Path, dataset_root: Path | None) -> None:
    if case.dataset:
        shutil.copytree(dataset_root / "ds", d / "ds")
        shutil.copytree(dataset_root / "ds.sweep", d / "ds.sweep")
        shutil.copy(dataset_root / "spec.toml", d / "spec.toml")
    for name, content in case.files.items():
        if "*" in name:  # damage an existing file of the dataset
            matches = sorted(d.glob(name))
            assert matches, name
            path = matches[0]
        else:
            path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "DIR":
            if path.is_file():  # a folder where the dataset's file was
                path.unlink()
            path.mkdir(exist_ok=True)
            continue
        if content == "FIFO":  # a file that never ends (in place of the dataset's, if named so)
            if path.is_file():
                path.unlink()
            os.mkfifo(path)
            continue
        if path.is_dir():  # a file where the dataset's folder was
            shutil.rmtree(path)
        if isinstance(content, dict):
            content = json.dumps(content)
        if isinstance(content, str):
            content = content.replace("{d}", str(d))
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


def _snapshot(d: Path) -> dict[str, tuple]:
    out = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        out[p.relative_to(d).as_posix()] = (p.is_dir(), st.st_size, st.st_mtime_ns)
    return out


def _alarm(signum, frame):
    raise _Hang


class _CaseFolders:
    """An empty folder `N/case` for each case, alone in its parent, numbered under one module
    folder (pytest's tmp_path scans its base folder for the next number and moves a symlink
    each time, ~10 ms a case over 1,700 cases sharing one name prefix). A case that passed and
    left no folder hands its own on, emptied of the files it was given: removing a folder is
    the dear step on some disks (an rmdir took ~3 ms on the 2-core development VM, ext4 mounted
    with discard: the cases' 3,550 folders cost ~12 s of wall time in a later session's clean-up
    of old base folders), a file's unlinking is not (~25 us there)."""

    def __init__(self, root: Path) -> None:
        self.root, self.numbers, self.spare = root, itertools.count(), None

    def take(self) -> Path:
        d, self.spare = self.spare, None
        if d is None:
            d = self.root / str(next(self.numbers)) / "case"
            d.mkdir(parents=True)
        return d

    def hand_on(self, d: Path) -> None:
        entries = list(d.iterdir())
        if any(p.is_dir() and not p.is_symlink() for p in entries):
            return  # a case given a folder (a dataset): a fresh folder for the next one
        for p in entries:
            p.unlink()
        self.spare = d


@pytest.fixture(scope="module")
def case_folders(tmp_path_factory):
    return _CaseFolders(tmp_path_factory.mktemp("hostile-cases"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_refused_in_one_line(case, case_folders, monkeypatch, request):
    dataset_root = request.getfixturevalue("small_dataset") if case.dataset else None
    d = case_folders.take()
    assert not any(d.iterdir()) and [p.name for p in d.parent.iterdir()] == ["case"]
    _materialize(case, d, dataset_root)
    monkeypatch.chdir(d)  # a stray write into the working folder shows in the snapshot
    before = _snapshot(d)
    args = [a.replace("{d}", str(d)) for a in case.args]
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    try:
        r = CliRunner().invoke(main, args, catch_exceptions=False)
    except _Hang:
        pytest.fail(f"no answer within {LIMIT_S} s: {args}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    err = r.stderr
    assert r.exit_code == 2, f"exit {r.exit_code}: {err.strip()[-500:]} {r.output[-300:]}"
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err + r.output and "internal error" not in err
    after = _snapshot(d)
    assert after == before, f"written: {sorted(set(after) ^ set(before))[:5]}"
    leftovers = [p for p in d.parent.iterdir() if p.name != "case"]
    assert not leftovers, leftovers
    case_folders.hand_on(d)


def test_the_table_covers_every_command_and_kind():
    by_command = collections.Counter(c.command for c in CASES)
    assert set(by_command) == set(main.commands), set(main.commands) - set(by_command)
    assert len(CASES) >= 300
    kinds = {c.kind for c in CASES}
    assert {"hf_config", "model_shape", "config_file", "cluster_toml", "chip_toml",
            "sweep_spec", "sweep_filter", "trace", "cli_value", "fault", "plan", "output_path",
            "corrupt_state", "cases_file", "slo", "calibration", "fabric_toml"} <= kinds
    print("\n" + format_counts())


def test_a_2048_socket_node_is_refused_within_10_s():
    """The node of thousands of sockets (a plan search once ran for minutes, 3.8 GB)."""
    import time

    for extra in ([], ["--set", "topology.kind=switch"]):
        t = time.perf_counter()
        r = CliRunner().invoke(main, [*SIM, "--set", "sockets_per_node=2048", "--sockets",
                                      "2048", *extra])
        assert r.exit_code == 2 and time.perf_counter() - t < 10, r.output


@pytest.mark.slow  # a fresh interpreter imports the CLI
def test_a_failed_write_to_standard_output_is_one_line(tmp_path):
    """`rdu-cluster models > /dev/full` was an internal error."""
    import subprocess
    import sys

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-c", "from rdu_cluster.entry import run; run()",
                            "models"], stdout=full, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                           timeout=120, check=False)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: standard output: cannot write: No space left on device"


if __name__ == "__main__":
    print(format_counts())
