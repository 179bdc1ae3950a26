"""Shared fixtures. One Ray instance serves the whole test session: starting Ray costs seconds."""

from __future__ import annotations

import os

import pytest


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
