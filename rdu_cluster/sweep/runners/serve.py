"""`serve`: a serving scenario (a synthetic request trace on a cluster under a plan and a
scheduler), run by the engine's Simulation on its local backend, one row per point: the summary
`rdu-cluster serve` prints, as columns.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa

from rdu_cluster.config import DEFAULT_FABRIC
from rdu_cluster.engine import evictions, prefix_cache, replica_routing, schedulers
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.sweep.fields import (
    FieldDef,
    boolean,
    choice,
    float_in,
    fraction,
    int_in,
    length_dist,
    nonnegative_int,
    positive_int,
    text,
)
from rdu_cluster.sweep.registry import Point, Runner, RunOutput, register
from rdu_cluster.sweep.runners.common import (
    cached_model,
    check_simulate,
    cluster_overrides,
    infeasible_row,
    make_options,
    option_values,
    point_cluster,
    point_profile,
    pool_chips,
    simulate_fields,
    simulate_namespaces,
    unflag,
)
from workloads import checks, sessions, traces
from workloads.checks import MAX_BATCH
from workloads.errors import ConfigError
from workloads.traces import MAX_REQUESTS

if TYPE_CHECKING:
    from rdu_cluster.engine.disagg import Pool

def think_time(value: Any) -> str:
    """A think time as `serve --think-time` takes it (workloads.sessions.ThinkTime)."""
    from workloads.sessions import ThinkTime

    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"expected S or 'exponential:MEAN' / 'uniform:LO:HI', got {value!r}")
    try:
        ThinkTime.parse(str(value), "")
    except ConfigError as e:
        raise ValueError(str(e).lstrip(": ")) from None
    return str(value)


def serve_fields() -> dict[str, FieldDef]:
    base = simulate_fields()
    i64, f64, s, b = pa.int64(), pa.float64(), pa.string(), pa.bool_()
    fields = {k: base[k] for k in ("model", "cluster", "weights", "kv_dtype", "sockets",
                                    "sockets_per_node", "calibration", "stack")}
    for f in (
        FieldDef("plan", text, s, column="plan", doc="tp16, tp2ep8, tp4pp4 [tp over all sockets]"),
        FieldDef("execution_model", text, s, column="execution_model", doc="[the chip's]"),
        FieldDef("requests", int_in(1, MAX_REQUESTS), i64,
                 doc="synthetic trace: number of requests"),
        # at least one request in checks.MAX_SECONDS: below, no two fit in a run (traces.py)
        FieldDef("rate", float_in(1 / checks.MAX_SECONDS, sys.float_info.max), f64,
                 column="rate_requests_per_s", doc="synthetic trace: requests per second"),
        FieldDef("arrival", choice(*traces.ARRIVALS), s, default=traces.ARRIVAL,
                 column="arrival"),
        FieldDef("burstiness", float_in(0.0, 1e3), f64, default=traces.BURSTINESS,
                 column="burstiness", doc="coefficient of variation of bursty gaps"),
        FieldDef("prompt_len", length_dist, s, default=traces.PROMPT_LEN,
                 column="prompt_len_dist", doc="N, uniform:LO:HI or lognormal:MEAN:SIGMA"),
        FieldDef("output_len", length_dist, s, default=traces.OUTPUT_LEN,
                 column="output_len_dist"),
        FieldDef("seed", nonnegative_int, i64, doc="trace and routing seed [sweep.seed]"),
        FieldDef("scheduler", text, s,
                 doc="a registered policy [the GPU stack's own: guaranteed-no-evict under "
                 f"tensorrt-llm, else {schedulers.DEFAULT}; its column is the run's]"),
        # its column is the run's (the stack's cap where unset: run_serve's rows)
        FieldDef("max_batch", int_in(1, MAX_BATCH), i64,
                 doc="sequences a replica runs at once [a GPU's stack's cap; an RDU "
                 f"{Limits.max_batch}; with pools, the decode pool's]"),
        FieldDef("token_budget", int_in(1, MAX_BATCH * 64), i64,
                 doc="new tokens a step takes [a GPU's stack's own; an RDU "
                 f"{Limits.token_budget}; with pools, the prefill pool's]"),
        FieldDef("chunked_prefill", boolean, b,
                 doc="prompt chunks beside the decodes [as the GPU stack's scheduler: vllm, "
                 "eager; an RDU not; with pools, the prefill pool's]"),
        FieldDef("preemption", choice(*schedulers.PREEMPTION), s, default=Limits.preemption,
                 column="preemption"),
        FieldDef("kv_fraction", fraction, f64, column="kv_fraction",
                 doc="KV share of what weights, activations and the runtime leave [stack rule]"),
        FieldDef("fault", text, s, column="fault", doc="one simulated fault: socket:N@T[...]"),
        FieldDef("concurrency", positive_int, i64, column="concurrency",
                 doc="closed loop: clients (vLLM --max-concurrency); rate then paces sends"),
        FieldDef("routing", text, s, default=replica_routing.DEFAULT, column="routing",
                 doc="replica routing policy (engine/replica_routing/)"),
        FieldDef("prefill_pool", text, s, column="prefill_pool",
                 doc="disaggregated: CLUSTER:PLAN:N prefill replicas (with decode_pool)"),
        FieldDef("decode_pool", text, s, column="decode_pool",
                 doc="disaggregated: CLUSTER:PLAN:M decode replicas (with prefill_pool)"),
        FieldDef("fabric", text, s, default=DEFAULT_FABRIC, column="fabric",
                 doc="disaggregated: inter-node fabric of the KV hand-over"),
        FieldDef("trace", text, s, column="trace",
                 doc="a trace file instead of requests/rate (CSV/Parquet/Arrow, Azure, Mooncake)"),
        FieldDef("sessions", positive_int, i64, column="sessions",
                 doc="multi-turn workload instead of requests: sessions (prompt_len: each "
                 "turn's user message; rate: session starts per second [inf])"),
        FieldDef("turns", positive_int, i64, column="turns", doc="with sessions: turns each"),
        FieldDef("system_prompt", nonnegative_int, i64, column="system_prompt",
                 doc=f"with sessions: shared system prompt tokens [{sessions.SYSTEM_TOKENS}]"),
        FieldDef("think_time", think_time, s, column="think_time",
                 doc="with sessions: S, exponential:MEAN or uniform:LO:HI seconds "
                 f"[{sessions.THINK_TIME}]"),
        FieldDef("prefix_cache", choice(*prefix_cache.MODES), s, column="prefix_cache",
                 doc="off, hbm or tiered [tiered on an RDU, hbm on a GPU, as serve]"),
        FieldDef("prefix_block", positive_int, i64, column="prefix_block",
                 doc="tokens per prefix-cache block [the KV block]"),
        FieldDef("prefix_eviction", text, s, column="prefix_eviction",
                 doc=f"[{evictions.DEFAULT}]"),
    ):
        fields[f.name] = f
    return fields


# The engine's energy and cost figures (rdu_cluster/engine/energy.py); null where the chip has no
# [power] or the cluster no [cost] table.
ENERGY_COLUMNS = ("energy_j", "power_w", "joules_per_token", "cost_usd",
                  "cost_per_million_tokens_usd")
# A serve point's figures that carry an interval.
SERVE_BANDED = ("throughput_tokens_per_s", "request_throughput",
                *(f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e") for q in (50, 90, 99)),
                "mean_itl_ms", "p99_itl_ms", "joules_per_token", "cost_per_million_tokens_usd")
SERVE_SCHEMA = pa.schema(
    [("point_id", pa.string()), ("cluster", pa.string()), ("model", pa.string()),
     ("stack", pa.string()), ("seed", pa.int64()), ("sockets", pa.int64()), ("tp", pa.int64()),
     ("ep", pa.int64()), ("pp", pa.int64()), ("replicas", pa.int64()),
     ("max_batch", pa.int64()), ("token_budget", pa.int64()),
     ("chunked_prefill", pa.bool_()), ("scheduler", pa.string()), ("requests", pa.int64()),
     ("requests_served", pa.int64()), ("requests_unserved", pa.int64()),
     ("preemptions", pa.int64()), ("swaps", pa.int64()), ("output_tokens", pa.int64()),
     ("makespan_s", pa.float64()), ("throughput_tokens_per_s", pa.float64()),
     *((f"{m}_p{q}_s", pa.float64()) for m in ("ttft", "tpot", "e2e") for q in (50, 90, 99)),
     ("steps", pa.int64()), ("decode_steps", pa.int64()), ("windows", pa.int64()),
     *((k, pa.float64()) for k in ENERGY_COLUMNS),
     # vllm bench serve's names (engine/bench.py); the KV hand-over of a disaggregated run
     ("request_throughput", pa.float64()), ("mean_itl_ms", pa.float64()),
     ("p99_itl_ms", pa.float64()), ("max_concurrent_requests", pa.int64()),
     ("kv_transfer_p50_s", pa.float64()),
     ("feasible", pa.bool_()), ("infeasible_reason", pa.string()),
     ("prefix_cache_mode", pa.string()), ("prefix_cache_hit_rate", pa.float64()),
     *((f"prefix_cache_hit_rate_{t}", pa.float64()) for t in ("hbm", "ddr", "host")),
     ("prefix_copy_s", pa.float64()),
     # intervals (rdu_cluster/validation/uncertainty.py serving_columns)
     *((f"{k}_{end}", pa.float64()) for k in SERVE_BANDED for end in ("low", "high")),
     ("interval_note", pa.string())]
)


def _seed(f: Mapping[str, Any], seed: int) -> int:
    return f.get("seed", seed)


def _serve_config(f: Mapping[str, Any], chip, seed: int):
    from rdu_cluster.engine import schedulers
    from rdu_cluster.engine.prefix_cache import PrefixConfig
    from rdu_cluster.engine.simulation import ServeConfig

    options = None if _pools(f) else make_options(chip, option_values(f), f.get("stack"))
    scheduler, limits = schedulers.engine_defaults(
        *_engines(f, chip, options), scheduler=f.get("scheduler"),
        max_batch=f.get("max_batch"), token_budget=f.get("token_budget"),
        chunked_prefill=f.get("chunked_prefill"), preemption=f["preemption"])
    return ServeConfig(plan=f.get("plan"), scheduler=scheduler, limits=limits,
                       seed=_seed(f, seed), kv_memory_fraction=f.get("kv_fraction"),
                       execution_model=f.get("execution_model"),
                       options=options,  # a pair's pools take theirs each (_pool_options)
                       faults=(f["fault"],) if "fault" in f else (),
                       concurrency=f.get("concurrency"), routing=f["routing"],
                       prefix=PrefixConfig(f.get("prefix_cache"), f.get("prefix_block"),
                                           f.get("prefix_eviction", evictions.DEFAULT)))


def _engines(f: Mapping[str, Any], chip, options) -> tuple[tuple[Any, Any], ...]:
    """The (chip, execution options) of the replicas that prefill and of those that decode
    (schedulers.engine_defaults), as serve takes them: the point's cluster's, or each pool's
    (its own chip's where a pool does not load: the checks name it, check_serve)."""
    chips = pool_chips([f["prefill_pool"], f["decode_pool"]]) if _pools(f) else []
    if not chips:
        return (chip, options), (chip, options)
    return tuple(zip((c for c, _ in chips), _pool_options(f)))


def _serve_sim(f: Mapping[str, Any], model, cluster, trace, config):
    """A Simulation, or a Disaggregated pair of pools when the point names them."""
    from rdu_cluster.backends import make as make_backend
    from rdu_cluster.config import load_fabric
    from rdu_cluster.engine import disagg
    from rdu_cluster.engine.simulation import Simulation

    pools = _pools(f)
    if pools is None:
        return Simulation(model, cluster, trace, config, make_backend("local"))
    return disagg.Disaggregated(model, *pools, load_fabric(f["fabric"]), trace, config,
                                lambda: make_backend("local"), options=_pool_options(f))


def _pool_options(f: Mapping[str, Any]) -> tuple[Any, Any]:
    """A disaggregated point's execution options, each pool's on its own chip: the point's
    stack on a GPU pool (serving_stacks.pool_stack), its toggles where they are its chip's."""
    from chip import serving_stacks

    (c0, _), (c1, _) = pool_chips([f["prefill_pool"], f["decode_pool"]])
    return cast("tuple[Any, Any]", tuple(
        make_options(c, option_values(f), serving_stacks.pool_stack(c, f.get("stack")))
        for c in (c0, c1)))


POOLS = ("prefill_pool", "decode_pool")


def _pools(f: Mapping[str, Any]) -> tuple[Pool, Pool] | None:
    """The point's (prefill, decode) pools; None: aggregated serving."""
    from rdu_cluster.engine import disagg

    given = [disagg.Pool.parse(f[k], "--" + k.replace("_", "-")) for k in POOLS if k in f]
    if len(given) == 1:
        raise ConfigError("give both prefill_pool and decode_pool (or neither: aggregated)")
    return cast("tuple[Pool, Pool] | None", tuple(given) or None)  # both or neither (above)


def _shape(sim) -> dict:
    """Sockets, plan and replicas of a run (a disaggregated run: its decode pool's plan)."""
    if hasattr(sim, "clusters"):
        pre, dec = sim.sims
        return {"cluster": "+".join(c.name for c in sim.clusters),
                "sockets": sum(c.sockets for c in sim.clusters), "tp": dec.plan.tp,
                "ep": dec.plan.ep, "pp": dec.plan.pp,
                "replicas": len(pre.replicas) + len(dec.replicas)}
    return {"cluster": sim.cluster.name, "sockets": sim.cluster.sockets, "tp": sim.plan.tp,
            "ep": sim.plan.ep, "pp": sim.plan.pp, "replicas": len(sim.replicas)}


def _trace(f: Mapping[str, Any], seed: int):
    """The point's workload: a trace file, sessions, or a synthetic trace (one of the three:
    check_serve)."""
    if "trace" in f:
        return traces.read_trace(f["trace"])
    if "sessions" in f:
        spec = sessions.SessionSpec(
            f["sessions"], f["turns"], f.get("system_prompt", sessions.SYSTEM_TOKENS),
            traces.LengthDist.parse(f["prompt_len"], "prompt_len"),
            traces.LengthDist.parse(f["output_len"], "output_len"),
            sessions.ThinkTime.parse(f.get("think_time", sessions.THINK_TIME), "think_time"),
            f.get("rate", math.inf), f["arrival"])
        return sessions.sessions(spec, _seed(f, seed))
    return traces.synthetic(
        f["requests"], f["rate"], f["arrival"],
        traces.LengthDist.parse(f["prompt_len"], "prompt_len"),
        traces.LengthDist.parse(f["output_len"], "output_len"),
        seed=_seed(f, seed), burstiness=f["burstiness"],
    )


def run_serve(points: Sequence[Point], seed: int) -> RunOutput:
    """Each point is one Simulation on a fresh local backend: deterministic given the point and
    the seed (a point's `seed` field, else the sweep's). A point the engine refuses (the weights
    do not fit at its plan) is infeasible, with the engine's message."""
    from rdu_cluster.engine import metrics
    from rdu_cluster.engine.requests import DONE

    rows, bad = [], {}
    for p in points:
        f = p.fields
        cluster = point_cluster(f)
        model = cached_model(f["model"], f.get("weights"), f.get("kv_dtype"))
        config = _serve_config(f, cluster.chip, seed)
        try:
            sim = _serve_sim(f, model, cluster, _trace(f, seed), config)
            tables = sim.run()
        except ConfigError as e:
            bad[p.id] = str(e)
            rows.append(infeasible_row({"point_id": p.id, "cluster": cluster.name,
                                        "model": model.name, "seed": config.seed,
                                        "sockets": cluster.sockets}, bad[p.id]))
            continue
        s = tables.summary  # the engine's own summary: what `rdu-cluster serve` prints
        req = tables.requests
        done = [st == DONE for st in req.column("state").to_pylist()]
        e2e = metrics.percentiles([v for v, ok in zip(req.column("e2e_s").to_pylist(), done)
                                   if ok])
        b = s["bench"]
        row = {"point_id": p.id, "model": model.name, "seed": config.seed, **_shape(sim),
               "max_batch": config.limits.max_batch,
               "token_budget": config.limits.token_budget,
               "chunked_prefill": config.limits.chunked_prefill, "scheduler": config.scheduler,
               "stack": _stack(sim, cluster, config.options),
               "request_throughput": b["request_throughput"],
               "mean_itl_ms": b["mean_itl_ms"], "p99_itl_ms": b.get("p99_itl_ms"),
               "max_concurrent_requests": b["max_concurrent_requests"],
               "kv_transfer_p50_s": (s["kv_transfer_ms"][50] / 1e3 if "kv_transfer_ms" in s
                                     else 0.0),
               "requests": s["requests"], "requests_served": s["served"],
               "requests_unserved": s["unserved"], "preemptions": s["preemptions"],
               "swaps": int(sum(v or 0 for v in req.column("swaps").to_pylist())),
               "output_tokens": s["output_tokens"], "makespan_s": s["makespan_s"],
               "throughput_tokens_per_s": s["tokens_per_s"], "steps": s["steps"],
               "decode_steps": s["decode_steps"], "windows": s["windows"],
               **{k: s[k] for k in ENERGY_COLUMNS}, "feasible": True,
               "prefix_cache_mode": s["prefix_cache"],
               "prefix_cache_hit_rate": s["prefix_cache_hit_rate"],
               **{f"prefix_cache_hit_rate_{t}": s["prefix_cache_hit_rate_by_tier"].get(t)
                  for t in ("hbm", "ddr", "host")},
               "prefix_copy_s": s["prefix_copy_s"]}
        for name, values in (("ttft", s["ttft_s"]), ("tpot", s["tpot_s"]), ("e2e", e2e)):
            row.update({f"{name}_p{q}_s": v for q, v in values.items()})
        with point_profile(f):
            row.update(_serve_intervals(row, sim, cluster, config))
        rows.append(row)
    return RunOutput(pa.Table.from_pylist(rows, schema=SERVE_SCHEMA) if rows else None, bad)


def _stack(sim, cluster, options) -> str | None:
    """The serving stack the run served with: a disaggregated run's GPU pools' (an RDU pool
    takes none; `cluster`, the point's own, is neither pool), as serve's summary names it."""
    from chip import serving_stacks
    from rdu_cluster.validation import uncertainty

    if hasattr(sim, "clusters"):
        return next((s for _, s in uncertainty.pools_of(sim.clusters, sim.pool_options) if s),
                    None)
    return serving_stacks.stack_of(cluster.chip, options)


def _serve_intervals(row: Mapping[str, Any], sim, cluster, config) -> dict[str, Any]:
    """The point's SERVE_BANDED figures' intervals (a disaggregated run's from the pool that
    sets each: uncertainty.pool_of)."""
    from chip import serving_stacks
    from rdu_cluster.validation import uncertainty

    figures = {k: row[k] for k in SERVE_BANDED
               if isinstance(row.get(k), (int, float)) and not math.isnan(row[k])}
    pools = (uncertainty.pools_of(sim.clusters, sim.pool_options) if hasattr(sim, "clusters")
             else None)
    stack = serving_stacks.stack_of(cluster.chip, config.options)
    return uncertainty.serving_columns(figures, chip=cluster.chip, stack=stack, keys=figures,
                                       pools=pools)


def _check_workload(f: Mapping[str, Any], origin: Mapping[str, str]) -> None:
    """One workload a point: requests and rate, sessions and turns, or a trace file."""
    given = [k for k in ("trace", "sessions") if k in f]
    if len(given) > 1 or (given and "requests" in f):
        field = given[-1]
        raise ConfigError(f"{origin.get(field, 'base')}.{field}: give one workload: requests "
                          "and rate, sessions and turns, or trace")
    if "sessions" in f and "turns" not in f:
        raise ConfigError(f"{origin.get('sessions', 'base')}.turns: missing field (sessions "
                          "need turns)")
    if not given:
        for name in ("requests", "rate"):
            if name not in f:
                raise ConfigError(f"{name}: missing field (set it in [base] or in an axis; or "
                                  "give sessions and turns, or trace)")
    if f["burstiness"] != 1.0 and f["arrival"] != "bursty":  # as `serve --burstiness` refuses
        raise ConfigError(f"{origin.get('burstiness', 'base')}.burstiness: "
                          f"{checks.show(f['burstiness'])} needs arrival = 'bursty' (it is the "
                          "coefficient of variation of bursty gaps); this point's arrival is "
                          f"{checks.show(f['arrival'])}")
    if "trace" in f:
        from workloads import traces

        traces.read_trace(f["trace"])  # a bad file fails before anything runs


def check_serve(points: Sequence[Point], origin: Mapping[str, str]) -> None:
    """Clusters and models as `simulate` checks them; then every distinct plan (on its cluster
    and model), scheduler, fault and options set, so that a bad one fails before anything runs,
    naming its field."""
    from rdu_cluster.engine import plan as plans
    from rdu_cluster.engine import replica_routing, schedulers
    from rdu_cluster.engine.faults import Fault
    from rdu_cluster.engine.prefix_cache import PrefixConfig

    check_simulate(points, origin)
    checks: dict[tuple, tuple[str | None, str, Any]] = {}  # key -> (field, context, load)
    for p in points:
        f = p.fields
        _check_workload(f, origin)
        over = cluster_overrides(f)
        cluster = point_cluster(f)
        model = cached_model(f["model"], f.get("weights"), f.get("kv_dtype"))
        if "plan" in f:
            checks.setdefault(
                ("plan", f["plan"], f["cluster"], over, model.name),
                ("plan", f"{f['plan']!r} on {cluster.name} with {model.name}: ",
                 functools.partial(plans.PlanSpec.parse, f["plan"], cluster, model)))
        limits = schedulers.Limits(f.get("max_batch", Limits.max_batch),
                                   f.get("token_budget", Limits.token_budget),
                                   f.get("chunked_prefill", Limits.chunked_prefill),
                                   f["preemption"])
        name = f.get("scheduler", schedulers.DEFAULT)
        checks.setdefault(("scheduler", name, limits),
                          (None, "", functools.partial(schedulers.get, name,
                                                       limits)))  # the field its flag names
        if "fault" in f:
            checks.setdefault(("fault", f["fault"], cluster.name, cluster.sockets),
                              ("fault", f"on {cluster.name}: ",
                               functools.partial(Fault.parse, f["fault"], cluster)))
        checks.setdefault(("routing", f["routing"]), ("routing", "", functools.partial(
            replica_routing.get, f["routing"])))
        _pool_checks(f, model, cluster.chip, origin, checks)
        prefix = PrefixConfig(f.get("prefix_cache"), f.get("prefix_block"),
                              f.get("prefix_eviction", evictions.DEFAULT))
        checks.setdefault(("prefix", prefix), (None, "", prefix.check))
        opts = option_values(f)
        if opts:
            checks.setdefault(("options", cluster.chip.kind, opts),
                              (f"options.{opts[0][0]}", "",
                               functools.partial(make_options, cluster.chip, opts)))
    for field, context, load in checks.values():
        try:
            load()
        except ConfigError as e:
            field = field or _flag_field(str(e))
            where = origin.get(field, "base")
            raise ConfigError(f"{where}.{field}: {context}{unflag(str(e))}") from None


def _pool_checks(f: Mapping[str, Any], model, chip, origin: Mapping[str, str],
                 checks: dict) -> None:
    """A disaggregated point's spec errors, whatever its numbers: one pool without the other,
    a pool's cluster or plan, the fabric, and the fields the engine refuses beside pools (its
    own check, on a one-request stand-in of the workload: the trace is not built twice)."""
    from rdu_cluster.config import load_fabric
    from rdu_cluster.engine import disagg
    from workloads.traces import Trace

    try:
        pools = _pools(f)
    except ConfigError as e:
        field = _flag_field(str(e), next(k for k in POOLS if k in f))
        raise ConfigError(f"{origin.get(field, 'base')}.{field}: {unflag(str(e))}") from None
    if pools is None:
        return
    if "plan" in f:
        raise ConfigError(f"{origin.get('plan', 'base')}.plan: not with prefill_pool/decode_pool "
                          "(each pool names its plan)")
    checks.setdefault(("fabric", f["fabric"]), ("fabric", "", functools.partial(
        load_fabric, f["fabric"])))
    for key, pool in zip(POOLS, pools):
        checks.setdefault((key, str(pool), f["fabric"], model.name), (key, "", functools.partial(
            _pool_plan, pool, model, f["fabric"])))
    one = np.ones(1, dtype=np.int64)
    stand_in = Trace(np.zeros(1), one, one, after=-one if "sessions" in f else None)
    config = _serve_config(f, chip, 0)
    # the stand-in is only checked (Disaggregated.__post_init__), never run: it needs no backend
    no_backend = cast("Callable[[], object]", None)
    checks.setdefault(("disagg", "sessions" in f, config.concurrency, config.faults), (
        None, "", lambda: disagg.Disaggregated(model, *pools, load_fabric(f["fabric"]),
                                               stand_in, config, no_backend)))


def _pool_plan(pool, model, fabric: str) -> None:
    """The pool's cluster loads and its plan fits it, as the plan of an aggregated point."""
    from rdu_cluster.config import load_fabric
    from rdu_cluster.engine import plan as plans

    plans.PlanSpec.parse(pool.plan, pool.spec(model, load_fabric(fabric)), model)


def _flag_field(message: str, default: str = "prefill_pool") -> str:
    """The field of the CLI flag an engine message starts with (--prefix-eviction:
    prefix_eviction; --prefill-pool/--decode-pool: prefill_pool), else `default`."""
    m = re.match(r"--([a-z-]+)", message)
    return m.group(1).replace("-", "_") if m else default


SERVE = register(
    Runner(
        kind="serve",
        fields=serve_fields(),
        namespaces=simulate_namespaces(),
        run=run_serve,
        check=check_serve,
        points_per_task=4,  # a point is a whole serving simulation: tenths of a second to seconds
        # a workload: requests (and rate), sessions (and turns) or a trace (_check_workload)
        required=("model", "cluster", ("requests", "sessions", "trace")),
        doc="serving simulation (engine, local backend): the summary of a trace, one row per point",
    )
)
