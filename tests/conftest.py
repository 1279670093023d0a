"""Session-wide fixtures: container engines (skip on a laptop without them, fail in CI), the base
image, the check that no labelled container outlives the test session, one Ray cluster, the venvs of software we did
not write (``foreign_venvs.py``), and ``stop_after_last_user``: what several modules share is started once and
stopped after the last test that uses it. With ``ROLLOUT_TEST_TIMES`` set, each test's seconds and outcome are written
there at the end (``.ci/run`` prints the ten slowest)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

BASE_IMAGE = "rollout-farm/base:bookworm"
LABEL = "rollout-farm.run"


def _required(var: str) -> bool:
    return os.environ.get(var, "") not in ("", "0", "false", "no")


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


@pytest.fixture(scope="session", autouse=True)
def ctrl_c_reaches_children():
    """A test that presses Ctrl-C on a child (SIGINT) needs the child to take it. A shell started in the
    background without job control (``.ci/run &``) ignores SIGINT, and an ignored signal stays ignored in every
    process it starts, so the child would never see it: give this process Python's handler back (a handled
    signal is reset to its default on exec, and Python then installs its own in the child)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture(scope="session")
def docker_available() -> bool:
    """True when a docker daemon answers. Without one: skip, or fail if ROLLOUT_REQUIRE_DOCKER=1 (CI)."""
    if _docker_answers():
        return True
    if _required("ROLLOUT_REQUIRE_DOCKER"):
        pytest.fail("ROLLOUT_REQUIRE_DOCKER is set but no docker daemon answers `docker info`")
    pytest.skip("no docker daemon (set ROLLOUT_REQUIRE_DOCKER=1 to make this an error)")


@pytest.fixture(scope="session")
def base_image(docker_available) -> str:
    """The project's base image (built by `rollout images base`, which .ci/run calls)."""
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
        message = f"base image {BASE_IMAGE} is missing: run `rollout images base`"
        if _required("ROLLOUT_REQUIRE_DOCKER"):
            pytest.fail(message)
        pytest.skip(message)
    return BASE_IMAGE


@pytest.fixture(scope="session")
def apptainer_binary() -> str:
    """The apptainer (or singularity) CLI on PATH. Without one: skip, or fail if ROLLOUT_REQUIRE_APPTAINER=1 (CI,
    which installs the real binary with .ci/apptainer/install and puts .ci/apptainer/bin first on PATH)."""
    found = shutil.which("apptainer") or shutil.which("singularity")
    if found is not None:
        return found
    if _required("ROLLOUT_REQUIRE_APPTAINER"):
        pytest.fail("ROLLOUT_REQUIRE_APPTAINER is set but neither apptainer nor singularity is on PATH")
    pytest.skip("no apptainer binary (set ROLLOUT_REQUIRE_APPTAINER=1 to make this an error)")


@pytest.fixture(scope="session")
def podman_available() -> bool:
    if shutil.which("podman") is not None:
        return True
    if _required("ROLLOUT_REQUIRE_PODMAN"):
        pytest.fail("ROLLOUT_REQUIRE_PODMAN is set but podman is not installed")
    pytest.skip("podman is not installed (set ROLLOUT_REQUIRE_PODMAN=1 to make this an error)")


@pytest.fixture(scope="session")
def vllm_available() -> bool:
    """True when vllm (the cpu-llm extra) imports. Without it: skip, or fail if ROLLOUT_REQUIRE_VLLM=1 (CI)."""
    try:
        import torch  # noqa: F401
        import vllm  # noqa: F401
        return True
    except Exception as exc:  # noqa: BLE001 - a broken install (a GPU torchvision beside it) is also "missing"
        if _required("ROLLOUT_REQUIRE_VLLM"):
            pytest.fail(f"ROLLOUT_REQUIRE_VLLM is set but vllm does not import: {type(exc).__name__}: {exc}")
        pytest.skip("vllm is not installed (pip install -e '.[cpu-llm]'; set ROLLOUT_REQUIRE_VLLM=1 to make "
                    "this an error)")


@pytest.fixture(scope="session", autouse=True)
def no_labelled_containers_left():
    """After the session, no container labelled rollout-farm.run that this session (or a process it
    started, now dead) created may remain: they are removed, and the session errors, so a leak is
    seen and never piles up. Containers of other live processes on the machine are left alone."""
    yield
    from envs.runtimes.docker.containers import OWNER_LABEL, owner_alive, owner_labels

    me = owner_labels()[OWNER_LABEL]
    leaks = []
    for engine in ("docker", "podman"):
        if shutil.which(engine) is None:
            continue
        out = subprocess.run([engine, "ps", "-aq", "--filter", f"label={LABEL}"], capture_output=True, text=True)
        ids = out.stdout.split() if out.returncode == 0 else []
        if not ids:
            continue
        shown = subprocess.run([engine, "inspect", "--format", "{{.Id}} {{json .Config.Labels}}", *ids],
                               capture_output=True, text=True)
        mine = []
        for line in shown.stdout.splitlines():
            cid, _, labels = line.partition(" ")
            labels = json.loads(labels or "{}") or {}
            if labels.get(OWNER_LABEL) == me or not owner_alive(labels):
                mine.append(cid)
        if mine:
            subprocess.run([engine, "rm", "-f", *mine], capture_output=True)
            leaks.append(f"{engine}: {len(mine)}")
    if leaks:
        pytest.fail(f"containers labelled {LABEL} left after the tests: {', '.join(leaks)}")


@pytest.fixture(scope="session")
def ray_cluster():
    """One Ray cluster per test session for the tests that run farms in this process (started on first use).
    Tests that need their own cluster (multi-node, job submit, a killed driver) start it in a subprocess with its
    own temp dir and tear it down by process id."""
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    import io

    from cluster.session.connect import connect

    connect(num_cpus=4, out=io.StringIO())  # logical CPUs: a vLLM-on-CPU engine needs 4 (any 2-core machine)
    yield ray
    ray.shutdown()


@pytest.fixture
def serve_as_found(ray_cluster):
    """For a test whose runs join the session's cluster: Serve shut down after it when it started Serve. Such a run
    starts Serve with its proxies on every interface, where the model's face asks for a key; the serving tests after
    it start their own on 127.0.0.1, where it asks none (``test_service_credentials.py`` checks that it does not)."""
    from ray import serve

    from cluster.session.ray_private import serve_running

    was_running = serve_running()
    yield
    if not was_running and serve_running():
        serve.shutdown()


@pytest.fixture(scope="session")
def docker_bridge_ip() -> str:
    """The host's address on docker's default bridge (docker0), where a container on "bridge" can reach the host:
    the bridge's IPAM gateway, or (engines that leave it out of ``network inspect``) the bridge interface's own."""
    import fcntl
    import socket
    import struct

    import docker

    network = docker.from_env().api.inspect_network("bridge")
    for entry in network["IPAM"]["Config"] or []:
        if entry.get("Gateway"):
            return entry["Gateway"]
    name = network["Options"].get("com.docker.network.bridge.name", "docker0")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()))  # SIOCGIFADDR
    return socket.inet_ntoa(packed[20:24])


# ---- started once, stopped after its last user ------------------------------------------------------------------

_LAST_USER_OF = pytest.StashKey[list]()
_stops: dict[str, object] = {}
STOPPED_AFTER_LAST_USER = ("served", "scripted", "machines")
"""Session fixtures that hold the session cluster's CPUs or nodes (the tiny model's engine, the scripted Serve app,
the separate machines): a later test (another engine, a farm spread over the nodes) needs them back."""


def pytest_collection_modifyitems(items):
    for name in STOPPED_AFTER_LAST_USER:
        users = [item for item in items if name in getattr(item, "fixturenames", ())]
        if users:
            users[-1].stash.setdefault(_LAST_USER_OF, []).append(name)


def _stop_after_last_user(request, stop) -> None:
    _stops[request.fixturename] = stop
    request.addfinalizer(lambda: _stop(request.fixturename))


@pytest.fixture(scope="session")
def stop_after_last_user():
    """``stop_after_last_user(request, stop)`` in a session fixture (one of ``STOPPED_AFTER_LAST_USER``) calls
    ``stop()`` once: after the last collected test that uses that fixture, or at the end of the session when that test
    did not run."""
    return _stop_after_last_user


def _stop(name: str) -> None:
    stop = _stops.pop(name, None)
    if stop is not None:
        stop()


@pytest.fixture(autouse=True)
def _stop_what_no_later_test_uses(request):
    yield
    for name in request.node.stash.get(_LAST_USER_OF, []):
        _stop(name)


# ---- each test's seconds, for .ci/run's list of the slowest -------------------------------------------------------

_times: dict[str, dict] = {}


def pytest_runtest_logreport(report):
    """With ``ROLLOUT_TEST_TIMES`` set (``.ci/run`` sets it; an environment variable of ours, not pytest's options,
    which the pytest runs the tests start would inherit): each test's set-up, call and tear-down seconds summed, and
    its outcome."""
    if os.environ.get("ROLLOUT_TEST_TIMES"):
        entry = _times.setdefault(report.nodeid, {"seconds": 0.0, "outcome": "passed"})
        entry["seconds"] += report.duration
        if report.failed:
            entry["outcome"] = "failed"
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("ROLLOUT_TEST_TIMES"):
        with open(os.environ["ROLLOUT_TEST_TIMES"], "w") as out:
            json.dump(_times, out)


# ---- software we did not write, in venvs of its own (foreign_venvs.py): built or probed once a session ----------


@pytest.fixture(scope="session")
def harbor():
    """The python of the Harbor 0.25.0 venv (``harbor_venv.py`` runs its checks)."""
    from foreign_venvs import HARBOR, python_for

    return python_for(HARBOR)


@pytest.fixture(scope="session")
def nemo_gym():
    """``validate(model, body)``, ``validate_many([(model, body), ...])`` and
    ``check_session_contract(app_factory, keeps_state, task_data=None)``, run in the NeMo Gym 0.7.0 venv."""
    from foreign_venvs import NEMO_GYM, python_for
    from gym.nemo_gym_venv import NemoGymVenv

    venv = NemoGymVenv(python_for(NEMO_GYM))
    yield venv
    venv.close()


@pytest.fixture(scope="session")
def swebench5():
    """swebench 5.0.2's harness (``reports(cases)``), in its venv."""
    from foreign_venvs import SWEBENCH5, python_for
    from swebench5_venv import Swebench5

    return Swebench5(python_for(SWEBENCH5))


@pytest.fixture(scope="session")
def mini_swe():
    """The python of the venv of pyproject's mini-swe-agent pin."""
    from foreign_venvs import MINI_SWE, python_for

    assert "==" in MINI_SWE.installs[0][-1], "pyproject.toml pins no mini-swe-agent"
    return python_for(MINI_SWE)


@pytest.fixture(scope="session")
def renderers_python():
    """The python of the renderers 0.1.12 venv."""
    from foreign_venvs import RENDERERS, python_for

    return python_for(RENDERERS)


@pytest.fixture(scope="session")
def skyrl_python():
    """The python of the SkyRL 0.3.0 venv (beside ours: it sees our packages after its own)."""
    from foreign_venvs import SKYRL, python_for

    return python_for(SKYRL)
