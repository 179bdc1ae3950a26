"""What more than one kind of sweep runner uses: the fields and namespaces of `simulate`, which
`plan` and `serve` pick theirs from (simulate_fields, simulate_namespaces); a point's cluster,
model and calibration profile, each loaded once per worker process (cached_*, point_*); its
cluster overrides and execution options (cluster_overrides, option_values, make_options); the
check of its clusters, models, stacks and execution models that every kind runs first
(check_simulate); the row of a point that cannot run (infeasible_row); and a spec error's field
in place of an engine message's flag (unflag).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

import pyarrow as pa

from rdu_cluster.config import MAX_SOCKETS, OVERRIDE_PREFIXES, is_override
from rdu_cluster.sweep.fields import (
    FieldDef,
    Namespace,
    boolean,
    dtype,
    int_in,
    scalar,
    text,
)
from rdu_cluster.sweep.registry import Point
from workloads.checks import MAX_BATCH
from workloads.errors import ConfigError
from workloads.traces import MAX_LENGTH

# The cluster-config override fields (OVERRIDE_SCALARS, OVERRIDE_PREFIXES): a point's value goes
# to load_cluster(overrides=...) as is, as --set's do.
_OVERRIDE_DOCS = {
    "chip.": "chip config override, e.g. chip.tiers.hbm.*",
    "topology.": "topology override, e.g. topology.link_latency_s",
    "cost.": "cost override, e.g. cost.socket_hour_usd",
}
# The toggles the contract names, used where chip/ does not define its options classes yet.
FALLBACK_TOGGLES = {
    "rdu": ("kernel_looping", "batch_streaming", "schedule_offloading", "fused"),
    "gpu": ("cuda_graphs", "overlap_comm"),
}
OPTION_CLASSES = {
    "rdu": (("chip.dataflow", "DataflowOptions"),),
    "gpu": (("chip.dataflow", "GpuOptions"), ("chip.kernel_by_kernel", "GpuOptions")),
}


@functools.cache
def option_classes() -> dict[str, type]:
    """Chip kind -> its options dataclass, where chip/ defines one."""
    out: dict[str, type] = {}
    for kind, places in OPTION_CLASSES.items():
        for module, name in places:
            try:
                out[kind] = getattr(importlib.import_module(module), name)
                break
            except (ImportError, AttributeError):
                continue
    return out


def toggles(kind: str) -> tuple[str, ...]:
    cls = option_classes().get(kind)
    if cls is None or not dataclasses.is_dataclass(cls):
        return FALLBACK_TOGGLES[kind]
    return tuple(f.name for f in dataclasses.fields(cls))


def simulate_fields() -> dict[str, FieldDef]:
    i64, s = pa.int64(), pa.string()
    fields = [
        FieldDef("model", text, s, column="model_ref", doc="catalog name or config.json path"),
        FieldDef("cluster", text, s, column="cluster_ref", doc="cluster name or TOML path"),
        FieldDef("batch", int_in(1, MAX_BATCH), i64, default=1),
        FieldDef("prompt_len", int_in(1, MAX_LENGTH), i64, default=1024),
        FieldDef("gen_len", int_in(1, MAX_LENGTH), i64, default=256),
        FieldDef("tp", int_in(1, MAX_SOCKETS), i64, doc="tensor-parallel degree [all sockets]"),
        FieldDef("weights", dtype, s, column="weights_dtype"),
        FieldDef("kv_dtype", dtype, s, column="kv_dtype"),
        FieldDef("execution_model", text, s, doc="[the chip's]"),
        FieldDef("stack", text, s, doc="GPU serving stack (chip/serving_stacks.py) [the "
                 "default stack]; refused on a chip that takes none (RDU)"),
        FieldDef("sockets", int_in(1, MAX_SOCKETS), i64,
                 doc="override of the cluster's socket count"),
        FieldDef("sockets_per_node", int_in(1, MAX_SOCKETS), i64, column="sockets_per_node"),
        FieldDef("plan", text, s, doc="e.g. tp4pp2 [tp over all sockets]; the row says its name"),
        FieldDef("calibration", text, s, default="default",
                 doc="calibration profile name or path, or none (as --calibration)"),
    ]
    return {f.name: f for f in fields}


def simulate_namespaces() -> tuple[Namespace, ...]:
    names = frozenset(toggles("rdu")) | frozenset(toggles("gpu"))
    return (
        Namespace("options.", boolean, names, doc="optimization toggles"),
        *(Namespace(p, scalar, doc=_OVERRIDE_DOCS[p]) for p in OVERRIDE_PREFIXES),
    )


def cluster_overrides(fields: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, v) for k, v in fields.items() if is_override(k)))


def option_values(fields: Mapping[str, Any]) -> tuple[tuple[str, bool], ...]:
    return tuple(sorted((k[8:], v) for k, v in fields.items() if k.startswith("options.")))


# Workers build each cluster and model once per process; a sweep reuses a few of them a lot.
# The calibration profile is a field of the point (its name or path), not the driver's active
# profile, so a Ray worker applies the same values as a local run and the rows are the same.
@functools.lru_cache(maxsize=256)
def cached_cluster(ref: str, overrides: tuple[tuple[str, Any], ...],
                   profile: str = "default"):
    from rdu_cluster.config import load_cluster
    from rdu_cluster.validation import calibration

    with calibration.use(cached_profile(profile)):
        return load_cluster(ref, dict(overrides))


@functools.lru_cache(maxsize=16)
def cached_profile(profile: str):
    from rdu_cluster.validation import calibration

    return calibration.load(profile)


def point_cluster(f: Mapping[str, Any]):
    """The cluster of a point: its reference, overrides and calibration profile."""
    return cached_cluster(f["cluster"], cluster_overrides(f), f.get("calibration") or "default")


def point_profile(f: Mapping[str, Any]):
    """The point's calibration profile made active: its intervals are that profile's
    (rdu_cluster/validation/uncertainty.py reads the active one)."""
    from rdu_cluster.validation import calibration

    return calibration.use(cached_profile(f.get("calibration") or "default"))


@functools.lru_cache(maxsize=256)
def cached_model(ref: str, weights: str | None, kv: str | None):
    from workloads.catalog import load_model
    from workloads.dtypes import DType

    spec = load_model(ref)
    p = spec.precision
    if weights:  # one weight dtype for all: as `simulate --weights` does
        p = dataclasses.replace(p, weights=DType(weights), expert_weights=None)
    if kv:
        p = dataclasses.replace(p, kv_cache=DType(kv))
    return spec.with_precision(p)


def make_options(chip, values: tuple[tuple[str, bool], ...], stack: str | None = None) -> Any:
    """A point's execution options: on a GPU its serving stack (`stack`, or the default;
    chip/serving_stacks.py) with the toggles the point sets applied over it, the stack's name
    then saying so ("sglang (cuda_graphs=False)"); elsewhere the toggles. None where it sets
    neither (the execution model's default: on a GPU, the default stack). A stack on a chip
    that takes none is refused."""
    from chip import serving_stacks

    base = serving_stacks.options_for(chip, stack, where="--stack")
    mine = {k: v for k, v in values if k in toggles(chip.kind)}
    if not mine:  # None: the execution model's own default (the default stack on a GPU)
        return base if stack else None
    if base is not None:
        changed = ", ".join(f"{k}={v}" for k, v in sorted(mine.items()))
        # mypy matches **mine to every field, the str `stack` too; mine holds bool toggles only
        return dataclasses.replace(base, **mine,  # type: ignore[arg-type]
                                   stack=f"{base.stack} ({changed})")
    cls = option_classes().get(chip.kind)
    if cls is None:
        raise ConfigError(
            f"options.{min(mine)}: this build has no {chip.kind} options (chip.dataflow) yet"
        )
    return cls(**mine)


def check_simulate(points: Sequence[Point], origin: Mapping[str, str]) -> None:
    """Load every distinct cluster and model once, so that a bad name or override fails before
    anything runs, naming where in the spec it came from."""
    clusters, models = set(), set()
    engines: dict[tuple[str, tuple], Point] = {}  # (execution model, cluster key) -> a point
    for p in points:
        key = (p.fields["cluster"], cluster_overrides(p.fields),
               p.fields.get("calibration") or "default")
        clusters.add(key)
        models.add((p.fields["model"], p.get("weights"), p.get("kv_dtype")))
        if p.get("execution_model"):
            engines.setdefault((p.get("execution_model"), key), p)
    for ref, over, profile in sorted(clusters, key=repr):
        _blame(functools.partial(cached_cluster, ref, over, profile),
               ["cluster", "calibration", *dict(over)], origin)
    for ref, w, kv in sorted(models, key=repr):
        _blame(
            functools.partial(cached_model, ref, w, kv), ["model", "weights", "kv_dtype"], origin
        )
    _check_stacks(points, origin)
    if engines:
        from chip import execution

        for name in sorted({name for name, _ in engines}):
            _blame(functools.partial(execution.get, name), ["execution_model"], origin)
        for (name, key), p in engines.items():
            chip = cached_cluster(*key).chip
            try:
                execution.check_runs_on(name, chip)
            except ConfigError as e:
                raise ConfigError(f"{origin.get('execution_model', 'base')}.{e} (the point "
                                  f"with cluster {p.fields['cluster']!r}: a filter can drop "
                                  "such points)") from None


def _check_stacks(points: Sequence[Point], origin: Mapping[str, str]) -> None:
    """A stack that is no stack, or named for a chip that takes none, as `--stack` refuses it
    (a serve point's pools: where neither is a GPU, serving_stacks.pool_options)."""
    from chip import serving_stacks

    seen = set()
    for p in points:
        name = p.fields.get("stack")
        pools = tuple(p.fields.get(k) for k in ("prefill_pool", "decode_pool"))
        key = (name, p.fields["cluster"], cluster_overrides(p.fields), pools)
        if name is None or key in seen:
            continue
        seen.add(key)
        try:
            if all(pools):
                chips = pool_chips(cast("tuple[str, str]", pools))  # both given
                if chips:
                    serving_stacks.pool_options(chips, name)
            else:
                cluster = point_cluster(p.fields)
                serving_stacks.options_for(cluster.chip, name, system=cluster.name)
        except ConfigError as e:
            raise ConfigError(f"{origin.get('stack', 'base')}.stack: {unflag(str(e))}") from None


def pool_chips(pools: Sequence[str]) -> list[tuple[Any, str]]:
    """Each pool's chip and name (CLUSTER:PLAN:REPLICAS), prefill first; none where a pool
    does not load (the serve runner's pool checks name it)."""
    from rdu_cluster.config import load_cluster
    from rdu_cluster.engine.disagg import Pool

    try:
        parsed = [Pool.parse(p, "--prefill-pool") for p in pools]
        return [(load_cluster(q.cluster, dict(q.overrides)).chip, p)
                for q, p in zip(parsed, pools)]
    except ConfigError:
        return []


def _blame(load, fields: Sequence[str], origin: Mapping[str, str]) -> None:
    """Run `load`; a ConfigError is prefixed with the spec field it most likely comes from: an
    override whose name the message mentions, else the first field (the cluster or model)."""
    try:
        load()
    except ConfigError as e:
        text = str(e)
        named = [f for f in fields[1:] if f.rsplit(".", 1)[-1] in text]
        field = (named or list(fields))[0]
        raise ConfigError(f"{origin.get(field, 'base')}.{field}: {text}") from None


def infeasible_row(known: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """A point that cannot run is a row too: who it is, feasible = false and why; the figures
    it has none of stay null."""
    return {**known, "feasible": False, "infeasible_reason": reason}


def unflag(message: str) -> str:
    """An engine message names its CLI flag ("--plan: ..."); a spec error names the field."""
    return re.sub(r"^--[a-z-]+(/--[a-z-]+)*:?\s*", "", message)
