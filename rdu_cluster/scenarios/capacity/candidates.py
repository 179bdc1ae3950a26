"""`capacity`'s candidates, from the analytic pass to the verified rows (cli/capacity.py
parses the options and calls these): each system's replica costs, one replica_cost a plan
(`analytic`, in --jobs forked processes where there are more than one), the cheapest
candidates of each system and pair (`shortlist`; `stack_pairs`: the pairs a serving stack is
tried on), and each candidate verified at the SLO's boundary (`verify_all`: in this process,
in --jobs processes, or each as a Ray task)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from functools import partial

from rdu_cluster import processes
from rdu_cluster.backends import make as make_backend
from rdu_cluster.config import load_cluster
from rdu_cluster.engine import loop
from rdu_cluster.engine.disagg import Pool
from rdu_cluster.scenarios.capacity.sizing import (
    ReplicaCost,
    aggregated,
    disaggregated,
    replica_cost,
    replica_plans,
)
from rdu_cluster.scenarios.capacity.steady import settle
from rdu_cluster.scenarios.capacity.verification import verify
from rdu_cluster.validation import calibration
from workloads.errors import ConfigError


def _costs(args: tuple) -> list[ReplicaCost]:
    """A system's replica costs, its plans' in this process; `args`: (model, cluster, plans,
    max_nodes, lengths, fab, draft, choose, stack, overrides)."""
    costs = (f() for f in _plans(args))
    return [c for c in costs if c is not None]


def _plans(args: tuple) -> list[Callable[[], ReplicaCost | None]]:
    """_costs' arguments as one replica_cost a plan."""
    model, cluster, plans, max_nodes, lengths, fab, draft, choose, stack, overrides = args
    return [partial(replica_cost, model, Pool(cluster, p, 1, overrides), lengths, fab,
                    draft, choose, stack)
            for p in plans or replica_plans(model, cluster, max_nodes)]


def analytic(asks: list[tuple], n_jobs: int) -> list[list[ReplicaCost]]:
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


def gpu(cluster_ref: str) -> bool:
    return load_cluster(cluster_ref).chip.kind == "gpu"


def stack_pairs(pairs, stack: str | None, first: bool) -> list[tuple[str, str]]:
    """The pairs a stack is tried on: a pair with a GPU pool under each (its GPU pools run it,
    an RDU pool its own execution model: serving_stacks.pool_options); RDU-only pairs once
    (with the first stack)."""
    return [(p, d) for p, d in pairs if first or gpu(p) or gpu(d)]


def shortlist(groups, pairs, model, question, k, system=(None, ())):
    """The `k` cheapest analytic candidates of each system and of each pair, with and without
    speculation as --speculative asks: `groups` maps (cluster, speculative) to a system's
    replica costs, and (cluster, speculative, "pool") to those of a pair's decode pool that is
    no system here. A pair decodes speculatively in its decode pool (its prefill pool sized
    without the draft's prefill, its hand-over without the draft's KV: the engine's
    verification adds both). `question`: (traffic, slo, max_nodes, (prompt, gen), fab), what
    every candidate is sized for; `system`: the GPU stack and the --set overrides."""
    traffic, slo, max_nodes, (prompt, gen), fab = question
    stack, overrides = system
    out = []
    for key, costs in groups.items():
        if len(key) == 2:
            deps = [aggregated(c, traffic, slo, max_nodes, prompt, gen) for c in costs]
            out += _cheapest([d for d in deps if d is not None], k)
    modes = sorted({key[1] for key in groups})
    for p, d in pairs:
        pre = groups.get((p, False)) or _costs(
            (model, p, (), max_nodes, (prompt, gen), fab, None, None,
             stack if gpu(p) else None, overrides))
        for on in modes:
            dec = groups.get((d, on)) or groups.get((d, on, "pool"))
            if not pre or not dec:
                continue
            deps = [_pair(pre, c, traffic, slo, max_nodes, (prompt, gen), model, fab)
                    for c in dec]
            out += _cheapest([x for x in deps if x is not None], k)
    return out


def _pair(pre, dec, traffic, slo, max_nodes, lengths, model, fab):
    """The pair of decode pool `dec` with the prefill plan of `pre` that the analytic pass
    prices lowest (a plan that fits one GPU prefills a prompt about half as fast as two, so
    a TTFT-bound pool of it may need more GPUs: the Llama 3.1 70B sessions question's H200
    pairs, 21 tp1 replicas where 9 of tp2); of two priced alike, the one whose pool the
    analytic pass gives the lower pP TTFT (the wider margin to the bound), then the smaller
    replica."""
    deps = [disaggregated(c, dec, traffic, slo, max_nodes, lengths, model, fab)
            for c in sorted(pre, key=lambda c: (c.group, c.prefill_s))]
    return min((d for d in deps if d is not None),
               key=lambda d: (*_price(d), d.analytic["ttft_s"]), default=None)


def _price(d) -> tuple[float, int]:
    return (d.price_per_hour if d.price_per_hour is not None else math.inf, d.sockets)


def _cheapest(deps, k):
    return sorted(deps, key=_price)[:k]


def verify_all(jobs: list[tuple], backend_name: str, address: str | None,
               n_jobs: int, done: Callable[[], None] | None = None) -> list:
    """Each candidate verified (_verified) in this process, in --jobs processes, or as a Ray
    task (--backend ray: each task serves on the local engine backend); results in the
    candidates' order, so every way gives the same table; `done()` as each one ends. The
    pairs are handed out first (longest first: a pair's run decodes every user's tokens in
    one or two replicas, a step a window, where a system's alike replicas serve one replica's
    share; its searches took 5-25x a system's CPU on the three capacity questions), so that
    no worker is left with a pair when the others are done: listed last, they set the wall
    time."""
    profile = calibration.active()
    order = sorted(range(len(jobs)), key=lambda i: not jobs[i][0].disaggregated)
    tasks = [(profile, *jobs[i]) for i in order]
    out = (_on_ray(tasks, address, done) if backend_name == "ray"
           else processes.map_forked(_task, tasks, n_jobs,
                                     done=None if done is None else lambda i, r: done()))
    got = dict(zip(order, out))
    return [got[i] for i in range(len(jobs))]


def _task(task: tuple):
    """One candidate, under the calibration profile it was planned with."""
    profile, *job = task
    with calibration.use(profile), loop.frozen():  # a collection a candidate, not a run
        return _verified(*job)


def _on_ray(tasks: list[tuple], address: str | None,
            done: Callable[[], None] | None = None) -> list:
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
        refs = [remote.remote(t) for t in tasks]
        waiting = list(refs)
        while waiting and done is not None:  # each as it ends, for the progress line
            _, waiting = ray.wait(waiting, num_returns=1)
            done()
        return ray.get(refs)
    finally:
        if owned:
            ray.shutdown()


def _verified(dep, model, model_ref, w, traffic, slo, fab, max_nodes):
    """The deployment at the SLO's boundary at steady state, with its interval (settle:
    the fewest replicas that meet, one fewer verified to miss, by bisection within
    --max-nodes), served on the local engine backend."""
    serve = lambda d, t, stop=None: verify(d, model, (model_ref, w), t, slo, fab,
                                           lambda: make_backend("local"), stop)
    try:
        return settle(dep, serve, traffic, max_nodes, slo)
    except ConfigError:  # the engine refuses it (weights do not fit at its plan)
        return None
