"""Composition of Experts (CoE): a router model plus N expert models on one node, experts in the
capacity tier (DDR on an RDU socket, host DRAM behind PCIe on a GPU), a budget of HBM expert
slots with a replacement policy, and the model switch that copies an expert's shards tier to tier.

The setting is [MICRO24] section V (Samba-CoE): 150 Llama 2 7B experts, TP over the 8 sockets of
one node; the router and the KV cache live in HBM, with room reserved for the expert in use; a
request runs the router, then, if its expert is not in HBM, every socket copies its shard of the
expert from the capacity tier into HBM (chip/memory.py MemoryTiers.copy_time: bytes over the
slower tier's bandwidth, all sockets at once), and the request waits for it; then the expert runs.

Two entry points:
- `table_v`: the per-request figures of MICRO24 Table V's setting: the router at batch 8, then
  each (prompt, expert) pair in turn, each a cold switch (8 prompts on 8 distinct experts).
- `serve_coe`: a request trace through one node, FIFO, requests of the same expert batched.
  A self-contained scheduler until the distributed engine (rdu_cluster/engine) takes the switch
  as a socket operation; the figures it uses (switch time, step costs) are the same functions.

Expert popularity: uniform, Zipf with exponent s (p_i ~ 1 / i^s, expert 0 the most popular), or
the trace's `model` column. Replacement policies: LRU, and LFU (least accesses so far, ties to the
least recent).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pyarrow as pa

from chip.memory import MemoryTiers
from partitioning.cluster import ClusterSpec
from rdu_cluster import results
from rdu_cluster.config import load_cluster
from rdu_cluster.estimate import estimate
from rdu_cluster.report import text_table
from workloads import graph as graphs
from workloads.catalog import load_model
from workloads.errors import ConfigError
from workloads.spec import ModelSpec
from workloads.traces import Trace

POLICIES = ("lru", "lfu")
DISTRIBUTIONS = ("uniform", "zipf", "trace")
DEFAULT_EXPERT = "llama-2-7b"  # [MICRO24] V: Samba-CoE experts are Llama 2 7B
# [MICRO24] does not name the router's architecture in the text we rely on. Assumption: a model
# of the experts' size (a 7B classifier), run as one prefill plus one decode step (the label).
DEFAULT_ROUTER = "llama-2-7b"


@dataclass(frozen=True)
class Popularity:
    kind: str = "uniform"
    s: float = 1.0  # Zipf exponent

    def __post_init__(self) -> None:
        if self.kind not in DISTRIBUTIONS:
            raise ConfigError(f"distribution: {self.kind!r} unknown; accepted: "
                              f"{', '.join(DISTRIBUTIONS)}")
        if self.kind == "zipf" and not self.s > 0:
            raise ConfigError(f"zipf: exponent must be positive, got {self.s!r}")

    @classmethod
    def parse(cls, text: str) -> Popularity:
        """"uniform", "zipf:1.1", "trace"."""
        name, _, arg = text.partition(":")
        if name == "zipf":
            try:
                return cls("zipf", float(arg) if arg else 1.0)
            except ValueError:
                raise ConfigError(
                    f"distribution: {text!r}: zipf takes a number, zipf:1.1"
                ) from None
        return cls(name)

    def probabilities(self, n: int) -> np.ndarray:
        if self.kind == "zipf":
            w = 1.0 / np.arange(1, n + 1, dtype=float) ** self.s
            return w / w.sum()
        return np.full(n, 1.0 / n)


@dataclass(frozen=True)
class CoEScenario:
    router: ModelSpec
    experts: tuple[ModelSpec, ...]
    popularity: Popularity = field(default_factory=Popularity)
    hbm_slots: int | None = None  # experts HBM may hold; None: as many as fit
    policy: str = "lru"

    def __post_init__(self) -> None:
        if not self.experts:
            raise ConfigError("experts: a CoE needs at least one expert")
        if self.policy not in POLICIES:
            raise ConfigError(f"policy: {self.policy!r} unknown; accepted: {', '.join(POLICIES)}")
        if self.hbm_slots is not None and self.hbm_slots < 1:
            raise ConfigError(
                f"hbm-slots: need at least 1 (the expert in use), got {self.hbm_slots}"
            )

    @classmethod
    def copies(cls, n: int, expert: str = DEFAULT_EXPERT, router: str = DEFAULT_ROUTER,
               **kw) -> CoEScenario:
        if n < 1:
            raise ConfigError(f"experts: expected a positive number, got {n}")
        spec = load_model(expert)
        return cls(load_model(router), (spec,) * n, **kw)

    @property
    def n(self) -> int:
        return len(self.experts)


def capacity_tier(cluster: ClusterSpec) -> str:
    """Where experts live when not in HBM: "ddr" on an RDU, "host" on a GPU."""
    return "ddr" if cluster.chip.has_tier("ddr") else "host"


def switch_time_s(expert: ModelSpec, cluster: ClusterSpec, tp: int | None = None) -> float:
    """Every socket of the group copies its shard (weights / tp) from the capacity tier into HBM
    at once; the switch takes one shard's copy time."""
    tp = tp or cluster.sockets
    tiers = MemoryTiers.of(cluster.chip)
    return tiers.copy_time(graphs.weight_bytes(expert) / tp, capacity_tier(cluster), "hbm")


@dataclass(frozen=True)
class Memory:
    """Per-socket bytes of a CoE on one node (tp = sockets of the node)."""

    router: float
    expert: float  # one expert's shard
    kv: float  # the KV reserve: batch x context of the largest expert
    hbm: float
    tier: float
    tier_name: str
    slots: int  # experts HBM holds at once
    experts_in_tier: float  # all experts' shards (the backing store)

    @property
    def fits_tier(self) -> bool:
        return self.experts_in_tier <= self.tier

    @property
    def tier_fraction(self) -> float:
        return self.experts_in_tier / self.tier


def memory(scenario: CoEScenario, cluster: ClusterSpec, batch: int, context: int) -> Memory:
    """Per-socket layout: router + KV reserve + expert slots in HBM; every expert in the tier."""
    tp = cluster.sockets
    router = graphs.weight_bytes(scenario.router) / tp
    expert = max(graphs.weight_bytes(e) for e in scenario.experts) / tp
    kv = max(float(graphs.kv_cache_bytes(e, batch, context)) for e in set(scenario.experts)) / tp
    hbm = cluster.chip.hbm.capacity_bytes
    tier = cluster.chip.tier(capacity_tier(cluster)).capacity_bytes
    free = hbm - router - kv
    if free < expert:
        raise ConfigError(
            f"{cluster.name}: HBM cannot hold the router, the KV reserve and one expert "
            f"({(router + kv + expert) / 1e9:.1f} GB per socket, {hbm / 1e9:.1f} GB available)"
        )
    slots = min(int(free // expert), scenario.n)
    if scenario.hbm_slots is not None:
        slots = min(slots, scenario.hbm_slots)
    in_tier = sum(graphs.weight_bytes(e) for e in scenario.experts) / tp
    return Memory(router, expert, kv, hbm, tier, capacity_tier(cluster), slots, in_tier)


class ExpertCache:
    """The experts resident in HBM: `slots` of them, replaced by LRU or LFU. Deterministic."""

    def __init__(self, slots: int, policy: str = "lru"):
        self.slots, self.policy = slots, policy
        self.resident: OrderedDict[int, None] = OrderedDict()  # least recent first
        self.uses: dict[int, int] = {}

    def access(self, expert: int) -> bool:
        """Touch `expert`; True on a hit. A miss loads it, evicting by the policy if full."""
        self.uses[expert] = self.uses.get(expert, 0) + 1
        if expert in self.resident:
            self.resident.move_to_end(expert)
            return True
        if len(self.resident) >= self.slots:
            self.resident.pop(self._victim())
        self.resident[expert] = None
        return False

    def _victim(self) -> int:
        if self.policy == "lru":
            return next(iter(self.resident))
        order = {e: i for i, e in enumerate(self.resident)}
        return min(self.resident, key=lambda e: (self.uses[e], order[e]))


# ---- MICRO24 Table V ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TableV:
    cluster: str
    experts: int
    batch: int
    prompt_len: int
    gen_len: int
    router_s: float
    switch_s: float  # one expert
    expert_s: float  # one (prompt, expert) pair: prefill + gen_len tokens at batch 1
    memory: Memory

    @property
    def pair_s(self) -> float:
        return self.switch_s + self.expert_s

    @property
    def total_s(self) -> float:
        return self.router_s + self.batch * self.pair_s

    @property
    def out_of_memory(self) -> bool:
        return not self.memory.fits_tier


def table_v(cluster: ClusterSpec, experts: int = 150, batch: int = 8, prompt_len: int = 512,
            gen_len: int = 20, expert: str = DEFAULT_EXPERT,
            router: str = DEFAULT_ROUTER) -> TableV:
    """MICRO24 Table V's setting. prompt_len is not given in the text we rely on: 512 is an
    assumption (a chat prompt), a parameter. Each pair is a cold switch."""
    scenario = CoEScenario.copies(experts, expert, router)
    mem = memory(scenario, cluster, 1, prompt_len + gen_len)
    r = estimate(scenario.router, cluster, batch=batch, prompt_len=prompt_len, gen_len=1)
    e = estimate(scenario.experts[0], cluster, batch=1, prompt_len=prompt_len, gen_len=gen_len)
    return TableV(
        cluster=cluster.name,
        experts=experts,
        batch=batch,
        prompt_len=prompt_len,
        gen_len=gen_len,
        router_s=_f(r.ttft_s) + _f(r.tpot_s),
        switch_s=switch_time_s(scenario.experts[0], cluster),
        expert_s=_f(e.ttft_s) + (gen_len - 1) * _f(e.tpot_s),
        memory=mem,
    )


# ---- serving a trace ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CoERun:
    """Per-request arrays (request order) and the run's totals."""

    cluster: str
    expert: np.ndarray
    arrival_s: np.ndarray
    start_s: np.ndarray  # its group began (switch or prefill)
    first_token_s: np.ndarray
    finish_s: np.ndarray
    switched: np.ndarray  # bool: its group paid a switch
    output_len: np.ndarray
    switch_s_total: float
    router_s_total: float
    busy_s: float
    memory: Memory

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s

    @property
    def latency_s(self) -> np.ndarray:
        return self.finish_s - self.arrival_s

    @property
    def makespan_s(self) -> float:
        return float(self.finish_s.max() - self.arrival_s.min())

    @property
    def tokens_per_s(self) -> float:
        return float(self.output_len.sum()) / self.makespan_s

    @property
    def hit_rate(self) -> float:
        return 1.0 - float(self.switched.mean())


def assign_experts(trace: Trace, scenario: CoEScenario, seed: int = 0) -> np.ndarray:
    """The expert of each request: drawn from the popularity (seeded), or the trace's `model`
    column (expert names: the catalog names of `scenario.experts` or "expert-<i>")."""
    n = len(trace)
    if scenario.popularity.kind != "trace":
        rng = np.random.default_rng(seed)
        return rng.choice(scenario.n, size=n, p=scenario.popularity.probabilities(scenario.n))
    if trace.model is None:
        raise ConfigError("distribution trace: the trace has no model column")
    names = {f"expert-{i}": i for i in range(scenario.n)}
    for i, e in enumerate(scenario.experts):
        names.setdefault(e.name, i)
    unknown = sorted({m for m in trace.model if m not in names})
    if unknown:
        raise ConfigError(f"trace model {unknown[0]!r} is not an expert; expected "
                          f"expert-0..expert-{scenario.n - 1} or an expert's catalog name")
    return np.array([names[m] for m in trace.model], dtype=np.int64)


def serve_coe(scenario: CoEScenario, cluster: ClusterSpec, trace: Trace, seed: int = 0,
              max_batch: int = 8, router_batch: int = 8) -> CoERun:
    """FIFO through one node: route what has arrived (router batches of up to `router_batch`),
    then serve the oldest routed request's expert with every routed request of that expert (up to
    `max_batch`, static batch to the longest output), switching it in first on a miss."""
    if max_batch < 1 or router_batch < 1:
        raise ConfigError("max-batch and router-batch must be positive")
    experts = assign_experts(trace, scenario, seed)
    ctx = int(trace.prompt_len.max() + trace.output_len.max())
    mem = memory(scenario, cluster, max_batch, ctx)
    if not mem.fits_tier:
        raise ConfigError(_oom_message(scenario, cluster, mem))
    cache = ExpertCache(mem.slots, scenario.policy)
    costs = _Costs(scenario, cluster)
    state = _Serve.of(len(trace))
    t, routed = 0.0, 0
    pending: list[int] = []
    n = len(trace)
    while state.done < n:
        if not pending and routed < n:
            t = max(t, float(trace.arrival_s[routed]))
        while routed < n and trace.arrival_s[routed] <= t:  # route every arrival so far
            arrived = int(np.searchsorted(trace.arrival_s, t, side="right"))
            group = list(range(routed, min(arrived, routed + router_batch)))
            dt = costs.router(len(group), int(trace.prompt_len[group].max()))
            t += dt
            state.router_s += dt
            pending += group
            routed += len(group)
        head = pending[0]
        e = int(experts[head])
        group = [i for i in pending if experts[i] == e][:max_batch]
        chosen = set(group)
        pending = [i for i in pending if i not in chosen]
        t = _run_group(state, group, e, t, cache, costs, trace)
    return CoERun(cluster.name, experts, trace.arrival_s.copy(), state.start, state.first,
                  state.finish, state.switched, trace.output_len.copy(), state.switch_s,
                  state.router_s, state.busy, mem)


@dataclass
class _Serve:
    start: np.ndarray
    first: np.ndarray
    finish: np.ndarray
    switched: np.ndarray
    switch_s: float = 0.0
    router_s: float = 0.0
    busy: float = 0.0
    done: int = 0

    @classmethod
    def of(cls, n: int) -> _Serve:
        return cls(np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool))


def _run_group(state: _Serve, group, e: int, t: float, cache: ExpertCache, costs, trace) -> float:
    start = t
    hit = cache.access(e)
    if not hit:
        dt = costs.switch(e)
        t += dt
        state.switch_s += dt
    b = len(group)
    prompt = int(trace.prompt_len[group].max())
    gen = int(trace.output_len[group].max())
    ttft, tpot = costs.expert(e, b, prompt, gen)
    for i in group:
        state.start[i] = start
        state.first[i] = t + ttft
        state.finish[i] = t + ttft + (int(trace.output_len[i]) - 1) * tpot
        state.switched[i] = not hit
    state.busy += (t - start) + ttft + (gen - 1) * tpot
    state.done += b
    return t + ttft + (gen - 1) * tpot


class _Costs:
    """Memoized step costs of the router and the experts on one node."""

    def __init__(self, scenario: CoEScenario, cluster: ClusterSpec):
        self.s, self.c = scenario, cluster
        self.router = lru_cache(maxsize=None)(self._router)
        self.expert = lru_cache(maxsize=None)(self._expert)
        self.switch = lru_cache(maxsize=None)(lambda e: switch_time_s(self.s.experts[e], self.c))

    def _router(self, batch: int, prompt: int) -> float:
        r = estimate(self.s.router, self.c, batch=batch, prompt_len=prompt, gen_len=1)
        return _f(r.ttft_s) + _f(r.tpot_s)

    def _expert(self, e: int, batch: int, prompt: int, gen: int) -> tuple[float, float]:
        est = estimate(self.s.experts[e], self.c, batch=batch, prompt_len=prompt, gen_len=gen)
        return _f(est.ttft_s), _f(est.tpot_s)


def _oom_message(scenario: CoEScenario, cluster: ClusterSpec, mem: Memory) -> str:
    return (
        f"{cluster.name} runs out of memory for {scenario.n} experts: they need "
        f"{mem.experts_in_tier * cluster.sockets / 1e12:.2f} TB of {mem.tier_name}, "
        f"{mem.tier * cluster.sockets / 1e12:.2f} TB available"
    )


def _f(x) -> float:
    return float(np.ravel(np.asarray(x, dtype=float))[0])



# ---- validation metrics (rdu_cluster/validate.py registers them) -----------------------------


def _case_table_v(case: dict, key: str = "cluster") -> TableV:
    return table_v(load_cluster(case[key]), case.get("experts", 150), case.get("batch", 8),
                   case.get("prompt_len", 512), case.get("gen_len", 20),
                   case.get("model", DEFAULT_EXPERT), case.get("router", DEFAULT_ROUTER))


VALIDATION_METRICS = {
    # MICRO24 Table V: baseline time over the cluster's (a speed-up of `cluster`)
    "coe_overall_speedup": lambda c: _case_table_v(c, "baseline_cluster").total_s
    / _case_table_v(c).total_s,
    "coe_switch_speedup": lambda c: _case_table_v(c, "baseline_cluster").switch_s
    / _case_table_v(c).switch_s,
    # bytes the experts need in the capacity tier over what it holds: >= 1 is out of memory
    "coe_tier_demand": lambda c: _case_table_v(c).memory.tier_fraction,
}


# ---- text report ---------------------------------------------------------------------------------


def table_v_report(tvs: list[TableV]) -> str:
    """MICRO24 Table V's setting, one column per system, ratios against the first."""
    first = tvs[0]
    title = (f"CoE: {first.experts} experts, router at batch {first.batch}, then each (prompt, "
             f"expert) pair: prompt {first.prompt_len}, {first.gen_len} output tokens, each a "
             f"cold switch")
    ms = lambda x: f"{x * 1e3:.2f}"
    done = lambda t, i: t.router_s + (i + 1) * t.pair_s  # request i's completion
    rows = [
        ["router (batch of all prompts) ms", *(ms(t.router_s) for t in tvs)],
        ["switch one expert ms", *(ms(t.switch_s) for t in tvs)],
        ["expert prefill + decode ms", *(ms(t.expert_s) for t in tvs)],
        ["overall ms", *(ms(t.total_s) for t in tvs)],
        ["mean request latency ms",
         *(ms(sum(done(t, i) for i in range(t.batch)) / t.batch) for t in tvs)],
        [f"overall time / {first.cluster}", *(f"{t.total_s / first.total_s:.2f}x" for t in tvs)],
        [f"switch time / {first.cluster}", *(f"{t.switch_s / first.switch_s:.2f}x" for t in tvs)],
        ["expert slots in HBM", *(str(t.memory.slots) for t in tvs)],
        ["experts' bytes / capacity tier",
         *(f"{t.memory.tier_fraction:.1%} of {t.memory.tier_name}" for t in tvs)],
        ["fits", *("yes" if not t.out_of_memory else "OUT OF MEMORY" for t in tvs)],
    ]
    return title + "\n" + text_table(["", *(t.cluster for t in tvs)], rows)


def serve_report(runs: list[CoERun]) -> str:
    pct = lambda a, q: f"{float(np.percentile(a, q)) * 1e3:,.0f}"
    rows = [
        ["requests", *(str(len(r.arrival_s)) for r in runs)],
        ["output tokens/s (all requests)", *(f"{r.tokens_per_s:,.1f}" for r in runs)],
        ["makespan s", *(f"{r.makespan_s:.2f}" for r in runs)],
        ["TTFT p50 / p99 ms", *(f"{pct(r.ttft_s, 50)} / {pct(r.ttft_s, 99)}" for r in runs)],
        ["latency p50 / p99 ms",
         *(f"{pct(r.latency_s, 50)} / {pct(r.latency_s, 99)}" for r in runs)],
        ["requests that waited for a switch", *(f"{1 - r.hit_rate:.1%}" for r in runs)],
        ["time switching s", *(f"{r.switch_s_total:.2f}" for r in runs)],
        ["time routing s", *(f"{r.router_s_total:.2f}" for r in runs)],
        ["expert slots in HBM", *(str(r.memory.slots) for r in runs)],
        ["experts' bytes / capacity tier",
         *(f"{r.memory.tier_fraction:.1%} of {r.memory.tier_name}" for r in runs)],
    ]
    return text_table(["", *(r.cluster for r in runs)], rows)


def requests_table(run: CoERun):
    """One row per request (Arrow): what `serve` writes for a CoE run."""
    return pa.table({
        "request": np.arange(len(run.arrival_s)),
        "expert": run.expert,
        "arrival_s": run.arrival_s,
        "start_s": run.start_s,
        "first_token_s": run.first_token_s,
        "finish_s": run.finish_s,
        "ttft_s": run.ttft_s,
        "latency_s": run.latency_s,
        "switched": run.switched,
        "output_len": run.output_len,
    }, metadata={"rdu_cluster.cluster": run.cluster})


def serve_cli(expert: str, cluster: ClusterSpec, trace: Trace, experts: int, router: str,
              distribution: str, policy: str, hbm_slots: int | None, max_batch: int,
              seed: int, out_dir) -> str:
    """`serve --coe-experts N`: run the trace, write requests.parquet, return the summary."""
    scenario = CoEScenario.copies(experts, expert, router,
                                  popularity=Popularity.parse(distribution),
                                  hbm_slots=hbm_slots, policy=policy)
    run = serve_coe(scenario, cluster, trace, seed=seed, max_batch=max_batch)
    results.write_table(requests_table(run), out_dir / "requests.parquet")
    title = (f"CoE on {cluster.name}: {experts} x {expert} experts, router {router}, "
             f"{distribution} popularity, {policy} replacement, {len(trace)} requests")
    return title + "\n" + serve_report([run])
