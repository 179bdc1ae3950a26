"""A sweep folder read as it is by pyarrow, pandas, polars, DuckDB and Ray Data: the same rows,
the partition columns `cluster` and `model` as strings, one schema version in every file."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from rdu_cluster.sweep import LocalExecutor, dataset, expand, load_spec, run_sweep
from tests.sweep.helpers import write

# Two clusters, one of them named like a number: a reader would type its column as an integer
# were the folder value not kept a string (dataset.partition_value).
SPEC = """
[sweep]
kind = "fake"
seed = 3
[[axes]]
type = "grid"
cluster = ["sn40l-16", "16"]
model = ["m1", "2024-01-01"]
x = [1, 2, 3]
"""
ROWS = 12


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("readers")
    spec = load_spec(write(root, SPEC))
    run_sweep(spec, expand(spec).points, root / "ds", LocalExecutor(), progress=False)
    return root / "ds"


def _expected(folder) -> set[tuple]:
    tbl = dataset.read_dataset(folder)
    return set(zip(tbl.column("point_id").to_pylist(), tbl.column("cluster").to_pylist(),
                   tbl.column("model").to_pylist()))


def test_the_folder_holds_parquet_only_and_one_schema_version(folder):
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files and all(p.suffix == ".parquet" and p.name.startswith("part-") for p in files)
    versions = {pq.read_schema(p).metadata[b"rdu_cluster.dataset_schema_version"] for p in files}
    assert versions == {dataset.DATASET_SCHEMA_VERSION.encode()}
    assert (dataset.meta_dir(folder) / dataset.SWEEP_FILE).is_file()
    folders = {p.parent.relative_to(folder).as_posix() for p in files}
    assert "cluster=_16/model=_2024-01-01" in folders  # typed-looking values kept strings


def test_pyarrow_and_read_dataset(folder):
    tbl = pq.read_table(folder)
    assert tbl.num_rows == ROWS
    assert set(tbl.column("cluster").to_pylist()) == {"sn40l-16", "_16"}
    assert dataset.read_dataset(folder).schema.field("cluster").type == "string"


def test_pandas(folder):
    pd = pytest.importorskip("pandas")
    df = pd.read_parquet(folder)
    assert len(df) == ROWS
    # pandas makes hive partitions categoricals; their values are plain strings
    assert all(isinstance(v, str) for v in df["cluster"]) and all(
        isinstance(v, str) for v in df["model"])
    assert set(zip(df.point_id, df.cluster.astype(str), df.model.astype(str))) == \
        _expected(folder)


def test_polars(folder):
    pl = pytest.importorskip("polars")
    df = pl.read_parquet(folder)
    assert df.height == ROWS
    assert df.schema["cluster"] == pl.String and df.schema["model"] == pl.String
    assert set(df.select("point_id", "cluster", "model").iter_rows()) == _expected(folder)


def test_duckdb(folder):
    duckdb = pytest.importorskip("duckdb")
    rel = duckdb.sql(f"select point_id, cluster, model from read_parquet("
                     f"'{folder}/**/*.parquet', hive_partitioning = true)")
    assert dict(zip(rel.columns, rel.types))["cluster"] == "VARCHAR"
    assert set(rel.fetchall()) == _expected(folder)


@pytest.mark.slow
def test_ray_data(folder, ray_session):
    ds = ray_session.data.read_parquet(str(folder))
    rows = ds.take_all()
    assert len(rows) == ROWS
    assert all(isinstance(r["cluster"], str) and isinstance(r["model"], str) for r in rows)
    assert {(r["point_id"], r["cluster"], r["model"]) for r in rows} == _expected(folder)
