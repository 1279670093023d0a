"""The fixtures of separate machines beside the session's head (their helpers: ``separate_machines.py``).

The machines are the session's (``machines``, stopped after its last user): started once and lent test after test,
each handed over as a fresh machine is (an image store and a container list that are empty, Serve stopped so the run
starts it as a run across machines does, listening for the other machines). A machine a test killed, or whose
daemon it killed, is replaced; a sandbox machine the test did not ask for is stopped, so the run sees exactly the
sandbox nodes it was lent. The head's files are one directory masked on every machine (``head_files``: a directory
of its own per test inside it)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from separate_machines import MODEL, SANDBOX, Machines, drivers, lend, need_machines, start_registry


@pytest.fixture(scope="session")
def head_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("head-only")


@pytest.fixture
def head_files(head_root) -> Path:
    """A directory only the head has (masked on every machine): datasets and run directories go here."""
    path = head_root / uuid.uuid4().hex[:8]
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def machines(ray_cluster, head_root, request, stop_after_last_user) -> Machines:
    need_machines()
    pool = Machines(ray_cluster.get_runtime_context().gcs_address, head_root)

    def stop() -> None:
        pool.stop()
        from ray import serve

        serve.shutdown()  # the runs started it listening beyond loopback (its face then asks for a key): later
        # tests start their own on 127.0.0.1

    stop_after_last_user(request, stop)
    return pool


@pytest.fixture(autouse=True)
def _no_driver_outlives_its_test():
    """A run a failed test left going would go on using the machines the next test is lent."""
    yield
    while drivers:
        driver = drivers.pop()
        if driver.poll() is None:
            driver.kill()
            driver.wait()


@pytest.fixture
def two_machines(machines, head_files, base_image):
    """Two sandbox nodes."""
    return lend(machines, SANDBOX, SANDBOX)


@pytest.fixture
def one_machine(machines, head_files, base_image):
    """One sandbox node (a second joins in the test that needs it)."""
    return lend(machines, SANDBOX)


@pytest.fixture
def model_and_sandbox_machines(machines, head_files, base_image):
    """A model node (no sandboxes) and a sandbox node."""
    return lend(machines, MODEL, SANDBOX)


@pytest.fixture
def registry(machines, tmp_path):
    running = start_registry(tmp_path, machines.network)
    yield running
    running.stop()
