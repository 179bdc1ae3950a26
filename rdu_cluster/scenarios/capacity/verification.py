"""Pass 2: a deployment served on the serving engine (engine/simulation.py, or engine/disagg/
for a pair of pools), judged on the SLO (engine/bench.py), stopped once certain to miss where
asked (engine/decided.py); and the `rdu-cluster serve` arguments that reproduce the run."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

from chip import serving_stacks
from rdu_cluster.config import FabricSpec, load_cluster
from rdu_cluster.engine import alike, bench, decided
from rdu_cluster.engine.disagg import Disaggregated, Pool, group_sockets
from rdu_cluster.engine.prefix_cache import PrefixConfig
from rdu_cluster.engine.schedulers import engine_defaults
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from rdu_cluster.scenarios.capacity.deployment import Deployment
from rdu_cluster.scenarios.capacity.result import Result
from rdu_cluster.scenarios.capacity.slo import SLO
from rdu_cluster.scenarios.capacity.traffic import Traffic
from rdu_cluster.validation import calibration
from workloads import traces
from workloads.catalog import load_model
from workloads.spec import ModelSpec
from workloads.speculative import Speculation


def verify(dep: Deployment, model: ModelSpec, ref: tuple[str, str | None], traffic: Traffic,
           slo: SLO, fabric: FabricSpec, backend: Callable[[], object],
           stop: SLO | None = None) -> Result:
    """`dep` served on the engine, judged on `slo`; `ref`: the model's name and --weights as
    given (the row's serve_args). With `stop` (bounds at least `slo`'s), the run stops once
    its pP TTFT or TPOT certainly exceeds its `stop` bound (engine/decided.py): the Result
    then carries only that verdict (Result.decided). Runs whose replicas are alike
    (engine/alike.py: one replica's run) are not stopped."""
    pct = slo.percentile
    spec = bench.MetricSpec((50.0, pct), tuple(
        (k, v) for k, v in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms)) if v is not None),
        traffic.warmup, traffic.steadies)
    rate = traffic.rate
    trace = _trace(dep, traffic, rate)
    options = (None if dep.disaggregated or not _on_gpu(dep)
               else serving_stacks.stack(cast(str, dep.stack)))
    scheduler, limits = engine_defaults(*_engines(dep, options), max_batch=dep.max_batch)
    config = ServeConfig(plan=dep.pools[0].plan, scheduler=scheduler, limits=limits,
                         seed=traffic.seed, metrics=spec,
                         concurrency=(None if traffic.trace is not None
                                      else traffic.concurrency),
                         prefix=PrefixConfig(traffic.prefix_cache),
                         speculation=dep.speculation, draft=dep.draft,
                         options=options)  # a pair's pools take theirs each (pool_options)
    watch = None if stop is None else decided.Watch(
        {"ttft": stop.ttft_ms, "tpot": stop.tpot_ms}, pct, len(trace), traffic.warmup,
        traffic.steadies, bool((trace.output_len > 1).all()))
    args = serve_args(dep, (*ref, _kv_arg(model, ref[0])), traffic, slo, rate, fabric, trace)
    try:
        if dep.disaggregated:  # the summary is what is read (Simulation.summary_only)
            s = _pair_served(
                (dep, model.name, ref, replace(traffic, requests=None)), trace, watch,
                lambda keep: Disaggregated(model, dep.pools[0], dep.pools[1], fabric, trace,
                                           config, backend, summary_only=True, watch=watch,
                                           keep=keep, options=pool_options(dep)),
                traffic.steadies and traffic.concurrency is not None)
        else:
            s = _served(dep.pools[0], model, fabric, trace, config, backend,
                        traffic.ramp_of(dep), watch)
    except decided.Decided as d:
        ttft, tpot = (d.at_least_ms if d.metric == m else 0.0 for m in ("ttft", "tpot"))
        return Result(dep, {"unserved": 0, "requests": len(trace), "decided": {
            "metric": d.metric, "at_least_ms": d.at_least_ms, "completed": d.completed}},
            ttft, tpot, slo.misses(ttft, tpot), args, slo=slo,
            decided={d.metric: d.at_least_ms})
    b = s["bench"]
    w = bench.p_word(pct)
    # none served: vLLM's statistics are then 0, which would read as meeting every bound
    ttft, tpot = ((b[f"p{w}_ttft_ms"], b[f"p{w}_tpot_ms"]) if b["completed"]
                  else (math.inf, math.inf))
    # a request refused (its KV past the replica's, its prompt past the budget) is traffic not
    # served: the percentiles of the rest do not show it, so the deployment misses outright
    miss = math.inf if s["unserved"] else slo.misses(ttft, tpot)
    return Result(dep, s, ttft, tpot, miss, args, slo=slo)


# A pair's closed-loop runs kept at their checkpoints (engine/checkpoint.py), the latest few of
# the candidate settled now (a kept run holds its cost tables, past the process's cache of
# them: backends/local.py): settle serves a row again with twice its requests, and that run
# (or its one fewer, from that deployment's run at a shorter count) goes on from a kept run's
# checkpoint instead of from the start (question 2 of bench_capacity.py: its pairs' doublings
# took ~100 s of its ~320 s of CPU).
KEPT_RUNS = 4
_kept: OrderedDict[tuple, Disaggregated] = OrderedDict()


def _pair_served(key: tuple, trace: traces.Trace, watch: decided.Watch | None,
                 run_of: Callable[[bool], Disaggregated], keep: bool) -> dict:
    """The summary of a pair's run of `trace` (run_of(keep): its run, keeping its checkpoint
    or not, stopped once `watch` is certain: decided.Decided; `key`: what else it serves): a
    run of more requests than a kept run of the same key goes on from the longest such
    (_longest_below; Disaggregated.continued: the same tables, or the same verdict, as from
    the start); with `keep` (a closed loop of clients whose row may double) the run is
    kept, a run stopped as certain too (the one fewer of the row at its doubled count went
    on from it: question 1 of bench_capacity.py's four, 3.7 s of CPU from the start)."""
    n = len(trace)
    below = _longest_below(key, n) if keep else None
    paused = None if below is None else _kept.pop(below)
    run = paused if paused is not None and paused.continues(trace, watch) else run_of(keep)
    try:
        return (run.continued(trace, watch) if run is paused else run.run()).summary
    finally:
        kept = run.kept()
        if kept is not None:
            _kept[(*key, n)] = kept
            while len(_kept) > KEPT_RUNS:
                _kept.popitem(last=False)


def _longest_below(key: tuple, n: int) -> tuple | None:
    """The kept run of `key` with the most requests fewer than n (None: none). Its
    checkpoint is every longer run's state (engine/checkpoint.py), not only its doubling's:
    a row's one fewer at its steady count goes on from that deployment's run at a shorter
    count (question 2 of bench_capacity.py: three at 16,000, from their runs at 4,000 or
    2,000)."""
    counts = [k[-1] for k in _kept if k[:-1] == key and k[-1] < n]
    return (*key, max(counts)) if counts else None


def forget_runs() -> None:
    """Drop the kept runs (settle, as a candidate starts and ends: another candidate's runs
    would hold their cost tables past the process's cache of them)."""
    _kept.clear()


def _served(pool: Pool, model: ModelSpec, fabric: FabricSpec, trace: traces.Trace,
            config: ServeConfig, backend: Callable[[], object], ramp_s: float,
            watch: decided.Watch | None = None) -> dict:
    """The summary of `pool` serving `trace`: where its replicas are alike (engine/alike.py:
    closed loop, every request the same, nothing drawn per replica), from one replica of each
    kind, else the whole run."""
    whole = pool.spec(model, fabric)
    if pool.replicas > 1:
        one = replace(pool, replicas=1).spec(model, fabric)
        if alike.applies(model, whole, one, trace, config, pool.replicas, ramp_s):
            return alike.run(model, whole, one, trace, config, backend, pool.replicas, ramp_s)
    sim = Simulation(model, whole, trace, config, backend())
    sim.summary_only = True
    if watch is not None:
        sim.dispatch.watch, sim.finished.watch = watch, decided.completions(watch)
    return sim.run().summary


def _trace(dep: Deployment, traffic: Traffic, rate: float | None) -> traces.Trace:
    if traffic.sessions:  # their closed loops, started over the ramp unless --rate starts them
        return traces.ramped(cast(traces.Trace, traffic.trace), traffic.ramp_of(dep))
    if traffic.trace is not None:
        return traffic.trace  # replayed as it is (its own arrivals)
    p, o = traffic.dists()
    n = traffic.n_requests(rate or 0.0)
    if traffic.concurrency is None:
        # without a concurrency: an open loop at its rate
        return traces.synthetic(n, cast(float, rate), "poisson", p, o, seed=traffic.seed)
    t = traces.synthetic(n, math.inf, "poisson", p, o, seed=traffic.seed)
    return traces.ramped(t, traffic.ramp_of(dep), traffic.concurrency)


def serve_args(dep: Deployment, model: tuple[str, str | None, str | None], traffic: Traffic,
               slo: SLO, rate: float | None, fabric: FabricSpec, trace: traces.Trace) -> list:
    """`rdu-cluster serve` arguments that reproduce the verified run; `model`: the model as
    --model names it, its --weights and --kv-dtype (None: the model's own)."""
    model_ref, weights, kv = model
    args = ["--model", model_ref, *(["--weights", weights] if weights else []),
            *(["--kv-dtype", kv] if kv else [])]
    profile = calibration.active()  # the profile load_cluster applied (serve's --calibration)
    if profile is None or profile.name != calibration.DEFAULT:
        args += ["--calibration", "none" if profile is None else profile.name]
    args += [a for k, v in dep.pools[0].overrides for a in ("--set", f"{k}={v}")]
    if dep.disaggregated:
        args += ["--prefill-pool", str(dep.pools[0]), "--decode-pool", str(dep.pools[1]),
                 "--fabric", fabric.name]
    else:
        pool = dep.pools[0]
        args += ["--cluster", pool.cluster, "--plan", pool.plan, "--replicas",
                 str(pool.replicas)]
        if pool.replicas * group_sockets(pool.plan) > dep.sockets_per_node[0]:
            args += ["--fabric", fabric.name]
    if traffic.workload_args:
        args += [*traffic.workload_args, "--max-batch", str(dep.max_batch), "--seed",
                 str(traffic.seed)]
    else:
        args += ["--requests", str(len(trace)), "--prompt-len", traffic.prompt, "--output-len",
                 traffic.output, "--max-batch", str(dep.max_batch), "--seed", str(traffic.seed)]
    ramp = ["--ramp-up", repr(traffic.ramp_of(dep))] if traffic.ramp_of(dep) else []
    if traffic.sessions:
        args += ramp  # the sessions' closed loops, started over the ramp
    elif traffic.workload_args:
        pass  # the trace's own arrivals
    elif traffic.concurrency:
        args += ["--concurrency", str(traffic.concurrency), *ramp]
    else:
        args += ["--rate", repr(rate)]
    args += ["--metric-percentiles", f"50,{bench.p_word(slo.percentile)}", "--goodput",
             slo.goodput_args()]
    if traffic.warmup:
        args += ["--warmup-requests", str(traffic.warmup)]
    if traffic.steadies:
        args += ["--warmup-mser"]
    if traffic.prefix_cache is not None:
        args += ["--prefix-cache", traffic.prefix_cache]
    if _on_gpu(dep):  # a stack is named
        args += ["--stack", cast(str, dep.stack)]
    if dep.draft is None:
        return args
    # k given: serve's own choice of k is made at its --max-batch, not the k verified
    spec = cast(Speculation, dep.speculation)  # a draft comes with its speculation
    return args + ["--draft", dep.draft, "--spec-k", str(spec.k), *traffic.spec_args]


def _kv_arg(model: ModelSpec, model_ref: str) -> str | None:
    """The KV-cache dtype the run was costed at, where it is not the model's own (--kv-dtype)."""
    kv = model.precision.kv_cache
    return None if kv == load_model(model_ref).precision.kv_cache else kv.value


def _engines(dep: Deployment, options: Any) -> tuple[tuple[Any, Any], ...]:
    """The (chip, execution options) of the replicas that prefill and of those that decode
    (schedulers.engine_defaults: the policy, token budget and chunking serve takes from the
    row's serve_args, which carry none of them)."""
    chips = [load_cluster(p.cluster, dict(p.overrides)).chip for p in dep.pools]
    if not dep.disaggregated:
        return (chips[0], options), (chips[0], options)
    return tuple(zip(chips, pool_options(dep)))


def _on_gpu(dep: Deployment) -> bool:
    """A pool on GPUs: the deployment's stack is then named to serve (a pool of RDU sockets
    beside it runs its own execution model: serving_stacks.pool_options)."""
    return dep.stack is not None and any(load_cluster(p.cluster).chip.kind == "gpu"
                                         for p in dep.pools)


def pool_options(dep: Deployment) -> tuple[Any, Any]:
    """A pair's execution options, each pool's: the deployment's stack on a GPU pool."""
    chips = [(load_cluster(p.cluster, dict(p.overrides)).chip, str(p)) for p in dep.pools]
    return cast("tuple[Any, Any]", tuple(serving_stacks.pool_options(chips, dep.stack)))
