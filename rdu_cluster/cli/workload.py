"""The workload options serve and capacity share, turned into a trace and a speculation: a
trace file (optionally cut to its first --requests and its arrivals rescaled to --rate), a
synthetic trace, or the multi-turn sessions; --draft/--spec-k/--acceptance/--tree."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from partitioning import evaluate
from partitioning.footprint import PlanDoesNotFit
from partitioning.scenario import Scenario, tensor_plan
from rdu_cluster.engine.plan import PlanSpec, check_draft_sockets
from rdu_cluster.scenarios import speculative
from workloads import sessions, traces
from workloads.errors import ConfigError
from workloads.speculative import Speculation, parse_acceptance, parse_tree


def check_unused(flags: Sequence[str], trace: bool, sessions: bool,
                 arrival: str | None = None) -> None:
    """Refuse the workload options among `flags` (given on the command line) that would have
    no effect: a trace brings its own lengths and arrivals, only sessions think or share a
    system prompt, and only bursty arrivals have a burstiness."""
    rules = (
        (("--think-time", "--system-prompt"), not sessions, "only with --sessions"),
        (("--prompt-len", "--output-len", "--arrival", "--burstiness"), trace,
         "not with --trace (the trace gives each request's lengths and arrival)"),
        (("--burstiness",), sessions,
         "not with --sessions (session starts take --arrival with its default shape)"),
        (("--burstiness",), arrival != "bursty",
         "only with --arrival bursty (the coefficient of variation of its gaps)"),
    )
    for names, applies, why in rules:
        hit = [f for f in flags if f in names]
        if applies and hit:
            raise ConfigError(f"{'/'.join(hit)}: {why}")


def trace(path, n, rate, arrival, burstiness, prompt_len, output_len, seed) -> traces.Trace:
    if path:
        return file_trace(path, n, rate)
    if n is None or rate is None:
        raise ConfigError("give --trace FILE, or --requests N and --rate R")
    _check_rate(rate)
    return traces.synthetic(
        n, rate, arrival,
        traces.LengthDist.parse(prompt_len, "--prompt-len"),
        traces.LengthDist.parse(output_len, "--output-len"),
        seed=seed, burstiness=burstiness,
    )


def file_trace(path, n: int | None = None, rate: float | None = None) -> traces.Trace:
    """The trace file, its first `n` requests, its arrivals scaled (times compressed or
    stretched, order and shape kept) to a mean of `rate` requests per second (inf: all at 0)."""
    t = traces.read_trace(path)
    if n is not None:
        if n < 1:
            raise ConfigError(f"--requests: must be positive, got {n}")
        t = _head(t, n)
    if rate is None:
        return t
    _check_rate(rate)
    if math.isinf(rate):
        return dataclasses.replace(t, arrival_s=t.arrival_s * 0.0)
    own = trace_rate(t)
    if not own:
        raise ConfigError(f"--rate {rate:g}: the trace {path} has no spread of arrivals to "
                          "rescale (one request, or all at one time)")
    return dataclasses.replace(t, arrival_s=(t.arrival_s - t.arrival_s[0]) * own / rate)


def trace_rate(t: traces.Trace) -> float | None:
    """Requests per second over the trace's span ((n - 1) gaps); None without a span."""
    span = float(t.arrival_s[-1] - t.arrival_s[0]) if len(t) else 0.0
    return (len(t) - 1) / span if span > 0 else None


def _head(t: traces.Trace, n: int) -> traces.Trace:
    if n >= len(t):
        return t
    if t.after is not None and (t.after[:n] >= n).any():
        raise ConfigError("--requests: cuts a session of the trace")
    cut = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)}
    head: dict[str, Any] = {k: (v[:n] if v is not None and not isinstance(v, str) else v)
                            for k, v in cut.items()}
    return traces.Trace(**head)


def _check_rate(rate: float) -> None:
    if not (rate > 0 or math.isinf(rate)):
        raise ConfigError(f"--rate: must be positive, got {rate}")


def session_trace(path, n_requests, n, turns, rate, arrival, prompt_len, output_len, system,
                  think, seed) -> traces.Trace:
    """--sessions N --turns T: the multi-turn workload (workloads/sessions.py)."""
    flag = "--sessions" if n is not None else "--turns"
    if path or n_requests is not None:
        raise ConfigError(f"{flag}: not with --trace or --requests")
    if n is None or turns is None:
        raise ConfigError("--sessions and --turns go together")
    if rate is not None:
        _check_rate(rate)
    spec = sessions.SessionSpec(
        n, turns, system, traces.LengthDist.parse(prompt_len, "--prompt-len"),
        traces.LengthDist.parse(output_len, "--output-len"), sessions.ThinkTime.parse(think),
        math.inf if rate is None else rate, arrival)
    return sessions.sessions(spec, seed)


def speculation(model, cluster, trace, draft, spec_k, acceptance, max_batch, tree, placement,
                draft_sockets, plan, options=None) -> Speculation | None:
    """--draft/--spec-k/--acceptance/--tree as simulate parses them; k by default: the fastest
    per request in 1..16 (a tree: up to its depth) at the trace's mean lengths, the batch the
    run can reach (--max-batch, or what the KV cache holds beside the draft) and the
    placement, on the plan's tp, with the run's execution `options` (speculative.best_k)."""
    if draft is None:
        given = [n for n, v in (("--spec-k", spec_k), ("--acceptance", acceptance),
                                ("--tree", tree)) if v is not None]
        if given or placement != "shared" or draft_sockets != 1:
            raise ConfigError(f"{'/'.join(given) or '--draft-placement/--draft-sockets'}: "
                              "only with --draft")
        return None
    check_draft(draft, model, trace)
    speculative.check_sockets(placement, draft_sockets)
    if placement == "separate":  # the replica's layout, as the engine checks it, before k
        check_draft_sockets(cluster, PlanSpec.parse(plan, cluster, model), draft_sockets)
    acc = (speculative.default_acceptance(draft, model.name) if acceptance is None
           else parse_acceptance(acceptance))
    branching = parse_tree(tree)
    if spec_k is not None:
        if spec_k < 1:
            raise ConfigError(f"--spec-k: must be positive, got {spec_k}")
        return Speculation(spec_k, acc, branching)
    tp = PlanSpec.parse(plan, cluster, model).tp
    scenario = Scenario(model, cluster, tensor_plan(cluster, tp), 1,
                        float(trace.prompt_len.mean()), float(trace.output_len.mean()), options)
    # at the most sequences the run can hold: --max-batch, or fewer where the KV cache holds
    # fewer (a GPU stack's default cap, thousands, is the engine's, not the memory's); halved
    # while the draft's weights and KV beside them do not fit
    batch = max(1, min(max_batch, evaluate.kv_batch(scenario)))
    while True:
        try:
            return speculative.best_k(scenario.but(batch=batch), acc, draft,
                                      ks=range(1, (len(branching) if branching else 16) + 1),
                                      branching=branching, placement=placement,
                                      draft_sockets=draft_sockets).speculation
        except PlanDoesNotFit:
            if batch == 1:
                raise
            batch = max(1, batch // 2)


def check_draft(draft: str | None, model, trace: traces.Trace) -> None:
    """The draft against the target and the trace's longest request (speculative.check_draft)."""
    if draft is None or not len(trace):
        return
    worst = int(np.argmax(trace.prompt_len + trace.output_len))
    speculative.check_draft(draft, model, int(trace.prompt_len[worst]),
                            int(trace.output_len[worst]))
