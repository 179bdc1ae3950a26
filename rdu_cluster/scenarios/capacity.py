"""Capacity planning to a latency SLO: the cheapest deployments of a model that serve a traffic
at a TTFT / TPOT bound, found in two passes (as AIConfigurator and Vidur's config search do):

1. Analytic pre-filter, from the step costs of partitioning.estimate. Per system and replica
   plan: the largest batch whose decode step keeps TPOT within the bound (and whose KV fits),
   one prompt's prefill time, and for each deployment size (whole nodes) the load it would see:
   with N closed-loop users (or a rate, through Little's law) each replica runs about N / n
   sequences and prefills its share of the arrivals, lambda = N / E2E. In an aggregated replica
   prefill steps stall the decodes, so the decode share of time is 1 - rho (rho = lambda / n x
   prefill time) and the TPOT seen is TPOT(batch) / (1 - rho). The smallest deployment that
   passes is the system's candidate. A disaggregated pair sizes its decode pool from the TPOT
   bound alone and its prefill pool to keep rho <= PREFILL_RHO_MAX.
2. Verification: each short-listed deployment is served by the engine (engine/simulation.py
   or engine/disagg.py) and the SLO percentile of TTFT and TPOT is measured (engine/bench.py).
   A candidate that misses is retried one size up, at most GROW_TRIES times; one that meets
   with SHRINK_MARGIN to spare one size down, at most SHRINK_TRIES times.

Aggregated candidates are verified closed loop (N clients, ramped up over one estimated E2E so
that they do not all prefill at once); disaggregated ones open loop at the analytic request rate
(engine/disagg.py runs open loop only), which the table says.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from chip import serving_stacks
from partitioning.estimate import estimate
from partitioning.evaluate import footprint
from partitioning.plan import Plan as PartitionPlan
from partitioning.scenario import Scenario, tensor_plan
from rdu_cluster.config import ClusterSpec, FabricSpec, load_cluster
from rdu_cluster.engine import bench
from rdu_cluster.engine.disagg import Disaggregated, Pool, group_sockets, transfer_time
from rdu_cluster.engine.prefix_cache import PrefixConfig
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from rdu_cluster.scenarios import speculative
from rdu_cluster.validation import calibration
from workloads import graph, traces
from workloads.errors import ConfigError
from workloads.spec import ModelSpec
from workloads.speculative import Speculation

BATCHES = np.array([1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512])
PREFILL_RHO_MAX = 0.8  # a prefill pool's utilization cap: queueing grows as 1/(1-rho) (M/D/1)
GROW_TRIES = 2  # verification retries one size up
SHRINK_TRIES = 2  # ... and one size down, while the SLO is met with SHRINK_MARGIN to spare
SHRINK_MARGIN = 0.15  # 15% under the tighter bound
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
    spec_args: tuple[str, ...] = ()  # the --acceptance / --tree given with --draft

    @property
    def sessions(self) -> bool:
        return self.trace is not None and self.trace.after is not None

    @property
    def prefill_share(self) -> float:
        """The share of prompt tokens prefilled (not served from the prefix cache): those past
        the longest prefix an earlier request of the trace shares (every cached prefix kept: a
        lower bound on the work, which verification checks); 1 without a cache or content."""
        if self.prefix_cache == "off" or self.trace is None or self.trace.content is None:
            return 1.0
        return uncached_tokens(self.trace) / float(self.trace.prompt_len.sum())

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
        return 2 * self.concurrency if self.concurrency else max(50, int(rate * 30))


def uncached_tokens(trace: traces.Trace) -> int:
    """Prompt tokens of `trace` past the longest chunk prefix an earlier request held (its
    prompt and output: a turn's answer is cached with it, as vLLM's prefix cache keeps it)."""
    seen: set[int] = set()
    total = 0
    for i, chunks in enumerate(trace.content):
        keys = list(itertools.accumulate(chunks, lambda k, c: hash((k, c)), initial=0))[1:]
        hit = sum(n for _, n in itertools.takewhile(
            lambda kc: kc[0] in seen, zip(keys, (c[1] for c in chunks))))
        total += max(int(trace.prompt_len[i]) - hit, 0)
        seen.update(keys)
    return total


@dataclass(frozen=True)
class ReplicaCost:
    """Analytic costs of one replica of `plan` on `cluster`: TPOT at each batch of BATCHES up
    to the KV limit, one prompt's prefill, and the KV limit itself."""

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


def replica_cost(model: ModelSpec, cluster_ref: str, plan: str, lengths: tuple[float, float],
                 fabric: FabricSpec, draft: str | None = None,
                 choose: Callable[[ClusterSpec, str], Speculation] | None = None,
                 stack: str | None = None) -> ReplicaCost | None:
    """None when the plan does not fit the chip (weights, or no room for one sequence's KV).
    `lengths`: the mean (prompt, output) lengths; `stack`: the GPU serving stack (default: the
    default stack; chip/serving_stacks.py). With `draft`: speculative decoding, `choose`
    giving the speculation on the replica's cluster and plan; TPOT is then the speculative
    step over the tokens it emits (scenarios/speculative.py), on tensor-parallel plans only
    (the draft shares the target's sockets)."""
    try:
        cl = Pool(cluster_ref, plan, 1).spec(model, fabric)
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
            spec, memo = choose(cl, plan), {}
            ests = [speculative.speculative_estimate(
                base.but(plan=tensor_plan(cl, p.tp), batch=int(b)), spec, draft, memo=memo)
                for b in batches]
            tpot = np.array([float(e.tpot_s) for e in ests])
            prefill = float(ests[0].ttft_s)  # batch 1 (BATCHES[0]): the draft's prefill too
        except ConfigError:
            return None
        price = cl.cost.get("socket_hour_usd") if cl.cost else None
        return ReplicaCost(cluster_ref, plan, g, batches, tpot, prefill, kv_batch, price,
                           load_cluster(cluster_ref).sockets_per_node, draft, spec, named)
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
                       load_cluster(cluster_ref).sockets_per_node, stack=named)


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


@dataclass
class Deployment:
    label: str  # the system: a cluster name, or PREFILL->DECODE
    pools: tuple[Pool, ...]  # one (aggregated) or (prefill, decode)
    max_batch: int
    rate: float | None  # disaggregated: the open-loop rate it is verified at
    ramp_s: float  # aggregated closed loop: clients' ramp-up
    sockets_per_node: tuple[int, ...]
    price_per_hour: float | None
    analytic: dict = field(default_factory=dict)
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

    def grown(self) -> Deployment:
        """One size up: a replica more (of the decode pool when disaggregated)."""
        return self._resized(1)

    def shrunk(self) -> Deployment | None:
        """One size down (None at one replica)."""
        return self._resized(-1) if self.pools[-1].replicas > 1 else None

    def _resized(self, by: int) -> Deployment:
        last = self.pools[-1]
        pools = (*self.pools[:-1], replace(last, replicas=last.replicas + by))
        rates = [(self.price_per_hour or 0.0) / self.sockets] if self.price_per_hour else []
        d = replace(self, pools=pools)
        if rates and self.disaggregated:  # the decode pool's own price per socket
            rates = [self.analytic.get("decode_socket_hour", rates[0])]
            d.price_per_hour = self.price_per_hour + by * rates[0] * group_sockets(last.plan)
        elif rates:
            d.price_per_hour = rates[0] * d.sockets
        return d


def aggregated(cost: ReplicaCost, traffic: Traffic, slo: SLO, max_nodes: int,
               prompt: float, gen: float) -> Deployment | None:
    """The fewest replicas of `cost`'s plan that pass the analytic test (sockets are priced
    by the socket-hour, so a deployment need not fill its last node)."""
    bound = None if slo.tpot_ms is None else slo.tpot_ms / 1e3
    b_max = cost.max_batch(bound)
    prefill = cost.prefill_s * traffic.prefill_share
    if not b_max or (slo.ttft_ms is not None and prefill > slo.ttft_ms / 1e3):
        return None
    for n in range(1, max_nodes * cost.sockets_per_node // cost.group + 1):
        ok, e2e, tpot_eff, rho = _load(cost, prefill, traffic, n, gen, b_max)
        if ok and (bound is None or tpot_eff <= bound):
            price = (None if cost.price_per_socket_hour is None
                     else cost.price_per_socket_hour * n * cost.group)
            return Deployment(cost.cluster, (Pool(cost.cluster, cost.plan, n),), b_max, None,
                              _short(e2e), (cost.sockets_per_node,), price,
                              {"tpot_s": tpot_eff, "rho": rho, "e2e_s": e2e}, cost.draft,
                              cost.speculation, cost.stack)
    return None


def _load(cost: ReplicaCost, prefill: float, traffic: Traffic, n: int, gen: float,
          b_max: int) -> tuple[bool, float, float, float]:
    """(fits, E2E, TPOT with prefill stalls, prefill utilization) of n replicas. A user who
    thinks between requests (sessions) is in the batch e2e / (e2e + think) of the time."""
    tpot = cost.tpot_at(1)
    for _ in range(4):  # fixed point: the batch depends on E2E under a rate
        e2e = prefill + (gen - 1) * tpot
        cycle = e2e + traffic.think_s
        users = traffic.concurrency * e2e / cycle if traffic.concurrency else traffic.rate * e2e
        batch = users / n
        if batch > b_max:
            return False, e2e, math.inf, 1.0
        lam = (traffic.concurrency / cycle) if traffic.concurrency else traffic.rate
        rho = lam / n * prefill
        if rho >= 1:
            return False, e2e, math.inf, rho
        tpot = cost.tpot_at(max(1.0, batch)) / (1 - rho)
    return True, e2e, tpot, rho


def disaggregated(pre: ReplicaCost, dec: ReplicaCost, traffic: Traffic, slo: SLO,
                  max_nodes: int, prompt: float, gen: float, model: ModelSpec,
                  fabric: FabricSpec) -> Deployment | None:
    bound = None if slo.tpot_ms is None else slo.tpot_ms / 1e3
    b_max = dec.max_batch(bound)
    if not b_max or (slo.ttft_ms is not None and pre.prefill_s > slo.ttft_ms / 1e3):
        return None
    move = float(transfer_time(fabric, pre.group, dec.group,
                               np.array([prompt * float(graph.kv_cache_bytes(model, 1, 1))]))[0])
    users = traffic.concurrency
    n_d = 1
    while True:
        if n_d * dec.group > max_nodes * dec.sockets_per_node:
            return None
        batch = (users / n_d) if users else None
        tpot = dec.tpot_at(max(1.0, batch or 1.0))
        e2e = pre.prefill_s + move + gen * tpot
        if not users:
            batch = traffic.rate * e2e / n_d
            tpot = dec.tpot_at(max(1.0, batch))
        if batch <= b_max and (bound is None or tpot <= bound):
            break
        n_d += 1
    lam = users / e2e if users else traffic.rate
    n_p = max(1, math.ceil(lam * pre.prefill_s / PREFILL_RHO_MAX))
    if n_p * pre.group > max_nodes * pre.sockets_per_node:
        return None
    prices = [c.price_per_socket_hour for c in (pre, dec)]
    price = (None if None in prices
             else prices[0] * n_p * pre.group + prices[1] * n_d * dec.group)
    return Deployment(f"{pre.cluster}->{dec.cluster}", (Pool(pre.cluster, pre.plan, n_p),
                      Pool(dec.cluster, dec.plan, n_d)), b_max, _short(lam), 0.0,
                      (pre.sockets_per_node, dec.sockets_per_node), price,
                      {"tpot_s": tpot, "rho": lam / n_p * pre.prefill_s, "e2e_s": e2e,
                       "kv_transfer_s": move, "decode_socket_hour": prices[1]},
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

    @property
    def meets_slo(self) -> bool:
        return self.miss <= 0


def verify(dep: Deployment, model: ModelSpec, model_ref: str, weights: str | None,
           traffic: Traffic, slo: SLO, fabric: FabricSpec,
           backend: Callable[[], object]) -> Result:
    pct = slo.percentile
    spec = bench.MetricSpec((50.0, pct), tuple(
        (k, v) for k, v in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms)) if v is not None))
    rate = dep.rate if dep.disaggregated else traffic.rate
    trace = _trace(dep, traffic, rate)
    limits = Limits(max_batch=dep.max_batch, token_budget=token_budget(trace))
    config = ServeConfig(plan=dep.pools[0].plan, limits=limits,
                         seed=traffic.seed, metrics=spec,
                         concurrency=(None if dep.disaggregated or traffic.trace is not None
                                      else traffic.concurrency),
                         prefix=PrefixConfig(traffic.prefix_cache),
                         speculation=dep.speculation, draft=dep.draft,
                         options=serving_stacks.stack(dep.stack) if _all_gpu(dep) else None)
    if dep.disaggregated:
        sim = Disaggregated(model, *dep.pools, fabric, trace, config, backend)
    else:
        cl = dep.pools[0].spec(model, fabric)
        sim = Simulation(model, cl, trace, config, backend())
    s = sim.run().summary
    b = s["bench"]
    w = bench.p_word(pct)
    # none served: vLLM's statistics are then 0, which would read as meeting every bound
    ttft, tpot = ((b[f"p{w}_ttft_ms"], b[f"p{w}_tpot_ms"]) if b["completed"]
                  else (math.inf, math.inf))
    # a request refused (its KV past the replica's, its prompt past the budget) is traffic not
    # served: the percentiles of the rest do not show it, so the deployment misses outright
    miss = math.inf if s["unserved"] else slo.misses(ttft, tpot)
    return Result(dep, s, ttft, tpot, miss,
                  serve_args(dep, model_ref, weights, traffic, slo, rate, fabric, trace))


def token_budget(trace: traces.Trace) -> int:
    """serve's token budget, or the longest prompt where that is longer: the engine refuses a
    prompt over the budget unchunked, and the pre-filter prefills one prompt at a time (a
    32,768-token prompt was verified as 'serves no request')."""
    default = Limits().token_budget
    return max(default, int(trace.prompt_len.max())) if len(trace) else default


def _trace(dep: Deployment, traffic: Traffic, rate: float | None) -> traces.Trace:
    if traffic.trace is not None:
        return traffic.trace  # replayed as it is (its own arrivals, or the sessions' loop)
    p, o = traffic.dists()
    n = traffic.n_requests(rate or 0.0)
    if dep.disaggregated or traffic.concurrency is None:
        return traces.synthetic(n, rate, "poisson", p, o, seed=traffic.seed)
    t = traces.synthetic(n, math.inf, "poisson", p, o, seed=traffic.seed)
    first = min(traffic.concurrency, n)
    arrival = t.arrival_s.astype(float).copy()
    arrival[:first] = np.arange(first) * dep.ramp_s / traffic.concurrency
    return replace(t, arrival_s=arrival)


def serve_args(dep: Deployment, model_ref: str, weights: str | None, traffic: Traffic,
               slo: SLO, rate: float | None, fabric: FabricSpec, trace: traces.Trace) -> list:
    """`rdu-cluster serve` arguments that reproduce the verified run."""
    args = ["--model", model_ref, *(["--weights", weights] if weights else [])]
    profile = calibration.active()  # the profile load_cluster applied (serve's --calibration)
    if profile is None or profile.name != calibration.DEFAULT:
        args += ["--calibration", "none" if profile is None else profile.name]
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
    if traffic.workload_args:
        pass  # the trace's own arrivals, or the sessions' closed loops
    elif not dep.disaggregated and traffic.concurrency:
        args += ["--concurrency", str(traffic.concurrency), "--ramp-up", repr(dep.ramp_s)]
    else:
        args += ["--rate", repr(rate)]
    if (budget := token_budget(trace)) != Limits().token_budget:
        args += ["--token-budget", str(budget)]
    args += ["--metric-percentiles", f"50,{bench.p_word(slo.percentile)}", "--goodput",
             slo.goodput_args()]
    if traffic.prefix_cache is not None:
        args += ["--prefix-cache", traffic.prefix_cache]
    if _all_gpu(dep):
        args += ["--stack", dep.stack]
    if dep.draft is None:
        return args
    # k given: serve's own choice of k is made at its --max-batch, not the k verified
    return args + ["--draft", dep.draft, "--spec-k", str(dep.speculation.k), *traffic.spec_args]


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
