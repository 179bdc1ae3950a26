"""`rdu-cluster capacity`: the cheapest deployments that serve a traffic within a latency SLO
(rdu_cluster/scenarios/capacity/): an analytic pre-filter, then serving-engine runs of the
short list. Exit code 1 when nothing meets the SLO (the closest is shown, with its miss).

The command parses and checks its options, builds the candidates and verifies them
(scenarios/capacity/candidates.py), and shows the rows (output/capacity.py)."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import cast

import click
import numpy as np

from chip import serving_stacks
from partitioning.plan import Plan as PartitionPlan
from partitioning.plan import validate as validate_plan
from rdu_cluster.backends import BACKENDS
from rdu_cluster.cli import options as o
from rdu_cluster.cli import workload
from rdu_cluster.cli.options import (
    TRACE_HELP,
    calibration_option,
    session_options,
    speculative_options,
)
from rdu_cluster.config import MAX_SOCKETS, cli_overrides, load_cluster, load_fabric
from rdu_cluster.engine.prefix_cache import MODES
from rdu_cluster.output import atomic
from rdu_cluster.output import capacity as output
from rdu_cluster.output.progress import Progress
from rdu_cluster.scenarios import capacity as cap
from rdu_cluster.scenarios import speculative
from rdu_cluster.scenarios.capacity import candidates
from workloads import checks, traces
from workloads.catalog import load_model
from workloads.errors import ConfigError
from workloads.spec import with_dtypes
from workloads.speculative import parse_acceptance, parse_tree

# Each shortlisted deployment is one or more serving-engine runs (seconds each): 100 per system
# is already more than an interactive search waits for, and far more than candidates differ.
MAX_SHORTLIST = 100


@click.command()
@calibration_option
@click.option("--model", "model_ref", required=True, help="Catalog name or config.json path.")
@click.option("--weights", "weights", multiple=True,
              help="Weight dtype(s) to try (fp8, bf16, ...) [default: the model's]; repeatable.")
@click.option("--kv-dtype", default=None,
              help="KV-cache dtype of every candidate (fp8, ...) [default: the model's].")
@click.option("--stack", "stacks", multiple=True,
              help="GPU systems: the serving stack(s) to try (" + ", ".join(serving_stacks.STACKS)
              + f") [default: {serving_stacks.DEFAULT_STACK}]; repeatable. RDU systems take "
              "none (refused when no --cluster is a GPU).")
@click.option("--cluster", "clusters", multiple=True,
              help="A system to consider (a cluster: its chip, node and price); repeatable. "
              "The clusters of a --pair are considered on their own too.")
@click.option("--plan", "plans", multiple=True,
              help="Replica plans to try [default: tp over 1, 2, 4 ... sockets up to a node and "
                   "over 2 nodes, tpNpp2; an MoE model also adpNepN over 1 and 2 nodes].")
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
              help="As serve --prefix-cache [default: tiered on an RDU, hbm on a GPU].")
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
@click.option("--no-progress", is_flag=True,
              help="No progress on stderr (candidates verified, of those short-listed).")
@click.option("--plot", "plot_path", default=None,
              help="Write the Pareto front (tokens/s per user vs per socket) per system: an "
              "interactive .html page (Plotly).")
def capacity(model_ref, weights, kv_dtype, clusters, plans, max_nodes, concurrency, rate,
             prompt_len, output_len, requests, slos, slo_percentile, disaggregated, pairs,
             fabric, shortlist, seed, prefix_cache, backend_name, as_json, plot_path,
             trace_path, n_sessions, turns, system_prompt, think_time, spec_mode, draft, spec_k,
             tree, placement, draft_sockets, acceptance, stacks, ramp_up, steady_tol,
             assignments, address, n_jobs, no_progress) -> None:
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
    _check((model_ref, kv_dtype), weights, clusters, plans, fab, traffic, draft, acceptance,
           tree, overrides)
    _check_stacks(stacks, clusters)
    if backend_name == "local" and address:
        raise ConfigError("--address: only with --backend ray")
    costs, jobs = _shortlisted((model_ref, kv_dtype), weights, stacks, clusters, plans, pairs,
                               max_nodes,
                               traffic, slo, (prompt, gen), fab, modes,
                               (draft, spec_k, acceptance, tree), overrides, shortlist,
                               n_jobs if backend_name == "local" else 1)
    with Progress(len(jobs), "candidates", "capacity", enabled=not no_progress) as bar:
        got = candidates.verify_all(jobs, backend_name, address, n_jobs, bar.update)
    results = cap.ranked([r for r in got if r is not None])
    _render(results, costs, slo, traffic, time.perf_counter() - started, as_json, plot_path)


def _shortlisted(model_kv, weights, stacks, clusters, plans, pairs, max_nodes, traffic, slo,
                 lengths, fab, modes, spec, overrides, shortlist, n_jobs) -> tuple[list, list]:
    """The candidates of each weight dtype and --stack: their systems' replica costs in one
    analytic pass (candidates.analytic, in n_jobs processes), then each one's shortlist.
    `model_kv`: --model and --kv-dtype. Returns the costs (each with its dtype: what --plot
    draws) and the verification jobs."""
    model_ref, kv_dtype = model_kv
    draft, spec_k, acceptance, tree = spec
    prompt, gen = lengths
    jobs, costs = [], []
    asked: list[tuple] = []  # each (w, stack)'s systems, costed at once (candidates.analytic)
    for w, stack in [(w, s) for w in weights or (None,) for s in stacks or (None,)]:
        model = with_dtypes(load_model(model_ref), w, kv_dtype)
        choose = lambda cl, plan, model=model, stack=stack: workload.speculation(
            model, cl, _sample(traffic), draft, spec_k, acceptance, 1, tree, "shared", 1, plan,
            serving_stacks.options_for(cl.chip, stack if cl.chip.kind == "gpu" else None))
        # an RDU system takes no stack: its candidates come once, with the first stack's (a
        # pair's decode pool on it is costed under every stack the pair is tried on: "pool")
        first = stack is None or stack == stacks[0]
        systems = [c for c in clusters if first or candidates.gpu(c)]
        pools = {d for _, d in candidates.stack_pairs(pairs, stack, first)} - set(systems)
        asked.append((w, stack, first, model, {
            (c, on, *(["pool"] if c in pools else [])): (
                model, c, plans, max_nodes, (prompt, gen), fab, draft if on else None, choose,
                stack if candidates.gpu(c) else None, overrides)
            for c in [*systems, *sorted(pools)] for on in modes}))
    got = iter(candidates.analytic([a for *_, ask in asked for a in ask.values()], n_jobs))
    for w, stack, first, model, ask in asked:
        groups = {key: next(got) for key in ask}
        costs += [(w, c) for key, cs in groups.items() if len(key) == 2 for c in cs]
        cands = candidates.shortlist(groups, candidates.stack_pairs(pairs, stack, first), model,
                                     (traffic, slo, max_nodes, (prompt, gen), fab), shortlist,
                                     (stack, overrides))
        jobs += [(dep, model, model_ref, w, traffic, slo, fab, max_nodes) for dep in cands]
    return costs, jobs


def _render(results, costs, slo, traffic, wall, as_json, plot_path) -> None:
    """--plot's page, then the rows (JSON lines or the table); where none meets the SLO, the
    closest, and exit code 1."""
    if plot_path:
        output.plot(costs, Path(plot_path))
    if as_json:
        for r in results:
            click.echo(json.dumps(output.record(r, slo)))
    else:
        click.echo(output.table(results, slo, traffic, wall))
    if not any(r.meets_slo for r in results):
        # With --json on stderr, so stdout stays JSON lines; without it a run whose candidates
        # all failed the pre-filter printed no row and no word, and exited 1.
        click.echo(output.closest(results, slo), err=as_json)
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


def _check(model_kv, weights, clusters, plans, fab, traffic, draft, acceptance, tree,
           overrides=()) -> None:
    """Refuse up front what the search would otherwise skip in silence (a candidate the engine
    refuses is dropped, so a bad option would read as "nothing meets the SLO"): a draft that
    does not load, an acceptance or tree that does not parse, requests past the model's
    context, a --plan that can run on none of the --cluster systems (the model's shape or the
    cluster's sockets; memory is the search's to judge)."""
    for c in clusters:
        load_cluster(c, dict(overrides))  # a key or value --set gets wrong: one line, here
    model_ref, kv_dtype = model_kv
    model = with_dtypes(load_model(model_ref), None, kv_dtype)
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


def _check_stacks(stacks: tuple[str, ...], clusters: tuple[str, ...]) -> None:
    """Each --stack known; --stack with no GPU among the systems refused (none would run it)."""
    for name in stacks:
        serving_stacks.stack(name)
    if stacks and not any(candidates.gpu(c) for c in clusters):
        first = load_cluster(clusters[0])
        serving_stacks.options_for(first.chip, stacks[0], system=first.name)  # refuses

