"""The Ray backend: the same dataset as the local one."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from rdu_cluster.sweep import LocalExecutor, RayExecutor, expand, load_spec, run_sweep
from tests.sweep.helpers import write
from tests.sweep.test_simulate import SPEC


@pytest.mark.slow
def test_ray_backend_matches_local(ray_session, tmp_path):
    spec = load_spec(write(tmp_path, SPEC))
    points = expand(spec).points
    run_sweep(spec, points, tmp_path / "local", LocalExecutor(), progress=False)
    backend = RayExecutor(workers=2)
    try:
        s = run_sweep(spec, points, tmp_path / "ray", backend, points_per_task=5, progress=False)
    finally:
        backend.close()
    assert s.backend == "ray" and s.tasks == 8 and len({w for w, *_ in s.timeline}) == 2
    a = pq.read_table(tmp_path / "local").sort_by("point_id")
    b = pq.read_table(tmp_path / "ray").sort_by("point_id")
    assert a.equals(b)  # bit-identical rows, any backend, any task size
    assert ray_session.is_initialized()  # an instance it did not start is left running
    # (Ray Data reads such a folder: tests/sweep/test_readers.py::test_ray_data.)
