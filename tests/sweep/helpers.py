"""A fake sweep runner (kind "fake") for the spec, dataset and resume tests: no estimate needed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pyarrow as pa

from rdu_cluster.sweep.fields import FieldDef, Namespace, boolean, positive_int, scalar, text
from rdu_cluster.sweep.registry import Runner, RunOutput, register

CALLS: list[int] = []  # chunk sizes run, in order
FAIL_AFTER: list[int] = []  # raise KeyboardInterrupt once this many chunks ran (if set)


def _run(points, seed):
    if FAIL_AFTER and len(CALLS) >= FAIL_AFTER[0]:
        raise KeyboardInterrupt
    CALLS.append(len(points))
    ok = [p for p in points if p.fields["x"] != 13]  # x = 13 is "infeasible"
    tbl = pa.table(
        {
            "point_id": [p.id for p in ok],
            "cluster": [p.fields["cluster"] for p in ok],
            "model": [p.fields.get("model", "m") for p in ok],
            "value": [float(p.fields["x"] * p.fields.get("y", 1) + seed) for p in ok],
        }
    )
    bad = {p.id: "x = 13 does not fit" for p in points if p.fields["x"] == 13}
    return RunOutput(tbl, bad)


FAKE = register(
    Runner(
        kind="fake",
        fields={
            "cluster": FieldDef("cluster", text, pa.string(), default="c1", column="cluster_ref"),
            "model": FieldDef("model", text, pa.string(), column="model_ref"),
            "x": FieldDef("x", positive_int, pa.int64(), default=1, column="x"),
            "y": FieldDef("y", positive_int, pa.int64(), column="y"),
        },
        namespaces=(
            Namespace("options.", boolean, frozenset({"turbo"})),
            Namespace("chip.", scalar),
        ),
        run=_run,
        check=lambda points, origin: None,
        vector_fields=("x",),
        points_per_task=100,
    )
)


def write(tmp_path: Path, body: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path
