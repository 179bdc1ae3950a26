"""Parameter sweeps: a TOML spec of a base scenario and axes -> points -> tasks (in-process or
on Ray) -> a partitioned Parquet dataset that resumes where an interrupted run stopped.

    spec = load_spec("examples/sweeps/decode-small.toml")
    points = expand(spec).points
    summary = run_sweep(spec, points, "out/", LocalExecutor())
"""

from rdu_cluster.sweep.dataset import count_rows, read_dataset, read_manifest
from rdu_cluster.sweep.execute import LocalExecutor, RayExecutor, Summary, run_sweep
from rdu_cluster.sweep.registry import Point, Runner, RunOutput, kinds, register
from rdu_cluster.sweep.spec import DEFAULT_MAX_POINTS, Spec, expand, load_spec, parse_spec

__all__ = [
    "DEFAULT_MAX_POINTS",
    "LocalExecutor",
    "Point",
    "RayExecutor",
    "RunOutput",
    "Runner",
    "Spec",
    "Summary",
    "count_rows",
    "expand",
    "kinds",
    "load_spec",
    "parse_spec",
    "read_dataset",
    "read_manifest",
    "register",
    "run_sweep",
]
