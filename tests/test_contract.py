"""The one-evaluator contract: for a few (model, cluster, plan, shape) points, `simulate --json`,
`plan --json`, a simulate-kind sweep row and the serving engine's first decode step report the
same per-socket HBM and the same TPOT, and a point that does not fit is refused with the same
one-line message by every command.

Conventions the comparison relies on, stated once:
- `batch` is per replica: the engine serves batch x replicas requests, dealt round robin.
- simulate's TPOT is the decode step at the mean context prompt + (gen - 1) / 2; the engine's
  first decode step is at context = prompt, which is simulate's TPOT at --gen-len 1.
- Expert parallelism: simulate, plan and sweeps cost a step at the routing model's expected
  busiest-group load; the engine draws each step's loads (engine/expert_loads.py). Its first decode
  step is the evaluator's at the load it drew (evaluate_plan's expert_load).
- HBM per socket is the busiest socket's (pipeline stages hold different layers).
- Pipeline plans: the engine's decode step is not yet the evaluator's (a known disagreement,
  test_the_engine_pipelines_as_the_evaluator_does); HBM and every command's TPOT agree.
- The engine holds weights and one prompt's activations from the start, and the KV cache of
  each request (prompt + output, the static scheduler reserves it at admission) while it runs;
  prompt + output is a multiple of the KV block (16 tokens), so blocks add no rounding.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from partitioning.plan import Plan
from partitioning.scenario import Scenario
from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.cli import main
from rdu_cluster.config import load_cluster
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from rdu_cluster.sweep.registry import Point
from rdu_cluster.sweep.runners import SIMULATE
from rdu_cluster.validation import calibration
from workloads import traces
from workloads.catalog import load_model

POINTS = [  # model, cluster, plan, batch per replica, prompt, gen
    # MoE, 4 KV heads replicated over 16 sockets
    ("qwen3-235b-a22b", "sn40l-16", "tp16", 4, 2032, 16),
    ("llama-3.1-70b", "sn40l-16", "tp8", 4, 2032, 16),  # dense, two replicas
    ("llama-3.1-8b", "dgx-h100", "tp4", 8, 1008, 16),  # GPU (kernel by kernel), two replicas
    ("llama-3.1-70b", "sn40l-16", "tp4pp2", 4, 2032, 16),  # pipeline: two stages, two replicas
    ("qwen3-235b-a22b", "sn40l-16", "tp2ep8", 4, 2032, 16),  # experts over 8 groups of 2
]
REL = 1e-9  # one evaluator: the same figures up to float summation order


def _cli(*args: str, profile: str = "none") -> list[dict]:
    r = CliRunner().invoke(main, [*args, "--calibration", profile])
    assert r.exit_code == 0, r.output
    return [json.loads(line) for line in r.output.splitlines()]


def _simulate(model, cluster, plan, batch, prompt, gen) -> dict:
    (row,) = _cli("simulate", "--model", model, "--cluster", cluster, "--plan", plan,
                  "--batch", str(batch), "--prompt-len", str(prompt), "--gen-len", str(gen),
                  "--json")
    return row


def _sweep_row(model, cluster, plan, batch, prompt, gen, profile="none") -> dict:
    fields = {"model": model, "cluster": cluster, "plan": plan, "batch": batch,
              "prompt_len": prompt, "gen_len": gen, "calibration": profile}
    out = SIMULATE.run([Point("p", fields)], 0)
    (row,) = out.table.to_pylist()
    return row


def _engine(model, cluster, plan, batch, prompt, gen) -> tuple[float, float, float]:
    """(HBM of the busiest socket at the first decode step, that step's time, the busiest
    expert group's load in it)."""
    spec = load_model(model)
    with calibration.use(None):
        c = load_cluster(cluster)
    p = Plan.parse(plan)
    n = batch * c.sockets // (p.tp * p.ep * p.pp)
    trace = traces.Trace(np.zeros(n), np.full(n, prompt), np.full(n, gen))
    # a budget that holds the batch's prompts, and at least the 8,192 tokens a GPU engine's
    # activation workspace is sized at (chip/runtime_memory.py), as simulate sizes it
    config = ServeConfig(plan=plan, scheduler="static",
                         limits=Limits(max_batch=batch, token_budget=max(batch * prompt, 8192)))
    t = Simulation(spec, c, trace, config, LocalBackend()).run()
    steps = t.steps.to_pandas()
    first = steps[(steps.phase == "decode") & (steps.replica == 0)].iloc[0]
    assert first.batch == batch
    sockets = t.sockets.to_pandas()
    # every request has finished by the last window: what a socket holds then is resident;
    # the KV cache is counted in the bytes of the replica's largest per-token socket
    last = sockets[sockets.window == sockets.window.max()]
    return last.hbm_used_bytes.max() + first.kv_used_bytes, first.time_s, first.expert_load_max


def _evaluate(model, cluster, plan, batch, prompt, gen, **kw):
    from partitioning.evaluate import evaluate_plan

    with calibration.use(None):
        c = load_cluster(cluster)
    return evaluate_plan(Scenario(load_model(model), c, Plan.parse(plan), batch, prompt, gen),
                         **kw)


@pytest.mark.parametrize("point", POINTS, ids=[f"{p[0]}-{p[2]}" for p in POINTS])
def test_every_command_reports_the_same_hbm_and_tpot(point):
    model, cluster, plan, batch, prompt, gen = point
    sim = _simulate(*point)
    (planned,) = _cli("plan", "--model", model, "--cluster", cluster, "--plan", plan,
                      "--batch", str(batch), "--context", str(prompt), "--gen-len", str(gen),
                      "--json")
    swept = _sweep_row(*point)
    hbm, step_s, load = _engine(*point)
    assert sim["plan"] == planned["plan"] == swept["plan"] == plan
    assert sim["feasible"] and swept["feasible"]
    for other in (planned["hbm_used_bytes"], swept["hbm_used_bytes_per_socket"], hbm):
        assert other == pytest.approx(sim["hbm_used_bytes_per_socket"], rel=REL)
    for other in (planned["tpot_s"], swept["tpot_s"]):
        assert other == pytest.approx(sim["tpot_s"], rel=REL)
    at_prompt = _simulate(model, cluster, plan, batch, prompt, 1)
    # a longer mean context streams more KV; the step costs more, or as much where something
    # else bounds it (the default GPU stack's overlapped host, longer than a small model's step)
    assert at_prompt["decode_kv_streaming_s"] < sim["decode_kv_streaming_s"]
    assert at_prompt["tpot_s"] <= sim["tpot_s"]
    if Plan.parse(plan).pp > 1:
        return  # the engine's pipeline step: test_the_engine_pipelines_as_the_evaluator_does
    if Plan.parse(plan).ep == 1:
        assert load == 1.0
        assert step_s == pytest.approx(at_prompt["tpot_s"], rel=REL)
    else:
        drawn = _evaluate(*point[:4], prompt, 1, expert_load=load)
        assert step_s == pytest.approx(drawn.tpot_s, rel=REL)


@pytest.mark.xfail(strict=True, reason=(
    "known disagreement, not yet fixed: the engine runs a pipeline replica's decode step as "
    "its stages one after another at the whole batch, with the activations sent as routed "
    "messages between them (engine/simulation.py _combine, _add_transfers); the evaluator "
    "cuts the batch into min(batch, pp) micro-batches, period max(sum of stage times, m x "
    "slowest stage), each stage ending in its send kernel (partitioning/evaluate.py). "
    "llama-3.1-70b tp4pp2 batch 4: engine 21.456 ms, evaluator 21.570 ms (-0.53%); at batch "
    "1 (one micro-batch) the sends alone differ: 21.153 vs 21.166 ms"))
def test_the_engine_pipelines_as_the_evaluator_does():
    point = POINTS[3]
    model, cluster, plan, batch, prompt, _ = point
    assert Plan.parse(plan).pp > 1
    _, step_s, _ = _engine(*point)
    at_prompt = _simulate(model, cluster, plan, batch, prompt, 1)
    assert step_s == pytest.approx(at_prompt["tpot_s"], rel=REL)


def test_kv_head_replication_counts_in_every_footprint():
    """qwen3-235b-a22b has 4 KV heads: at tp16 each socket holds one whole head, so its KV
    cache is a quarter of the whole (not the sixteenth the old estimate path counted), and
    simulate's HBM per socket is that footprint's."""
    from partitioning.evaluate import evaluate_plan

    spec, cluster = load_model("qwen3-235b-a22b"), load_cluster("sn40l-16")
    sim = _simulate("qwen3-235b-a22b", "sn40l-16", "tp16", 4, 2032, 16)
    fp = evaluate_plan(Scenario(spec, cluster, Plan.parse("tp16"), 4, 2032, 16)).footprints[0]
    assert fp.region("kv_cache") == pytest.approx(sim["kv_cache_bytes"] / 4, rel=REL)
    assert fp.tier("hbm") == pytest.approx(sim["hbm_used_bytes_per_socket"], rel=REL)


def test_a_point_that_does_not_fit_is_refused_alike_everywhere():
    args = ["--model", "qwen3-235b-a22b", "--cluster", "sn40l-16", "--plan", "tp16",
            "--batch", "128"]
    sim = CliRunner().invoke(main, ["simulate", *args, "--prompt-len", "8192"])
    planned = CliRunner().invoke(main, ["plan", *args, "--context", "8192"])  # (any profile)
    assert sim.exit_code == planned.exit_code == 2
    message = sim.output.strip()
    assert message == planned.output.strip()
    assert message.startswith("error: plan tp16: qwen3-235b-a22b does not fit sn40l-16: hbm")
    assert "\n" not in message
    row = _sweep_row("qwen3-235b-a22b", "sn40l-16", "tp16", 128, 8192, 256)
    assert not row["feasible"] and row["tpot_s"] is None
    assert "error: " + row["infeasible_reason"] == message


@pytest.mark.parametrize("profile", ["default", "none"])
def test_a_sweep_row_applies_the_calibration_simulate_applies(profile):
    """A sweep point names its profile (default: the shipped one, as every command's
    --calibration), so a sweep row and simulate agree with or without calibration."""
    point = POINTS[0]
    model, cluster, plan, batch, prompt, gen = point
    (sim,) = _cli("simulate", "--model", model, "--cluster", cluster, "--plan", plan,
                  "--batch", str(batch), "--prompt-len", str(prompt), "--gen-len", str(gen),
                  "--json", profile=profile)
    swept = _sweep_row(*point, profile=profile)
    assert swept["tpot_s"] == pytest.approx(sim["tpot_s"], rel=REL)


def test_calibration_changes_the_sweep_row():
    """The profile reaches the sweep's cluster: calibrated and first-principles rows differ."""
    point = POINTS[0]
    assert _sweep_row(*point, profile="default")["tpot_s"] != _sweep_row(*point)["tpot_s"]
