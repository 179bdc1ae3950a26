"""Result tables: a pyarrow schema with units in the column names and a schema version in its
metadata, built from Estimates (records, table, estimate_table). Writing them: output/atomic.py."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

import rdu_cluster
from chip.cost import CAUSES
from chip.runtime_memory import PARTS as RESERVED_PARTS
from partitioning.estimate import Estimate
from rdu_cluster.scenarios import economics
from rdu_cluster.scenarios.economics import COLUMNS as ECONOMICS
from rdu_cluster.validation import uncertainty
from workloads.ops import OpClass

if TYPE_CHECKING:
    import pyarrow as pa

SCHEMA_VERSION = "5"  # 2: feasible / infeasible_reason; 3: <figure>_low/_high, interval_note;
# 4: stack; 5: calibration, decode/prefill_prefetch_stall_s

# The first columns are a public interface (`simulate --json`): keep their names.
PUBLIC = [
    ("model", "string"),
    ("cluster", "string"),
    ("sockets", "int64"),
    ("batch", "int64"),
    ("prompt_len", "int64"),
    ("gen_len", "int64"),
    ("tokens_per_s_per_request", "float64"),
    ("tokens_per_s_total", "float64"),
    ("tpot_s", "float64"),
    ("ttft_s", "float64"),
    ("hbm_bw_utilization", "float64"),
    ("bound", "string"),
    ("weight_bytes", "float64"),
    ("kv_cache_bytes", "float64"),
    ("flops_per_token", "float64"),
    ("bytes_per_token", "float64"),
]
DETAIL = (
    [
        ("plan", "string"),
        ("tp", "int64"),
        ("replicas", "int64"),
        ("chip", "string"),
        ("execution_model", "string"),
        # the GPU serving stack (chip/serving_stacks.py); null on a chip that takes none
        ("stack", "string"),
        # the calibration the chip ran with: "PROFILE (CHIP)", "PROFILE (inherited from CHIP)"
        # or "first principles" (rdu_cluster/validation/calibration.py)
        ("calibration", "string"),
        ("hbm_used_bytes_per_socket", "float64"),
        ("kv_cache_bytes_per_socket", "float64"),
        # the fullest socket's HBM: the activation workspace, and what its runtime reserves
        # (chip/runtime_memory.py), in all and by part
        ("activation_bytes_per_socket", "float64"),
        ("reserved_by", "string"),
        ("reserved_bytes_per_socket", "float64"),
    ]
    + [(f"reserved_{p}_bytes_per_socket", "float64") for p in RESERVED_PARTS]
    + [
        # false where the point does not fit (partitioning.footprint.misfits), with the reason;
        # its speed columns are then null (sweeps keep such points as rows)
        ("feasible", "bool_"),
        ("infeasible_reason", "string"),
        ("decode_kernels", "float64"),
    ]
    + [(f"decode_{c}_s", "float64") for c in CAUSES]
    + [(f"decode_class_{c.value}_s", "float64") for c in OpClass]
    + [(f"prefill_{c}_s", "float64") for c in CAUSES]
    # energy and cost of decode (rdu_cluster/scenarios/economics.py); null when the estimate comes without
    # its cluster or the cluster's chip has no [power] / the cluster no [cost] table
    + [(c, "float64") for c in ECONOMICS]
    # intervals at the default level (rdu_cluster/validation/uncertainty.py): null, with the
    # reason in interval_note, outside every measured regime or without an uncertainty model
    + [(c, "float64") for c in uncertainty.BOUND_COLUMNS]
    + [("interval_note", "string")]
    # speculative decoding (rdu_cluster/scenarios/speculative.py); null for plain decode
    + [
        ("draft", "string"),
        ("spec_k", "int64"),
        ("acceptance", "string"),
        ("tokens_per_step", "float64"),
        ("spec_speedup", "float64"),
    ]
)


@functools.cache
def schema() -> pa.Schema:
    """The result schema. Built on first use: the columns name their types by pyarrow's factory
    functions, so a command that prints no table (a plain `simulate`) never loads pyarrow."""
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, typ)()) for name, typ in PUBLIC + DETAIL],
                     metadata={"rdu_cluster.schema_version": SCHEMA_VERSION})


def records(est: Estimate, chip: str, execution_model: str, cluster=None) -> list[dict]:
    """One record per design point of `est` (a scalar estimate gives one). With `cluster` (the
    ClusterSpec it was estimated on) the energy and cost columns are filled."""
    cols = _columns(est, chip, execution_model, cluster)
    n = max(np.size(v) for v in cols.values() if not isinstance(v, str))
    out = []
    for i in range(n):
        row = {k: _pick(v, i, n) for k, v in cols.items()}
        for k in uncertainty.BOUND_COLUMNS:  # NaN: this point's regime has no interval
            if isinstance(row.get(k), float) and math.isnan(row[k]):
                row[k] = None
        out.append(row)
    return out


def _columns(est: Estimate, chip: str, model: str, cluster=None) -> dict:
    d, p = est.decode, est.prefill
    cols = {
        "model": est.model,
        "cluster": est.cluster,
        "sockets": est.sockets,
        "batch": est.batch,
        "prompt_len": est.prompt_len,
        "gen_len": est.gen_len,
        "tokens_per_s_per_request": est.tokens_per_s_per_request,
        "tokens_per_s_total": est.tokens_per_s_total,
        "tpot_s": est.tpot_s,
        "ttft_s": est.ttft_s,
        "hbm_bw_utilization": est.hbm_bw_utilization,
        "bound": None,  # set below
        "weight_bytes": est.weight_bytes,
        "kv_cache_bytes": est.kv_cache_bytes,
        "flops_per_token": est.flops_per_token,
        "bytes_per_token": est.bytes_per_token,
        "plan": est.plan,
        "tp": est.tp,
        "replicas": est.replicas,
        "chip": chip,
        "execution_model": model,
        "stack": est.stack,
        "calibration": cluster.chip.calibration if cluster is not None else None,
        "hbm_used_bytes_per_socket": est.hbm_used_bytes,
        "kv_cache_bytes_per_socket": est.kv_cache_bytes_per_socket,
        **_memory_columns(est),
        "feasible": np.asarray(est.misfit) == "",
        "infeasible_reason": np.where(np.asarray(est.misfit) == "", None, est.misfit),
        "decode_kernels": d.kernels,
    }
    cols.update({f"decode_{c}_s": d.cause(c) for c in CAUSES})
    cols.update({f"decode_class_{c.value}_s": d.by_class.get(c.value, 0.0) for c in OpClass})
    # A pipeline or EP plan's prefill comes as a time without breakdown: null, not zero.
    cols.update({f"prefill_{c}_s": p.cause(c) if p.by_cause else None for c in CAUSES})
    cols["bound"] = est.extra["bound"] if "bound" in est.extra else d.bound()
    cluster = cluster or est.extra.get("cluster")
    if cluster is not None:
        cols.update(economics.estimate_columns(est, cluster))
    cols.update(interval_columns(cols, cluster.chip if cluster is not None else chip))
    return cols


def interval_columns(cols: Mapping, chip) -> dict:
    """The figures' `<key>_low` / `<key>_high` and `interval_note` (uncertainty.columns), for a
    record's columns as they stand (speculative.records calls it again on its own figures)."""
    return uncertainty.columns(cols, chip=chip, stack=cols.get("stack"), batch=cols["batch"])


def _memory_columns(est: Estimate) -> dict:
    mem = est.extra.get("memory")
    if mem is None:
        return {}
    return {"activation_bytes_per_socket": mem.get("activations", 0.0),
            "reserved_by": est.extra.get("reserved_by") or None,
            "reserved_bytes_per_socket": mem.get("reserved", 0.0),
            **{f"reserved_{p}_bytes_per_socket": mem.get(f"reserved_{p}", 0.0)
               for p in RESERVED_PARTS}}


def _pick(value, i: int, n: int):
    if value is None or isinstance(value, str):
        return value
    arr = np.broadcast_to(np.asarray(value), (n,)) if np.ndim(value) <= 1 else value.ravel()
    item = arr[i] if np.ndim(arr) else arr
    return item.item() if hasattr(item, "item") else item


def table(rows: Iterable[Mapping], extra_metadata: Mapping[str, str] | None = None) -> pa.Table:
    import pyarrow as pa

    rows = list(rows)
    casts = [(f.name, _caster(f.type)) for f in schema()]
    casted = [{name: None if (v := r.get(name)) is None else cast(v) for name, cast in casts}
              for r in rows]
    meta = dict(schema().metadata)
    meta[b"rdu_cluster.code_version"] = rdu_cluster.__version__.encode()
    for k, v in (extra_metadata or {}).items():
        meta[f"rdu_cluster.{k}".encode()] = str(v).encode()
    return pa.Table.from_pylist(casted, schema=schema().with_metadata(meta))


def _caster(typ):
    """A column's Python cast, chosen once per column (not per cell)."""
    import pyarrow as pa

    if pa.types.is_boolean(typ):
        return bool
    if pa.types.is_integer(typ):
        return lambda value: round(float(value))
    if pa.types.is_floating(typ):
        return float
    return str


def json_lines(tbl: pa.Table) -> str:
    return "\n".join(json.dumps(r) for r in tbl.to_pylist())


def estimate_table(
    est: Estimate,
    chip: str,
    execution_model: str,
    extra_metadata: Mapping[str, str] | None = None,
    cluster=None,
) -> pa.Table:
    """`table(records(est, chip, execution_model))`, built one numpy column at a time instead of
    one dict per design point: the same schema and values, ~20x faster for the thousands of
    points of a vectorized estimate (what sweeps use). `cluster` fills the energy/cost columns."""
    import pyarrow as pa

    cols = _columns(est, chip, execution_model, cluster)
    n = max(np.size(v) for v in cols.values() if not isinstance(v, str))
    arrays = [_column(cols.get(f.name), f.type, n, f.name in uncertainty.BOUND_COLUMNS)
              for f in schema()]
    meta = dict(schema().metadata)
    meta[b"rdu_cluster.code_version"] = rdu_cluster.__version__.encode()
    for k, v in (extra_metadata or {}).items():
        meta[f"rdu_cluster.{k}".encode()] = str(v).encode()
    return pa.Table.from_arrays(arrays, schema=schema().with_metadata(meta))


def _column(value, typ, n: int, nan_null: bool = False) -> pa.Array:
    """`nan_null`: NaN is written as null (a bound of a point with no interval)."""
    import pyarrow as pa

    if value is None:
        return pa.nulls(n, typ)
    if isinstance(value, str):
        return pa.array([value] * n, typ)
    arr = np.asarray(value)
    arr = np.broadcast_to(arr, (n,)) if arr.ndim <= 1 else arr.ravel()
    if pa.types.is_boolean(typ):
        return pa.array(arr.astype(bool), typ)
    if pa.types.is_integer(typ):  # as _caster: round half to even, like Python's round
        return pa.array(np.round(arr.astype(float)).astype(np.int64), typ)
    if pa.types.is_floating(typ):
        arr = arr.astype(np.float64)
        return pa.array(arr, typ, mask=np.isnan(arr) if nan_null else None)
    return pa.array([None if x is None else str(x) for x in arr], typ)
