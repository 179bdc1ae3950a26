"""Energy and cost columns of the serving tables (engine/energy.py): each figure recomputed from
chip/power.py and the cluster's [cost] price, and the splits that must add up."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from chip import execution
from chip.cost_tables import DYNAMIC_ROW, ROWS, CostTables
from chip.power import idle_power_w, power_spec, socket_power_w
from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.cli import main
from rdu_cluster.config import load_cluster
from rdu_cluster.engine import energy
from rdu_cluster.engine.replica import Span
from rdu_cluster.engine.requests import Request
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from workloads import traces
from workloads.catalog import load_model
from workloads.ops import StepShape
from workloads.speculative import ConstantAcceptance, Speculation

CLUSTER = "sn40l-8"
FIXED = {"rate": float("inf"), "prompt": traces.LengthDist("fixed", 256),
         "output": traces.LengthDist("fixed", 32)}


def cols(tbl) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in tbl.to_pydict().items()}


def run_on(cluster, n=12, **config):
    """A run on a cluster object (a modified price or power table)."""
    trace = traces.synthetic(n, 20.0, "poisson", traces.LengthDist("uniform", 64, 512),
                             traces.LengthDist("fixed", 16), seed=1)
    sim = Simulation(load_model("llama-3.1-8b"), cluster, trace, ServeConfig(seed=1, **config),
                     LocalBackend())
    return sim.run()


@pytest.fixture(scope="module")
def runs(serve):
    """Plain, two replicas, chunked prefill (mixed steps), a failed socket (recovery rows and
    a smaller group after it), speculative decoding."""
    spec = Speculation(3, ConstantAcceptance(0.7))
    return {
        "plain": serve(cluster=CLUSTER, n=20),
        "two_replicas": serve(cluster=CLUSTER, n=20, plan="tp4"),
        "chunked": serve(cluster=CLUSTER, n=20,
                         limits=Limits(max_batch=16, token_budget=256, chunked_prefill=True)),
        "failed": serve(cluster=CLUSTER, n=20, faults=("socket:3@0.05",)),
        "speculative": serve(cluster=CLUSTER, n=8, speculation=spec, draft="llama-3.2-1b"),
    }


def test_a_step_is_split_by_token_share():
    """A mixed step of 60 + 20 prompt tokens and two decodes (1 each), then a decode span of 3
    steps over the two decodes: 82 tokens of work, then equal halves."""
    a, b, c, d = (Request(i, 0.0, 100, 10) for i in range(4))
    spans = [Span(2, 1, 0, [c, d], [(a, 60), (b, 20)]), Span(0, 3, 1, [c, d], [])]
    cols = {"energy_j": np.array([82.0, 1.0, 2.0, 3.0]), "cost_usd": np.array([8.2, 0, 0, 6])}
    into = {"energy_j": {}, "cost_usd": {}}
    energy.split_over_requests(spans, cols, into)
    assert into["energy_j"] == pytest.approx({0: 60.0, 1: 20.0, 2: 4.0, 3: 4.0})
    assert into["cost_usd"] == pytest.approx({0: 6.0, 1: 2.0, 2: 3.1, 3: 3.1})


def test_socket_rows_name_the_dynamic_energy():
    assert ROWS[-2:] == ("comm_bytes", "dynamic_j") and ROWS[DYNAMIC_ROW] == "dynamic_j"


@pytest.mark.parametrize("name", ["plain", "two_replicas", "chunked", "failed", "speculative"])
def test_step_energy_between_idle_and_peak(runs, name):
    sim, t = runs[name]
    spec = power_spec(sim.cluster.chip)
    s = cols(t.steps)
    socket_s = s["sockets"] * s["time_s"]
    assert np.all(s["energy_j"] >= spec.idle_w * socket_s * (1 - 1e-12))
    assert np.all(s["energy_j"] <= spec.peak_w * socket_s * (1 + 1e-12))
    recovery = s["phase"] == "recovery"
    assert recovery.any() == (name == "failed")
    assert np.allclose(s["energy_j"][recovery], spec.idle_w * socket_s[recovery], rtol=1e-12)
    price = sim.cluster.cost["socket_hour_usd"]
    assert np.allclose(s["cost_usd"], price * socket_s / 3600, rtol=1e-12)


def test_decode_step_energy_is_the_power_model_of_its_step_cost(serve):
    """One request: its decode steps have batch 1 at context S. The step's S is found by its
    time in a fresh cost table, then the step is costed again through chip.execution and the
    energy taken from socket_power_w: every socket of the group runs that step (tp8)."""
    sim, t = serve(cluster=CLUSTER, n=1, prompt=traces.LengthDist("fixed", 300),
                   output=traces.LengthDist("fixed", 6))
    s = cols(t.steps)
    setup = sim.build.setups(sim.layouts[0], sim.plan)[0]
    prog, chip = setup.program, sim.cluster.chip
    tables = CostTables(chip, prog, setup.comm_time)
    sums = np.arange(290, 320)
    table_times = np.array([tables.decode_span(1, int(x), 1, None)[0, 0] for x in sums])
    decodes = np.flatnonzero(s["phase"] == "decode")
    assert len(decodes) == 5 and set(s["sockets"]) == {8}
    for i in decodes:
        match = sums[table_times == s["time_s"][i]]
        assert len(match) == 1
        cost = execution.step_cost(prog.graph(StepShape.decode(1.0, float(match[0]))), chip,
                                   setup.comm_time, prog.options, prog.execution_model)
        expected = 8 * float(socket_power_w(cost, chip)) * float(cost.time_s)
        assert s["energy_j"][i] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", ["plain", "two_replicas", "chunked", "failed", "speculative"])
def test_requests_and_sockets_add_up_to_the_steps(runs, name):
    """Recovery rows are charged to no request (a reload has none in it)."""
    _, t = runs[name]
    s, r, k = cols(t.steps), cols(t.requests), cols(t.sockets)
    work = s["phase"] != "recovery"
    for column in ("energy_j", "cost_usd"):
        assert r[column].sum() == pytest.approx(s[column][work].sum(), rel=1e-9)
        assert k[column].sum() == pytest.approx(s[column][work].sum(), rel=1e-9)
    assert np.all(r["energy_j"][r["generated_tokens"] > 0] > 0)


@pytest.mark.parametrize("name", ["plain", "two_replicas", "failed"])
def test_summary_adds_idle_draw_outside_steps(runs, name):
    sim, t = runs[name]
    s, summ = cols(t.steps), t.summary
    idle = idle_power_w(sim.cluster.chip)
    makespan, sockets = summ["makespan_s"], sim.cluster.sockets
    gaps = sockets * makespan - float(np.sum(s["time_s"] * s["sockets"]))
    assert gaps >= 0
    assert summ["energy_j"] == pytest.approx(s["energy_j"].sum() + idle * gaps, rel=1e-12)
    assert summ["energy_j"] >= s["energy_j"].sum()
    assert summ["power_w"] == pytest.approx(summ["energy_j"] / makespan)
    assert summ["joules_per_token"] == pytest.approx(summ["energy_j"] / summ["output_tokens"])
    price = sim.cluster.cost["socket_hour_usd"]
    assert summ["cost_usd"] == pytest.approx(price * sockets * makespan / 3600)
    assert summ["cost_per_million_tokens_usd"] == pytest.approx(
        summ["cost_usd"] / summ["output_tokens"] * 1e6)
    if name != "plain":  # a smaller group after the fault, or replicas idle between windows
        assert gaps > 0


def test_a_degraded_socket_keeps_dynamic_energy_and_draws_idle_longer(serve):
    """All requests at 0 and fixed lengths: the same steps, whatever their times."""
    sim, plain = serve(cluster=CLUSTER, n=8, **FIXED)
    _, slow = serve(cluster=CLUSTER, n=8, faults=("socket:0@0.0:degraded:0.5",), **FIXED)
    a, b = cols(plain.steps), cols(slow.steps)
    assert np.array_equal(a["step"], b["step"]) and np.array_equal(a["batch"], b["batch"])
    idle = idle_power_w(sim.cluster.chip)
    dynamic = lambda s: s["energy_j"] - idle * s["sockets"] * s["time_s"]
    assert np.allclose(dynamic(a), dynamic(b), rtol=1e-9)
    assert np.all(b["time_s"] > a["time_s"]) and np.all(b["energy_j"] > a["energy_j"])
    assert np.allclose(b["energy_j"] - a["energy_j"], idle * 8 * (b["time_s"] - a["time_s"]),
                       rtol=1e-9)


def test_cost_per_million_tokens_scales_with_the_price():
    cluster = load_cluster(CLUSTER)
    base = run_on(cluster).summary
    double = replace(cluster, cost={"socket_hour_usd": 2 * cluster.cost["socket_hour_usd"],
                                    "source": "test: twice the price"})
    twice = run_on(double).summary
    assert twice["cost_per_million_tokens_usd"] == pytest.approx(
        2 * base["cost_per_million_tokens_usd"], rel=1e-12)
    assert twice["energy_j"] == base["energy_j"]


def test_no_power_or_cost_table_gives_nulls():
    cluster = load_cluster(CLUSTER)
    bare = replace(cluster, cost={}, chip=replace(cluster.chip, power={}))
    t = run_on(bare)
    for key in ("energy_j", "power_w", "joules_per_token", "cost_usd",
                "cost_per_million_tokens_usd"):
        assert t.summary[key] is None
    for tbl in (t.steps, t.requests, t.sockets):
        for column in ("energy_j", "cost_usd"):
            assert tbl.column(column).null_count == tbl.num_rows
    priced = run_on(replace(cluster, chip=replace(cluster.chip, power={})))
    assert priced.summary["energy_j"] is None and priced.summary["cost_usd"] > 0


def test_serve_prints_the_energy_line_and_writes_the_columns(tmp_path):
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["serve", "--model", "llama-3.1-8b", "--cluster", CLUSTER,
                                  "--requests", "10", "--rate", "20", "--output-len", "16",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("  energy "))
    assert "J/token" in line and "W mean" in line and "per million tokens" in line
    for name in ("requests", "steps", "sockets"):
        tbl = pq.read_table(out / f"{name}.parquet")
        assert {"energy_j", "cost_usd"} <= set(tbl.column_names)
        assert tbl.column("energy_j").null_count == 0
    assert "sockets" in pq.read_table(out / "steps.parquet").column_names
