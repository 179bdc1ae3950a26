"""Plan search: enumerate every valid plan on a cluster, evaluate each with an injected
evaluator, keep those that fit, rank them by an objective.

Enumeration: every model group (tp, ep, pp) whose product divides the cluster's socket count
(so 1, 2, 4, 8 or 16 sockets of a 16-socket system), as one replica (dp 1) and filling the
cluster (dp = sockets / group) -- the replica counts that can differ on the structure --, ep only
for MoE models; for MoE models also with attention data-parallel over the whole stage width
(adp = tp x ep: one socket's attention per group, as engines serve DeepSeek-style models), and
for each mixer kind of a
hybrid model every degree d dividing the stage width and the mixer's heads with d >= width / 4
(a per-block choice). Plans that fail `validate` are never built; plans that do not fit are
returned as rejected, with the reason.

Objectives: "latency" (tokens/s per request, highest first), "throughput" (tokens/s over all
replicas), "sockets" (fewest sockets, then latency). Ties go to fewer sockets, then the name.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from partitioning.plan import Plan, mixer_heads, validate
from workloads.errors import ConfigError
from workloads.spec import Mixer, ModelSpec

OBJECTIVES = ("latency", "throughput", "sockets")
# The largest node a plan search covers. The search costs every candidate's collectives flow by
# flow over the node (their routes and shared links), and a node's candidates grow with its
# divisors: a switched node of 128 sockets is searched in ~10 s on 2 cores (Llama 3.1 8B), 256
# in ~20 s, 2,048 in minutes. Scale-up nodes that ship hold 8 to 72 (GB200 NVL72); a larger
# one is evaluated under a given plan (one plan of a 2,048-socket node: ~5 s).
MAX_SEARCH_SOCKETS_PER_NODE = 128


@dataclass(frozen=True)
class SearchResult:
    ranked: tuple[Any, ...]  # evaluator results, best first
    rejected: tuple[tuple[Plan, str], ...]  # plans that do not fit, with the reason
    evaluated: int


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_searchable(sockets_per_node: int) -> None:
    """Refuse a plan search over a node past MAX_SEARCH_SOCKETS_PER_NODE, naming the way out."""
    if sockets_per_node > MAX_SEARCH_SOCKETS_PER_NODE:
        raise ConfigError(
            f"--plan: a plan search over a node of {sockets_per_node:,} sockets is bounded to "
            f"nodes of {MAX_SEARCH_SOCKETS_PER_NODE} (it costs each candidate's collectives "
            "over the whole node); give the plan, e.g. --plan tp8")


def enumerate_plans(spec: ModelSpec, sockets: int) -> Iterator[Plan]:
    """The plans `validate` accepts on a cluster of `sockets` sockets that can differ on its
    structure, fewest sockets first: every model group (tp, ep, pp, per-block degrees) whose
    size divides the cluster, as one replica and as replicas on every socket. Replicas occupy
    consecutive blocks of sockets laid out alike, so a replica count in between repeats the
    same groups and routes in fewer copies: the per-request figures of one replica, a total
    below the full cluster's, more sockets than one replica. It can rank first for no
    objective and is not enumerated (Llama 3.1 70B on 1,024 sockets: 105 plans, not 266)."""
    moe = spec.moe is not None
    mixers = sorted({la.mixer for la in spec.layers} - {Mixer.NONE}, key=lambda m: m.value)
    plans = []
    for group in divisors(sockets):
        for tp, ep in itertools.product(divisors(group), repeat=2):
            pp = group // (tp * ep)
            if group % (tp * ep) or (ep > 1 and not moe):
                continue
            choices = [(c, 1) for c in _block_choices(spec, mixers, tp * ep)]
            if moe and tp * ep > 1:
                choices.append(((), tp * ep))
            for choice, adp in choices:
                for dp in sorted({1, sockets // group}):
                    plan = Plan(tp=tp, pp=pp, ep=ep, dp=dp, mixer_tp=choice, adp=adp)
                    try:
                        validate(plan, spec, sockets)
                    except ConfigError:
                        continue
                    plans.append(plan)
    yield from sorted(plans, key=lambda p: p.sockets)


def _block_choices(spec: ModelSpec, mixers: list[Mixer], width: int):
    """Per-block degrees: explored for hybrids; for one mixer kind only where the width does
    not divide its heads (then the largest degree that does)."""
    options = []
    for mixer in mixers:
        heads = mixer_heads(spec, mixer)
        ok = [d for d in divisors(width) if heads % d == 0 and d * 4 >= width] or [1]
        if len(mixers) == 1:
            ok = ok[-1:]
        options.append([(mixer, d) for d in ok])
    for combo in itertools.product(*options):
        yield tuple((m, d) for m, d in combo if d != width)


def rank_key(objective: str) -> Callable[[Any], tuple]:
    if objective not in OBJECTIVES:
        raise ConfigError(f"--objective: {objective!r}; accepted: {', '.join(OBJECTIVES)}")
    if objective == "latency":
        return lambda e: (-e.tokens_per_s_per_request, e.plan.sockets, e.plan.name)
    if objective == "throughput":
        return lambda e: (-e.tokens_per_s_total, e.plan.sockets, e.plan.name)
    return lambda e: (e.plan.sockets, -e.tokens_per_s_per_request, e.plan.name)


def search(
    plans: Iterable[Plan],
    evaluator: Callable[[Plan], Any],
    objective: str = "latency",
) -> SearchResult:
    """Evaluate each plan; `evaluator` raises ConfigError (PlanDoesNotFit) for a plan that does
    not fit and returns an object with .plan, .tokens_per_s_per_request, .tokens_per_s_total."""
    key = rank_key(objective)
    ok, rejected, n = [], [], 0
    for plan in plans:
        n += 1
        try:
            ok.append(evaluator(plan))
        except ConfigError as e:
            rejected.append((plan, str(e)))
    return SearchResult(tuple(sorted(ok, key=key)), tuple(rejected), n)
