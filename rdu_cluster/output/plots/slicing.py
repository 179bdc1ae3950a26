"""Which rows of a sweep dataset a figure draws, and in which traces: its axes (the input
columns that vary; hardware axes made variants of their cluster, `with_variants`), the slice
that fixes the axes a figure does not show (`slice_mask`, `settings_slice`) and the groups of
rows drawn as one trace each (`groups`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rdu_cluster.output.plots.common import Cols, fmt, unique

# Columns that are results or bookkeeping, never a sweep axis to slice on.
_NOT_AXES = {
    "point_id", "chip", "execution_model", "bound", "sockets", "replicas", "cluster_ref",
    "model_ref", "chip_peak_flops_per_s", "chip_hbm_bandwidth_bytes_per_s", "seed", "tp", "ep",
    "pp", "dp", "plan", "mixer_tp", "requests", "plans_evaluated", "plans_feasible",
    "variant", "variant_axes", "cluster_base", "calibration",
}
# Sweep axes that change the hardware (a --set path of the chip or the topology): each
# combination is a variant of its cluster, drawn as a system of its own (`with_variants`).
HARDWARE_PREFIXES = ("chip_", "topology_")
# Axes an operator chooses (batch limits, plan, load): a Pareto front runs over them; every
# other varying axis (prompt and output lengths, dtypes, ...) is a setting with its own front.
KNOBS = {"batch", "tp", "plan", "rate_requests_per_s", "max_batch", "token_budget",
         "chunked_prefill", "preemption", "scheduler", "kv_fraction", "objective", "spill"}
MAX_GROUPS = 20  # traces per panel (one colour each) before a plot slices the settings


def with_variants(cols: Cols) -> Cols:
    """A sweep whose axes vary the hardware: every plot draws each variant as a system of its
    own. The cluster column becomes "CLUSTER [variant]" (a colour, a bar, a trace each), the
    original is kept as `cluster_base`, the variant's label as `variant`, and the hardware
    axes stop being axes to slice on. A dataset without such axes is returned as it is."""
    hw = [n for n in axis_columns(cols) if n.startswith(HARDWARE_PREFIXES)]
    if not hw:
        return cols
    label = np.array([", ".join(f"{_short(n)}={fmt(v)}" for n, v in zip(hw, row))
                      for row in zip(*(cols[n] for n in hw))], dtype=object)
    base = np.asarray(cols["cluster"], dtype=object)
    return {**cols, "cluster_base": base, "variant": label, "variant_axes": np.array(hw),
            "cluster": np.array([f"{c} [{v}]" for c, v in zip(base, label)], dtype=object)}


def _short(column: str) -> str:
    """chip_tiers_hbm_bandwidth_bytes_per_s -> hbm_bandwidth_bytes_per_s"""
    for prefix in ("chip_tiers_", "chip_execution_", "chip_peak_flops_", "topology_", "chip_"):
        if column.startswith(prefix):
            return column[len(prefix):]
    return column


# --- slicing and grouping ------------------------------------------------------------------
def axis_columns(cols: Cols) -> list[str]:
    """Scenario axes: the input columns that take more than one value in the dataset."""
    from rdu_cluster.output.results import schema
    from rdu_cluster.sweep.runners import SERVE_SCHEMA

    inputs = {"batch", "prompt_len", "gen_len", "cluster", "model", "max_batch",
              "token_budget", "chunked_prefill", "scheduler"}
    outputs = ({f.name for f in schema()} | {f.name for f in SERVE_SCHEMA}) - inputs
    variant = set(np.ravel(cols.get("variant_axes", [])).tolist())  # with_variants
    names = [n for n in cols if n not in outputs and n not in _NOT_AXES and "." not in n
             and n not in variant]
    return [n for n in names if len(unique(cols[n])) > 1]


def slice_mask(cols: Cols, keep: Sequence[str]) -> tuple[np.ndarray, str]:
    """Rows where every varying axis not in `keep` is at its most common value, chosen within
    each (cluster, model) group (so an axis zipped with the cluster, like tp, keeps them all)."""
    n = len(cols["cluster"])
    mask = np.zeros(n, dtype=bool)
    fixed: dict[str, set[str]] = {}
    names = [a for a in axis_columns(cols) if a not in keep and a not in ("cluster", "model")]
    for cluster in unique(cols["cluster"]):
        for model in unique(cols["model"]):
            group = (cols["cluster"] == cluster) & (cols["model"] == model)
            for name in names:
                values, counts = unique(cols[name][group], counts=True)
                if len(values):
                    value = _mode(values, counts)
                    group &= _equal(cols[name], value)
                    fixed.setdefault(name, set()).add(fmt(value))
            mask |= group
    text = "; ".join(f"{k}={'/'.join(sorted(v))}" for k, v in fixed.items())
    return mask, text or "all points"


def groups(cols: Cols, mask: np.ndarray, by: Sequence[str]) -> list[tuple[str, np.ndarray]]:
    """(label, rows) per combination of the cluster and the `by` columns within `mask`: the
    label names the cluster and each `by` value, e.g. "sn40l-8, max_batch=4"."""
    keys = [cols["cluster"]] + [cols[b] for b in by]
    raw = {tuple(k[i] for k in keys) for i in np.flatnonzero(mask)}
    out = []
    for combo in sorted(raw, key=lambda c: tuple(order_key(v) for v in c)):  # 4 < 16 < 160
        m = mask.copy()
        for k, v in zip(keys, combo):
            m &= _equal(k, v)
        label = ", ".join([fmt(combo[0]), *(f"{b}={fmt(v)}" for b, v in zip(by, combo[1:]))])
        out.append((label, m))
    return out


def order_key(value) -> tuple:
    """Numbers by value, before anything else by text."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def settings_slice(cols: Cols, x_axes: Sequence[str]) -> tuple[np.ndarray, list[str], str]:
    """Rows and the varying axes to draw one trace per value of: every varying axis not on the
    x axis (`x_axes`); if that makes more than MAX_GROUPS traces a panel, the settings (not
    knobs) are fixed at their most common value instead, named in the returned text."""
    varying = [a for a in axis_columns(cols) if a not in ("cluster", "model", *x_axes)]
    mask = np.ones(len(cols["cluster"]), dtype=bool)
    if len(groups(cols, mask, varying)) <= MAX_GROUPS * max(1, len(unique(cols["model"]))):
        return mask, varying, ""
    mask, fixed = slice_mask(cols, [*x_axes, *(a for a in varying if a in KNOBS)])
    return mask, [a for a in varying if a in KNOBS], f" Slice: {fixed}."


# --- small helpers -------------------------------------------------------------------------
def _mode(values: np.ndarray, counts: np.ndarray):
    """The most common value; on a tie, True for a toggle (the optimizations' default is on),
    else the smallest."""
    tied = [v for v, c in zip(values, counts) if c == counts.max()]
    if all(isinstance(v, bool) for v in tied) and True in tied:
        return True
    return tied[0]


def _equal(column: np.ndarray, value) -> np.ndarray:
    return np.array([v == value for v in column.tolist()], dtype=bool)
