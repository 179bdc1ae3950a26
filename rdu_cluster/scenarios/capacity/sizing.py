"""Pass 1, analytic: from the step costs of partitioning.estimate, per system and replica plan,
the largest batch whose decode step keeps TPOT within the bound (and whose KV fits), one
prompt's prefill time, and for each deployment size (whole nodes) the load it would see: with N
closed-loop users (or a rate, through Little's law) each replica runs about N / n sequences and
prefills its share of the arrivals, lambda = N / E2E. In an aggregated replica prefill steps
stall the decodes, so the decode share of time is 1 - rho (rho = lambda / n x prefill time) and
the TPOT seen is TPOT(batch) / (1 - rho): its arrivals come fewer than one a decode step, so each
prompt prefills alone. The smallest deployment that passes is the system's candidate. A
disaggregated pair sizes its decode pool from the TPOT bound alone and its prefill pool as a
queue (prefill_replicas): the fewest replicas whose pP wait, with a prompt's own pass and its
hand-over, keeps TTFT within the bound and, for clients without think time, whose mean wait
does not throttle the closed loop (PREFILL_THROTTLE; sessions' turns queue otherwise:
PrefillLoad), each prompt counted at its share of a full prefill step (the pool's queue fills
its steps to the token budget), and no fewer than its prefix caches need to hold the
sessions' histories (Traffic.history_replicas)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from chip import serving_stacks
from partitioning import evaluate
from partitioning.estimate import Estimate, estimate
from partitioning.plan import Plan as PartitionPlan
from partitioning.scenario import Scenario, tensor_plan
from rdu_cluster.config import ClusterSpec, FabricSpec, load_cluster
from rdu_cluster.engine.disagg import Pool, transfer_time
from rdu_cluster.engine.schedulers import token_budget_for
from rdu_cluster.scenarios import speculative
from rdu_cluster.scenarios.capacity.deployment import Deployment
from rdu_cluster.scenarios.capacity.slo import SLO
from rdu_cluster.scenarios.capacity.traffic import Traffic
from workloads import graph
from workloads.errors import ConfigError
from workloads.spec import ModelSpec
from workloads.speculative import Speculation

BATCHES = np.array([1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512])
# A pair's prefill pool of clients without think time starts no smaller than keeps its mean
# queueing wait within this share of the closed loop's cycle (prefill_replicas): the decode pool
# is searched first, at that count, and a loop its prefill queue slows sends it less work (its
# TPOT verdict too kind, searched again in another pass). A TPOT near-linear in the batch moves
# less than this share with it. A start, not an answer: the verification searches both pools to
# their boundaries from it.
PREFILL_THROTTLE = 0.01
FIXED_POINT_ROUNDS = 50  # _load: rounds for E2E to settle within 0.1%
MAX_BATCH_CAP = 512  # the engine's --max-batch ceiling tried here (vLLM's max_num_seqs is 256-1024)


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
    kv_tokens: float = math.inf  # the KV tokens a replica holds: its prefix cache's room

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
    p = PartitionPlan.parse(plan)
    try:
        base = Scenario(model, cl, p, 1, int(prompt), int(gen), options)
        kv_batch, kv_tokens = evaluate.kv_capacity(base)
    except ConfigError:
        return None
    batches = BATCHES[BATCHES <= kv_batch]
    if not len(batches):
        return None
    at = lambda b: estimate(base.but(batch=b))
    spec = None
    try:
        if draft is not None:
            if p.pp != 1 or p.ep != 1 or p.adp != 1:
                return None
            # a draft comes with its `choose` (the docstring)
            spec = cast("Callable[[ClusterSpec, str], Speculation]", choose)(cl, plan)
            tpot, prefill = _speculative_times(base, p, batches, spec, draft)
        else:
            tpot, prefill = _times(at, batches)
    except ConfigError:
        return None
    price = cl.cost.get("socket_hour_usd") if cl.cost else None
    return ReplicaCost(cluster_ref, plan, cl.sockets, batches, tpot, prefill, kv_batch, price,
                       load_cluster(cluster_ref, dict(overrides)).sockets_per_node, draft,
                       spec, serving_stacks.stack_of(cl.chip, options), overrides,
                       None if draft is not None else _prefill_each(
                           at, prompt, kv_batch, prefill, token_budget_for(cl.chip, options)),
                       kv_tokens)


def _times(at: Callable, batches: np.ndarray) -> tuple[np.ndarray, float]:
    """TPOT at each of `batches` and one prompt's prefill (batches[0] is 1): one vectorized
    estimate over the batches, whatever the plan (a point of it costs what it costs alone: the
    same floats as an estimate a batch, on the 119 pipeline and expert-parallel plans of eleven
    models' capacity candidates, at a tenth of the time; the expert-parallel ones had taken
    most of question 1's analytic pass in benchmarks/bench_capacity.py)."""
    est = at(batches)
    return (np.asarray(est.tpot_s, dtype=float),
            float(np.asarray(est.ttft_s).ravel()[0]))  # one prompt's forward pass


def _speculative_times(base: Scenario, p: PartitionPlan, batches: np.ndarray,
                       spec: Speculation, draft: str) -> tuple[np.ndarray, float]:
    """_times of the speculative step (scenarios/speculative.py) over the tokens it emits."""
    memo: dict = {}
    ests = [speculative.speculative_estimate(
        base.but(plan=tensor_plan(base.cluster, p.tp), batch=int(b)), spec, draft, memo=memo)
        for b in batches]
    # batch 1 (BATCHES[0]): the draft's prefill too
    return np.array([float(e.tpot_s) for e in ests]), float(ests[0].ttft_s)


def _prefill_each(at: Callable[[int], Estimate], prompt: float, kv_batch: int,
                  alone: float, budget: int) -> float:
    """A prompt's share of a prefill step of as many prompts as serve's token budget holds
    (`budget`: the engine's, token_budget_for; its prefill-first and chunked schedulers fill
    a step so when prompts queue); `alone` (one prompt's) where one fills the budget or more
    would not fit."""
    k = min(budget // max(int(prompt), 1), kv_batch)
    if k <= 1:
        return alone
    try:
        return min(float(np.asarray(at(k).ttft_s).ravel()[0]) / k, alone)
    except ConfigError:
        return alone


def replica_plans(model: ModelSpec, cluster_ref: str, max_nodes: int) -> list[str]:
    """Tensor-parallel plans over every power of two of sockets below a node, a node and two
    nodes, and tp x pp over two nodes (a node per stage): the replica shapes a serving
    deployment uses, from one GPU a replica (vLLM's and SGLang's default tensor parallel size,
    how a model that fits one GPU is served: Llama 3.1 8B for 200 users on dgx-h100 is
    tp1 x 3 at $0.34/Mtok where the narrowest plan had been tp2, tp2 x 2 at $0.37); those
    whose weights and KV do not fit are dropped by the analytic pass. For an MoE model also
    attention data parallelism with experts over a node and over two (adp8ep8, adp16ep16 on
    8-GPU nodes: how engines serve DeepSeek-style models) where the experts divide. Wider
    replicas cost more analytic time (pipeline plans go through the partitioner per batch)
    and rarely win for serving; give them with --plan."""
    spn = load_cluster(cluster_ref).sockets_per_node
    out = [f"tp{g}" for g in sorted({1 << k for k in range(spn.bit_length())} | {spn})]
    if max_nodes >= 2:
        out += [f"tp{spn * 2}", f"tp{spn}pp2"]
    if model.moe is not None:
        out += [f"adp{g}ep{g}" for g in (spn, 2 * spn)[: 1 + (max_nodes >= 2)]
                if g > 1 and model.moe.num_experts % g == 0]
    return list(dict.fromkeys(out))


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
    thinks between requests (sessions) is in the batch e2e / (e2e + think) of the time. A closed
    loop's iteration starts from every user in the batch (its longest E2E, so its least arrival
    rate): from a batch of one, its first E2E was so short that the prefill looked saturated
    and the load was refused before the batch it forms was costed (DeepSeek-V3 with MTP on
    sn40l-16 tp16, 64 users: a 1.8 ms TPOT at batch 1, rho 8.3, every replica count refused)."""
    start = traffic.concurrency / n if traffic.concurrency else 1.0
    tpot, last, rho = cost.tpot_at(max(1.0, start)), math.nan, 0.0
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
    output) lengths, as replica_cost takes them. A speculative `dec` (its draft) makes the
    deployment draft in its decode pool (the prefill and the hand-over sized for the target
    alone)."""
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
    cycle = e2e + traffic.think_s
    lam = users / cycle if users else rate
    # a loaded pool batches prompts (prefill_service_s)
    load = PrefillLoad(lam, pre.prefill_service_s * share, prefill, move,
                       cycle if users else None, traffic.sessions)
    most = max_nodes * pre.sockets_per_node // pre.group
    # fewer replicas' caches keep less of each session's history (Traffic.session_room)
    cache = _cache_tokens(pre, traffic)
    scale = (lambda n: traffic.prefill_share(False, traffic.session_room(cache, n))
             / share) if share > 0 else (lambda n: 1.0)
    n_p = prefill_replicas(load, slo, most, scale)
    if n_p is None:
        return None
    fit = traffic.history_replicas(cache, outputs=False)  # fewer caches thrash
    n_p = max(n_p, fit) if fit <= most else n_p
    k = scale(n_p)
    ttft = pool_ttft(load, n_p, k, slo.percentile)
    return Deployment(f"{pre.cluster}->{dec.cluster}", (pre.pool(n_p), dec.pool(n_d)), b_max,
                      _short(cycle),
                      (pre.sockets_per_node, dec.sockets_per_node),
                      (pre.price_per_socket_hour, dec.price_per_socket_hour),
                      {"tpot_s": tpot, "rho": lam / n_p * load.service * k, "e2e_s": e2e,
                       "kv_transfer_s": move, "prefill_service_s": load.service * k,
                       # what search.resized sizes the prefill pool again from
                       "prefill_share": share * k, "arrivals_per_s": lam,
                       "prefill_s": prefill * k, "cycle_s": cycle if users else None,
                       "history_replicas": fit, "sessions": load.sessions,
                       "ttft_s": math.inf if ttft is None else ttft[0]},
                      dec.draft, dec.speculation, stack=dec.stack or pre.stack)


def _cache_tokens(cost: ReplicaCost, traffic: Traffic) -> float:
    """The tokens a replica of `cost` keeps in its prefix cache: its KV room where the cache
    is HBM's alone (a GPU's by default: serving_stacks.spills_prefix_cache); unbounded here
    where it spills to the tier below (an RDU's DDR by default, or --prefix-cache tiered),
    whose room holds the sessions' histories."""
    mode = traffic.prefix_cache
    spills = mode == "tiered" or (mode is None and _spills(cost.cluster))
    return math.inf if spills else cost.kv_tokens


@functools.cache
def _spills(cluster_ref: str) -> bool:
    """serving_stacks.spills_prefix_cache of the cluster's chip, read once a process (a pair's
    every prefill plan is sized with every decode plan: 111 sizings of the sessions question,
    0.19 s of reading cluster files where once a cluster)."""
    return serving_stacks.spills_prefix_cache(load_cluster(cluster_ref).chip)


@dataclass(frozen=True)
class PrefillLoad:
    """The load a pair's prefill pool carries: `lam` prompts/s of `service` s each (a loaded
    replica's per prompt), a prompt's own pass (`prefill`) and hand-over (`move`), a closed
    loop's `cycle` (None: an open loop), and whether its prompts are `sessions`' turns."""

    lam: float
    service: float
    prefill: float
    move: float
    cycle: float | None
    sessions: bool = False

    def scaled(self, k: float) -> PrefillLoad:
        """The same load with k times the prefill per prompt (its hand-over moves the whole
        prompt's KV, cached or not: not scaled)."""
        return replace(self, service=self.service * k, prefill=self.prefill * k)


def prefill_replicas(load: PrefillLoad, slo: SLO, most: int,
                     scale: Callable[[int], float] | None = None) -> int | None:
    """The fewest prefill replicas (at most `most`; None: none) that carry `load` with their
    pP TTFT, the pP wait and a prompt's own pass and hand-over, within the SLO's TTFT bound,
    and, for clients without think time, their mean wait at most PREFILL_THROTTLE of the
    closed loop's cycle; `scale(n)`: the prefill n replicas do for a prompt over
    `load.service`'s, at least 1 (their prefix caches keep less the fewer they are:
    Traffic.session_room). A replica is a queue with a fixed pass (cs2 = 0) and Kingman's
    heavy-traffic mean wait rho / (1 - rho) x (ca2 + cs2) / 2 x service, its pP that of an
    exponential of that mean (a heavy-traffic wait's tail). Clients without think time come
    back as their decodes end, evenly: every n-th prompt of a Poisson stream (Erlang-n gaps,
    ca2 = 1 / n). On the Llama 3.1 70B question's eight pairs it starts at rho 0.83-0.91, one
    or two replicas above the boundaries the engine verified (0.92-1.03 times the saturation
    count), where a cap of rho <= 0.8 started 25% above them. Sessions' turns come back after
    their think times from decodes that end in bursts (a closed loop's sessions go turn by
    turn together) and bring prefills of unequal size (the first turn's system prompt, a
    history evicted): taken as a Poisson stream (ca2 = 1), which starts the sessions
    question's eight pools at 0.9-1.11 times the boundaries the engine verified (the H200
    BF16 ones at 20 where 18 and 21; Erlang-n had started them at 13 and 14). There a mean
    wait at the TTFT bound is ~2% of a cycle (its think time in it): the throttle, set for
    the small waits of clients without think time, would start those two at 26; not
    applied."""
    throttle = None if load.sessions or load.cycle is None else PREFILL_THROTTLE * load.cycle
    for n in range(max(1, math.ceil(load.lam * load.service)), most + 1):
        got = pool_ttft(load, n, 1.0 if scale is None else scale(n), slo.percentile)
        if got is None:
            continue
        ttft, wait = got
        if (slo.ttft_ms is None or ttft * 1e3 <= slo.ttft_ms) and (
                throttle is None or wait <= throttle):
            return n
    return None


def pool_ttft(load: PrefillLoad, n: int, k: float, percentile: float
              ) -> tuple[float, float] | None:
    """(pP TTFT, mean wait) in s of n prefill replicas carrying `load` at k times its prefill
    a prompt (prefill_replicas' queue); None where they cannot carry it (rho >= 1)."""
    rho = load.lam * load.service * k / n
    if rho >= 1:
        return None
    ca2 = 1.0 if load.sessions else 1.0 / n
    wait = rho / (1.0 - rho) * ca2 / 2.0 * load.service * k
    return -math.log(1.0 - percentile / 100.0) * wait + load.prefill * k + load.move, wait


def _short(x: float) -> float:
    """6 significant figures: the value serve_args prints is the value verified."""
    return float(f"{x:.6g}")
