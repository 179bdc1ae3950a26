"""The serve runner: serving simulations (engine, local backend) as sweep points. The example
spec end to end with an interrupt and a resume, its exact columns, determinism, infeasible points
and one-line errors naming the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rdu_cluster.cli import main
from rdu_cluster.engine import evictions
from rdu_cluster.sweep import LocalExecutor, expand, load_spec, read_manifest, registry, run_sweep
from rdu_cluster.sweep.runners import SERVE, SERVE_SCHEMA, run_serve
from tests.sweep.helpers import write
from workloads.errors import ConfigError

EXAMPLE = Path(__file__).parents[2] / "examples" / "sweeps" / "serve-small.toml"
SCENARIO_COLUMNS = {  # the fields the example sets or defaults, as columns
    "arrival", "burstiness", "chunked_prefill", "cluster_ref", "max_batch",
    "model_ref", "output_len_dist", "plan", "preemption", "prompt_len_dist",
    "rate_requests_per_s", "scheduler", "token_budget", "routing", "fabric",
}

SMALL = """
[sweep]
kind = "serve"
[base]
model = "llama-3.1-8b"
cluster = "sn40l-8"
requests = 8
rate = 50.0
prompt_len = 128
output_len = 16
"""


@pytest.fixture(scope="module")
def example_sweep(tmp_path_factory):
    """The example spec run as a sweep whose second task is cut short, then resumed: (spec,
    points, points finished at the cut, the resumed run's summary, the dataset). The resume
    test checks the run; the report test reports its dataset (one 12-point run for both)."""
    spec = load_spec(EXAMPLE)
    points = expand(spec).points
    out = tmp_path_factory.mktemp("example") / "out"
    ran: list[int] = []

    def interrupted(pts, seed):  # the first task commits, the second is cut short
        if ran:
            raise KeyboardInterrupt
        ran.append(len(pts))
        return SERVE.run(pts, seed)

    with pytest.MonkeyPatch.context() as mp, pytest.raises(KeyboardInterrupt):
        mp.setitem(registry.RUNNERS, "serve", dataclasses.replace(SERVE, run=interrupted))
        run_sweep(spec, points, out, LocalExecutor(), points_per_task=4, progress=False)
    at_cut = len(read_manifest(out).finished)
    s = run_sweep(spec, points, out, LocalExecutor(), points_per_task=4, progress=False)
    return spec, points, at_cut, s, out


@pytest.mark.slow  # seconds: end to end
def test_example_runs_resumes_one_row_per_point(example_sweep):
    spec, points, at_cut, s, out = example_sweep
    assert spec.kind == "serve" and len(points) == 12
    assert at_cut == 4
    assert (s.skipped, s.ran, s.rows, s.infeasible) == (4, 8, 12, 0)

    tbl = pq.read_table(out)
    ids = tbl.column("point_id").to_pylist()
    assert sorted(ids) == sorted(p.id for p in points)  # one row per point
    assert set(tbl.column_names) == set(SERVE_SCHEMA.names) | SCENARIO_COLUMNS
    df = tbl.to_pandas()
    assert (df.requests_served == 48).all() and (df.tp == 8).all()
    assert set(df.cluster) == {"sn40l-8", "dgx-h100"} and set(df.max_batch) == {4, 16}
    assert (df.ttft_p50_s <= df.ttft_p90_s).all() and (df.ttft_p90_s <= df.ttft_p99_s).all()
    assert (df.throughput_tokens_per_s > 0).all() and (df.makespan_s > 0).all()
    assert (df.joules_per_token > 0).all() and (df.cost_per_million_tokens_usd > 0).all()
    assert (df.power_w == df.energy_j / df.makespan_s).all()
    # at the highest rate, a larger batch limit queues less
    hi = df[df.rate_requests_per_s == 160.0].set_index(["cluster", "max_batch"]).ttft_p90_s
    for cluster in ("sn40l-8", "dgx-h100"):
        assert hi[(cluster, 16)] < hi[(cluster, 4)]

    # determinism: a point run alone gives the row the resumed sweep wrote
    for p in (points[0], points[-1]):
        alone = run_serve([p], spec.seed).table.to_pylist()[0]
        row = tbl.filter(pc.equal(tbl.column("point_id"), p.id)).to_pylist()[0]
        assert {k: row[k] for k in alone if k not in ("cluster", "model")} == {
            k: v for k, v in alone.items() if k not in ("cluster", "model")
        }


@pytest.mark.slow  # seconds: end to end
def test_the_example_s_dataset_is_reported(example_sweep, tmp_path):
    """The example the issue found crashing `report`: its dataset gets every plot."""
    pytest.importorskip("plotly")
    r = CliRunner().invoke(main, ["report", str(example_sweep[-1]),
                                  "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output + (r.stderr or "")
    assert "serve dataset, 12 rows, 5 plots" in r.output and "skipped" not in r.output


def test_seed_field_infeasible_point_and_dry_run(tmp_path):
    body = SMALL + """
[[axes]]
type = "list"
points = [{ seed = 1 }, { seed = 2 }, { model = "llama-3.1-70b", plan = "tp1" }]
"""
    path = write(tmp_path, body)
    spec = load_spec(path)
    points = expand(spec).points
    s = run_sweep(spec, points, tmp_path / "out", LocalExecutor(), progress=False)
    assert (s.rows, s.infeasible) == (3, 1)
    reason = next(iter(read_manifest(tmp_path / "out").infeasible.values()))
    assert "does not fit" in reason
    every = pq.read_table(tmp_path / "out").to_pandas()
    assert list(every[~every.feasible].infeasible_reason) == [reason]
    df = every[every.feasible]
    assert sorted(df.seed) == [1, 2]
    assert df.makespan_s.nunique() == 2  # another seed, another trace
    r = CliRunner().invoke(main, ["sweep", str(path), "--dry-run"])
    assert r.exit_code == 0 and "serve, 3 points" in r.output


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ('plan = "tp3"', "base.plan: 'tp3' on sn40l-8 with llama-3.1-8b: tp x pp = 3 must divide"),
        ('scheduler = "fifo"', "base.scheduler: unknown 'fifo'; accepted: "),
        ('arrival = "gauss"', "base.arrival: 'gauss'; accepted: fixed, poisson, bursty"),
        ('prompt_len = "uniform:512:128"', "base.prompt_len: lengths must be >= 1"),
        ('fault = "socket:9@0.5"', "base.fault: on sn40l-8: 'socket:9@0.5': socket out of range"),
        ("kv_fraction = 1.5", "base.kv_fraction: expected a number in (0, 1]"),
        ('routing = "random"', "base.routing: unknown 'random'"),
        ('prefill_pool = "dgx-h100:tp8"', "base.prefill_pool: 'dgx-h100:tp8'; expected"),
        ('backend = "ray"', "base.backend: unknown field; accepted: arrival,"),
        ("[[axes]]\ntype = 'grid'\nrate = [1.0, inf]", "axes[0].rate[1]: expected a finite"),
        ('prefill_pool = "sn40l-8:tp8:1"',
         "base.prefill_pool: give both prefill_pool and decode_pool (or neither: aggregated)"),
        ('prefill_pool = "sn40l-8:tp8:1"\ndecode_pool = "sn40l-8:tp8:1"\nfabric = "nope"',
         "base.fabric: unknown fabric 'nope'"),
        ('prefill_pool = "nope:tp8:1"\ndecode_pool = "sn40l-8:tp8:1"',
         "base.prefill_pool: unknown cluster 'nope'"),
        ('prefill_pool = "sn40l-8:tp8:1"\ndecode_pool = "sn40l-8:tp8:1"\nplan = "tp8"',
         "base.plan: not with prefill_pool/decode_pool"),
        (('prefill_pool = "sn40l-8:tp8:1"\ndecode_pool = "sn40l-8:tp8:1"\n'
          'routing = "least-outstanding"'),
         "base.routing: least-outstanding: not with --prefill-pool/--decode-pool"),
        ('prefix_eviction = "no-such-policy"',
         f"base.prefix_eviction: unknown 'no-such-policy'; accepted: {', '.join(evictions.names())}"),
        ("burstiness = 3.0", "base.burstiness: 3.0 needs arrival = 'bursty'"),
        ("[[axes]]\ntype = 'grid'\narrival = ['bursty', 'fixed']\nburstiness = [2.0]",
         ("axes[0].burstiness: 2.0 needs arrival = 'bursty' (it is the coefficient of variation"
          " of bursty gaps); this point's arrival is 'fixed'")),
    ],
)
def test_bad_serve_spec_is_one_line_naming_the_field(tmp_path, extra, fragment):
    body = SMALL.replace("prompt_len = 128\n", "") + extra + "\n"  # nothing runs: no need
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as e:
        spec = load_spec(write(tmp_path, body))
        run_sweep(spec, expand(spec).points, out, LocalExecutor(), progress=False)
    assert fragment in str(e.value) and "\n" not in str(e.value)
    assert not out.exists()


def test_missing_trace_field_named(tmp_path):
    spec = load_spec(write(tmp_path, SMALL.replace("requests = 8\n", "")))
    with pytest.raises(ConfigError, match=r"requests: missing field \(set it in \[base\]"):
        expand(spec)


def test_length_spellings_are_one_point(tmp_path):
    ids = [
        expand(load_spec(write(tmp_path, SMALL.replace("prompt_len = 128", f"prompt_len = {v}"))))
        .points[0].id
        for v in ("128", '"128"', '"fixed:128"')
    ]
    assert len(set(ids)) == 1


def test_serve_sweep_axes_over_closed_loop_disaggregation(tmp_path):
    body = SMALL + """concurrency = 4
[[axes]]
type = "zip"
prefill_pool = ["dgx-h100:tp4:1", "dgx-h100:tp4:1"]
decode_pool = ["sn40l-8:tp4:1", "sn40l-8:tp8:1"]
"""
    spec = load_spec(write(tmp_path, body))
    s = run_sweep(spec, expand(spec).points, tmp_path / "out", LocalExecutor(), progress=False)
    assert s.rows == 2
    df = pq.read_table(tmp_path / "out").to_pandas()
    assert (df.kv_transfer_p50_s > 0).all() and (df.requests_served == 8).all()
    assert set(df.cluster) == {"dgx-h100+sn40l-8"} and sorted(df.sockets) == [8, 12]
    assert set(df["stack"]) == {"sglang"}  # the H100 pool's (the point's cluster: sn40l-8)
    # each figure's interval from the pool that sets it: the H100 prefill pool's TTFT has
    # one, the SN40L decode pool's TPOT none (no held-out RDU serving rows), E2E none (both)
    assert (df.ttft_p99_s_low < df.ttft_p99_s).all() and (df.ttft_p99_s < df.ttft_p99_s_high).all()
    assert df.tpot_p99_s_low.isna().all() and df.e2e_p99_s_high.isna().all()
    assert df.interval_note.str.contains("first token \\(prefill pool\\): serving taken").all()
    closed = load_spec(write(tmp_path, SMALL + "concurrency = 2\n"))
    s = run_sweep(closed, expand(closed).points, tmp_path / "o2", LocalExecutor(),
                  progress=False)
    df = pq.read_table(tmp_path / "o2").to_pandas()
    assert (df.requests_served == 8).all() and (df.concurrency == 2).all()


def test_calibration_field_is_the_profile_serve_uses(tmp_path):
    """A serve point's `calibration` field selects the profile as `serve --calibration` does:
    first-principles SN40L values (none) decode faster than the shipped fit on the same trace."""
    rows = {}
    for profile in ("none", "default"):
        spec = load_spec(write(tmp_path, SMALL + f'calibration = "{profile}"\n'))
        rows[profile] = run_serve(expand(spec).points, spec.seed).table.to_pylist()[0]
    assert rows["none"]["tpot_p50_s"] < rows["default"]["tpot_p50_s"]


def test_every_serve_row_column_is_in_docs_sweeps_md():
    """docs/sweeps.md names every column of a serve row (request_throughput, the ITL and peak
    concurrency figures, the KV hand-over and the prefix-cache columns were written and not
    named); `cluster` and `model` are the partition folders."""
    import re

    doc = (Path(__file__).parents[2] / "docs" / "sweeps.md").read_text()
    sec = doc[doc.index("A `serve` row"):doc.index("A task is committed")]
    names = set(re.findall(r"[a-z][a-z0-9_]*", sec))
    names |= {m.group(1) + q + "_s" for m in re.finditer(r"`([a-z0-9]+_p)\*_s`", sec)
              for q in ("50", "90", "99")}
    missing = [c for c in SERVE_SCHEMA.names if c not in names | {"cluster", "model"}]
    assert missing == []


def test_a_static_scheduler_with_chunked_prefill_names_the_field(tmp_path):
    """A limit the static scheduler cannot honour is refused in a sweep too, naming its field
    (the scheduler check had named every limit error base.scheduler)."""
    spec = write(tmp_path, SMALL.replace('[base]\n', '[base]\nscheduler = "static"\n'
                                         'chunked_prefill = true\n', 1))
    r = CliRunner().invoke(main, ["sweep", str(spec), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "base.chunked_prefill: not with --scheduler static" in r.output


def test_a_prefix_block_without_a_prefix_cache_is_refused(tmp_path):
    """prefix_block with prefix_cache = "off" sized no cache: refused, as serve refuses it."""
    spec = write(tmp_path, SMALL.replace('[base]\n', '[base]\nprefix_cache = "off"\n'
                                         'prefix_block = 32\n', 1))
    r = CliRunner().invoke(main, ["sweep", str(spec), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "base.prefix_block: not with --prefix-cache off" in r.output


def test_serve_and_serve_sweeps_take_the_engines_defaults():
    """Each serving default is written once (the engine's Limits / ServeConfig / PrefixConfig,
    workloads' trace and session defaults): `rdu-cluster serve` and a serve sweep's point
    that sets nothing run the engine's configuration."""
    from rdu_cluster.cli.serve import serve
    from rdu_cluster.engine.prefix_cache import PrefixConfig
    from rdu_cluster.engine.simulation import ServeConfig
    from rdu_cluster.sweep.runners import serve as serve_runner
    from workloads import sessions, traces

    engine = ServeConfig()
    fields = serve_runner.serve_fields()
    point = {n: f.default for n, f in fields.items() if f.default is not None}
    from rdu_cluster.config import load_cluster

    config = serve_runner._serve_config(point, load_cluster("sn40l-8").chip, 0)
    assert (config.limits, config.scheduler, config.kv_memory_fraction, config.routing,
            config.prefix) == (engine.limits, engine.scheduler, engine.kv_memory_fraction,
                               engine.routing, PrefixConfig())
    cli = {p.name: p.default for p in serve.params}
    # the policy, the most sequences a replica runs, the tokens a step takes and the chunking:
    # unset in both, the engine's for the chip and stack (schedulers.engine_defaults:
    # test_a_gpu_runs_its_stacks_cap_where_no_max_batch_is_given)
    assert cli["max_batch"] is None and "max_batch" not in point
    assert cli["token_budget"] is None and "token_budget" not in point
    assert cli["chunked_prefill"] is None and "chunked_prefill" not in point
    assert cli["scheduler"] is None and "scheduler" not in point  # scheduler_for's
    expected = {
        "preemption": engine.limits.preemption,
        "kv_fraction": engine.kv_memory_fraction, "routing": engine.routing,
        "prefix_eviction": PrefixConfig().eviction, "arrival": traces.ARRIVAL,
        "burstiness": traces.BURSTINESS, "prompt_len": traces.PROMPT_LEN,
        "output_len": traces.OUTPUT_LEN, "system_prompt": sessions.SYSTEM_TOKENS,
        "think_time": sessions.THINK_TIME}
    assert {k: cli[k] for k in expected} == expected
    assert {k: point[k] for k in expected if k in point} == {
        k: v for k, v in expected.items() if k in point}
    assert not engine.limits.chunked_prefill  # an RDU's, and every stack's but vllm's, eager's
    assert sessions.SessionSpec(1, 1).think == sessions.ThinkTime.parse(sessions.THINK_TIME)
    assert fields["fabric"].default == {p.name: p.default for p in serve.params}["fabric"]
