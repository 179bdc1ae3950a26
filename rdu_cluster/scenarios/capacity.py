"""Capacity planning to a latency SLO: the cheapest deployments of a model that serve a traffic
at a TTFT / TPOT bound, found in two passes (as AIConfigurator and Vidur's config search do):

1. Analytic pre-filter, from the step costs of partitioning.estimate. Per system and replica
   plan: the largest batch whose decode step keeps TPOT within the bound (and whose KV fits),
   one prompt's prefill time, and for each deployment size (whole nodes) the load it would see:
   with N closed-loop users (or a rate, through Little's law) each replica runs about N / n
   sequences and prefills its share of the arrivals, lambda = N / E2E. In an aggregated replica
   prefill steps stall the decodes, so the decode share of time is 1 - rho (rho = lambda / n x
   prefill time) and the TPOT seen is TPOT(batch) / (1 - rho): its arrivals come fewer than one
   a decode step, so each prompt prefills alone. The smallest deployment that
   passes is the system's candidate. A disaggregated pair sizes its decode pool from the TPOT
   bound alone and its prefill pool to keep rho <= PREFILL_RHO_MAX, rho counted at a prompt's
   share of a full prefill step (the pool's queue fills its steps to the token budget).
2. Verification: each short-listed deployment is served by the engine (engine/simulation.py
   or engine/disagg.py) and the SLO percentile of TTFT and TPOT is measured (engine/bench.py),
   each client's first request left out as warm-up. `search` bisects to the boundary: the
   fewest replicas that meet, one fewer verified to miss, within --max-nodes. `settle` then
   serves the boundary row with twice the requests until it moves less than STEADY_TOL (its
   own move: a row found at the longer count is measured on its own run at half it), with
   SEEDS seeds where lengths are drawn, and searches the interval's ends (_with_ends: the SLO's
   bounds over the uncertainty model's factors, on the same runs). A search's run stops once
   it certainly misses the bound it is judged on (engine/decided.py: most runs miss), and is
   served again to its end where its figures, or another bound, are asked for.

Closed loops (clients, sessions) start over a ramp of one estimated cycle (E2E and think time)
so that they do not all prefill at once; pairs of pools are verified as aggregated deployments
are (engine/disagg.py runs both pools in one event loop).
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np

from chip import serving_stacks
from partitioning.estimate import Estimate, estimate
from partitioning.evaluate import footprint
from partitioning.plan import Plan as PartitionPlan
from partitioning.scenario import Scenario, tensor_plan
from rdu_cluster.config import ClusterSpec, FabricSpec, load_cluster
from rdu_cluster.engine import alike, bench, decided
from rdu_cluster.engine.disagg import Disaggregated, Pool, group_sockets, transfer_time
from rdu_cluster.engine.prefix_cache import PrefixConfig
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from rdu_cluster.scenarios import speculative
from rdu_cluster.scenarios.boundary import boundary
from rdu_cluster.validation import calibration
from workloads import graph, traces
from workloads.errors import ConfigError
from workloads.spec import ModelSpec
from workloads.speculative import Speculation

BATCHES = np.array([1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512])
PREFILL_RHO_MAX = 0.8  # a prefill pool's utilization cap: queueing grows as 1/(1-rho) (M/D/1)
# Steady state: a closed loop is verified with STEADY_START requests per user, the first of
# each left out (warm-up); the boundary row is served again with twice the requests until its
# pP TTFT, pP TPOT and output throughput move less than STEADY_TOL (a pP on the scale of its
# bound where it lies under it, _moved; at most STEADY_DOUBLINGS
# times); lengths drawn from a distribution are served with SEEDS seeds, the worst deciding.
STEADY_START = 4
STEADY_TOL = 0.05
STEADY_DOUBLINGS = 3
SEEDS = 3
FIXED_POINT_ROUNDS = 50  # _load: rounds for E2E to settle within 0.1%
PAIR_PASSES = 3  # search: a pair's pools searched in turn at most this many times
MAX_BATCH_CAP = 512  # the engine's --max-batch ceiling tried here (vLLM's max_num_seqs is 256-1024)


@dataclass(frozen=True)
class SLO:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    percentile: float = 99.0

    @classmethod
    def parse(cls, items: Sequence[str], percentile: float) -> SLO:
        for item in items:  # e2el is a goodput key, not an SLO one: named as the only keys
            if item.partition(":")[0] not in ("ttft", "tpot"):
                raise ConfigError(f"--slo: {item!r}; accepted: KEY:MS with KEY one of ttft, tpot")
        bounds = dict(bench.MetricSpec.parse(None, [f.replace("slo", "") for f in items],
                                             "--slo").goodput)
        if not 0 < percentile < 100:
            raise ConfigError(f"--slo-percentile: {percentile} must be in (0, 100)")
        if not bounds:
            raise ConfigError("--slo: give at least one bound (ttft:MS, tpot:MS)")
        return cls(bounds.get("ttft"), bounds.get("tpot"), percentile)

    def misses(self, ttft_ms: float, tpot_ms: float) -> float:
        """How far the worse measure is over its bound (0.1: 10% over; <= 0 meets)."""
        parts = [m / b - 1 for m, b in ((ttft_ms, self.ttft_ms), (tpot_ms, self.tpot_ms))
                 if b is not None]
        return max(parts)

    def part(self, key: str) -> SLO | None:
        """The SLO's bound on `key` alone ('ttft': the one a pair's prefill pool sets, 'tpot':
        its decode pool's); None where the SLO has not both (the part is the whole, or none)."""
        if self.tpot_ms is None or self.ttft_ms is None:
            return None
        return replace(self, tpot_ms=None) if key == "ttft" else replace(self, ttft_ms=None)

    def goodput_args(self) -> str:
        return " ".join(f"{k}:{v:g}" for k, v in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms))
                        if v is not None)


@dataclass(frozen=True)
class Traffic:
    concurrency: int | None
    rate: float | None
    prompt: str = "1024"
    output: str = "256"
    requests: int | None = None  # default: 2 per user (closed loop) or 2 x rate x 30 s
    seed: int = 0
    prefix_cache: str | None = None  # serve --prefix-cache (None: its default)
    # A fixed workload (a trace file, or the multi-turn sessions) replayed as it is, and the
    # serve arguments that rebuild it; None: synthetic requests of `prompt` / `output`.
    trace: traces.Trace | None = None
    workload_args: tuple[str, ...] = ()
    think_s: float = 0.0  # sessions: mean seconds a user thinks between turns
    # closed loops (clients, sessions) start over one estimated cycle (E2E and think time:
    # Deployment.ramp_s) instead of all at 0, or over ramp_s seconds where given (--ramp-up);
    # False: sessions a --rate starts
    ramp: bool = True
    ramp_s: float | None = None
    steady_tol: float | None = STEADY_TOL  # None: no doubling check (--steady-tolerance off)
    spec_args: tuple[str, ...] = ()  # the --acceptance / --tree given with --draft

    @property
    def sessions(self) -> bool:
        return self.trace is not None and self.trace.after is not None

    def ramp_of(self, dep: Deployment) -> float:
        """Seconds over which the closed loops start (0: together, or a --rate starts them)."""
        if not self.ramps:
            return 0.0
        return dep.ramp_s if self.ramp_s is None else self.ramp_s

    @property
    def ramps(self) -> bool:
        """Whether the closed loops start over the ramp (not a --rate's session starts)."""
        return self.ramp and self.concurrency is not None and (self.trace is None
                                                               or self.sessions)

    def prefill_share(self, outputs: bool = True) -> float:
        """The share of prompt tokens prefilled (not served from the prefix cache): those past
        the longest prefix an earlier request of the trace holds (a session's turns reach the
        replica of its first: engine/dispatch.py), its output held with it or not (a pair's
        prefill pool serves each prompt for one token: the answer it never computed is
        prefilled with the next turn). Every cached prefix kept: a lower bound on the work,
        which verification checks (the sessions question's H100 tp2 x 11 -> SN40L-16 pair:
        0.348 without outputs, a hit rate of 65.1% served). 1 without a cache or content."""
        if self.prefix_cache == "off" or self.trace is None or self.trace.content is None:
            return 1.0
        return uncached_tokens(self.trace, outputs) / float(self.trace.prompt_len.sum())

    @property
    def one_token(self) -> bool:
        """Every request has one output token, so none has a TPOT (a fixed or uniform length,
        or a lognormal of sigma 0, that rounds to 1; a trace's own lengths)."""
        if self.trace is not None:
            return bool((self.trace.output_len <= 1).all())
        d = self.dists()[1]
        top = d.b if d.kind == "uniform" else d.a if d.kind == "fixed" or d.b == 0 else math.inf
        return top < 1.5  # the largest length drawn rounds to 1

    def dists(self) -> tuple[traces.LengthDist, traces.LengthDist]:
        return (traces.LengthDist.parse(self.prompt, "--prompt-len"),
                traces.LengthDist.parse(self.output, "--output-len"))

    def mean_lengths(self) -> tuple[float, float]:
        if self.trace is not None:
            return float(self.trace.prompt_len.mean()), float(self.trace.output_len.mean())
        p, o = self.dists()
        draw = lambda d: float(np.mean(d.sample(np.random.default_rng(0), 4096)))
        return draw(p), draw(o)

    def n_requests(self, rate: float) -> int:
        if self.trace is not None:
            return len(self.trace)
        if self.requests:
            return self.requests
        if self.concurrency:
            return STEADY_START * self.concurrency
        return max(50, int(rate * 30))

    @property
    def warmup(self) -> int:
        """Requests left out of the statistics as warm-up: a closed loop's first request of
        each client or session (the ramp: serve --warmup-requests)."""
        closed = self.concurrency and (self.trace is None or self.sessions)
        return cast(int, self.concurrency) if closed else 0  # closed: it has a concurrency

    @property
    def steadies(self) -> bool:
        """Whether the runs are taken to steady state: synthetic traffic (not a trace or the
        sessions, the question's own workload) checked by doubling, measured with the initial
        transient left out (MetricSpec.mser)."""
        return self.trace is None and bool(self.steady_tol)

    @property
    def drawn(self) -> bool:
        """Whether its lengths are drawn (a distribution), so that seeds differ."""
        return self.trace is None and any(d.kind != "fixed" for d in self.dists())


@traces.per_trace()
def uncached_tokens(trace: traces.Trace, outputs: bool = True) -> int:
    """Prompt tokens of `trace` past the longest chunk prefix an earlier request held: its
    prompt and, with `outputs`, its output (a turn's answer is cached with it, as vLLM's
    prefix cache keeps it where it was decoded). Once a trace (the analytic pass asks it of
    every plan: 49 times, ~10 ms each, for the sessions question)."""
    seen: set[int] = set()
    total = 0
    # asked only of a trace with content (Traffic.prefill_share)
    content = cast("tuple[tuple[tuple[int, int], ...], ...]", trace.content)
    for i, chunks in enumerate(content):
        keys = list(itertools.accumulate(chunks, lambda k, c: hash((k, c)), initial=0))[1:]
        hit = sum(n for _, n in itertools.takewhile(
            lambda kc: kc[0] in seen, zip(keys, (c[1] for c in chunks))))
        prompt = int(trace.prompt_len[i])
        total += max(prompt - hit, 0)
        held = prompt + (int(trace.output_len[i]) if outputs else 0)
        ends = itertools.accumulate(n for _, n in chunks)
        seen.update(k for k, end in zip(keys, ends) if end <= held)
    return total


@dataclass(frozen=True)
class ReplicaCost:
    """Analytic costs of one replica of `plan` on `cluster`: TPOT at each batch of BATCHES up
    to the KV limit, one prompt's prefill, and the KV limit itself. `prefill_each_s`: a
    prompt's share of a full prefill step, as many prompts as the token budget holds in one
    pass (the engine batches queued prompts so; a sparse MoE model reads more of its experts'
    weights once for them all: DeepSeek-V3 FP8 on hgx-h200 tp8, 36 ms for one 1,024-token
    prompt, 18 ms each for eight): what a loaded prefill pool spends on each prompt. None: the
    prompt's own prefill (speculative candidates)."""

    cluster: str
    plan: str
    group: int
    batches: np.ndarray
    tpot_s: np.ndarray
    prefill_s: float
    kv_batch: int
    price_per_socket_hour: float | None
    sockets_per_node: int
    draft: str | None = None  # speculative decoding: the draft model and its speculation
    speculation: Speculation | None = None
    stack: str | None = None  # the GPU serving stack (chip/serving_stacks.py); None off a GPU
    overrides: tuple = ()  # --set on the cluster (Pool.overrides)
    prefill_each_s: float | None = None

    @property
    def prefill_service_s(self) -> float:
        """The prefill time a loaded prefill pool spends on each prompt (its utilization's
        unit)."""
        return self.prefill_s if self.prefill_each_s is None else self.prefill_each_s

    def pool(self, replicas: int) -> Pool:
        return Pool(self.cluster, self.plan, replicas, self.overrides)

    def max_batch(self, tpot_bound_s: float | None) -> int:
        ok = self.batches if tpot_bound_s is None else self.batches[self.tpot_s <= tpot_bound_s]
        return int(min(ok.max(), self.kv_batch, MAX_BATCH_CAP)) if len(ok) else 0

    def tpot_at(self, batch: float) -> float:
        """TPOT at `batch`, linear between the evaluated batches (a decode step's cost is
        close to linear in batch between them: weights once, KV and FLOPs per sequence); inf
        beyond the KV capacity or the largest batch evaluated."""
        if batch > self.kv_batch or batch > self.batches[-1]:
            return math.inf
        return float(np.interp(batch, self.batches, self.tpot_s))


def replica_cost(model: ModelSpec, replica: Pool, lengths: tuple[float, float],
                 fabric: FabricSpec, draft: str | None = None,
                 choose: Callable[[ClusterSpec, str], Speculation] | None = None,
                 stack: str | None = None) -> ReplicaCost | None:
    """The costs of one replica (`replica`: its cluster, plan and --set overrides; its count
    is ignored). None when the plan does not fit the chip (weights, or no room for one
    sequence's KV). `lengths`: the mean (prompt, output) lengths; `stack`: the GPU serving
    stack (default: the default stack; chip/serving_stacks.py). With `draft`: speculative
    decoding, `choose` giving the speculation on the replica's cluster and plan; TPOT is then
    the speculative step over the tokens it emits (scenarios/speculative.py), on
    tensor-parallel plans only (the draft shares the target's sockets)."""
    cluster_ref, plan, overrides = replica.cluster, replica.plan, replica.overrides
    try:
        cl = replace(replica, replicas=1).spec(model, fabric)
    except ConfigError:
        return None
    options = serving_stacks.options_for(cl.chip, stack, system=cluster_ref)
    prompt, gen = lengths
    g = cl.sockets
    hbm = cl.chip.hbm.capacity_bytes
    p = PartitionPlan.parse(plan)
    # The one footprint (partitioning.evaluate.footprint): weights, the activation workspace
    # and what the runtime reserves (chip/runtime_memory.py) per socket, and one sequence's KV
    # cache with heads replicated where tp exceeds them: a plan an engine would not start is no
    # candidate; the engine sizes its KV blocks from what the same regions leave.
    try:
        base = Scenario(model, cl, p, 1, int(prompt), int(gen), options)
        fps, why = footprint(base, check=False)
    except ConfigError:
        return None
    if why:
        return None
    resident = max(fp.region("weights") + fp.regions.get(("activations", "hbm"), 0.0)
                   + fp.regions.get(("reserved", "hbm"), 0.0) for fp in fps)
    per_seq = max(fp.region("kv_cache") for fp in fps)
    # Attention data-parallel groups each hold the KV of their own sequences
    kv_batch = p.adp * int((hbm - resident) // per_seq) if hbm > resident else 0
    batches = BATCHES[BATCHES <= kv_batch]
    if not len(batches):
        return None
    at = lambda b: estimate(base.but(batch=b))
    named = serving_stacks.stack_of(cl.chip, options)
    if draft is not None:
        if p.pp != 1 or p.ep != 1 or p.adp != 1:
            return None
        try:
            memo: dict
            # a draft comes with its `choose` (the docstring)
            spec, memo = cast("Callable[[ClusterSpec, str], Speculation]", choose)(cl, plan), {}
            ests = [speculative.speculative_estimate(
                base.but(plan=tensor_plan(cl, p.tp), batch=int(b)), spec, draft, memo=memo)
                for b in batches]
            tpot = np.array([float(e.tpot_s) for e in ests])
            prefill = float(ests[0].ttft_s)  # batch 1 (BATCHES[0]): the draft's prefill too
        except ConfigError:
            return None
        price = cl.cost.get("socket_hour_usd") if cl.cost else None
        return ReplicaCost(cluster_ref, plan, g, batches, tpot, prefill, kv_batch, price,
                           load_cluster(cluster_ref, dict(overrides)).sockets_per_node,
                           draft, spec, named, overrides)
    try:
        if p.pp == 1 and p.ep == 1:  # tensor parallel: one vectorized call over the batches
            est = at(batches)
            tpot = np.asarray(est.tpot_s, dtype=float)
            prefill = float(np.asarray(est.ttft_s).ravel()[0])  # one prompt's forward pass
        else:
            tpot = np.array([float(at(int(b)).tpot_s) for b in batches])
            prefill = float(at(1).ttft_s)
    except ConfigError:
        return None
    price = cl.cost.get("socket_hour_usd") if cl.cost else None
    return ReplicaCost(cluster_ref, plan, g, batches, tpot, prefill, kv_batch, price,
                       load_cluster(cluster_ref, dict(overrides)).sockets_per_node,
                       stack=named, overrides=overrides,
                       prefill_each_s=_prefill_each(at, prompt, kv_batch, prefill))


def _prefill_each(at: Callable[[int], Estimate], prompt: float, kv_batch: int,
                  alone: float) -> float:
    """A prompt's share of a prefill step of as many prompts as serve's token budget holds
    (the engine's prefill-first and chunked schedulers fill a step so when prompts queue);
    `alone` (one prompt's) where one fills the budget or more would not fit."""
    k = min(Limits().token_budget // max(int(prompt), 1), kv_batch)
    if k <= 1:
        return alone
    try:
        return min(float(np.asarray(at(k).ttft_s).ravel()[0]) / k, alone)
    except ConfigError:
        return alone


def replica_plans(model: ModelSpec, cluster_ref: str, max_nodes: int) -> list[str]:
    """Tensor-parallel plans over a quarter of a node up to two nodes, and tp x pp over two
    nodes (a node per stage): the replica shapes a serving deployment uses; for an MoE model
    also attention data parallelism with experts over a node and over two (adp8ep8,
    adp16ep16 on 8-GPU nodes: how engines serve DeepSeek-style models) where the experts
    divide. Wider replicas cost more analytic time (pipeline plans go through the partitioner
    per batch) and rarely win for serving; give them with --plan."""
    spn = load_cluster(cluster_ref).sockets_per_node
    out = [f"tp{g}" for g in (spn // 4, spn // 2, spn) if g >= 1]
    if max_nodes >= 2:
        out += [f"tp{spn * 2}", f"tp{spn}pp2"]
    if model.moe is not None:
        out += [f"adp{g}ep{g}" for g in (spn, 2 * spn)[: 1 + (max_nodes >= 2)]
                if g > 1 and model.moe.num_experts % g == 0]
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Deployment:
    label: str  # the system: a cluster name, or PREFILL->DECODE
    pools: tuple[Pool, ...]  # one (aggregated) or (prefill, decode)
    max_batch: int
    ramp_s: float  # closed loop: clients (sessions) start one after another over this
    sockets_per_node: tuple[int, ...]
    socket_prices: tuple[float | None, ...]  # USD per socket-hour of each pool's chip
    analytic: dict = field(default_factory=dict, compare=False)
    draft: str | None = None  # speculative decoding (aggregated only)
    speculation: Speculation | None = None
    stack: str | None = None  # the GPU pools' serving stack; None where no pool is a GPU

    @property
    def disaggregated(self) -> bool:
        return len(self.pools) == 2

    @property
    def sockets(self) -> int:
        return sum(p.replicas * group_sockets(p.plan) for p in self.pools)

    @property
    def price_per_hour(self) -> float | None:
        """Sockets are priced by the socket-hour (a deployment need not fill its last node)."""
        if None in self.socket_prices:
            return None
        prices = cast("tuple[float, ...]", self.socket_prices)  # none is None (above)
        return sum(u * p.replicas * group_sockets(p.plan) for u, p in zip(prices, self.pools))

    @property
    def pool_nodes(self) -> list[int]:
        """The nodes each pool takes (its sockets in whole nodes)."""
        return [-(-p.replicas * group_sockets(p.plan) // n)
                for p, n in zip(self.pools, self.sockets_per_node)]

    @property
    def nodes(self) -> int:
        return sum(self.pool_nodes)

    def within(self, max_nodes: int) -> bool:
        """Whether every pool holds at most `max_nodes` nodes (--max-nodes: per pool)."""
        return max(self.pool_nodes) <= max_nodes

    def most_replicas(self, pool: int, max_nodes: int) -> int:
        """The most replicas pool `pool` takes within `max_nodes` nodes."""
        p = self.pools[pool]
        return max(1, max_nodes * self.sockets_per_node[pool] // group_sockets(p.plan))

    def with_replicas(self, pool: int, n: int) -> Deployment:
        pools = list(self.pools)
        pools[pool] = replace(pools[pool], replicas=n)
        return replace(self, pools=tuple(pools))


def aggregated(cost: ReplicaCost, traffic: Traffic, slo: SLO, max_nodes: int,
               prompt: float, gen: float) -> Deployment | None:
    """The fewest replicas of `cost`'s plan that pass the analytic test (sockets are priced
    by the socket-hour, so a deployment need not fill its last node)."""
    bound = None if slo.tpot_ms is None else slo.tpot_ms / 1e3
    b_max = cost.max_batch(bound)
    prefill = cost.prefill_s * traffic.prefill_share()
    if not b_max or (slo.ttft_ms is not None and prefill > slo.ttft_ms / 1e3):
        return None
    for n in range(1, max_nodes * cost.sockets_per_node // cost.group + 1):
        ok, e2e, tpot_eff, rho = _load(cost, prefill, traffic, n, gen, b_max)
        if ok and (bound is None or tpot_eff <= bound):
            return Deployment(cost.cluster, (cost.pool(n),), b_max,
                              _short(e2e + traffic.think_s), (cost.sockets_per_node,),
                              (cost.price_per_socket_hour,),
                              {"tpot_s": tpot_eff, "rho": rho, "e2e_s": e2e}, cost.draft,
                              cost.speculation, cost.stack)
    return None


def _load(cost: ReplicaCost, prefill: float, traffic: Traffic, n: int, gen: float,
          b_max: int) -> tuple[bool, float, float, float]:
    """(fits, E2E, TPOT with prefill stalls, prefill utilization) of n replicas. A user who
    thinks between requests (sessions) is in the batch e2e / (e2e + think) of the time."""
    tpot, last, rho = cost.tpot_at(1), math.nan, 0.0
    rate = cast(float, traffic.rate)  # read only where there is no concurrency: an open loop
    # fixed point: the batch and the prefill share depend on E2E, E2E on the TPOT they give.
    # Until E2E settles: cut at four rounds it could oscillate (a short E2E, so many prefills
    # that the TPOT stretches, so a long E2E ...) and pass one replica on a TPOT and an E2E of
    # different rounds (E2E 2.86 s for a 0.15 s cycle: the ramp ten cycles long). A load that
    # does not settle is taken as not carried.
    for _ in range(FIXED_POINT_ROUNDS):
        e2e = prefill + (gen - 1) * tpot
        if abs(e2e - last) <= 1e-3 * e2e:
            return True, e2e, tpot, rho
        last = e2e
        cycle = e2e + traffic.think_s
        users = traffic.concurrency * e2e / cycle if traffic.concurrency else rate * e2e
        batch = users / n
        if batch > b_max:
            return False, e2e, math.inf, 1.0
        lam = (traffic.concurrency / cycle) if traffic.concurrency else rate
        rho = lam / n * prefill
        if rho >= 1:
            return False, e2e, math.inf, rho
        tpot = cost.tpot_at(max(1.0, batch)) / (1 - rho)
    return False, e2e, math.inf, rho


def disaggregated(pre: ReplicaCost, dec: ReplicaCost, traffic: Traffic, slo: SLO,
                  max_nodes: int, lengths: tuple[float, float], model: ModelSpec,
                  fabric: FabricSpec) -> Deployment | None:
    """The fewest decode replicas of `dec` and prefill replicas of `pre` that carry `traffic`
    within `slo` (analytically: the verification serves it); `lengths`: the mean (prompt,
    output) lengths, as replica_cost takes them."""
    prompt, gen = lengths
    bound = None if slo.tpot_ms is None else slo.tpot_ms / 1e3
    b_max = dec.max_batch(bound)
    if not b_max or (slo.ttft_ms is not None and pre.prefill_s > slo.ttft_ms / 1e3):
        return None
    move = float(transfer_time(fabric, pre.group, dec.group,
                               np.array([prompt * float(graph.kv_cache_bytes(model, 1, 1))]))[0])
    # the prefix cache is the prefill pool's, without the answers (decoded elsewhere)
    share = traffic.prefill_share(outputs=False)
    prefill = pre.prefill_s * share
    users = traffic.concurrency
    rate = cast(float, traffic.rate)  # read only where there are no users: an open loop
    for n_d in range(1, max_nodes * dec.sockets_per_node // dec.group + 1):
        tpot = dec.tpot_at(1)
        for _ in range(4):  # fixed point: the batch depends on E2E (a user thinks out of it)
            e2e = prefill + move + gen * tpot
            if not math.isfinite(e2e):
                break
            batch = (users * e2e / (e2e + traffic.think_s) if users else rate * e2e) / n_d
            tpot = dec.tpot_at(max(1.0, batch))
        if math.isfinite(tpot) and batch <= b_max and (bound is None or tpot <= bound):
            break
    else:
        return None
    e2e = prefill + move + gen * tpot
    lam = users / (e2e + traffic.think_s) if users else rate
    service = pre.prefill_service_s * share  # a loaded pool batches prompts
    n_p = max(1, math.ceil(lam * service / PREFILL_RHO_MAX))
    if n_p * pre.group > max_nodes * pre.sockets_per_node:
        return None
    return Deployment(f"{pre.cluster}->{dec.cluster}", (pre.pool(n_p), dec.pool(n_d)), b_max,
                      _short(e2e + traffic.think_s),
                      (pre.sockets_per_node, dec.sockets_per_node),
                      (pre.price_per_socket_hour, dec.price_per_socket_hour),
                      {"tpot_s": tpot, "rho": lam / n_p * service, "e2e_s": e2e,
                       "kv_transfer_s": move, "prefill_service_s": service},
                      stack=dec.stack or pre.stack)


def _short(x: float) -> float:
    """6 significant figures: the value serve_args prints is the value verified."""
    return float(f"{x:.6g}")


# -- verification -----------------------------------------------------------------------------
@dataclass
class Result:
    deployment: Deployment
    summary: dict
    ttft_ms: float
    tpot_ms: float
    miss: float
    serve_args: list[str]
    below: float | None = None  # the miss of one replica fewer (the boundary's other side)
    below_at_least: bool = False  # that run stopped once certain to miss: a lower bound
    slo: SLO | None = None  # the SLO `miss` is on (a pool's part is judged on it: search)
    steady: dict = field(default_factory=dict)  # how the steady state was checked (settle)
    interval: dict = field(default_factory=dict)  # nodes and $/Mtok ends, robust (_with_ends)
    # a run stopped once certain to miss (engine/decided.py): metric -> its pP at least (ms);
    # its other figures are lower bounds (0 where nothing is known) and its summary holds
    # nothing else: only a verdict, never a row
    decided: dict = field(default_factory=dict)

    @property
    def meets_slo(self) -> bool:
        return self.miss <= 0

    def answers(self, slo: SLO) -> bool:
        """Whether the run's verdict on `slo` is known: a whole run, or one stopped where a
        metric `slo` bounds is certain to exceed that bound (its pP at least a value over it)."""
        bound = lambda m: getattr(slo, f"{m}_ms")
        return not self.decided or any(bound(m) is not None and at_least > bound(m)
                                       for m, at_least in self.decided.items())


def search(dep: Deployment, serve: Callable[..., Result], max_nodes: int,
           slo: SLO | None = None) -> Result:
    """The deployment at the boundary (engine-verified): the fewest replicas that meet the SLO
    within --max-nodes (boundary). A disaggregated one, pool by pool on the bound each sets
    (SLO.part): the fewest decode replicas that meet TPOT (and, fewer than the count it
    starts from, the whole SLO: TTFT holds the decode queue), then the fewest prefill replicas
    that meet TTFT at that decode pool (down from a count that meets, the count its measured
    throughput saturates is asked next: saturated), again while the pair misses or a pool
    met at no size (at most PAIR_PASSES passes: more prefill replicas send the decode pool
    more work, so its TPOT may then miss).
    Judged on the whole SLO more decode replicas may only lengthen TTFT in a closed loop (a
    faster decode pool sends prompts faster to the same prefill pool), and more prefill ones
    never mend a TPOT. Nothing meets: the largest tried (the closest). `serve` is asked once
    per deployment; a run is judged on `slo` (default: its own SLO)."""
    seen: dict[tuple, Result] = {}

    def served(d: Deployment, part: str | None = None) -> Result:
        """d's run: the first asked of it may stop once certain to miss the bound it is
        judged on (`slo`, None: the caller's; on `part`, None: either)."""
        if d.pools not in seen:
            seen[d.pools] = serve(d, stop=(slo, part))
        return seen[d.pools]

    def whole(d: Deployment) -> Result:  # a run stopped early, served again to its end
        if served(d).decided:
            seen[d.pools] = serve(d, stop=None)
        return seen[d.pools]

    judge = _judge(slo)

    def miss(d: Deployment, part: str | None) -> float:
        """d's miss on `part` (a run stopped on a metric the part leaves out: served whole)."""
        r = served(d, part)
        bound = slo or r.slo
        if bound is not None and not r.answers((part and bound.part(part)) or bound):
            r = whole(d)
        return judge(r, part)

    def margin(d: Deployment, part: str | None, other: bool) -> float | bool:
        """d's miss for the boundary's line; its verdict alone where the miss is a lower bound
        (a run stopped once certain to miss) or on a bound other than its neighbours' (below
        a pool's start, the whole SLO where the part is asked above it)."""
        m = miss(d, part)
        return m <= 0 if other and part is not None or served(d).decided else m

    def fewest(base: Deployment, pool: int, part: str | None) -> tuple[Result, bool]:
        """The boundary of `pool` judged on `part` from base's count, and whether it is past
        the top (the largest is then returned, served to its end)."""
        at = lambda n: base.with_replicas(pool, n)
        start, top = base.pools[pool].replicas, base.most_replicas(pool, max_nodes)
        # below the count it starts from, judged on the whole SLO (which a part meets where
        # the whole does), so that its run stops on either bound: a decode pool too small
        # for the TTFT the prompts queue into would otherwise run to its end for its TPOT
        n = boundary(lambda n: margin(at(n), None if n < start else part, n < start), start,
                     top, (lambda n: saturated(served(at(n)))) if part == "ttft" else None)
        if n is None:
            return whole(at(top)), True
        below = miss(at(n - 1), None) if n > 1 else None
        return replace(served(at(n)), below=below, below_at_least=n > 1 and bool(
            served(at(n - 1)).decided)), False

    if not dep.disaggregated:
        return fewest(dep, 0, None)[0]
    for _ in range(PAIR_PASSES):
        res, decode_topped = fewest(dep, 1, "tpot")
        res, prefill_topped = fewest(res.deployment, 0, "ttft")
        dep = res.deployment
        if judge(res, None) <= 0 and not (decode_topped or prefill_topped):
            break  # again only while it misses, or a pool met at no size (its largest kept)
    return res


def saturated(r: Result) -> int | None:
    """The prefill pool's count at which the request throughput r's run carried saturates it
    (x a prompt's analytic prefill service time), rounded: the Llama 3.1 70B question's eight
    pairs had boundaries 0.92-1.03 times it at the analytic throughput, but for one whose
    TTFT the decode queue bounds. None without the service time or the run's figures (a run
    stopped as certain to miss)."""
    each = r.deployment.analytic.get("prefill_service_s")
    if each is None or r.decided or "bench" not in r.summary:
        return None
    return max(1, round(r.summary["bench"]["request_throughput"] * each))


def _judge(slo: SLO | None) -> Callable[[Result, str | None], float]:
    """A run's miss on `slo` (None: the run's own, Result.slo), or on its bound on `part`
    alone ('ttft', 'tpot': SLO.part)."""
    def judge(r: Result, part: str | None) -> float:
        whole = slo or r.slo
        if whole is None:
            return r.miss  # a run without its SLO (tests): the whole
        return judged(r, (whole.part(part) if part else None) or whole)
    return judge


def settle(dep: Deployment, serve: Callable[[Deployment, Traffic, SLO | None], Result],
           traffic: Traffic, max_nodes: int, slo: SLO | None = None) -> Result:
    """The boundary at steady state. Searched (search) at the traffic's request count; then,
    for synthetic traffic (a trace or the sessions are the question's own workload), the
    boundary row is served with twice the requests until its pP TTFT, pP TPOT and output
    throughput move less than STEADY_TOL (_moved: a pP under its bound on the bound's scale),
    the search going on at the longer count wherever the verdict changed, and one fewer
    asked there; a row found at that count is measured on its own run at half it, and doubled
    on while it moves and STEADY_DOUBLINGS last; lengths drawn from a distribution are
    served with SEEDS seeds, the worst deciding the verdict (the search going on with all of
    them if one misses), and the spread reported. With the `slo`, the row's interval
    (_with_ends), its ends searched on the same runs."""
    _kept.clear()  # another candidate's runs: their cost tables would outlive the process's cache
    try:
        return _settle(dep, serve, traffic, max_nodes, slo)
    finally:
        _kept.clear()


def _settle(dep: Deployment, serve: Callable[[Deployment, Traffic, SLO | None], Result],
            traffic: Traffic, max_nodes: int, slo: SLO | None = None) -> Result:
    runs: dict[tuple, Result] = {}
    bounds = None if slo is None else loosest(dep, slo)

    def cached(d: Deployment, t: Traffic, stop: tuple | None = (None, None)) -> Result:
        """Each deployment and traffic served once: to its end (stop None), or stopped once
        certain to miss `stop` = (an SLO, None: the loosest any judge of the row's own runs
        uses, the SLO's and its interval's optimistic end's; a part of it, None: both
        bounds). An interval end's search stops its runs on its own bounds: the pessimistic
        end's runs, above the row, are judged on nothing else."""
        key = (d.pools, t.n_requests(t.rate or 0.0), t.seed)
        if key not in runs or (stop is None and runs[key].decided):
            judged, part = stop or (None, None)
            whole: SLO | None = None if stop is None else judged or bounds
            on = None if whole is None else (part and whole.part(part)) or whole
            runs[key] = serve(d, t, on)
        return runs[key]

    def at(tr: Traffic, seeds: Sequence[int] = ()) -> Callable[..., Result]:
        """search's serve at tr's count: its seed, or the worst of `seeds` (drawn lengths);
        `stop` as `cached`'s."""
        def serve_at(d: Deployment, stop: tuple | None = (None, None)) -> Result:
            if len(seeds) <= 1:
                return cached(d, tr, stop)
            return _worst([cached(d, replace(tr, seed=k), stop) for k in seeds])
        return serve_at

    def own(row: Result, t: Traffic) -> float:
        """The row's move over its own last doubling: its deployment's run at half t's
        count against the row (a row found at t, by a verdict that changed there or one
        fewer that met, was not the one doubled)."""
        half = replace(t, requests=t.n_requests(t.rate or 0.0) // 2)
        return _moved(cached(row.deployment, half, None), row, slo)

    res = search(dep, at(traffic), max_nodes)
    moved, t = None, traffic
    left = STEADY_DOUBLINGS if traffic.steadies else 0
    tol = cast(float, traffic.steady_tol)  # (doubled only where it steadies: a tolerance)
    while True:
        while left and (moved is None or moved > tol):
            t, left = replace(t, requests=2 * t.n_requests(t.rate or 0.0)), left - 1
            again = cached(res.deployment, t, None)
            res = (again if again.meets_slo == res.meets_slo
                   else search(again.deployment, at(t), max_nodes))
            moved = own(res, t)
        seeds = [t.seed + k for k in range(SEEDS)] if t.drawn else [t.seed]
        # the runs at the search's first count (traffic's), and at the steady one (t's)
        final = at(t, seeds)
        if len(seeds) > 1:
            again = final(res.deployment, stop=None)
            res = again if again.meets_slo or not res.meets_slo else search(
                again.deployment, final, max_nodes)
        # a pair's saturation count asked first only where the count doubled: at the search's
        # own count one fewer was served already (the question's sessions: 5 runs more, each a
        # miss)
        doubled = t.n_requests(t.rate or 0.0) != traffic.n_requests(traffic.rate or 0.0)
        row = _one_fewer(res, final, max_nodes, doubled and res.deployment.disaggregated)
        changed, res = row.deployment != res.deployment, row
        if not (changed and doubled):
            break
        # one fewer met at the steady count: the new row's own doubling, and more while it
        # moves and the doublings last (a row at its prefill pool's saturation moved 15-35%
        # from half its count where the row it replaced had settled)
        moved = own(res, t)
        if moved <= tol or not left:
            break
    # settled: the row's own last doubling moved it less than the tolerance (None: not
    # doubled); False is a row still moving after STEADY_DOUBLINGS doublings, printed as such
    settled = None if moved is None else bool(moved <= tol)
    res = replace(res, steady={
        "requests": t.n_requests(t.rate or 0.0),
        "warmup_requests": res.summary.get("bench", {}).get("warmup_requests", t.warmup),
        "moved_on_doubling": moved, "tolerance": traffic.steady_tol, "settled": settled,
        "seeds": seeds, **res.steady})
    return _with_ends(res, final, slo, max_nodes, at(traffic, seeds)) if slo is not None else res


def loosest(dep: Deployment, slo: SLO) -> SLO:
    """The largest bound of each metric that a judge of dep's runs uses: the SLO's and its
    interval ends' (bands; the optimistic end's are looser). A run that certainly misses these
    misses every judge's."""
    out = slo
    b = bands(dep, slo)
    for end in (0, 1):
        e = b.slo(slo, end)
        if e is not None:
            out = replace(out, ttft_ms=_larger(out.ttft_ms, e.ttft_ms),
                          tpot_ms=_larger(out.tpot_ms, e.tpot_ms))
    return out


def _larger(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else max(a, b)


def _one_fewer(res: Result, serve: Callable[[Deployment], Result], max_nodes: int,
               hint: bool = False) -> Result:
    """The boundary's other side at the steady count: one replica fewer of the pool searched
    last (the first) served there too; where it meets at that count, the search goes on there
    (the runs at the shorter count had found the boundary). With `hint` (a pair's prefill
    pool) it is first asked at the count the row's own run saturates (saturated), where that
    lies two or more below: the start-up transient of a shorter run can hold the boundary
    above it (the Llama 3.1 70B question's `hgx-h200:tp2 + sn40l-16:tp16` BF16 pair: 21
    replicas at 2,000 requests, 16 at 16,000, where one fewer, 20, met and ran to its end
    there first)."""
    n = res.deployment.pools[0].replicas
    if not res.meets_slo or n == 1:
        return res
    least = saturated(res) if hint else None
    for k in ([least] if least is not None and least < n - 1 else []) + [n - 1]:
        fewer = serve(res.deployment.with_replicas(0, k))
        if fewer.meets_slo:
            return search(fewer.deployment, serve, max_nodes)
    return replace(res, below=fewer.miss, below_at_least=bool(fewer.decided))


@dataclass(frozen=True)
class Bands:
    """The interval factors (low, high) of a row's pP TTFT and pP TPOT (the chips that set
    them: the prefill pool's and the decode pool's) and of its output throughput, in the
    serving regime (uncertainty.band), and their basis; None outside every measured regime."""

    ttft: tuple[float, float] | None
    tpot: tuple[float, float] | None
    throughput: tuple[float, float] | None
    basis: str

    def slo(self, slo: SLO, end: int) -> SLO | None:
        """The bounds a simulated run must keep for the deployment to meet `slo` at the
        optimistic (0) or pessimistic (1) end of the intervals; None without the bands."""
        if (slo.ttft_ms is not None and self.ttft is None) or (
                slo.tpot_ms is not None and self.tpot is None):
            return None
        scale = lambda b, f: None if b is None else b / f[end]
        return replace(slo, ttft_ms=scale(slo.ttft_ms, self.ttft),
                       tpot_ms=scale(slo.tpot_ms, self.tpot))


def bands(dep: Deployment, slo: SLO, level: float = 0.8) -> Bands:
    """The row's interval factors from the uncertainty model of the active calibration
    (rdu_cluster/validation/uncertainty.py: held-out errors of the serving regime, or its
    parts)."""
    try:
        from rdu_cluster.validation import uncertainty
    except ImportError:  # a build without the uncertainty model
        return Bands(None, None, None, "no uncertainty model (rdu_cluster.validation."
                     "uncertainty)")
    pw = bench.p_word(slo.percentile)
    chip = lambda pool: load_cluster(pool.cluster, dict(pool.overrides)).chip
    got = {key: uncertainty.band(metric=metric, chip=chip(pool), stack=None,
                                 regime="serving", level=level)
           for key, metric, pool in (("ttft", f"p{pw}_ttft_ms", dep.pools[0]),
                                     ("tpot", f"p{pw}_tpot_ms", dep.pools[-1]),
                                     ("throughput", "output_throughput", dep.pools[-1]))}
    basis = "; ".join(dict.fromkeys(f"{k}: {b.basis}" for k, b in got.items()))
    return Bands(got["ttft"].bounds, got["tpot"].bounds, got["throughput"].bounds,
                 f"{level:.0%} intervals; {basis}")


def judged(r: Result, slo: SLO) -> float:
    """r's miss under `slo` (the worst seed's, where several were served)."""
    if not math.isfinite(r.miss) and r.miss > 0:
        return math.inf  # refused requests, or none served
    pairs = r.steady.get("runs") or [(r.ttft_ms, r.tpot_ms)]
    return max(slo.misses(a, b) for a, b in pairs)


def _with_ends(res: Result, serve: Callable[[Deployment], Result], slo: SLO,
               max_nodes: int, first: Callable[[Deployment], Result] | None = None) -> Result:
    """The row with its interval: the boundary searched again (the same runs, judged) with
    the SLO's bounds divided by the times' low factors (nodes_low: the simulator as slow as it
    may be) and by their high factors (nodes_high), $/Mtok at each end from that end's price
    and its throughput at its factor, and `robust`: the row still meets at the pessimistic
    end. No interval (None) where a band is missing: the basis says why. With `first` (the
    runs at the search's first, shorter count, most of them made already), each end is
    found there first and then searched at `serve`'s count from it: the same boundary (one
    fewer verified to miss at that count), in a run or two there instead of a bisection."""
    b = bands(res.deployment, slo)
    ends = [b.slo(slo, end) for end in (0, 1)]
    if None in ends or (b.throughput is None):
        return replace(res, interval={"basis": b.basis})
    high = cast(SLO, ends[1])  # neither end is None (above)
    out: dict = {"basis": b.basis, "robust": res.meets_slo and judged(res, high) <= 0}
    for end, name in ((0, "low"), (1, "high")):
        start = res.deployment if first is None else search(
            res.deployment, first, max_nodes, ends[end]).deployment
        found = search(start, serve, max_nodes, ends[end])
        ok = judged(found, cast(SLO, ends[end])) <= 0
        thr = found.summary["bench"]["output_throughput"] * b.throughput[1 - end]
        price = found.deployment.price_per_hour
        out[f"nodes_{name}"] = found.deployment.nodes if ok else None
        out[f"plan_{name}"] = " + ".join(map(str, found.deployment.pools)) if ok else None
        out[f"usd_per_million_tokens_{name}"] = (price * 1e6 / 3600 / thr
                                                 if ok and price and thr else None)
    return replace(res, interval=out)


def _moved(a: Result, b: Result, slo: SLO | None = None) -> float:
    """The largest change of pP TTFT, pP TPOT and output throughput from a to b, each over
    its scale: the throughput's own value (it sets $/Mtok); a pP's own value or its SLO bound,
    the larger (the verdict is the pP against its bound: a p99 TTFT of 279 ms under a 1,500 ms
    bound that falls 8.6% a doubling as the ramp's transient thins moves the verdict 1.6% of
    the way to its bound, and was served twice and then eight times as long for it). Never
    stricter than the relative change; the same where a pP is at or over its bound."""
    bounds = (None, None) if slo is None else (slo.ttft_ms, slo.tpot_ms)
    pairs = [(a.ttft_ms, b.ttft_ms, bounds[0]), (a.tpot_ms, b.tpot_ms, bounds[1]),
             (a.summary["bench"]["output_throughput"], b.summary["bench"]["output_throughput"],
              None)]
    return max(abs(y - x) / max(x, bound or 0.0) if x and math.isfinite(x) and math.isfinite(y)
               else (0.0 if x == y else math.inf) for x, y, bound in pairs)


def _worst(results: list[Result]) -> Result:
    """The first seed's run with the worst seed's miss, and the spread over the seeds; a run
    stopped as certain to miss (Result.decided) where one was."""
    stopped = next((r for r in results if r.decided), None)
    if stopped is not None:
        return stopped
    spread = lambda f: [min(map(f, results)), max(map(f, results))]
    first = results[0]
    return replace(first, miss=max(r.miss for r in results), steady={
        "runs": [(r.ttft_ms, r.tpot_ms) for r in results],
        "ttft_ms_range": spread(lambda r: r.ttft_ms), "tpot_ms_range": spread(lambda r: r.tpot_ms),
        "output_throughput_range": spread(lambda r: r.summary["bench"]["output_throughput"])})


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
    limits = Limits(max_batch=dep.max_batch, token_budget=token_budget(trace))
    config = ServeConfig(plan=dep.pools[0].plan, limits=limits,
                         seed=traffic.seed, metrics=spec,
                         concurrency=(None if traffic.trace is not None
                                      else traffic.concurrency),
                         prefix=PrefixConfig(traffic.prefix_cache),
                         speculation=dep.speculation, draft=dep.draft,
                         # _all_gpu: a stack is named
                         options=(serving_stacks.stack(cast(str, dep.stack)) if _all_gpu(dep)
                                  else None))
    watch = None if stop is None else decided.Watch(
        {"ttft": stop.ttft_ms, "tpot": stop.tpot_ms}, pct, len(trace), traffic.warmup,
        traffic.steadies, bool((trace.output_len > 1).all()))
    args = serve_args(dep, *ref, traffic, slo, rate, fabric, trace)
    try:
        if dep.disaggregated:  # the summary is what is read (Simulation.summary_only)
            s = _pair_served(
                (dep, model.name, ref, replace(traffic, requests=None)), trace, watch,
                lambda keep: Disaggregated(model, dep.pools[0], dep.pools[1], fabric, trace,
                                           config, backend, summary_only=True, watch=watch,
                                           keep=keep),
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
# goes on from the row's own run's checkpoint instead of from the start (question 2 of
# bench_capacity.py: its pairs' doublings took ~100 s of its ~320 s of CPU).
KEPT_RUNS = 4
_kept: OrderedDict[tuple, Disaggregated] = OrderedDict()


def _pair_served(key: tuple, trace: traces.Trace, watch: decided.Watch | None,
                 run_of: Callable[[bool], Disaggregated], keep: bool) -> dict:
    """The summary of a pair's run of `trace` (run_of(keep): its run, keeping its checkpoint
    or not, stopped once `watch` is certain: decided.Decided; `key`: what else it serves): a
    run of twice the requests of a kept run of the same key goes on from it
    (Disaggregated.continued: the same tables, or the same verdict, as from the start); with
    `keep` (a closed loop of clients whose row may double) the run is kept, a run stopped as
    certain too (the one fewer of the row at its doubled count went on from it: question 1
    of bench_capacity.py's four, 3.7 s of CPU from the start)."""
    n = len(trace)
    paused = _kept.pop((*key, n // 2), None) if keep and n % 2 == 0 else None
    run = paused if paused is not None and paused.continues(trace, watch) else run_of(keep)
    try:
        return (run.continued(trace, watch) if run is paused else run.run()).summary
    finally:
        kept = run.kept()
        if kept is not None:
            _kept[(*key, n)] = kept
            while len(_kept) > KEPT_RUNS:
                _kept.popitem(last=False)


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


def token_budget(trace: traces.Trace) -> int:
    """serve's token budget, or the longest prompt where that is longer: the engine refuses a
    prompt over the budget unchunked, and the pre-filter prefills one prompt at a time (a
    32,768-token prompt was verified as 'serves no request')."""
    default = Limits().token_budget
    return max(default, int(trace.prompt_len.max())) if len(trace) else default


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


def serve_args(dep: Deployment, model_ref: str, weights: str | None, traffic: Traffic,
               slo: SLO, rate: float | None, fabric: FabricSpec, trace: traces.Trace) -> list:
    """`rdu-cluster serve` arguments that reproduce the verified run."""
    args = ["--model", model_ref, *(["--weights", weights] if weights else [])]
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
    if (budget := token_budget(trace)) != Limits().token_budget:
        args += ["--token-budget", str(budget)]
    args += ["--metric-percentiles", f"50,{bench.p_word(slo.percentile)}", "--goodput",
             slo.goodput_args()]
    if traffic.warmup:
        args += ["--warmup-requests", str(traffic.warmup)]
    if traffic.steadies:
        args += ["--warmup-mser"]
    if traffic.prefix_cache is not None:
        args += ["--prefix-cache", traffic.prefix_cache]
    if _all_gpu(dep):  # a stack is named
        args += ["--stack", cast(str, dep.stack)]
    if dep.draft is None:
        return args
    # k given: serve's own choice of k is made at its --max-batch, not the k verified
    spec = cast(Speculation, dep.speculation)  # a draft comes with its speculation
    return args + ["--draft", dep.draft, "--spec-k", str(spec.k), *traffic.spec_args]


def _all_gpu(dep: Deployment) -> bool:
    """Every pool on GPUs: the deployment's stack is then named to serve (a pool of RDU
    sockets beside a GPU pool takes no --stack; its GPU pool runs the default one)."""
    return dep.stack is not None and all(load_cluster(p.cluster).chip.kind == "gpu"
                                         for p in dep.pools)


def ranked(results: list[Result]) -> list[Result]:
    """Meeting the SLO first, then the cheapest per hour, then the fewest sockets."""
    return sorted(results, key=lambda r: (not r.meets_slo, r.deployment.price_per_hour
                                          if r.deployment.price_per_hour is not None
                                          else math.inf, r.deployment.sockets, r.miss))
