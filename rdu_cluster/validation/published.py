"""Run the validation table (rdu_cluster/validation/published.toml): each published figure, the
simulated one, the error and whether it is within the case's stated tolerance.

A case's configuration is complete in the table; this module only maps a metric name to how it
is computed from `estimate`. Nothing here adjusts a model to a published value.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from chip.dataflow import DataflowOptions
from chip.kernel_by_kernel import GpuOptions
from partitioning.estimate import Estimate, estimate
from rdu_cluster.config import load_cluster
from workloads import catalog
from workloads.errors import ConfigError

GIB = 2.0**30
# Options by name: what a case's `options` field may say.
OPTIONS: dict[str, Any] = {
    "default": None,
    "cuda_graphs": GpuOptions(cuda_graphs=True),
    "eager": GpuOptions(cuda_graphs=False),
    # [MICRO24]-era dataflow: fused layers, no KernelLooping / BatchStreaming.
    "micro24_fused_host": DataflowOptions(False, False, False, True),
    "micro24_fused_hw": DataflowOptions(False, False, True, True),
    "micro24_unfused_host": DataflowOptions(False, False, False, False),
}


@dataclass(frozen=True)
class Result:
    id: str
    claim: str
    source: str
    kind: str
    published: Any
    simulated: Any
    error: float | None  # relative error (value, range ends) or margin past a bound (negative)
    passed: bool
    tolerance: str
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def load_cases(path: str | None = None) -> list[dict[str, Any]]:
    if path is None:
        text = resources.files("rdu_cluster").joinpath("validation/published.toml").read_text()
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    return tomllib.loads(text)["case"]


def run(cases: list[dict[str, Any]] | None = None) -> list[Result]:
    return [run_case(c) for c in (cases if cases is not None else load_cases())]


def run_case(case: dict[str, Any]) -> Result:
    kind = case["kind"]
    metric = METRICS.get(case["metric"])
    if metric is None:
        raise ConfigError(f"validation case {case['id']}: unknown metric {case['metric']!r}")
    if kind in ("range", "argmax"):
        values = {m: metric({**case, "model": m}) for m in case["models"]}
        return _judge_set(case, values)
    return _judge(case, metric(case))


# ---- metrics --------------------------------------------------------------------------------


def _estimate(case: dict[str, Any], options: Any = "case", **kw) -> Estimate:
    spec = catalog.load_model(case["model"])
    name = case.get("options", "default") if options == "case" else options
    opts = OPTIONS[name] if isinstance(name, str) else name
    return estimate(
        spec,
        load_cluster(case["cluster"]),
        batch=case.get("batch", 1),
        prompt_len=case.get("prompt_len", 1024),
        gen_len=case.get("gen_len", 128),
        tp=case.get("tp"),
        options=opts,
        **kw,
    )


def _scalar(x) -> float:
    return float(np.ravel(np.asarray(x, dtype=float))[0])


def _roofline_fraction(case) -> float:
    """Achieved speed over the memory/compute roofline of the same step (no communication:
    the roofline of the chip, as [DF] and [KL] use it)."""
    est = _estimate(case)
    roof = _estimate(case, execution_model="roofline").decode
    ideal = _scalar(roof.time_s) - _scalar(roof.cause("communication"))
    return ideal / _scalar(est.tpot_s)


def _speedup(slow: str, fast: str) -> Callable[[dict], float]:
    def metric(case):
        return _scalar(_estimate(case, slow).tpot_s) / _scalar(_estimate(case, fast).tpot_s)

    return metric


METRICS: dict[str, Callable[[dict], float]] = {
    "weight_gib": lambda c: _estimate(c).weight_bytes / GIB,
    "kv_gib": lambda c: _scalar(_estimate(c).kv_cache_bytes) / GIB,
    "model_gib_per_token": lambda c: (
        (_estimate(c).weight_bytes + _scalar(_estimate(c).kv_cache_bytes))
        / _scalar(np.asarray(c.get("batch", 1)))
        / GIB
    ),
    "gflop_per_token": lambda c: _scalar(_estimate(c).flops_per_token) / 1e9,
    "flop_per_byte": lambda c: (
        _scalar(_estimate(c).flops_per_token) / _scalar(_estimate(c).bytes_per_token)
    ),
    "tokens_per_s": lambda c: _scalar(_estimate(c).tokens_per_s_per_request),
    "hbm_bw_utilization": lambda c: _scalar(_estimate(c).hbm_bw_utilization),
    "roofline_fraction": _roofline_fraction,
    "fusion_speedup": _speedup("micro24_unfused_host", "micro24_fused_host"),
    "orchestration_speedup": _speedup("micro24_fused_host", "micro24_fused_hw"),
}

# Speculative decoding and Composition of Experts (rdu_cluster/speculative.py, rdu_cluster/coe.py).
from rdu_cluster.scenarios.coe import VALIDATION_METRICS as _COE_METRICS
from rdu_cluster.scenarios.speculative import VALIDATION_METRICS as _SPEC_METRICS

METRICS.update(_SPEC_METRICS)
METRICS.update(_COE_METRICS)


# ---- judging ----------------------------------------------------------------------------------


def _judge(case: dict[str, Any], sim: float) -> Result:
    kind, pub = case["kind"], case["published"]
    if kind == "value":
        err = (sim - pub) / pub
        passed, tol = abs(err) <= case["rtol"], f"±{case['rtol']:.0%}"
    elif kind == "min":
        err, passed, tol = (sim - pub) / pub, sim >= pub, f">= {pub:g}"
    elif kind == "max":
        err, passed, tol = (pub - sim) / pub, sim <= pub, f"<= {pub:g}"
    else:
        raise ConfigError(f"validation case {case['id']}: unknown kind {kind!r}")
    return _result(case, sim, err, passed, tol)


def _judge_set(case: dict[str, Any], values: dict[str, float]) -> Result:
    pub = case["published"]
    if case["kind"] == "argmax":
        best = max(values, key=values.get)
        return _result(case, best, None, best == pub, "categorical", values)
    lo, hi = min(values.values()), max(values.values())
    err_lo, err_hi = (lo - pub[0]) / pub[0], (hi - pub[1]) / pub[1]
    err = max(err_lo, err_hi, key=abs)
    passed = abs(err_lo) <= case["rtol"] and abs(err_hi) <= case["rtol"]
    return _result(case, [lo, hi], err, passed, f"ends ±{case['rtol']:.0%}", values)


def _result(case, sim, err, passed, tol, detail=None) -> Result:
    return Result(
        id=case["id"],
        claim=case["claim"],
        source=case["source"],
        kind=case["kind"],
        published=case["published"],
        simulated=sim,
        error=None if err is None else float(err),
        passed=bool(passed),
        tolerance=tol,
        detail=detail or {},
    )


def format_value(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in x) + "]"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
