"""Calibration: every parameter declared, profiles applied (or not), the fit itself, and the
mechanisms the fit relies on (visible in the breakdown, which still partitions the step)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

import cluster_configs
from chip import kernel_efficiency
from partitioning.estimate import estimate
from partitioning.scenario import Scenario, tensor_plan
from rdu_cluster.cli import main
from rdu_cluster.config import load_chip, load_cluster
from rdu_cluster.validation import calibration, fit
from rdu_cluster.validation import published as v
from tests.calibration_cases import SN40L_ROWS, cases_file, sn40l_cases
from workloads.catalog import load_model
from workloads.errors import ConfigError


def test_every_execution_and_topology_parameter_is_declared():
    decls = calibration.declarations()
    for name in cluster_configs.bundled("chips"):
        chip = load_chip(name)
        declared = {d.key for d in decls
                    if name in d.chips and not kernel_efficiency.is_stack_key(d.key)}
        assert set(chip.execution) == declared, name
    for name in cluster_configs.bundled("clusters"):
        topo = load_cluster(name).topology
        keys = {"link_bandwidth_bytes_per_s", "link_latency_s"}
        if topo.inter_node_bandwidth_bytes_per_s:
            keys |= {"inter_node_bandwidth_bytes_per_s", "inter_node_latency_s"}
        assert keys <= {d.key for d in decls if name in d.clusters}, name
    for d in decls:
        if d.status == "unknown":
            assert d.range and d.basis


def test_profile_applies_only_when_active_and_user_overrides_win():
    profile = calibration.load("default")
    key = ("sn40l", "collective_latency_s")
    assert key in profile.values
    plain = load_cluster("sn40l-16").chip.execution["collective_latency_s"]
    with calibration.use(profile):
        fitted = load_cluster("sn40l-16").chip.execution["collective_latency_s"]
        user = load_cluster("sn40l-16", {"chip.execution.collective_latency_s": 7e-6})
    assert fitted == profile.values[key] != plain
    assert user.chip.execution["collective_latency_s"] == 7e-6
    with pytest.raises(ConfigError, match="calibration"):
        calibration.load("no-such-profile")


def test_fit_recovers_an_affine_host_time_from_exact_rows():
    # The Python engine's host time is affine in the batch (python_host_step_s + batch x
    # python_host_seq_s): rows made exactly from known values must be fitted back to them. The
    # CPU-overhead rows are the `eager` stack's (Sarathi-Serve's loop), so they fit its own
    # figures and leave the chip's, which other stacks run, alone.
    rows = [dict(r, role="calibrate", value=1.5 + 0.06 * r["batch"])
            for r in v.load_cases() if r["metric"] == "host_step_ms" and r["tp"] == 1]
    assert len({r["batch"] for r in rows}) >= 3
    values = {pid[0]: value for pid, value in fit.fit(rows).values.items()}
    assert values["eager.python_host_step_s"] == pytest.approx(1.5e-3, rel=1e-3)
    assert values["eager.python_host_seq_s"] == pytest.approx(60e-6, rel=1e-3)
    assert "python_host_seq_s" not in values


@pytest.mark.slow  # fits a chip's parameters to its rows: seconds of CPU
def test_calibrate_writes_a_profile_with_ranges_rows_and_residuals(tmp_path):
    # the DGX A100's rows: the parameters the A100 shares with other GPUs fitted to them alone
    rows = cases_file(tmp_path, lambda row: row.get("cluster") == "dgx-a100")
    out = tmp_path / "p.toml"
    result = CliRunner().invoke(
        main, ["calibrate", "--chip", "a100-sxm-80gb", "--cases", str(rows), "--out", str(out),
              "--no-uncertainty"]
    )
    assert result.exit_code == 0, result.output
    profile = calibration.load(str(out))
    assert ("a100-sxm-80gb", "kernel_latency_s") in profile.values  # the A100's own
    body = out.read_text()
    for field in ("range", "first_principles", "rows", "[[residual]]", "code_version", "date"):
        assert field in body


def test_calibrate_out_may_not_replace_the_cases_file(tmp_path):
    rows = tmp_path / "rows.toml"
    text = v.resources.files("rdu_cluster").joinpath("validation/measurements.toml").read_text()
    rows.write_text(text)
    result = CliRunner().invoke(main, ["calibrate", "--cases", str(rows), "--out",
                                       str(tmp_path / "." / "rows.toml")])
    assert result.exit_code == 2
    assert "is the --cases file, which the fit reads" in result.output
    assert rows.read_text() == text


@pytest.mark.parametrize("role, chip, needle", [
    ("check", None, "no calibrate rows for the chips with unknown parameters"),
    ("calibrate", "sn40l", "no calibrate rows for chip sn40l to fit"),
    ("calibrate", "h100-sxm", "no calibrate row responds to an unknown parameter of chip h100"),
])
def test_calibrate_with_nothing_to_fit_writes_nothing(tmp_path, role, chip, needle):
    from tests.test_validate import ROW  # a weight_gib row on dgx-h100: no parameter moves it

    cases = tmp_path / "c.toml"
    cases.write_text(ROW.replace('role = "check"', f'role = "{role}"'))
    out = tmp_path / "p.toml"
    args = ["calibrate", "--cases", str(cases), "--out", str(out)]
    result = CliRunner().invoke(main, args + (["--chip", chip] if chip else []))
    assert result.exit_code == 2 and needle in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def _decode(model, cluster, tp=None, options=None):
    c = load_cluster(cluster)
    return estimate(Scenario(load_model(model), c, tensor_plan(c, tp), prompt_len=1024, gen_len=64,
                             options=options))


def test_router_wait_only_for_moe_and_breakdown_partitions():
    # First-principles values: KernelLooping prefetches the next layer during the chain, except
    # the routed experts, which must wait for the router.
    moe = _decode("gpt-oss-120b", "sn40l-16").decode
    dense = _decode("llama-3.1-8b", "sn40l-16").decode
    assert float(moe.cause("router_wait")) > 0
    assert float(dense.cause("router_wait")) == 0
    for cost in (moe, dense):
        assert float(sum(cost.by_cause.values())) == pytest.approx(float(cost.time_s))
        assert float(cost.cause("collective_latency")) > 0


def test_collective_latency_is_on_the_chain_and_prefetch_hides_it():
    base = load_cluster("sn40l-16")
    hidden = _decode("llama-3.1-8b", "sn40l-16")
    # Less of the free SRAM kept for prefetch: the chain is exposed (adds to the stream) as a
    # prefetch stall, and the step gets slower.
    slow = estimate(Scenario(
        load_model("llama-3.1-8b"),
        load_cluster("sn40l-16", {"chip.execution.prefetch_fraction": 0.001}),
        prompt_len=1024, gen_len=64,
    ))
    assert float(slow.tpot_s) > float(hidden.tpot_s)
    assert float(slow.decode.cause("prefetch_stall")) > float(hidden.decode.cause(
        "prefetch_stall"))
    assert base.chip.execution["prefetch_fraction"] == 1.0


def test_serving_stacks_differ_in_host_and_allreduce():
    from chip.serving_stacks import stack

    runs = {name: _decode("llama-3.1-8b", "dgx-h100", tp=8, options=stack(name)).decode
            for name in ("tensorrt-llm", "vllm", "eager", "sglang", "tensorrt-llm-0.11")}
    assert float(runs["vllm"].cause("host")) > float(runs["tensorrt-llm"].cause("host"))
    assert float(runs["eager"].time_s) > float(runs["tensorrt-llm"].time_s)
    # SGLang's overlap scheduler hides the part of its Python host work that the step covers
    assert float(runs["sglang"].cause("host")) < float(runs["vllm"].cause("host"))
    # TensorRT-LLM 0.11 without multi-block mode: one thread block per KV head and sequence
    assert float(runs["tensorrt-llm-0.11"].by_class["attention"]) > 2 * float(
        runs["tensorrt-llm"].by_class["attention"])
    with pytest.raises(ConfigError, match="stack"):
        stack("triton")


def test_simulate_stack_and_calibration_options():
    args = ["simulate", "--model", "llama-3.1-8b", "--cluster", "dgx-h100", "--tp", "8", "--json"]
    trt = CliRunner().invoke(main, [*args, "--stack", "tensorrt-llm"])
    none = CliRunner().invoke(main, [*args, "--stack", "tensorrt-llm", "--calibration", "none"])
    assert trt.exit_code == 0 and none.exit_code == 0, trt.output + none.output
    # the fitted NCCL latency (Vidur's 8-GPU measurements) is far above the first-principles one
    import json

    assert json.loads(trt.output)["tpot_s"] > json.loads(none.output)["tpot_s"]
    bad = CliRunner().invoke(main, [*args, "--stack", "triton"])
    assert bad.exit_code == 2 and "stack" in bad.output



@pytest.mark.parametrize("kind, name", [("chips", "sn40l"), ("clusters", "sn40l-16")])
def test_calibrate_out_may_not_replace_a_file_a_rows_cluster_reads(kind, name):
    # the row names the bundled cluster sn40l-16 (no path): it reads its TOML and the chip's.
    # Checked on the function, not the command: a regression would overwrite the bundled file.
    import importlib

    c = importlib.import_module("rdu_cluster.cli.calibrate")  # the package's name is the command
    rows = [r for r in v.load_cases() if r["id"] == "sn40l16-llama8b-tokens"]
    assert rows[0]["cluster"] == "sn40l-16"
    with pytest.raises(ConfigError, match=f"{name}.toml file, which the fit reads"):
        c._not_an_input(cluster_configs.config_dir(kind) / f"{name}.toml", None, rows)


def test_profile_text_quotes_what_the_cases_file_carries():
    # a --cases version with a quote made a profile no TOML reader could open
    import tomllib

    version = 'v"2\\n\n\x7f\tü'
    text = fit.profile_text(fit.Fit({}, (), {}), [], version, "p")
    assert tomllib.loads(text)["measurements_version"] == version


@pytest.mark.parametrize("text, needle", [
    ("", "parameter: missing field"),
    ('name = "p"\n[[paramter]]\nchips = ["sn40l"]\nkey = "collective_latency_s"\nvalue = 3e-6\n',
     "paramter: unknown field"),
    ("parameter = []\n", "one or more"),
    ('[[parameter]]\nchips = ["sn40l"]\nkey = "hbm_efficiency"\nvalue = 0.5\n',
     "'hbm_efficiency'; accepted: the unknown parameters"),
    ('[[parameter]]\nchips = ["h100-sxm"]\nkey = "kernel_latency_s"\nvalue = 3e-6\n',
     # the message lists every group the key is declared for: a new chip's own entry adds one
     "declared for together (['h100-sxm', 'h200-sxm', 'gh200-96gb'] or "),
])
def test_a_profile_holds_only_what_calibrate_writes(tmp_path, text, needle):
    # each was accepted: no values at all (as --calibration none), a derived parameter set by
    # hand, or one of two chips that share a fitted value
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        calibration.load(str(path))


def test_a_profile_knows_the_rows_it_was_fitted_to(tmp_path):
    profile = calibration.load("default")
    assert "sn40l16-llama8b-tokens" in profile.rows
    assert not profile.rows & {r["id"] for r in v.load_cases() if r["role"] == "check"}
    path = tmp_path / "p.toml"
    path.write_text('[[parameter]]\nchips = ["sn40l"]\nkey = "collective_latency_s"\n'
                    "value = 3e-6\nrows = 5\n")
    with pytest.raises(ConfigError, match="parameter 1.rows: expected a list of row ids"):
        calibration.load(str(path))


@pytest.mark.slow  # fits two SN40L rows: seconds of CPU
def test_calibrate_no_progress_silences_stderr(tmp_path):
    """docs/sweeps.md: the long commands' progress on stderr, --no-progress silences it;
    calibrate had no --no-progress."""
    r = CliRunner().invoke(main, ["calibrate", "--chip", "sn40l", "--cases",
                                  str(sn40l_cases(tmp_path, SN40L_ROWS[:2])), "--out",
                                  str(tmp_path / "p.toml"), "--no-progress", "--no-uncertainty"])
    assert r.exit_code == 0, r.output
    assert r.stderr == "" and "wrote" in r.stdout


@pytest.mark.slow  # runs every bundled row to see which parameters move it: seconds
def test_parameters_are_grouped_by_the_rows_that_respond_to_them():
    """A group is a parameter with the calibrate rows that respond to it, closed over shared
    rows: the Python engine's host time (only the CPU-overhead rows, here taken as calibrate
    rows, respond) is fitted apart from the H100 kernel parameters although all are parameters
    of the same chips, and the group's fit equals the joint one."""
    cpu_rows = [dict(r, role="calibrate") for r in v.load_cases()
                if r["metric"] == "host_step_ms"]
    rows = cpu_rows + [r for r in v.load_cases()
                       if r["metric"] == "linear_time_us" and "h100" in r["cluster"]]
    sim = fit.Simulator(rows)
    host_keys = ("eager.python_host_step_s", "eager.python_host_seq_s")
    decls = [d for d in fit.fitted_declarations() if d.key in (*host_keys, "kernel_latency_s")]
    touching = fit.responses(decls, rows, sim)
    groups = fit.groups(touching, decls, rows)
    by_key = {tuple(sorted(d.key for d in g.params)): set(g.rows) for g in groups}
    cpu = {r["id"] for r in cpu_rows}
    assert by_key[tuple(sorted(host_keys))] == cpu
    assert all(not (ids & cpu) for keys, ids in by_key.items() if keys != tuple(sorted(host_keys)))
    joint = fit.fit(rows, sim=sim).values
    # the joint fit's memo of row runs: a group fitted alone evaluates the same points, so it
    # reuses them (a value in the memo is the row's value there, whichever fit ran it)
    alone = fit.fit(cpu_rows, sim=sim).values
    for key in (k for k in alone if k[0] in host_keys):
        assert joint[key] == pytest.approx(alone[key], rel=1e-6)


def test_leave_one_out_keeps_a_parameter_without_rows_at_its_prior():
    """Left out, the only row a parameter responds to takes the data for it away: the refit
    keeps the prior (a free parameter with no gradient would drift to a bound) and predicts
    the row from first principles."""
    ttft = "argonne-a100-trtllm-llama-3.1-8b-ttft-1024-b16"
    rows = [r for r in v.load_cases()
            if r["id"] == ttft or (r["metric"] == "linear_time_us" and "a100" in r["id"])]
    sim = fit.Simulator(rows)
    full = fit.fit(rows, sim=sim)
    (group,) = [g for g in full.groups if ttft in g.rows]
    decl = next(d for d in group.params if d.key == "compute_efficiency")
    assert len(group.rows) > 1  # the A100 kernel rows still fit the rest of the group
    assert full.values[fit._pid(decl)] != pytest.approx(fit.prior(decl), rel=1e-3)
    refit = fit.fit_group(group, sim, exclude=ttft, start=full.values)
    assert refit[fit._pid(decl)] == fit.prior(decl)


def test_a_row_is_not_rerun_when_a_parameter_it_does_not_respond_to_moves(monkeypatch):
    """After `responses`, the simulator keys a row's cache on the parameters it responds to: a fit
    perturbing another parameter of the same chip reuses the row's value."""
    row = next(r for r in v.load_cases() if r["id"] == "argonne-h100-trtllm-llama-3.1-8b-tp1-128")
    sim = fit.Simulator([row])
    decls = {d.key: d for d in fit.fitted_declarations("h100-sxm")}
    host, worker = fit._pid(decls["host_step_s"]), fit._pid(decls["python_worker_s"])
    sim.depends[row["id"]] = {host}
    runs = []
    real = v.run_case
    monkeypatch.setattr(v, "run_case", lambda case: runs.append(case["id"]) or real(case))
    first = sim(row["id"], {host: 1e-3, worker: 1e-4})
    assert sim(row["id"], {host: 1e-3, worker: 2e-3}) == first and len(runs) == 1
    assert sim(row["id"], {host: 2e-3, worker: 2e-3}) < first and len(runs) == 2


@pytest.mark.slow  # fits, refits and derives a model twice, once in forked processes: seconds
def test_processes_give_the_fit_refits_and_model_of_one(monkeypatch):
    """calibrate --jobs: the parameters' responses, the leave-one-out refits, the bootstrap
    refits and the spread's runs in forked processes give the values of one process, and the
    rows the workers ran come back to the parent's memo. The Python engine's host-time rows
    (ms apiece), taken as a figure the uncertainty model covers."""
    from rdu_cluster.validation import uncertainty

    monkeypatch.setitem(uncertainty.ROW_METRICS, "host_step_ms", "serving")
    monkeypatch.setattr(fit, "code_version", lambda: "test")
    rows = [r for r in v.load_cases() if r["metric"] == "host_step_ms"]
    assert {r["role"] for r in rows} == {"calibrate", "check"}
    out = []
    for jobs in (1, 2):
        sim = fit.Simulator(rows)
        full = fit.fit(rows, sim=sim, jobs=jobs)
        model = uncertainty.derive(rows, full, sim, calibration.Profile("p"), "", 3, jobs)
        out.append((full, fit.leave_one_out(rows, full, sim, jobs), model, set(sim.cache)))
    (one, loo_one, model_one, memo_one), (two, loo_two, model_two, memo_two) = out
    assert one == two and loo_one == loo_two and model_one == model_two
    assert list(loo_two) == [r for g in two.groups for r in g.rows]  # the rows' own order
    assert {s["held_out"] for s in model_two["samples"]} == {"loo", "check"}
    assert all(s["spread"] > 0 for s in model_two["samples"])
    assert memo_two == memo_one  # what the workers ran came back


def test_a_process_pool_keeps_the_order_of_the_tasks_whatever_their_cost():
    sim = fit.Simulator([])
    tasks = list(range(7))
    assert sim.map(lambda t: t * t, tasks, 2, cost=lambda t: t % 3) == [t * t for t in tasks]
    assert sim.map(lambda t: t * t, tasks, 1, cost=lambda t: t % 3) == [t * t for t in tasks]


@pytest.mark.slow  # the whole fit: ~6 s
def test_the_shipped_profile_is_what_calibrate_fits(tmp_path):
    """cluster_configs/calibration/default.toml is `rdu-cluster calibrate`'s output over the
    bundled measurements, not a file left behind by an earlier code. The claim is on what a
    profile is for: a refit simulates every calibrate row as the shipped profile does, to 1e-4
    in log (0.01%), and gives every parameter the rows determine to 1e-3. The least-squares fit
    stops once a step is under xtol = 1e-4 of its log values' norm, so two machines whose
    floating point differs in the last bits can stop a step apart (sglang.moe_latency_s
    2.19491 and 2.19513 us, its rows 4e-6 apart in log). A parameter no row moves with
    between the two values (fit.RESPONDS in log) may end anywhere along that flat:
    sglang-0.5.10's block_bytes_per_s ended at 144.7 GB/s on one machine and 100.5 on
    another (Dec 2026), every row the same at both."""
    import math
    from pathlib import Path

    out = tmp_path / "fit.toml"
    r = CliRunner().invoke(main, ["calibrate", "--no-uncertainty", "--no-progress", "--out",
                                  str(out), "--jobs", "1"])
    assert r.exit_code == 0, r.output
    shipped = Path(cluster_configs.__file__).parent / "calibration" / "default.toml"
    fitted, ours = (calibration.load(str(p)).values for p in (out, shipped))
    assert fitted.keys() == ours.keys()
    rows = [row for row in v.load_cases() if row["role"] == "calibrate"]

    def simulated(values: dict) -> dict[str, float]:
        with calibration.use(calibration.Profile("refit", values)), v.memoised():
            return {row["id"]: v.run_case(row).simulated for row in rows}

    def apart(a: dict[str, float], b: dict[str, float], tol: float) -> dict:
        return {k: (a[k], b[k]) for k in a if abs(math.log(b[k] / a[k])) > tol}

    ref = simulated(ours)
    assert apart(ref, simulated(fitted), 1e-4) == {}
    moved = apart(ours, fitted, 1e-3)
    for key in {k for _, k in moved}:  # one parameter, on each of its chips
        one = {c: fitted[c] for c in moved if c[1] == key}
        assert apart(ref, simulated({**ours, **one}), fit.RESPONDS) == {}, key
