"""Composition of Experts (CoE): a router model plus N expert models on one node, experts in the
capacity tier (DDR on an RDU socket, host DRAM behind PCIe on a GPU), a budget of HBM expert
slots with a replacement policy, and the model switch that copies an expert's shards tier to tier.

The setting is [MICRO24] section V (Samba-CoE): 150 Llama 2 7B experts, TP over the 8 sockets of
one node; the router and the KV cache live in HBM, with room reserved for the expert in use; a
request runs the router, then, if its expert is not in HBM, every socket copies its shard of the
expert from the capacity tier into HBM (chip/memory.py MemoryTiers.copy_time: bytes over the
slower tier's bandwidth, all sockets at once), and the request waits for it; then the expert runs.

Two uses:
- `table_v`: the per-request figures of MICRO24 Table V's setting: the router at batch 8, then
  each (prompt, expert) pair in turn, each a cold switch (8 prompts on 8 distinct experts).
- serving a trace (`serve --coe-experts N`) runs in the engine (rdu_cluster/engine): the sockets
  hold every expert's shard as a region of the capacity tier (`socket_regions`), a switch is a
  region copy the engine issues to every socket (`ExpertResidency.switch_ops`, victim by the
  replacement policy), and the `coe` scheduler (engine/schedulers/coe.py) batches one expert's
  requests at a time. The router runs on the sockets, in the prefill step that admits a request
  (chip.cost_tables.CostTables._router_rows).

Expert popularity: uniform, Zipf with exponent s (p_i ~ 1 / i^s, expert 0 the most popular), or
the trace's `model` column. Replacement policies: LRU, and LFU (least accesses so far, ties to the
least recent).
"""

from __future__ import annotations

import collections
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from chip.memory import MemoryTiers
from partitioning.cluster import ClusterSpec
from partitioning.estimate import estimate
from partitioning.footprint import kv_cache_per_socket
from partitioning.scenario import Scenario
from rdu_cluster.config import load_cluster
from rdu_cluster.output.report import text_table
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
        if self.kind == "zipf" and not 0 < self.s <= 100:  # past 100: one expert takes all
            raise ConfigError(f"zipf: exponent must be in (0, 100], got {self.s!r}")

    @classmethod
    def parse(cls, text: str) -> Popularity:
        """"uniform", "zipf:1.1", "trace"."""
        name, _, arg = text.partition(":")
        if name == "zipf":
            try:
                s = float(arg) if arg else 1.0
            except ValueError:
                raise ConfigError(
                    f"distribution: {text!r}: zipf takes a number, zipf:1.1"
                ) from None
            return cls("zipf", s)
        if arg and name in DISTRIBUTIONS:
            raise ConfigError(f"distribution: {text!r}: {name} takes no argument; expected "
                              "uniform, zipf:S or trace")
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


# How a model switch is costed (validate names the one each row uses):
# - "per-socket": the simulator's default: every socket copies its shard at its own tier
#   bandwidth, all at once (SN40L DDR 200 GB/s per socket; a GPU's host link 64 / 32 GB/s).
# - "micro24": [MICRO24] VI-C's arithmetic, a named assumption: the RDU node's aggregate DDR->HBM
#   rate (">1 TB/s", MICRO24_NODE_COPY) against ONE host-to-GPU figure for the whole DGX (the
#   chip's host-link bandwidth: 64 GB/s H100, 32 GB/s A100).
# - "pcie-topology": the simulator's own estimate of the DGX: GPUS_PER_PCIE_SWITCH GPUs share
#   each PCIe switch's x16 uplink to the CPUs (DGX H100 / A100 system topology: four switches,
#   two GPUs each), pinned host buffers at PINNED_PCIE_EFFICIENCY of the link; RDU as per-socket.
SWITCH_MODELS = ("per-socket", "micro24", "pcie-topology")
MICRO24_NODE_COPY = 1e12  # [MICRO24]: "over 1 TB/s" DDR -> HBM per 8-socket node
GPUS_PER_PCIE_SWITCH = 2  # DGX H100 / DGX A100 user guides (system topology); assumption for others
# Pinned host-to-device copies reach ~80% of a PCIe link (x16 Gen4: ~25 of 32 GB/s and Gen5:
# ~50 of 64 GB/s in public bandwidthTest runs); pageable copies far less. Range 0.7-0.9.
PINNED_PCIE_EFFICIENCY = 0.8


def switch_time_s(expert: ModelSpec, cluster: ClusterSpec, tp: int | None = None,
                  model: str = "per-socket") -> float:
    """Seconds to bring one expert into the HBM of the `tp` sockets serving it (see
    SWITCH_MODELS; default: every socket copies its shard at once at its tier bandwidth)."""
    if model not in SWITCH_MODELS:
        raise ConfigError(f"switch_model: {model!r} unknown; accepted: {', '.join(SWITCH_MODELS)}")
    tp = tp or cluster.sockets
    nbytes = graphs.weight_bytes(expert)
    tier = capacity_tier(cluster)
    link = cluster.chip.tier(tier).bandwidth_bytes_per_s
    if model == "micro24":
        return nbytes / (MICRO24_NODE_COPY if tier == "ddr" else link)
    if model == "pcie-topology" and tier == "host":
        uplinks = -(-tp // GPUS_PER_PCIE_SWITCH)  # switches the group's GPUs sit behind
        return nbytes / (uplinks * link * PINNED_PCIE_EFFICIENCY)
    tiers = MemoryTiers.of(cluster.chip)
    return tiers.copy_time(nbytes / tp, tier, "hbm")


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


def memory(scenario: CoEScenario, cluster: ClusterSpec, batch: int, context: int,
           tp: int | None = None) -> Memory:
    """Per-socket layout: router + KV reserve + expert slots in HBM; every expert in the tier
    (tp: sockets the router and each expert are split over; default: the node's)."""
    tp = tp or cluster.sockets
    router = graphs.weight_bytes(scenario.router) / tp
    # experts are often copies of one model: each distinct one is sized once (65,536 copies
    # would otherwise cost a minute of identical parameter counts)
    counts = collections.Counter(scenario.experts)
    sizes = {e: graphs.weight_bytes(e) for e in counts}
    expert = max(sizes.values()) / tp
    kv = max(float(np.max(kv_cache_per_socket(e, tp, batch, context)))
             for e in set(scenario.experts))
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
    in_tier = sum(sizes[e] * n for e, n in counts.items()) / tp
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


# ---- in the engine -----------------------------------------------------------------------------


def expert_region(expert: int) -> str:
    """The region of an expert's shard in the capacity tier (its backing store)."""
    return f"experts/{expert}"


def hbm_region(expert: int) -> str:
    return f"experts/{expert}@hbm"


def socket_regions(scenario: CoEScenario, cluster: ClusterSpec, tp: int) -> tuple[list, ...]:
    """Region ops that load one socket at start: the router in HBM, every expert's shard in the
    capacity tier. No expert starts in HBM (the first request of each expert waits for it)."""
    tier = capacity_tier(cluster)
    ops = [["alloc", "weights/router", "hbm", graphs.weight_bytes(scenario.router) / tp,
            "weights"]]
    ops += [["alloc", expert_region(i), tier, graphs.weight_bytes(e) / tp, "weights"]
            for i, e in enumerate(scenario.experts)]
    return tuple(ops)


class ExpertResidency:
    """One replica's experts in HBM, as seen by the engine: `switch_ops(e)` is what the sockets
    do before a step of expert e: nothing when e is the expert in use or still resident (a hit),
    else free the policy's victim and copy e's shard from the capacity tier into HBM. The cache
    is touched once per change of expert (a group of e's requests is one access)."""

    def __init__(self, slots: int, policy: str, tier: str):
        self.cache = ExpertCache(slots, policy)
        self.tier = tier
        self.current = -1

    def switch_ops(self, expert: int) -> list:
        if expert == self.current:
            return []
        self.current = expert
        before = set(self.cache.resident)
        if self.cache.access(expert):
            return []
        ops = [["free", hbm_region(v)] for v in sorted(before - set(self.cache.resident))]
        return ops + [["copy", expert_region(expert), "hbm", hbm_region(expert)]]


def oom_message(scenario: CoEScenario, cluster: ClusterSpec, mem: Memory) -> str:
    return (
        f"{cluster.name} runs out of memory for {scenario.n} experts: they need "
        f"{mem.experts_in_tier * cluster.sockets / 1e12:.2f} TB of {mem.tier_name}, "
        f"{mem.tier * cluster.sockets / 1e12:.2f} TB available"
    )


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
            router: str = DEFAULT_ROUTER, switch_model: str = "per-socket") -> TableV:
    """MICRO24 Table V's setting. prompt_len is not given in the text we rely on: 512 is an
    assumption (a chat prompt), a parameter. Each pair is a cold switch."""
    if experts < batch:  # the setting's pairs are distinct experts: one each is impossible
        raise ConfigError(f"--experts: {experts} for a batch of {batch} prompts; the Table V "
                          "setting sends each prompt to an expert of its own (a cold switch "
                          f"each), so it needs at least {batch} (give more, or a smaller --batch)")
    scenario = CoEScenario.copies(experts, expert, router)
    mem = memory(scenario, cluster, 1, prompt_len + gen_len)
    r = estimate(Scenario(scenario.router, cluster, batch=batch, prompt_len=prompt_len,
                          gen_len=1))
    e = estimate(Scenario(scenario.experts[0], cluster, batch=1, prompt_len=prompt_len,
                          gen_len=gen_len))
    return TableV(
        cluster=cluster.name,
        experts=experts,
        batch=batch,
        prompt_len=prompt_len,
        gen_len=gen_len,
        router_s=_f(r.ttft_s) + _f(r.tpot_s),
        switch_s=switch_time_s(scenario.experts[0], cluster, model=switch_model),
        expert_s=_f(e.ttft_s) + (gen_len - 1) * _f(e.tpot_s),
        memory=mem,
    )


# ---- request-to-expert --------------------------------------------------------------------


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


def _f(x) -> float:
    return float(np.ravel(np.asarray(x, dtype=float))[0])



# ---- validation metrics (rdu_cluster/validation/published.py registers them) ----


def _case_table_v(case: dict, key: str = "cluster") -> TableV:
    return table_v(load_cluster(case[key]), case.get("experts", 150), case.get("batch", 8),
                   case.get("prompt_len", 512), case.get("gen_len", 20),
                   case.get("model", DEFAULT_EXPERT), case.get("router", DEFAULT_ROUTER),
                   case.get("switch_model", "per-socket"))


# Host memory the OS and the serving runtime keep for themselves (kernel, page tables, the
# runtime's pinned staging pools): not published for DGX; assumption 5% (range 2-10%).
HOST_RESERVE_FRACTION = 0.05


def tier_demand(case: dict) -> float:
    """The DGX out-of-memory accounting of [MICRO24] Table V: every expert's bytes over the host
    DRAM left after the OS and runtime reserve (the experts' backing store; HBM holds the
    router, the KV reserve and the expert slots). >= 1: out of memory. Reading "host_reserve"
    from the row (default HOST_RESERVE_FRACTION)."""
    mem = _case_table_v(case).memory
    return mem.experts_in_tier / (mem.tier * (1.0 - case.get("host_reserve", HOST_RESERVE_FRACTION)))


VALIDATION_METRICS = {
    # MICRO24 Table V: baseline time over the cluster's (a speed-up of `cluster`)
    "coe_overall_speedup": lambda c: _case_table_v(c, "baseline_cluster").total_s
    / _case_table_v(c).total_s,
    "coe_switch_speedup": lambda c: _case_table_v(c, "baseline_cluster").switch_s
    / _case_table_v(c).switch_s,
    # bytes the experts need in the capacity tier over what it can give them: >= 1 is out of
    # memory (tier_demand states the accounting)
    "coe_tier_demand": tier_demand,
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
