"""`rdu-cluster serve`: simulate serving a request trace on a cluster, on the local or Ray
backend; writes requests / steps / sockets / links tables (Parquet) and prints a summary."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import click

from chip import serving_stacks
from partitioning.cluster import ClusterSpec
from rdu_cluster.backends import BACKENDS
from rdu_cluster.backends import make as make_backend
from rdu_cluster.cli import options as o
from rdu_cluster.cli import workload
from rdu_cluster.cli.options import (
    TRACE_HELP,
    calibration_option,
    hardware_options,
    session_options,
    speculative_options,
)
from rdu_cluster.config import DEFAULT_FABRIC, MAX_SOCKETS, FabricSpec, load_cluster, load_fabric
from rdu_cluster.engine import bench, disagg, evictions, replica_routing, schedulers
from rdu_cluster.engine.faults import Fault
from rdu_cluster.engine.prefix_cache import MODES, PrefixConfig
from rdu_cluster.engine.simulation import ServeConfig, Simulation, Tables
from rdu_cluster.output import atomic
from rdu_cluster.output.progress import Progress
from rdu_cluster.output.report import banded
from rdu_cluster.output.timeline import Timeline
from rdu_cluster.scenarios import coe, speculative
from rdu_cluster.validation import calibration, uncertainty
from workloads import checks, traces
from workloads.catalog import load_model
from workloads.errors import ConfigError
from workloads.spec import ModelSpec, with_dtypes

TABLES = ("requests", "steps", "sockets", "links")
SUMMARY = "summary.json"
OWNED = (*(f"{name}.parquet" for name in TABLES), SUMMARY)  # what an earlier serve left in --out


@click.command(cls=o.SpreadValues)
@calibration_option
@click.option("--model", "model_ref", default="llama-3.1-70b", show_default=True,
              help="Catalog name or path to a HuggingFace config.json.")
@click.option("--cluster", "cluster_ref", default="sn40l-16", show_default=True,
              help="Cluster name or TOML path.")
@click.option("--plan", default=None, help="tp16, tp2ep8, tp4pp4, ... [default: tp over all sockets]")
@click.option("--trace", "trace_path", default=None,
              help=TRACE_HELP + " With --rate: its arrivals rescaled to that mean rate; with "
              "--requests: its first N.")
@click.option("--requests", "n_requests", default=None, type=o.REQUESTS,
              help="Synthetic trace: number of requests.")
@click.option("--rate", default=None, type=o.Finite(0.0, lo_open=True, allow_inf=True),
              help="Synthetic trace: requests per second ('inf': all at 0), needed with --requests "
              "unless --concurrency is given; with --trace, its arrivals rescaled to this mean "
              "rate; with --sessions, session starts per second [default: inf with "
              "--concurrency or --sessions].")
@session_options
@click.option("--prefix-cache", default=None, type=click.Choice(MODES),
              help="Prefix caching: off, in HBM, or tiered (spilled to DDR / host memory) "
              "[default: tiered on an RDU (its DDR), hbm on a GPU, as its stacks run].")
@click.option("--prefix-block", default=None, type=click.IntRange(max=traces.MAX_LENGTH),
              help="Tokens per prefix-cache block, 16 or more [default: the KV block, 16].")
@click.option("--prefix-eviction", default=evictions.DEFAULT, show_default=True,
              help=f"Prefix-cache eviction policy: {', '.join(evictions.names())}.")
@click.option("--arrival", type=click.Choice(traces.ARRIVALS), default=traces.ARRIVAL,
              show_default=True)
@click.option("--burstiness", default=traces.BURSTINESS, show_default=True,
              type=o.Finite(0.0, 1e3, lo_open=True),
              help="Coefficient of variation of bursty gaps (vLLM's --burstiness is the gamma "
                   "shape, 1 / CV^2: summary.json gives that).")
@click.option("--prompt-len", default=traces.PROMPT_LEN, show_default=True,
              help="N, uniform:LO:HI or lognormal:MEAN:SIGMA.")
@click.option("--output-len", default=traces.OUTPUT_LEN, show_default=True,
              help="As --prompt-len.")
@click.option("--seed", default=0, show_default=True, type=o.SEED)
@click.option("--scheduler", default=None,
              help=f"Scheduler policy: {', '.join(schedulers.names())} [default: the GPU "
              "stack's own: guaranteed-no-evict under tensorrt-llm, else "
              f"{schedulers.DEFAULT}; with pools, the decode pool's; coe with --coe-experts].")
@click.option("--max-batch", default=None, type=o.BATCH,
              help="Sequences a replica runs at once [default: a GPU's stack's own cap: "
              "sglang 4096, vllm 1024 on an H100/H200 (else 256), tensorrt-llm 2048, eager 128; "
              f"an RDU or a CoE run {schedulers.Limits.max_batch}; with pools, the decode "
              "pool's].")
@click.option("--token-budget", default=None, type=o.TOKENS,
              help="New tokens a step takes [default: a GPU's stack's own: sglang's "
              "chunked_prefill_size (8192 on an H100/H200), vllm's max_num_batched_tokens (8192 "
              f"on an H100/H200, else 2048), tensorrt-llm 8192; an RDU "
              f"{schedulers.Limits.token_budget}; with pools, the prefill pool's].")
@click.option("--chunked-prefill/--no-chunked-prefill", default=None,
              help="Prompt chunks batched beside the decodes (Sarathi-Serve) [default: as the "
              "GPU stack's scheduler: vllm and eager chunk, sglang and tensorrt-llm do not; an "
              "RDU or a CoE run not; with pools, the prefill pool's].")
@click.option("--preemption", type=click.Choice(schedulers.PREEMPTION),
              default=schedulers.Limits.preemption,
              show_default=True)
@click.option("--kv-fraction", default=None, type=o.FRACTION,
              help="The KV cache's share of what the weights, the activation workspace and the "
              "runtime's fixed parts leave (TensorRT-LLM's free_gpu_memory_fraction meaning, "
              "whatever the stack) [default: the stack's own rule: vLLM 0.9 of the whole HBM, "
              "SGLang its mem_fraction_static estimate, TensorRT-LLM 0.9 of what is left; an "
              "RDU: all that is left; chip/runtime_memory.py].")
@click.option("--fault", "faults", multiple=True,
              help="socket:N@T[:degraded:F] or link:A-B@T[:degraded:F]; repeatable.")
@click.option("--backend", "backend_name", type=click.Choice(BACKENDS), default="local",
              show_default=True)
@click.option("--address", default=None,
              help="Ray address ('auto': join a running cluster) [default: start one].")
@click.option("--out", "out_dir", required=True, help="Output folder (created if missing).")
@click.option("--no-progress", is_flag=True,
              help="No progress on stderr (a bar on a terminal, a line every few seconds "
              "otherwise).")
@click.option("--timeline", "timeline_path", default=None,
              help="Also write the run as Chrome/Perfetto trace-event JSON to this file (open it "
              "in ui.perfetto.dev): a track per socket and per link, a slice per step.")
@click.option("--coe-experts", default=None, type=o.EXPERTS,
              help="Composition of Experts: N copies of --model (default llama-2-7b) behind a "
              "router (rdu_cluster/scenarios/coe.py).")
@click.option("--coe-router", default="llama-2-7b", show_default=True)
@click.option("--coe-distribution", default="uniform", show_default=True,
              help="Request-to-expert: uniform, zipf:S, or trace (its model column).")
@click.option("--coe-policy", default="lru", show_default=True, type=click.Choice(("lru", "lfu")))
@click.option("--coe-hbm-slots", default=None, type=click.IntRange(1, o.MAX_EXPERTS),
              help="Experts HBM may hold [default: as many as fit].")
@speculative_options(speculative.PLACEMENTS)
@click.option("--concurrency", default=None, type=click.IntRange(max=o.MAX_CONCURRENCY),
              help="Closed loop: N clients, each sending its next request when its last one "
              "finishes (vLLM's --max-concurrency); with --rate, no request before its arrival.")
@click.option("--routing", default=replica_routing.DEFAULT, show_default=True,
              help=f"Replica routing policy: {', '.join(replica_routing.names())}.")
@o.dtype_options
@click.option("--metric-percentiles", default=bench.PERCENTILES_TEXT, show_default=True,
              help="Percentiles of TTFT, TPOT, ITL and E2EL in the summary (vLLM's option).")
@click.option("--goodput", multiple=True,
              help="KEY:MS bounds (ttft, tpot, e2el; vLLM's --goodput): request_goodput counts "
              "the requests meeting all of them. As vLLM takes them (--goodput ttft:500 "
              "tpot:50), repeated, or in one quoted word.")
@click.option("--warmup-requests", default=0, show_default=True, type=click.IntRange(0),
              help="The first N requests sent are warm-up (a closed loop's ramp): left out of "
              "every statistic, the duration from the first one measured (as vllm bench serve "
              "--num-warmups keeps its warm-up requests out).")
@click.option("--warmup-mser", is_flag=True,
              help="Also leave out the initial transient after them, as long as the MSER-5 "
              "rule puts it (White 1997: the cut minimizing the marginal standard error of the "
              "TTFT and TPOT means, within the first half); the summary says how many "
              "(warmup_requests). What capacity verifies closed loops with.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the summary as one JSON object with vllm bench serve's key names.")
@click.option("--replicas", default=None, type=click.IntRange(1, MAX_SOCKETS),
              help="N replicas of --plan on --cluster's chip and node network (nodes added as "
              "needed, joined by --fabric) [default: as many as the cluster holds].")
@click.option("--ramp-up", default=0.0, show_default=True,
              type=o.Finite(0.0, checks.MAX_SECONDS),
              help="With --concurrency (or --sessions without --rate): the clients (sessions) "
              "start one after another over this many seconds (client i at i x S / N) instead "
              "of all at 0.")
@click.option("--prefill-pool", default=None,
              help="Disaggregated serving: CLUSTER:PLAN:N prefill replicas (with --decode-pool).")
@click.option("--decode-pool", default=None,
              help="Disaggregated serving: CLUSTER:PLAN:M decode replicas (with --prefill-pool).")
@click.option("--fabric", default=DEFAULT_FABRIC, show_default=True,
              help="Inter-node fabric for the KV hand-over (cluster_configs/fabrics/).")
@o.stack_option
@hardware_options
def serve(model_ref, cluster_ref, plan, trace_path, n_requests, rate, arrival, burstiness,
          prompt_len, output_len, seed, scheduler, max_batch, token_budget, chunked_prefill,
          preemption, kv_fraction, faults, backend_name, address, out_dir, coe_experts,
          coe_router, coe_distribution, coe_policy, coe_hbm_slots, draft, spec_k, tree,
          placement, draft_sockets, concurrency, routing, weights_dtype, kv_dtype,
          metric_percentiles, goodput, as_json, replicas, ramp_up, prefill_pool, decode_pool,
          fabric, acceptance, no_progress, timeline_path, overrides, n_sessions, turns,
          system_prompt, think_time, prefix_cache, prefix_block, prefix_eviction,
          stack_name, warmup_requests, warmup_mser) -> None:
    """Simulate serving a request trace on a cluster."""
    ctx = click.get_current_context()
    _check_unused(ctx, trace_path, n_sessions, arrival, prefill_pool or decode_pool, replicas)
    o.check_not_inputs(timeline_path, "--timeline", [
        ("--trace", trace_path), ("--model", model_ref), ("--draft", draft),
        ("--coe-router", coe_router), ("--cluster", cluster_ref), ("--fabric", fabric)])
    if concurrency is not None and rate is None and trace_path is None:
        rate = math.inf  # closed loop: every request is ready, the clients pace them
    work = _Workload(trace_path, n_requests, n_sessions, turns, rate, arrival, burstiness,
                     prompt_len, output_len, system_prompt, think_time, seed)
    trace = _ramped(work.trace(), concurrency, ramp_up, rate)
    bench_spec = _metrics(metric_percentiles, goodput, warmup_requests, warmup_mser, len(trace))
    model_ref, scheduler = _coe_defaults(ctx, coe_experts, model_ref, scheduler)
    model = with_dtypes(load_model(model_ref), weights_dtype, kv_dtype)
    cluster = _cluster(cluster_ref, overrides, replicas, plan, model, fabric)
    scenario = _coe(coe_experts, model, coe_router, coe_distribution, coe_policy, coe_hbm_slots)
    pools = _pools(prefill_pool, decode_pool, fabric, ctx, overrides)
    deployed = _Deployment.of(model, cluster, pools, stack_name)
    scheduler, limits = schedulers.engine_defaults(
        *deployed.engines(), scheduler=scheduler, max_batch=max_batch,
        token_budget=token_budget, chunked_prefill=chunked_prefill, preemption=preemption,
        coe=scenario is not None)
    config = ServeConfig(plan=plan, scheduler=scheduler, limits=limits, seed=seed,
                         kv_memory_fraction=kv_fraction, faults=tuple(faults), coe=scenario,
                         draft=draft, draft_placement=placement, draft_sockets=draft_sockets,
                         metrics=bench_spec, routing=routing, concurrency=concurrency,
                         prefix=PrefixConfig(prefix_cache, prefix_block, prefix_eviction),
                         options=None if pools else deployed.options)
    config = _with_speculation(config, deployed, trace, spec_k, acceptance, tree)
    _check_start(config, deployed, backend_name, address)
    stream = atomic.TableFolder(out_dir, OWNED)  # --out checked; nothing made yet
    timeline = _timeline(timeline_path, out_dir)
    context = _context(deployed, config, work, backend_name, trace)
    if _in_step(trace, concurrency, ramp_up):
        click.echo(IN_STEP_NOTE.format(n=concurrency), err=True)
    started = time.perf_counter()
    with Progress(len(trace), "requests", "serve", enabled=not no_progress) as bar:
        sim = _simulation(deployed, trace, config, backend_name, address, bar.set_done)
        tables, doc, events = _run(sim, stream, timeline, context, streamed=not pools)
    if timeline is not None:
        click.echo(f"timeline: {timeline_path} ({events:,} trace events; open in "
                   "ui.perfetto.dev)", err=True)
    _print(tables, doc, dict(sim.wall, total_s=time.perf_counter() - started), context, as_json)


@dataclasses.dataclass(frozen=True)
class _Workload:
    """The trace's options: a trace file, the synthetic requests or the multi-turn sessions
    (rate: --rate, or inf for --concurrency's closed loop without one)."""

    trace_path: str | None
    n_requests: int | None
    n_sessions: int | None
    turns: int | None
    rate: float | None
    arrival: str
    burstiness: float
    prompt_len: str
    output_len: str
    system_prompt: int
    think_time: str
    seed: int

    def trace(self) -> traces.Trace:
        """--sessions/--turns' sessions, else --trace's file or the synthetic --requests."""
        if self.n_sessions is not None or self.turns is not None:
            return workload.session_trace(
                self.trace_path, self.n_requests, self.n_sessions, self.turns, self.rate,
                self.arrival, self.prompt_len, self.output_len, self.system_prompt,
                self.think_time, self.seed)
        return workload.trace(self.trace_path, self.n_requests, self.rate, self.arrival,
                              self.burstiness, self.prompt_len, self.output_len, self.seed)


def _metrics(percentiles: str, goodput: tuple[str, ...], warmup: int, mser: bool,
             n: int) -> bench.MetricSpec:
    """The summary's statistics (--metric-percentiles, --goodput) and the warm-up left out of
    them (--warmup-requests of the trace's n requests, --warmup-mser)."""
    # one word may hold several bounds: --goodput "ttft:500 tpot:50" (o.SpreadValues takes
    # vLLM's --goodput ttft:500 tpot:50 as two); an empty one names no bound: refused
    spec = bench.MetricSpec.parse(percentiles,
                                  [g for item in goodput for g in item.split() or [item]])
    if warmup >= n:
        raise ConfigError(f"--warmup-requests: {warmup} leaves none of the {n} requests "
                          "measured")
    return dataclasses.replace(spec, warmup=warmup, mser=mser)


def _coe(experts: int | None, model: ModelSpec, router: str, distribution: str, policy: str,
         hbm_slots: int | None) -> coe.CoEScenario | None:
    """--coe-experts copies of the model behind --coe-router; None without --coe-experts."""
    if experts is None:
        return None
    return coe.CoEScenario.copies(experts, model.name, router,
                                  popularity=coe.Popularity.parse(distribution),
                                  hbm_slots=hbm_slots, policy=policy)


@dataclasses.dataclass(frozen=True)
class _Deployment:
    """What serves the trace: the model on the cluster, or on the prefill and decode pools
    (pools: with the fabric between them), and the execution options and stack it runs."""

    model: ModelSpec
    cluster: ClusterSpec
    pools: tuple[disagg.Pool, disagg.Pool, FabricSpec] | None
    options: Any  # the run's execution options; with pools, each pool's (prefill, decode)
    stack: str | None

    @classmethod
    def of(cls, model: ModelSpec, cluster: ClusterSpec,
           pools: tuple[disagg.Pool, disagg.Pool, FabricSpec] | None,
           stack_name: str | None) -> _Deployment:
        options, stack = _stack(stack_name, [pools[0], pools[1]] if pools else [], cluster, model)
        return cls(model, cluster, pools, options, stack)

    def engines(self) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
        """The (chip, execution options) of the replicas that prefill and of those that decode:
        the cluster's twice, or each pool's (schedulers.engine_defaults)."""
        if not self.pools:
            return (self.cluster.chip, self.options), (self.cluster.chip, self.options)
        pre, dec, fabric = self.pools
        return ((pre.spec(self.model, fabric).chip, self.options[0]),
                (dec.spec(self.model, fabric).chip, self.options[1]))

    @property
    def name(self) -> str:
        """The deployment as the summary names it (its `cluster`)."""
        pools = self.pools
        return f"{pools[0]} -> {pools[1]} over {pools[2].name}" if pools else self.cluster.name


def _with_speculation(config: ServeConfig, deployed: _Deployment, trace: traces.Trace,
                      spec_k: int | None, acceptance: str | None,
                      tree: str | None) -> ServeConfig:
    """The config with --draft's speculation (workload.speculation: k by default the fastest
    for the trace's lengths, --max-batch, the placement and the deployment's execution
    options); not beside a CoE."""
    cluster, plan, options = deployed.cluster, config.plan, config.options
    if deployed.pools:  # the decode pool drafts and verifies: k is chosen on it
        pool = deployed.pools[1]
        cluster, plan = pool.spec(deployed.model, deployed.pools[2]), pool.plan
        options = deployed.options[1]
    speculation = workload.speculation(
        deployed.model, cluster, trace, config.draft, spec_k, acceptance,
        config.limits.max_batch, tree, config.draft_placement, config.draft_sockets, plan,
        options)
    if config.coe is not None and speculation is not None:
        raise ConfigError("--draft: not with --coe-experts")
    return dataclasses.replace(config, speculation=speculation)


def _check_start(config: ServeConfig, deployed: _Deployment, backend_name: str,
                 address: str | None) -> None:
    """The scheduler and its limits, the faults and --address: a bad one refused before the
    run starts."""
    # bad names and limits fail before anything starts
    schedulers.get(config.scheduler, config.limits)
    if not deployed.pools:  # before a backend starts (Ray takes seconds)
        for text in config.faults:
            Fault.parse(text, deployed.cluster)
    if backend_name == "local" and address:
        raise ConfigError("--address: only with --backend ray")


def _context(deployed: _Deployment, config: ServeConfig, work: _Workload, backend_name: str,
             trace: traces.Trace) -> dict:
    """The run's context in its summary (bench_json): what ran, where and on what traffic."""
    pools = deployed.pools
    return {"model": deployed.model.name, "cluster": deployed.name, "plan": config.plan,
            "stack": deployed.stack, "backend": backend_name,
            "routing": config.routing, "num_prompts": len(trace), "request_rate": work.rate,
            "burstiness": _vllm_burstiness(work.trace_path, work.arrival, work.burstiness),
            "max_concurrency": config.concurrency, "max_batch": config.limits.max_batch,
            "token_budget": config.limits.token_budget,
            "chunked_prefill": config.limits.chunked_prefill, "scheduler": config.scheduler,
            "calibration": calibration.label(
                [load_cluster(p.cluster) for p in pools[:2]] if pools else [deployed.cluster])}


def _simulation(deployed: _Deployment, trace: traces.Trace, config: ServeConfig,
                backend_name: str, address: str | None,
                progress) -> disagg.Disaggregated | Simulation:
    """The run of the trace on the deployment: on its pools when disaggregated."""
    backend = lambda: make_backend(  # started once the inputs are checked
        backend_name, **({"address": address} if backend_name == "ray" else {}))
    if deployed.pools:
        return disagg.Disaggregated(deployed.model, *deployed.pools, trace, config, backend,
                                    progress=progress,
                                    options=deployed.options)
    return Simulation(deployed.model, deployed.cluster, trace, config, backend,
                      progress=progress)


def _print(tables: Tables, doc: dict, wall: dict, context: dict, as_json: bool) -> None:
    """The summary on stdout, as one JSON object (bench_json's) or as text; an overloaded
    run's warning on stderr before it."""
    if tables.summary["overloaded"]:
        click.echo(OVERLOAD_WARNING, err=True)
    if as_json:
        click.echo(json.dumps(doc))
    else:
        stack = context["stack"]
        click.echo(format_summary(tables, wall, context["backend"], context["model"],
                                  context["cluster"] + (f", stack {stack}" if stack else "")
                                  + f", max batch {context['max_batch']}"
                                  + (", chunked prefill" if context["chunked_prefill"] else ""),
                                  doc))
        click.echo(f"  calibration: {context['calibration']}")


def _stack(name: str | None, pools: list, cluster, model) -> tuple:
    """(execution options, stack name) of the run: --stack (or the default) on a GPU cluster;
    with pools, each pool's (serving_stacks.pool_options: the stack on a GPU pool, an RDU
    pool's own beside it), which the summary's stack names."""
    if not pools:
        options = serving_stacks.options_for(cluster.chip, name, system=cluster.name)
        return (options if name else None), serving_stacks.stack_of(cluster.chip, options)
    chips = [(load_cluster(p.cluster).chip, str(p)) for p in pools]
    per_pool = serving_stacks.pool_options(chips, name)
    stacks = {serving_stacks.stack_of(c, o) for (c, _), o in zip(chips, per_pool)} - {None}
    return tuple(per_pool), (stacks.pop() if stacks else None)


def _coe_defaults(ctx: click.Context, coe_experts: int | None, model_ref: str,
                  scheduler: str | None) -> tuple[str, str | None]:
    """A CoE run's model and scheduler where not given ([MICRO24]'s experts, the coe policy);
    the --coe-* options refused without --coe-experts."""
    if coe_experts is None:
        given = [f"--{n.replace('_', '-')}" for n in ("coe_router", "coe_distribution",
                 "coe_policy", "coe_hbm_slots") if o.given(ctx, n)]
        if given:
            raise ConfigError(f"{'/'.join(given)}: only with --coe-experts")
        return model_ref, scheduler
    return (model_ref if o.given(ctx, "model_ref") else coe.DEFAULT_EXPERT,
            scheduler if o.given(ctx, "scheduler") else "coe")


def _cluster(ref: str, overrides, replicas: int | None, plan: str | None, model,
             fabric: str):
    """--cluster with --set/--sockets; with --replicas, that many replicas of --plan on its
    chip and node network (disagg.Pool)."""
    cluster = load_cluster(ref, overrides)
    if replicas is None:
        return cluster
    if plan is None:
        raise ConfigError("--replicas: give the replica's --plan too")
    return disagg.Pool(ref, plan, replicas, _pool_overrides(overrides, "--replicas")).spec(
        model, load_fabric(fabric))


def _pool_overrides(overrides: dict, flag: str) -> tuple:
    """--set applied to a pool's cluster (--sockets: the pool's replicas give them)."""
    if "sockets" in overrides:
        raise ConfigError(f"--sockets/--set sockets: not with {flag} (its replicas set the "
                          "sockets)")
    return tuple(sorted(overrides.items()))


def _run(sim, stream: atomic.TableFolder, timeline: Timeline | None, context: dict,
         streamed: bool) -> tuple[Tables, dict, int]:
    """Run and write the result set: created at the run's first rows (steps and sockets rows
    are streamed into it), swapped in whole at the end, removed on an error or interruption;
    the timeline's events likewise go to its file as they are made, which appears after the
    tables (a failure before leaves --out and the timeline's file as they were). A
    disaggregated run joins two runs' tables: those are not streamed. Returns the tables, the
    summary and the timeline's event count."""
    events = 0
    with stream, (timeline.file if timeline is not None else contextlib.nullcontext()):
        if timeline is not None:
            sim.observers.append(timeline)
        tables = sim.run(sink=stream.write) if streamed else sim.run()
        plan = (sim.metadata()["plan"] if tables.requests is None  # streamed
                else tables.requests.schema.metadata[b"rdu_cluster.plan"].decode())
        doc = bench_json(tables.summary, **{**context, "plan": plan})  # the plan run
        doc.update(_intervals(sim, doc))
        if timeline is not None:
            events = timeline.finish()
        stream.commit({name: getattr(tables, name) for name in TABLES}, doc, SUMMARY)
        if timeline is not None:
            timeline.commit()
    return tables, doc, events


def _intervals(sim, doc: dict) -> dict:
    """The summary's figures with their intervals (rdu_cluster/validation/uncertainty.py): a
    disaggregated run's from the pool that sets each (uncertainty.pool_of)."""
    if hasattr(sim, "clusters"):
        return uncertainty.serving_columns(doc, chip=None, stack=None,
                                           pools=uncertainty.pools_of(sim.clusters,
                                                                      sim.pool_options))
    return uncertainty.serving_columns(doc, chip=sim.cluster.chip, stack=doc.get("stack"))


IN_STEP_NOTE = ("note: {n} clients of identical requests started at once stay in step (nothing "
                "in the run disperses them), so its percentiles are those of waves of "
                "requests; --ramp-up S starts client i at i x S / N (capacity spreads them over "
                "one request's cycle)")
OVERLOAD_WARNING = ("warning: overloaded: the queue of requests waiting for admission grew "
                    "through the run (arrivals outpace service; latencies depend on the run's "
                    "length)")


def bench_json(summary: dict, **context) -> dict:
    """The summary as one object with vllm bench serve's key names (engine/bench.py), beside
    the run's context (vLLM's model_id, num_prompts, request_rate, burstiness,
    max_concurrency) and the simulator's own figures."""
    rate = context.pop("request_rate")
    return {
        "model_id": context.pop("model"), **context,
        "request_rate": "inf" if rate is None or math.isinf(rate) else rate,
        **summary["bench"],
        "failed": summary["unserved"], "overloaded": summary["overloaded"],
        "preemptions": summary["preemptions"], "swaps": summary["swaps"],
        **{k: summary[k] for k in ("energy_j", "joules_per_token", "power_w", "cost_usd",
                                   "cost_per_million_tokens_usd") if k in summary},
        **{k: summary[k] for k in ("prefix_cache", "prefix_cache_hit_rate",
                                   "prefix_cache_hit_rate_by_tier", "prefix_copy_s")},
    }


def _vllm_burstiness(trace_path: str | None, arrival: str, cv: float) -> float | str | None:
    """The arrivals as vLLM's `burstiness`: the shape of its gamma gaps (vllm/benchmarks/
    serve.py, get_request: gamma(shape=burstiness, scale=1 / (rate x burstiness)), coefficient
    of variation 1 / sqrt(shape)), where --burstiness here is the coefficient of variation:
    1 / cv^2 for bursty gaps, 1 for Poisson, 'inf' for fixed gaps (vLLM's constant-delay
    limit, written as it writes an infinite request_rate), None for a trace file's own times."""
    if trace_path is not None:
        return None
    if arrival == "fixed":
        return "inf"
    return 1.0 / cv**2 if arrival == "bursty" else 1.0


def _ramped(trace: traces.Trace, concurrency: int | None, ramp_up: float,
            rate: float | None) -> traces.Trace:
    """Closed loops started over ramp_up seconds (traces.ramped): --concurrency's clients, or
    --sessions' sessions where no --rate sets their starts."""
    sessions = trace.session is not None
    if ramp_up and not (concurrency is not None or (sessions and rate is None)):
        raise ConfigError(f"--ramp-up: a non-negative number of seconds with --concurrency or "
                          f"--sessions (without --rate), got {ramp_up}")
    return traces.ramped(trace, ramp_up, concurrency)


def _in_step(trace: traces.Trace, concurrency: int | None, ramp_up: float) -> bool:
    """Whether --concurrency's clients start at once and every request is alike: nothing in
    the run then disperses them, and they stay in step however long it runs (docs/capacity.md,
    "Ramp": p99 TTFT 4,842 ms at 16,000 requests where the same clients over a ramp of one
    cycle gave 88 ms)."""
    looped = concurrency is not None and 0 < concurrency < len(trace)  # clients send again
    if not looped or ramp_up or trace.session is not None:
        return False
    alike = lambda col: bool((col == col[0]).all())
    return all(alike(c) for c in (trace.arrival_s[:concurrency], trace.prompt_len,
                                  trace.output_len))


def _check_unused(ctx: click.Context, trace_path: str | None, n_sessions: int | None,
                  arrival: str, pools: str | None, replicas: int | None) -> None:
    """Options given that would have no effect are refused (workload.check_unused): the
    fabric joins pools or replicas only."""
    workload.check_unused(o.given(ctx, "prompt_len", "output_len", "arrival", "burstiness",
                                  "think_time", "system_prompt"),
                          trace_path is not None, n_sessions is not None, arrival)
    rate = ctx.params["rate"]
    if (trace_path is None and o.given(ctx, "arrival") and (rate is None or math.isinf(rate))
            and (n_sessions is not None or ctx.params["concurrency"] is not None
                 or rate is not None)):
        raise ConfigError("--arrival: only with a finite --rate (at rate inf every request "
                          "arrives at 0, whatever the process)")
    if pools and replicas is not None:
        raise ConfigError("--replicas: not with --prefill-pool/--decode-pool (each pool names "
                          "its replicas: CLUSTER:PLAN:N)")
    if ctx.params["prefix_cache"] == "off" and (unused := o.given(ctx, "prefix_block",
                                                                 "prefix_eviction")):
        raise ConfigError(f"{'/'.join(unused)}: not with --prefix-cache off (there is no "
                          "prefix cache to size or evict from)")
    if not (pools or replicas) and o.given(ctx, "fabric"):
        raise ConfigError("--fabric: only with --prefill-pool/--decode-pool or --replicas (it "
                          "joins their nodes)")


def _pools(prefill: str | None, decode: str | None, fabric: str, ctx: click.Context,
           overrides: dict) -> tuple[disagg.Pool, disagg.Pool, FabricSpec] | None:
    """(prefill Pool, decode Pool, FabricSpec), or None for aggregated serving."""
    if prefill is None and decode is None:
        return None
    if prefill is None or decode is None:
        raise ConfigError("--prefill-pool/--decode-pool: give both (or neither: aggregated)")
    changed = _pool_overrides(overrides, "--prefill-pool/--decode-pool")  # both pools'
    for name, flag in (("cluster_ref", "--cluster"), ("plan", "--plan")):
        if o.given(ctx, name):
            raise ConfigError(f"{flag}: not with --prefill-pool/--decode-pool (each pool names "
                              "its cluster and plan)")
    return (dataclasses.replace(disagg.Pool.parse(prefill, "--prefill-pool"), overrides=changed),
            dataclasses.replace(disagg.Pool.parse(decode, "--decode-pool"), overrides=changed),
            load_fabric(fabric))



def _timeline(path: str | None, out_dir: str) -> Timeline | None:
    """--timeline's file, checked; None without one."""
    if path is None:
        return None
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"--timeline {target}: is a folder; give a file name (run.json)")
    if atomic.within(target, out_dir):
        raise ConfigError(f"--timeline {target}: the --out folder or in it (a run replaces the "
                          "folder whole); give a file beside it")
    atomic.check_destination(target, "--timeline")
    return Timeline(target)




def format_summary(tables: Tables, wall: dict, backend: str, model: str, cluster: str,
                   doc: dict | None = None) -> str:
    s = tables.summary
    b = s["bench"]
    lines = [
        (f"{model} on {cluster} ({backend} backend): {s['served']}/{s['requests']} requests "
        f"served, {s['unserved']} unserved, {s['preemptions']} preemptions"
        + (f", {s['swaps']} swapped out" if s["swaps"] else "")),
        *(f"  {name:<4} ms  {_stats_text(b, key)}" for name, key in bench_rows()),
        (f"  throughput {b['request_throughput']:.3g} req/s, {b['output_throughput']:.0f} output "
         f"tokens/s, {b['total_token_throughput']:.0f} total tokens/s over "
         f"{s['makespan_s']:.2f} s simulated; max concurrent requests "
         f"{b['max_concurrent_requests']}"
         + ("" if b["request_goodput"] is None
            else f"; goodput {b['request_goodput']:.3g} req/s")),
        f"  {s['steps']} steps ({s['decode_steps']} decode) in {s['windows']} windows",
        *_extra_lines(s),
        *_energy_line(s),
        *_interval_lines(doc or {}),
        (f"  wall: start-up {wall['start_s']:.2f} s, run {wall['run_s']:.2f} s "
        f"({s['decode_steps'] / max(wall['run_s'], 1e-9):.0f} decode steps/s), "
        f"total {wall['total_s']:.2f} s"),
    ]
    return "\n".join(lines)


def _interval_lines(doc: dict) -> list[str]:
    """The headline figures with their intervals (bench_json's `<key>_low/_high`), and what
    they rest on or why there are none."""
    shown = [(f"{label} {banded(doc[k], doc.get(f'{k}_low'), doc.get(f'{k}_high'), fmt)}")
             for label, k, fmt in (("output tokens/s", "output_throughput", "{:.0f}"),
                                   ("p99 TTFT ms", "p99_ttft_ms", "{:.1f}"),
                                   ("p99 TPOT ms", "p99_tpot_ms", "{:.1f}"))
             if isinstance(doc.get(k), (int, float))]
    if "interval_note" not in doc:
        return []
    return [f"  {'; '.join(shown)}" if shown else "", f"  intervals: {doc['interval_note']}"]


def bench_rows() -> tuple[tuple[str, str], ...]:
    return (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2EL", "e2el"))


def _stats_text(b: dict, key: str) -> str:
    """mean, median and the chosen percentiles of one metric (vLLM's key names, ms)."""
    prefix = [(k.split("_")[0], v) for k, v in b.items()
              if k.endswith(f"_{key}_ms") and not k.startswith("std_")]
    return " ".join(f"{name} {'-' if v is None else f'{v:.1f}'}" for name, v in prefix)


def _extra_lines(s: dict) -> list[str]:
    out = []
    if "pools" in s:
        k = s["kv_transfer_ms"]
        out.append(f"  disaggregated: prefill {s['pools']['prefill']}, decode "
                   f"{s['pools']['decode']}; KV hand-over over {s['pools']['fabric']}: "
                   f"{s['kv_transfer_bytes_mean'] / 1e6:.1f} MB mean, ms "
                   + " ".join(f"p{q} {v:.2f}" for q, v in k.items()))
    if s["tokens_per_decode"] == s["tokens_per_decode"] and s["tokens_per_decode"] != 1.0:
        out.append(f"  speculative: {s['tokens_per_decode']:.3f} tokens per sequence per step "
                   f"({s['speculation']})")
    if s["prefix_cache"] != "off":
        tiers = ", ".join(f"{t} {v:.1%}" for t, v in s["prefix_cache_hit_rate_by_tier"].items())
        out.append(f"  prefix cache {s['prefix_cache']}: hit rate "
                   f"{s['prefix_cache_hit_rate']:.1%} of prompt tokens ({tiers}); "
                   f"{s['prefix_copy_s']:.3f} s copying to HBM")
    if s["switches"]:
        out.append(f"  CoE: {s['switches']} expert switches of "
                   f"{s['switch_s'] / s['switches'] * 1e3:.1f} ms, {s['switch_s']:.2f} s "
                   f"switching; {s['switch_waited']} requests waited for one")
    return out


def _energy_line(s: dict) -> list[str]:
    """Energy (chip/power.py) and cost ([cost] price) of the run; parts not configured are
    left out (engine/energy.py)."""
    parts = []
    if s["energy_j"] is not None:
        text = f"energy {_si(s['energy_j'], 'J')}"
        if s["joules_per_token"] is not None:
            text += f", {s['joules_per_token']:.3g} J/token"
        if s["power_w"] is not None:
            text += f", {_si(s['power_w'], 'W')} mean"
        parts.append(text)
    if s["cost_usd"] is not None:
        text = f"cost USD {s['cost_usd']:.3g}"
        if s["cost_per_million_tokens_usd"] is not None:
            text += f", {s['cost_per_million_tokens_usd']:.3g} per million tokens"
        parts.append(text)
    return [f"  {'; '.join(parts)}"] if parts else []


def _si(value: float, unit: str) -> str:
    """3 significant figures with an SI prefix: 1.23 MJ, 9.9 kW, 456 J."""
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"
