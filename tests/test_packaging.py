"""The configs and the model catalog are found from an installed (non-editable) package."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    return next(out.glob("rdu_cluster-*.whl"))


@pytest.mark.slow
def test_wheel_holds_configs_and_catalog(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "cluster_configs/chips/sn40l.toml" in names
    assert "cluster_configs/clusters/sn40l-16.toml" in names
    assert any(n.startswith("workloads/catalog/") and n.endswith(".json") for n in names)
    assert not any(n.startswith("tests/") for n in names)


@pytest.mark.slow
def test_installed_package_finds_its_data(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    code = (
        "import cluster_configs, workloads.catalog as c, rdu_cluster.config as k;"
        "assert cluster_configs.__file__.startswith(%r), cluster_configs.__file__;"
        "print(k.load_cluster('sn40l-16').sockets, len(c.list_models()))"
    ).replace("%r", repr(str(target)))
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    sockets, n_models = r.stdout.split()
    assert sockets == "16" and int(n_models) >= 16
