"""Shared fixtures. One Ray instance serves the whole test session: starting Ray costs seconds.
One `validate --json --no-loo` run serves every test that reads the bundled rows' report."""

from __future__ import annotations

import gc
import json
import os

import pytest
from hypothesis import settings

from tests.calibration_cases import sn40l_cases

# Property tests draw the same examples on every run (the project's results are deterministic,
# and so is its test suite: a CI run cannot fail on a draw the last run did not make).
# HYPOTHESIS_PROFILE=explore draws fresh examples, for hunting counterexamples by hand.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance for every Ray test of the session, shut down at the end."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if not ray.is_initialized():
        # address="local": always a fresh instance of our own, never a cluster that happens
        # to run on the machine (RAY_ADDRESS or /tmp/ray/ray_current_cluster).
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            object_store_memory=200 * 1024 * 1024,
        )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def validate_report():
    """`rdu-cluster validate --json --no-loo` over the bundled rows: (exit code, stdout, the
    parsed report). The run costs tens of seconds; every test that reads it shares it."""
    from click.testing import CliRunner

    from rdu_cluster.cli import main

    result = CliRunner().invoke(main, ["validate", "--json", "--no-loo"])
    assert result.exit_code in (0, 1), result.output[-2000:]
    return result.exit_code, result.stdout, json.loads(result.stdout)


@pytest.fixture(scope="session")
def sn40l_calibration(tmp_path_factory):
    """`rdu-cluster calibrate --chip sn40l` on sn40l_cases, progress on stderr, the uncertainty
    model too, its spread from 3 bootstrap refits rather than 8 (the same code, 6 of the 14
    SN40L fits fewer): (the CliRunner result, the profile's path). Seconds of CPU; its readers
    share it."""
    from click.testing import CliRunner

    from rdu_cluster.cli import main

    folder = tmp_path_factory.mktemp("calibration")
    out = folder / "p.toml"
    result = CliRunner().invoke(main, ["calibrate", "--chip", "sn40l", "--cases",
                                       str(sn40l_cases(folder)), "--out", str(out),
                                       "--resamples", "3"])
    assert result.exit_code == 0, result.output + result.stderr
    return result, out


GROUPS = {"ray_session": "ray", "validate_report": "validate", "sn40l_calibration": "calibration"}


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`): the tests that share one expensive session
    resource run on one worker, so the resource is made once: every Ray test on the worker that
    starts Ray, every reader of the shared validate report (or calibration) on the worker that
    runs it. Likewise the readers of a fixture a test module shares among its tests (a run
    several tests read): loadgroup hands out the other tests one at a time, alternately, so
    each worker made nearly every such fixture. loadgroup schedules by an `@group` suffix of
    the node id."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        group = _group(item)
        if group is not None:
            _set_node_id(item, f"{item.nodeid}@{group}")


def _group(item) -> str | None:
    names = getattr(item, "fixturenames", ())
    group = next((g for f, g in GROUPS.items() if f in names), None)
    if group is not None:
        return group
    info = getattr(item, "_fixtureinfo", None)
    for name in names:
        for fixture in (info.name2fixturedefs.get(name, ()) if info else ()):
            # baseid: the node id of the module that defines it (a conftest's is its folder)
            if fixture.scope != "function" and fixture.baseid.endswith(".py"):
                return fixture.baseid
    return None


def _set_node_id(item, nodeid: str) -> None:
    # xdist 3.8's own xdist_group mark sets item._nodeid, which pytest 9.2 no longer reads (it
    # keeps a NodeId in item._id): every group was split over both workers, and each made its
    # resource (the validate run, the calibration, Ray) once per worker.
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(nodeid)
    else:
        item._nodeid = nodeid


def pytest_collection_finish(session):
    """The session's long-lived objects (every module imported and every test item collected:
    ~170,000 objects under xdist, where each worker collects the whole suite) go to the
    permanent generation, as a caller embedding the engine would freeze its own. Else each
    engine run's full collection before its freeze (engine/loop.py) walks them all: ~0.1 s a
    run, some 60 s of CPU over the suite's runs. A run inside a caller's freeze leaves it as it
    is (tests/engine/test_loop.py checks both paths); results do not depend on it."""
    gc.collect()
    gc.freeze()
