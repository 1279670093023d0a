"""One Ray cluster per test session for the farm tests that run in this process (started on first use).
Tests that need their own cluster (multi-node, job submit, a killed driver) start it in a subprocess with
its own temp dir and tear it down by process id."""

from __future__ import annotations

import io

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    from cluster.workers.ray_session import connect

    connect(num_cpus=4, out=io.StringIO())  # logical CPUs: a vLLM-on-CPU engine needs 4 (any 2-core machine)
    yield ray
    ray.shutdown()
