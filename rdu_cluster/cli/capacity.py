"""`rdu-cluster capacity`: the cheapest deployments that serve a traffic within a latency SLO
(rdu_cluster/scenarios/capacity.py): an analytic pre-filter, then serving-engine runs of the
short list. Exit code 1 when nothing meets the SLO (the closest is shown, with its miss)."""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import cast

import click
import numpy as np

from chip import serving_stacks
from partitioning.plan import Plan as PartitionPlan
from partitioning.plan import validate as validate_plan
from rdu_cluster import processes
from rdu_cluster.backends import BACKENDS
from rdu_cluster.backends import make as make_backend
from rdu_cluster.cli import options as o
from rdu_cluster.cli import workload
from rdu_cluster.cli.options import (
    TRACE_HELP,
    calibration_option,
    session_options,
    speculative_options,
)
from rdu_cluster.config import MAX_SOCKETS, cli_overrides, load_cluster, load_fabric
from rdu_cluster.engine import loop
from rdu_cluster.engine.prefix_cache import MODES
from rdu_cluster.output import atomic
from rdu_cluster.scenarios import capacity as cap
from rdu_cluster.scenarios import speculative
from rdu_cluster.validation import calibration
from workloads import checks, traces
from workloads.catalog import load_model
from workloads.errors import ConfigError
from workloads.spec import with_dtypes
from workloads.speculative import Speculation, parse_acceptance, parse_tree

# Each shortlisted deployment is one or more serving-engine runs (seconds each): 100 per system
# is already more than an interactive search waits for, and far more than candidates differ.
MAX_SHORTLIST = 100


@click.command()
@calibration_option
@click.option("--model", "model_ref", required=True, help="Catalog name or config.json path.")
@click.option("--weights", "weights", multiple=True,
              help="Weight dtype(s) to try (fp8, bf16, ...) [default: the model's]; repeatable.")
@click.option("--stack", "stacks", multiple=True,
              help="GPU systems: the serving stack(s) to try (" + ", ".join(serving_stacks.STACKS)
              + f") [default: {serving_stacks.DEFAULT_STACK}]; repeatable. RDU systems take "
              "none (refused when no --cluster is a GPU).")
@click.option("--cluster", "clusters", multiple=True,
              help="A system to consider (a cluster: its chip, node and price); repeatable. "
              "The clusters of a --pair are considered on their own too.")
@click.option("--plan", "plans", multiple=True,
              help="Replica plans to try [default: tp over 1/4, 1/2, 1 and 2 nodes, tpNpp2; "
                   "an MoE model also adpNepN over 1 and 2 nodes].")
@click.option("--max-nodes", default=16, show_default=True, type=click.IntRange(1, MAX_SOCKETS),
              help="Upper bound on the nodes of a deployment (per pool when disaggregated).")
@click.option("--concurrency", default=None, type=click.IntRange(1, o.MAX_CONCURRENCY),
              help="Traffic: N closed-loop users (2 requests each by default, so at most half "
              "the --requests bound).")
@click.option("--rate", default=None, type=float,
              help="Traffic: requests per second (open loop); with --trace, its arrivals "
              "rescaled to this mean rate; with --sessions, session starts per second.")
@click.option("--trace", "trace_path", default=None,
              help="Traffic: a trace replayed as it is (" + TRACE_HELP + ")")
@session_options
@click.option("--prompt-len", default="1024", show_default=True,
              help="N, uniform:LO:HI or lognormal:MEAN:SIGMA.")
@click.option("--output-len", default="256", show_default=True, help="As --prompt-len.")
@click.option("--ramp-up", "ramp_up", default="auto", show_default=True,
              help="Closed loops (--concurrency clients, --sessions without --rate) start one "
              "after another over this many seconds; auto: one estimated cycle (E2E and think "
              "time) of the deployment verified; 0: all at once.")
@click.option("--steady-tolerance", "steady_tol", default=str(cap.STEADY_TOL),
              show_default=True,
              help="Steady state: the row is served again with twice the requests until its "
              "pP TTFT, pP TPOT and throughput move less than this fraction (a pP under its "
              "SLO bound: this fraction of the bound; at most "
              f"{cap.STEADY_DOUBLINGS} times); off: served once at --requests.")
@click.option("--requests", default=None, type=click.IntRange(1, 10**7),
              help="Requests per verification run [default: 2 per user, or 30 s of the rate].")
@click.option("--slo", "slos", multiple=True, required=True,
              help="ttft:MS and/or tpot:MS (a user's tokens/s is 1000 / TPOT ms); repeatable.")
@click.option("--slo-percentile", default=99.0, show_default=True, type=float)
@click.option("--disaggregated", is_flag=True,
              help="Also try prefill / decode pools: every ordered pair of --cluster, or --pair.")
@click.option("--pair", "pairs", multiple=True,
              help="PREFILL_CLUSTER:DECODE_CLUSTER pools to try (implies --disaggregated).")
@click.option("--fabric", default="ib-ndr", show_default=True,
              help="Inter-node fabric (KV hand-over; nodes of a multi-node replica).")
@click.option("--shortlist", default=2, show_default=True,
              type=click.IntRange(1, MAX_SHORTLIST),
              help="Deployments per system verified by the serving engine.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**63 - 1))
@click.option("--prefix-cache", default=None, type=click.Choice(MODES),
              help="As serve --prefix-cache [default: tiered where the chip has a lower tier].")
@click.option("--speculative", "spec_mode", default=None,
              type=click.Choice(("off", "on", "both")),
              help="Speculative decoding as a candidate axis (with --draft) [default: on with "
              "--draft, else off].")
@speculative_options(speculative.PLACEMENTS)
@click.option("--backend", "backend_name", type=click.Choice(BACKENDS), default="local",
              show_default=True,
              help="Where candidates are verified: in this process (local; --jobs N processes) "
              "or each as a Ray task (ray) on --address, $RAY_ADDRESS (ray job submit) or an "
              "instance of its own: the same table either way.")
@click.option("--address", default=None,
              help="With --backend ray: the Ray cluster to join ('auto': a running one).")
@click.option("--jobs", "n_jobs", default=1, show_default=True,
              type=click.IntRange(1, 1024),
              help="With --backend local: candidates verified in this many processes at once.")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="Sensitivity: " + o.SET_HELP + " Applied to every cluster considered (and "
              "carried in serve_args).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row.")
@click.option("--plot", "plot_path", default=None,
              help="Write the Pareto front (tokens/s per user vs per socket) per system: an "
              "interactive .html page (Plotly).")
def capacity(model_ref, weights, clusters, plans, max_nodes, concurrency, rate, prompt_len,
             output_len, requests, slos, slo_percentile, disaggregated, pairs, fabric, shortlist,
             seed, prefix_cache, backend_name, as_json, plot_path, trace_path, n_sessions,
             turns, system_prompt, think_time, spec_mode, draft, spec_k, tree, placement,
             draft_sockets, acceptance, stacks, ramp_up, steady_tol, assignments, address,
             n_jobs) -> None:
    """Find the cheapest deployments that meet a latency SLO for a traffic."""
    started = time.perf_counter()
    # a dtype given twice is one candidate (as a --cluster or --plan given twice is)
    weights = tuple(dict.fromkeys(w.lower() for w in weights))
    stacks = tuple(dict.fromkeys(stacks))
    if rate is not None and not 0 < rate < math.inf:
        raise ConfigError(f"--rate: must be a positive finite number, got {rate}")
    if plot_path and Path(plot_path).suffix != ".html":
        raise ConfigError(f"--plot {plot_path}: expected an .html file name")
    if plot_path:
        atomic.check_destination(plot_path, "--plot")  # before any work
    slo = cap.SLO.parse(slos, slo_percentile)
    traffic = _traffic(concurrency, rate, prompt_len, output_len, requests, seed, prefix_cache,
                       trace_path, n_sessions, turns, system_prompt, think_time)
    traffic = replace(traffic, ramp_s=_ramp(ramp_up, traffic), steady_tol=_tolerance(steady_tol))
    workload.check_unused(o.given(click.get_current_context(), "prompt_len", "output_len",
                                  "think_time", "system_prompt"),
                          trace_path is not None, n_sessions is not None)
    if slo.tpot_ms is not None and traffic.one_token:
        raise ConfigError("--slo tpot: no request of the traffic has more than one output "
                          "token")
    modes = _spec_modes(spec_mode, draft, spec_k, acceptance, tree, placement, draft_sockets)
    traffic = replace(traffic, spec_args=tuple(
        a for flag, v in (("--acceptance", acceptance), ("--tree", tree)) if v is not None
        for a in (flag, v)))
    prompt, gen = traffic.mean_lengths()
    fab = load_fabric(fabric)
    pairs = _pairs(pairs, clusters, disaggregated)
    # a pair adds its rows: its clusters keep (or get) their own
    clusters = tuple(dict.fromkeys([*clusters, *(c for pair in pairs for c in pair)]))
    if not clusters:
        raise ConfigError("--cluster: give at least one system (--cluster NAME or --pair "
                          "PREFILL:DECODE)")
    overrides = tuple(sorted(cli_overrides(assignments).items()))
    if any(k == "sockets" for k, _ in overrides):
        raise ConfigError("--set sockets: not with capacity (the search sets the sockets)")
    _check(model_ref, weights, clusters, plans, fab, traffic, draft, acceptance, tree,
           overrides)
    _check_stacks(stacks, clusters)
    jobs, costs = [], []
    if backend_name == "local" and address:
        raise ConfigError("--address: only with --backend ray")
    asked: list[tuple] = []  # each (w, stack)'s systems: _costs' arguments, costed at once
    for w, stack in [(w, s) for w in weights or (None,) for s in stacks or (None,)]:
        model = with_dtypes(load_model(model_ref), w, None)
        choose = lambda cl, plan, model=model, stack=stack: workload.speculation(
            model, cl, _sample(traffic), draft, spec_k, acceptance, 1, tree, "shared", 1, plan,
            serving_stacks.options_for(cl.chip, stack if cl.chip.kind == "gpu" else None))
        # an RDU system takes no stack: its candidates come once, with the first stack's
        first = stack is None or stack == stacks[0]
        systems = [c for c in clusters if first or _gpu(c)]
        asked.append((w, stack, first, model, {
            (c, on): (model, c, plans, max_nodes, (prompt, gen), fab, draft if on else None,
                      choose, stack if _gpu(c) else None, overrides)
            for c in systems for on in modes}))
    got = iter(_analytic([a for *_, ask in asked for a in ask.values()],
                         n_jobs if backend_name == "local" else 1))
    for w, stack, first, model, ask in asked:
        groups = {key: next(got) for key in ask}
        costs += [(w, c) for cs in groups.values() for c in cs]
        per = {c: cs for (c, on), cs in groups.items() if not on}
        cands = _shortlist(groups.values(), per, _stack_pairs(pairs, stack, first), traffic,
                           slo, max_nodes, prompt, gen, model, fab, shortlist,
                           (stack, overrides))
        jobs += [(dep, model, model_ref, w, traffic, slo, fab, max_nodes) for dep in cands]
    results = cap.ranked([r for r in _verify_all(jobs, backend_name, address, n_jobs)
                          if r is not None])
    wall = time.perf_counter() - started
    if plot_path:
        _plot(costs, Path(plot_path))
    if as_json:
        for r in results:
            click.echo(json.dumps(_record(r, slo)))
    else:
        click.echo(_table(results, slo, traffic, wall))
    if not any(r.meets_slo for r in results):
        # With --json on stderr, so stdout stays JSON lines; without it a run whose candidates
        # all failed the pre-filter printed no row and no word, and exited 1.
        click.echo(_closest(results, slo), err=as_json)
        sys.exit(1)


def _traffic(concurrency, rate, prompt_len, output_len, requests, seed, prefix_cache,
             trace_path, n_sessions, turns, system_prompt, think_time) -> cap.Traffic:
    """Synthetic (--concurrency or --rate), a trace file replayed (its arrivals, or rescaled to
    --rate), or the multi-turn sessions (each session a closed-loop user)."""
    if concurrency is not None and concurrency < 1:
        raise ConfigError(f"--concurrency: must be positive, got {concurrency}")
    base = cap.Traffic(concurrency, rate, prompt_len, output_len, requests, seed, prefix_cache)
    if rate is not None and math.isfinite(rate) and trace_path is None and n_sessions is None:
        traces.check_span(base.n_requests(rate), rate)  # before any candidate is searched
    if n_sessions is not None or turns is not None:
        if concurrency is not None:
            raise ConfigError("--concurrency: not with --sessions (each session is a user)")
        t = workload.session_trace(trace_path, requests, n_sessions, turns, rate, "poisson",
                                   prompt_len, output_len, system_prompt, think_time, seed)
        args = ["--sessions", str(n_sessions), "--turns", str(turns), "--system-prompt",
                str(system_prompt), "--think-time", think_time, "--prompt-len", prompt_len,
                "--output-len", output_len, *(["--rate", repr(rate)] if rate else [])]
        # a sessions trace: each turn has the one it follows and its think time
        after, think_s = cast(np.ndarray, t.after), cast(np.ndarray, t.think_s)
        return replace(base, concurrency=n_sessions, rate=None, trace=t, ramp=rate is None,
                       workload_args=tuple(args), think_s=float(think_s[after >= 0].mean())
                       if (after >= 0).any() else 0.0)
    if trace_path is not None:
        if concurrency is not None:
            raise ConfigError("--concurrency: not with --trace (a trace is replayed open loop, "
                              "at its arrivals or rescaled to --rate)")
        t = workload.file_trace(trace_path, requests, rate)
        own = workload.trace_rate(t)
        if own is None:
            raise ConfigError(f"--trace {trace_path}: its arrivals have no spread (one request "
                              "or all at once), so no arrival rate to plan for")
        args = ["--trace", trace_path, *(["--requests", str(requests)] if requests else []),
                *(["--rate", repr(rate)] if rate else [])]
        return replace(base, rate=own, trace=t, workload_args=tuple(args))
    if (concurrency is None) == (rate is None):
        raise ConfigError("give --concurrency N or --rate R (one of them), --trace FILE or "
                          "--sessions N --turns T")
    return base


def _tolerance(text: str) -> float | None:
    if text == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise ConfigError(f"--steady-tolerance: {text!r}; accepted: a fraction in (0, 1) or off")
    return value


def _ramp(text: str, traffic: cap.Traffic) -> float | None:
    """--ramp-up: seconds, or None for auto (Deployment.ramp_s)."""
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= checks.MAX_SECONDS:
        raise ConfigError(f"--ramp-up: {text!r}; accepted: auto or seconds in [0, "
                          f"{checks.MAX_SECONDS:g}]")
    if value and not traffic.ramps:
        raise ConfigError("--ramp-up: only with --concurrency or --sessions without --rate "
                          "(closed loops that start together)")
    return value


def _check(model_ref, weights, clusters, plans, fab, traffic, draft, acceptance, tree,
           overrides=()) -> None:
    """Refuse up front what the search would otherwise skip in silence (a candidate the engine
    refuses is dropped, so a bad option would read as "nothing meets the SLO"): a draft that
    does not load, an acceptance or tree that does not parse, requests past the model's
    context, a --plan that can run on none of the --cluster systems (the model's shape or the
    cluster's sockets; memory is the search's to judge)."""
    for c in clusters:
        load_cluster(c, dict(overrides))  # a key or value --set gets wrong: one line, here
    model = load_model(model_ref)
    for w in weights:
        with_dtypes(model, w, None)
    workload.check_draft(draft, model, _sample(traffic))
    if acceptance is not None:
        parse_acceptance(acceptance)
    parse_tree(tree)
    traces.check_fits(_sample(traffic), model.max_context, model.name)
    for plan in plans:
        errors = []
        for c in clusters:
            try:
                validate_plan(PartitionPlan.parse(plan), model, cap.Pool(c, plan, 1,
                                                                         overrides).spec(
                    model, fab).sockets)
            except ConfigError as e:
                errors.append(f"{c}: {e}")
        if len(errors) == len(clusters):
            raise ConfigError(f"--plan {plan}: fits none of the clusters ({'; '.join(errors)})")


def _sample(traffic: cap.Traffic) -> traces.Trace:
    """The traffic's requests (serve's default k is chosen at their mean lengths)."""
    if traffic.trace is not None:
        return traffic.trace
    return traces.synthetic(512, math.inf, "poisson", *traffic.dists(), seed=traffic.seed)


def _spec_modes(mode, draft, spec_k, acceptance, tree, placement, draft_sockets) -> tuple:
    """The speculative axis: (False,), (True,) or (False, True)."""
    mode = mode or ("on" if draft else "off")
    if draft is None:
        if mode != "off":
            raise ConfigError(f"--speculative {mode}: give --draft MODEL")
        workload.speculation(None, None, None, None, spec_k, acceptance, 1, tree, placement,
                             draft_sockets, None)  # options only with --draft: one message
    elif mode == "off":
        raise ConfigError("--draft: not with --speculative off")
    else:
        speculative.check_sockets(placement, draft_sockets)
    if placement != "shared":
        raise ConfigError(f"--draft-placement {placement}: capacity tries shared only (a "
                          "draft on sockets of its own is not priced yet)")
    return {"off": (False,), "on": (True,), "both": (False, True)}[mode]


def _pairs(pairs, clusters, disaggregated) -> list[tuple[str, str]]:
    out = []
    for text in pairs:
        p, _, d = text.partition(":")
        if not p or not d:
            raise ConfigError(f"--pair: {text!r}; expected PREFILL_CLUSTER:DECODE_CLUSTER")
        out.append((p, d))
    if disaggregated and not out:
        out = [(p, d) for p in clusters for d in clusters]
    return out


def _costs(model, cluster, plans, max_nodes, lengths, fab, draft=None, choose=None,
           stack=None, overrides=()) -> list[cap.ReplicaCost]:
    costs = (f() for f in _plans((model, cluster, plans, max_nodes, lengths, fab, draft,
                                  choose, stack, overrides)))
    return [c for c in costs if c is not None]


def _plans(args: tuple) -> list[Callable[[], cap.ReplicaCost | None]]:
    """_costs' arguments as one replica_cost a plan."""
    model, cluster, plans, max_nodes, lengths, fab, draft, choose, stack, overrides = args
    return [partial(cap.replica_cost, model, cap.Pool(cluster, p, 1, overrides), lengths, fab,
                    draft, choose, stack)
            for p in plans or cap.replica_plans(model, cluster, max_nodes)]


def _analytic(asks: list[tuple], n_jobs: int) -> list[list[cap.ReplicaCost]]:
    """_costs of each of `asks` (its arguments), each plan's in one of --jobs processes where
    there are more than one: the analytic pass ran in the parent before any candidate was
    verified (question 1 of benchmarks/bench_capacity.py: 1.3 s, its 21 plans 0.001-0.23 s
    each). The processes are forked with the costs to make (processes.map_forked: a
    speculative candidate's `choose` is a closure, not sent), and send back ReplicaCost
    values."""
    per = [_plans(a) for a in asks]
    got = processes.map_forked(lambda f: f(), [f for fs in per for f in fs], n_jobs)
    out, at = [], 0
    for fs in per:
        out.append([c for c in got[at : at + len(fs)] if c is not None])
        at += len(fs)
    return out


def _gpu(cluster_ref: str) -> bool:
    return load_cluster(cluster_ref).chip.kind == "gpu"


def _check_stacks(stacks: tuple[str, ...], clusters: tuple[str, ...]) -> None:
    """Each --stack known; --stack with no GPU among the systems refused (none would run it)."""
    for name in stacks:
        serving_stacks.stack(name)
    if stacks and not any(_gpu(c) for c in clusters):
        first = load_cluster(clusters[0])
        serving_stacks.options_for(first.chip, stacks[0], system=first.name)  # refuses


def _stack_pairs(pairs, stack: str | None, first: bool) -> list[tuple[str, str]]:
    """The pairs a stack is tried on: RDU-only pairs once (with the first stack); a pair with
    an RDU pool under the default stack only (its GPU pool is then served with no --stack)."""
    gpu = lambda p, d: (_gpu(p), _gpu(d))
    return [(p, d) for p, d in pairs
            if (first or any(gpu(p, d)))
            and (all(gpu(p, d)) or stack in (None, serving_stacks.DEFAULT_STACK))]


def _shortlist(groups, per, pairs, traffic, slo, max_nodes, prompt, gen, model, fab, k,
               system=(None, ())):
    """The `k` cheapest analytic candidates of each system (with and without speculation) and
    of each pair (without); `system`: the GPU stack and the --set overrides."""
    stack, overrides = system
    out = []
    for costs in groups:
        deps = [cap.aggregated(c, traffic, slo, max_nodes, prompt, gen) for c in costs]
        out += _cheapest([d for d in deps if d is not None], k)
    for p, d in pairs:
        pre = per.get(p) or _costs(model, p, (), max_nodes, (prompt, gen), fab,
                                   stack=stack if _gpu(p) else None, overrides=overrides)
        dec = per.get(d) or _costs(model, d, (), max_nodes, (prompt, gen), fab,
                                   stack=stack if _gpu(d) else None, overrides=overrides)
        if not pre or not dec:
            continue
        prefill = min(pre, key=lambda c: (c.group, c.prefill_s))  # the smallest replica
        deps = [cap.disaggregated(prefill, c, traffic, slo, max_nodes, (prompt, gen), model, fab)
                for c in dec]
        out += _cheapest([x for x in deps if x is not None], k)
    return out


def _cheapest(deps, k):
    key = lambda d: (d.price_per_hour if d.price_per_hour is not None else math.inf, d.sockets)
    return sorted(deps, key=key)[:k]


def _verify_all(jobs: list[tuple], backend_name: str, address: str | None,
                n_jobs: int) -> list:
    """Each candidate verified (_verified) in this process, in --jobs processes, or as a Ray
    task (--backend ray: each task serves on the local engine backend); results in the
    candidates' order, so every way gives the same table. The pairs are handed out first
    (longest first: a pair's run decodes every user's tokens in one or two replicas, a
    step a window, where a system's alike replicas serve one replica's share; its searches
    took 5-25x a system's CPU on the three capacity questions), so that no worker is left
    with a pair when the others are done: listed last, they set the wall time."""
    profile = calibration.active()
    order = sorted(range(len(jobs)), key=lambda i: not jobs[i][0].disaggregated)
    tasks = [(profile, *jobs[i]) for i in order]
    out = (_on_ray(tasks, address) if backend_name == "ray"
           else processes.map_forked(_task, tasks, n_jobs))
    got = dict(zip(order, out))
    return [got[i] for i in range(len(jobs))]


def _task(task: tuple):
    """One candidate, under the calibration profile it was planned with."""
    profile, *job = task
    with calibration.use(profile), loop.frozen():  # a collection a candidate, not a run
        return _verified(*job)


def _on_ray(tasks: list[tuple], address: str | None) -> list:
    """The candidates as Ray tasks: on the cluster at --address (or $RAY_ADDRESS, which `ray
    job submit` sets), else an instance of its own, stopped at the end; an instance already
    running in this process is used as it is."""
    import ray

    from rdu_cluster.backends import join_ray

    owned = not ray.is_initialized()
    if owned:
        addr = address or os.environ.get("RAY_ADDRESS")
        kw = {"log_to_driver": False, "configure_logging": False}
        join_ray(addr or "local", from_env=addr is not None and not address,
                 **(kw if addr else {**kw, "include_dashboard": False}))
    try:
        remote = ray.remote(num_cpus=1)(_task)
        return ray.get([remote.remote(t) for t in tasks])
    finally:
        if owned:
            ray.shutdown()


def _verified(dep, model, model_ref, w, traffic, slo, fab, max_nodes):
    """The deployment at the SLO's boundary at steady state, with its interval (cap.settle:
    the fewest replicas that meet, one fewer verified to miss, by bisection within
    --max-nodes), served on the local engine backend."""
    serve = lambda d, t, stop=None: cap.verify(d, model, (model_ref, w), t, slo, fab,
                                               lambda: make_backend("local"), stop)
    try:
        return cap.settle(dep, serve, traffic, max_nodes, slo)
    except ConfigError:  # the engine refuses it (weights do not fit at its plan)
        return None


def _record(r: cap.Result, slo: cap.SLO) -> dict:
    d, s, b = r.deployment, r.summary, r.summary["bench"]
    spec = cast(Speculation, d.speculation)  # read only with a draft, which comes with it
    return {
        "system": d.label, "weights": _weights(r), "stack": d.stack, "sockets": d.sockets,
        "nodes": d.nodes,
        "plan": " + ".join(str(p) for p in d.pools)
        + (f" +{d.draft} k{spec.k}" if d.draft else ""),
        "speculative": ({"draft": d.draft, "k": spec.k} if d.draft else None),
        "disaggregated": d.disaggregated, "max_batch": d.max_batch,
        "tokens_per_s_per_user": 1e3 / b["mean_tpot_ms"] if b["mean_tpot_ms"] else None,
        "tokens_per_s_per_socket": b["output_throughput"] / d.sockets,
        # the sockets' price over the tokens they stream at steady state (bench's steady
        # window: --warmup-requests)
        "usd_per_million_tokens": (d.price_per_hour * 1e6 / 3600 / b["output_throughput"]
                                   if d.price_per_hour and b["output_throughput"] else None),
        "joules_per_token": s.get("joules_per_token"),
        "usd_per_hour": d.price_per_hour,
        f"p{_pw(slo)}_ttft_ms": _finite(r.ttft_ms), f"p{_pw(slo)}_tpot_ms": _finite(r.tpot_ms),
        "meets_slo": r.meets_slo, "miss": _finite(r.miss), "unserved": r.summary["unserved"],
        # the boundary: one replica fewer (of the pool searched last) misses by this much
        "miss_one_fewer": None if r.below is None else _finite(r.below),
        # true where that run stopped once certain to miss (engine/decided.py): at least that
        "miss_one_fewer_at_least": r.below_at_least,
        "ramp_up_s": _ramp_arg(r.serve_args),
        # the interval (cap.with_ends): null bounds and the reason outside every regime
        **{k: r.interval.get(k) for k in ("nodes_low", "nodes_high", "plan_low", "plan_high",
                                          "usd_per_million_tokens_low",
                                          "usd_per_million_tokens_high", "robust")},
        "interval_note": r.interval.get("basis"),
        "steady": _steady(r.steady, slo),
        "verified": ("sessions (a closed loop each)" if "--sessions" in r.serve_args
                     else "trace replayed" if "--trace" in r.serve_args
                     else "closed loop" if r.serve_args.count("--concurrency") else "open loop"),
        "serve_args": r.serve_args,
        "calibration": calibration.label([load_cluster(p.cluster) for p in d.pools]),
    }


def _steady(st: dict, slo: cap.SLO) -> dict:
    """How the row's steady state was checked, with the seeds' spread (pP as the row's)."""
    pw = _pw(slo)
    names = {"ttft_ms_range": f"p{pw}_ttft_ms_range", "tpot_ms_range": f"p{pw}_tpot_ms_range"}
    return {names.get(k, k): v for k, v in st.items() if k != "runs"}


def _ramp_arg(args: list[str]) -> float:
    return float(args[args.index("--ramp-up") + 1]) if "--ramp-up" in args else 0.0


def _finite(v: float) -> float | None:
    """null for a run that served no request (inf internally, to rank last): JSON has no
    Infinity."""
    return v if math.isfinite(v) else None


def _weights(r: cap.Result) -> str | None:
    args = r.serve_args
    return args[args.index("--weights") + 1] if "--weights" in args else None


def _pw(slo: cap.SLO) -> str:
    from rdu_cluster.engine.bench import p_word

    return p_word(slo.percentile)


def _table(results, slo, traffic, wall) -> str:
    pw = _pw(slo)
    load = (f"{traffic.concurrency} users" if traffic.concurrency else f"{traffic.rate:g} req/s")
    if traffic.workload_args:
        load = f"{shlex.join(traffic.workload_args)} ({load})"
    bounds = ", ".join(f"{k} <= {v:g} ms" for k, v in (("TTFT", slo.ttft_ms),
                                                         ("TPOT", slo.tpot_ms)) if v)
    head = (f"{'#':>2} {'system':<24} {'sockets':>7} {'nodes':>11} {'plan':<34} {'batch':>5} "
            f"{'tok/s/user':>10} {'tok/s/sock':>10} {'$/Mtok':>19} {'J/tok':>6} "
            f"{f'p{pw} TTFT':>10} {f'p{pw} TPOT':>10}  SLO")
    title = (f"capacity: {load}, {bounds} at p{pw}; {len(results)} deployments verified "
             f"by the serving engine in {wall:.1f} s")
    lines = [title]
    if traffic.ramps:
        lines.append("closed loops start one after another over "
                     + ("one estimated cycle (E2E and think time) of each deployment"
                        if traffic.ramp_s is None else f"{traffic.ramp_s:g} s")
                     + " (--ramp-up; serve_args carry it); each row is the fewest replicas "
                     "that meet, one fewer verified to miss (bisection within --max-nodes)")
    notes = {r.interval.get("basis") for r in results} - {None}
    lines.append("nodes and $/Mtok: (low-high) where the uncertainty model covers the row "
                 "(each end the boundary searched again at the simulator's optimistic and "
                 "pessimistic ends); robust: meets at the pessimistic end; "
                 + " | ".join(sorted(notes)) if notes else "")
    records = [_record(r, slo) for r in results]
    labels = sorted({rec["calibration"] for rec in records})
    lines += [*([f"calibration: {'; '.join(labels)}"] if labels else []), head]
    for i, (r, rec) in enumerate(zip(results, records), 1):
        lines.append(
            f"{i:>2} {' '.join(x for x in (rec['system'], rec['weights'], rec['stack']) if x):<24} "
            f"{rec['sockets']:>7} {_span(rec['nodes'], rec['nodes_low'], rec['nodes_high'], 'd'):>11} "
            f"{rec['plan']:<34} {rec['max_batch']:>5} "
            f"{_f(rec['tokens_per_s_per_user'], '.1f'):>10} "
            f"{_f(rec['tokens_per_s_per_socket'], '.1f'):>10} "
            f"{_span(rec['usd_per_million_tokens'], rec['usd_per_million_tokens_low'], rec['usd_per_million_tokens_high'], '.2f'):>19} "
            f"{_f(rec['joules_per_token'], '.2f'):>6} {r.ttft_ms:>10.1f} {r.tpot_ms:>10.2f}  "
            f"{'meets' if r.meets_slo else _misses(r)}{_robust(rec['robust'])}"
            f"{', not settled' if r.steady.get('settled') is False else ''}")
    lines.append("serve_args (rdu-cluster serve ...):")
    lines += [f"{i:>2} {shlex.join(r.serve_args)}" for i, r in enumerate(results, 1)]
    return "\n".join(lines)


def _span(v, lo, hi, fmt: str) -> str:
    """`v (lo-hi)`, or `v` where the interval is unknown (or an end past --max-nodes: ?)."""
    if v is None:
        return "-"
    if lo is None and hi is None:
        return format(v, fmt)
    end = lambda x: "?" if x is None else format(x, fmt)
    return f"{format(v, fmt)} ({end(lo)}-{end(hi)})"


def _robust(robust) -> str:
    return "" if robust is None else ", robust" if robust else ", not robust"


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _closest(results, slo) -> str:
    if not results:
        return "nothing meets the SLO: no candidate passed the analytic pre-filter (raise " \
               "--max-nodes, add --cluster or relax --slo)"
    best = min(results, key=lambda r: r.miss)
    return (f"nothing meets the SLO; closest: {best.deployment.label} "
            f"{' + '.join(str(p) for p in best.deployment.pools)}, p{_pw(slo)} TTFT "
            f"{best.ttft_ms:.1f} ms, TPOT {best.tpot_ms:.2f} ms: {_misses(best)}")


def _misses(r: cap.Result) -> str:
    s = r.summary
    if s["unserved"] and s["bench"]["completed"]:
        return f"refuses {s['unserved']} of {s['requests']} requests"
    return f"misses by {r.miss:.0%}" if math.isfinite(r.miss) else "serves no request"


def _plot(costs, path: Path) -> None:
    """Each system's analytic front as an interactive page (Plotly, as `report` draws): a
    replica of each plan at each batch (tokens/s per user = 1 / TPOT, per socket = batch /
    TPOT / sockets), faint points, the front as a line, plan and batch on hover."""
    from rdu_cluster.output.plots import pareto_front, require_plotly

    go = require_plotly()
    if not costs:
        raise ConfigError("--plot: no plan fits, nothing to plot")
    if not path.parent.exists():
        raise ConfigError(f"--plot {path}: folder {path.parent} does not exist")
    systems: dict[str, list] = {}
    for w, c in costs:
        pts = systems.setdefault(" ".join(x for x in (c.cluster, w, c.stack) if x), [[], [], []])
        pts[0] += list(c.batches / c.tpot_s / c.group)
        pts[1] += list(1 / c.tpot_s)
        pts[2] += [f"{c.plan}, batch {b}" for b in c.batches]
    fig = go.Figure()
    for name, (x, y, text) in systems.items():
        x, y, text = np.array(x), np.array(y), np.array(text)
        front = pareto_front(x, y)
        fig.add_trace(go.Scatter(x=x, y=y, text=text, mode="markers", opacity=0.3,
                                 name=f"{name} (all)", legendgroup=name))
        fig.add_trace(go.Scatter(x=x[front], y=y[front], text=text[front],
                                 mode="lines+markers", name=name, legendgroup=name))
    fig.update_layout(title="Pareto front per system (analytic step costs)",
                      xaxis={"type": "log", "title": "tokens/s per socket"},
                      yaxis={"type": "log", "title": "tokens/s per user"},
                      template="plotly_white")
    # plotly.js embedded (as `report` does), so the page renders offline: no CDN
    atomic.atomic_write(path, fig.to_html(include_plotlyjs=True, full_html=True).encode(),
                         "--plot")
