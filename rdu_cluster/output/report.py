"""Plain-text tables for the terminal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from chip.cost import CAUSES
from partitioning.cluster import ClusterSpec
from partitioning.estimate import Estimate
from workloads import params
from workloads.dtypes import Precision
from workloads.spec import ModelSpec


def text_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(
        str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
    )
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def weights_text(p: Precision) -> str:
    """The weight dtype, with the routed experts' where it differs (gpt-oss: bf16, experts mxfp4)."""
    if p.expert_weights and p.expert_weights != p.weights:
        return f"{p.weights.value}, experts {p.expert_weights.value}"
    return p.weights.value


def model_summary(spec: ModelSpec) -> str:
    """One line: the model, its parameter count and the dtypes it is costed at, naming the
    checkpoint's quantization_config when that chose the weight dtype."""
    size = f"{params.total_params(spec) / 1e9:,.1f}B params"
    if spec.is_moe:
        size += f", {params.active_params(spec) / 1e9:,.1f}B active"
    weights = spec.quantization or weights_text(spec.precision)
    return (f"model {spec.name} ({spec.family}): {size}; weights {weights}, "
            f"KV cache {spec.precision.kv_cache.value}")


def stacks_text(estimates) -> str:
    """The serving stack of each estimate's cluster, for a first line: "stack sglang", or per
    cluster where they differ ("stack: dgx-h100 sglang, sn40l-16 none")."""
    named = [(e.cluster, e.stack or "none") for e in estimates]
    if len({s for _, s in named}) == 1 and named[0][1] != "none":
        return f"stack {named[0][1]}"
    return "stack: " + ", ".join(f"{c} {s}" for c, s in named)


def overrides_line(overrides: dict) -> str:
    """The --set / --sockets overrides a run was given, so its output says what it changed."""
    return "overrides: " + ", ".join(f"{k}={v}" for k, v in sorted(overrides.items()))


def banded(value: float, low: float | None, high: float | None, fmt: str) -> str:
    """A figure with its interval, `161.0 (148.2-170.1)`; the figure alone without one."""
    text = fmt.format(value)
    return text if low is None or high is None else f"{text} ({fmt.format(low)}-{fmt.format(high)})"


def interval_lines(records: Sequence[Mapping], names: Sequence[str]) -> list[str]:
    """One line per record: what its intervals rest on, or why a figure has none."""
    return [f"intervals, {name}: {r['interval_note']}" for name, r in zip(names, records)
            if r.get("interval_note")]


def memory_rows(estimates: Sequence[Estimate]) -> list[list[str]]:
    """The fullest socket's HBM by region, the runtime's reservation by part (GB)."""
    mems = [e.extra.get("memory") or {} for e in estimates]
    gb = lambda m, k: f"{_f(m[k]) / 1e9:.1f}" if k in m else "-"
    rows = [[f"  {label}", *(gb(m, k) for m in mems)] for k, label in (
        ("weights", "weights"), ("kv_cache", "KV cache"), ("activations", "activations"))]
    rows.append(["  reserved by the runtime", *(
        f"{gb(m, 'reserved')} ({e.extra.get('reserved_by') or '-'})" if "reserved" in m else "-"
        for m, e in zip(mems, estimates))])
    parts = sorted({k for m in mems for k in m if k.startswith("reserved_")})
    rows += [[f"    {k[len('reserved_'):].replace('_', ' ')}", *(gb(m, k) for m in mems)]
             for k in parts]
    return rows


def side_by_side(estimates: Sequence[Estimate], clusters: Sequence[ClusterSpec],
                 records: Sequence[Mapping] | None = None) -> str:
    """One column per cluster: headline figures (with their intervals, from `records`: the
    results.records of each estimate), then decode time per token by cause."""
    first = estimates[0]
    recs = records or [{} for _ in estimates]

    def fig(key: str, scale: float, fmt: str) -> list[str]:
        return [banded(_f(getattr(e, key)) * scale,
                       None if r.get(f"{key}_low") is None else r[f"{key}_low"] * scale,
                       None if r.get(f"{key}_high") is None else r[f"{key}_high"] * scale, fmt)
                for e, r in zip(estimates, recs)]

    title = (
        f"{first.model}  batch {_i(first.batch)}  prompt {_i(first.prompt_len)}  "
        f"gen {_i(first.gen_len)}"
    )
    header = ["", *(f"{c.name} ({c.chip.name})" for c in clusters)]
    rows = [
        ["sockets, plan", *(f"{e.sockets}, {e.plan or e.tp}" for e in estimates)],
        ["execution model", *(c.chip.execution_model for c in clusters)],
        ["calibration", *(c.chip.calibration for c in clusters)],
        ["tokens/s per request", *fig("tokens_per_s_per_request", 1.0, "{:,.1f}")],
        ["tokens/s total", *fig("tokens_per_s_total", 1.0, "{:,.1f}")],
        ["time per output token ms", *fig("tpot_s", 1e3, "{:.3f}")],
        ["time to first token ms", *fig("ttft_s", 1e3, "{:.2f}")],
        ["HBM bandwidth utilization", *(f"{_f(e.hbm_bw_utilization):.1%}" for e in estimates)],
        ["bound", *(str(np.ravel(e.decode.bound())[0]) for e in estimates)],
        ["HBM used per socket GB", *(f"{_f(e.hbm_used_bytes) / 1e9:.1f}" for e in estimates)],
        *memory_rows(estimates),
        ["decode ms per token, by cause:", *("" for _ in estimates)],
    ]
    for cause in CAUSES:
        if any(_f(e.decode.cause(cause)) > 0 for e in estimates):
            rows.append(
                [f"  {cause}", *(_ms_share(e.decode.cause(cause), e.tpot_s) for e in estimates)]
            )
    rows.append(["decode ms per token, by op class:", *("" for _ in estimates)])
    classes = sorted({k for e in estimates for k, v in e.decode.by_class.items() if _f(v) > 0})
    for cls in classes:
        rows.append(
            [f"  {cls}", *(_ms_share(e.decode.by_class.get(cls, 0.0), e.tpot_s) for e in estimates)]
        )
    notes = interval_lines(records or [], [c.name for c in clusters])
    return "\n".join([title, text_table(header, rows), *notes])


def _ms_share(part, total) -> str:
    return f"{_f(part) * 1e3:.3f} ({_f(part) / _f(total):.0%})"


def _f(x) -> float:
    return float(np.ravel(np.asarray(x, dtype=float))[0])


def _i(x) -> int:
    return round(_f(x))
