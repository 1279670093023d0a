"""A run's Ray cluster is its own. On a machine where someone ran `ray start --head`, `rollout run` with no address
starts a new cluster of its own (also with `farm.num_cpus`, also when a killed cluster left its address file), and
the other cluster keeps running untouched: same nodes, its actor alive, no job of the run on it. Joining is only
explicit, and a join that cannot work (a token the cluster wants, nothing answering) is one line and exit 2.

The other cluster is started once for the module by `ray start --head` in a temp dir of its own that stands in for
the machine's Ray temp dir (the runs get it as RAY_TMPDIR, so its address file is where Ray looks), on free ports,
with token authentication and its token in ~/.ray/auth_token of a HOME that is a temp dir too: a shared account, the
case where Ray alone joins it silently. It is stopped by process id.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "local_demo.yaml"
RAY = Path(sys.executable).parent / "ray"
ROLLOUT = Path(sys.executable).parent / "rollout"
CLI = [str(ROLLOUT)] if ROLLOUT.is_file() else [sys.executable, "-m", "cluster"]  # the console script, or the same
ONE_ROLLOUT = ["dataset.slice=0:1", "run.samples=1"]
PROBE_MARK = "--foreign-cluster-probe"  # on the probe's command line, so its own jobs are told apart from a run's

pytestmark = [pytest.mark.ray, pytest.mark.slow]
pytest.importorskip("ray")

# Connects to the other cluster as its owner would; "plant" first leaves a detached actor there. Prints its state.
PROBE = r'''
import json, sys
import ray
from ray._private import state

ray.init(address=sys.argv[1], namespace="owner", log_to_driver=False, logging_level="ERROR")
if sys.argv[2] == "plant":
    @ray.remote(num_cpus=0)
    class Keeper:
        def pid(self):
            import os
            return os.getpid()
    Keeper.options(name="keeper", lifetime="detached").remote()
print(json.dumps({"keeper_pid": ray.get(ray.get_actor("keeper").pid.remote()),
                  "nodes": sorted(n["NodeID"] for n in ray.nodes() if n["Alive"]),
                  "jobs": [j["Entrypoint"] for j in state.jobs() if sys.argv[3] not in j["Entrypoint"]]}))
'''


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def session_processes(session: int) -> list[int]:
    """Live processes of a session (every process `ray start` spawned inherits it), never this one."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            state, _ppid, _pgrp, sid = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue
        if int(sid) == session and state != "Z" and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def stop_session(session: int) -> list[int]:
    """SIGTERM, then SIGKILL what is left, by pid; the processes still alive after that."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        for pid in session_processes(session):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace
        while time.monotonic() < end and session_processes(session):
            time.sleep(0.2)
    return session_processes(session)


class Foreign:
    """Someone else's cluster on this machine: its address, the environment its owner uses, and its state."""

    def __init__(self, root: Path):
        self.root = root
        self.machine_tmp = root / "machine"  # RAY_TMPDIR: what /tmp is to Ray on a real machine
        self.address_file = self.machine_tmp / "ray" / "ray_current_cluster"
        self.home = root / "home"
        (self.home / ".ray").mkdir(parents=True)
        (self.home / ".ray" / "auth_token").write_text(secrets.token_hex(32))  # where `ray start` looks for it
        self.other_token = root / "other_token"
        self.other_token.write_text(secrets.token_hex(32))
        base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        self.env = {**base, "HOME": str(self.home), "RAY_TMPDIR": str(self.machine_tmp)}  # a newcomer's shell
        self.owner_env = {**self.env, "RAY_AUTH_MODE": "token"}
        self.address = ""
        self.session = 0

    def start(self) -> float:
        gcs, client, agent, agent_grpc, env_agent, metrics = free_ports(6)
        t0 = time.monotonic()
        start = subprocess.Popen(
            [str(RAY), "start", "--head", "--temp-dir", str(self.machine_tmp / "ray"), "--port", str(gcs),
             "--include-dashboard", "false", "--ray-client-server-port", str(client),
             "--dashboard-agent-listen-port", str(agent), "--dashboard-agent-grpc-port", str(agent_grpc),
             "--runtime-env-agent-port", str(env_agent), "--metrics-export-port", str(metrics),
             "--min-worker-port", "0", "--max-worker-port", "0", "--num-cpus", "1", "--disable-usage-stats"],
            env=self.owner_env, cwd=self.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        self.session = start.pid
        output, _ = start.communicate(timeout=180)
        assert start.returncode == 0, output[-3000:]
        self.address = f"127.0.0.1:{gcs}"
        return time.monotonic() - t0

    def state(self, plant: bool = False) -> dict:
        out = subprocess.run([sys.executable, "-c", PROBE, self.address, "plant" if plant else "look", PROBE_MARK],
                             env=self.owner_env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def foreign():
    if not RAY.is_file():
        pytest.skip(f"no ray command next to {sys.executable}")
    # A short path: Ray's unix sockets live under the temp dir and their paths are limited to ~107 characters.
    cluster = Foreign(Path(tempfile.mkdtemp(prefix="rf-fc-", dir="/tmp")))
    try:
        seconds = cluster.start()
        cluster.before = cluster.state(plant=True)
        cluster.address_text = cluster.address_file.read_text()
        print(f"ray start {seconds:.1f}s")
        yield cluster
    finally:
        left = stop_session(cluster.session) if cluster.session else []
        shutil.rmtree(cluster.root, ignore_errors=True)
    assert not left, f"processes of the other cluster still alive: {left}"


def rollout(env: dict, home: Path, *args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    """`rollout run` of one demo rollout; its run id (on its command line, so in a cluster's job table) is
    ``home``'s name."""
    t0 = time.monotonic()
    done = subprocess.run([*CLI, "run", str(DEMO), *ONE_ROLLOUT, f"run_id={home.name}", *args],
                          env={**env, "ROLLOUT_HOME": str(home)}, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    return done, time.monotonic() - t0


def run_home(tmp_path: Path) -> Path:
    return tmp_path / f"pc_{secrets.token_hex(4)}"


def results(home: Path) -> list[dict]:
    """The run's results: ``run_id=`` on the command line names its directory (``rollout`` gives ``home``'s name)."""
    return [json.loads(line) for line in (home / home.name / "results.jsonl").read_text().splitlines()]


def assert_untouched(foreign: Foreign, run_id: str) -> None:
    assert foreign.address_file.read_text() == foreign.address_text
    now = foreign.state()  # its GCS answers its owner
    assert now["nodes"] == foreign.before["nodes"]  # no node joined or left
    assert now["keeper_pid"] == foreign.before["keeper_pid"]  # its actor is the same, alive
    assert [job for job in now["jobs"] if run_id in job] == []  # the run did not run there


@pytest.mark.parametrize("extra", [[], ["farm.num_cpus=1"]], ids=["no-address", "num-cpus"])
def test_a_run_without_an_address_starts_its_own_cluster_and_leaves_the_other_alone(foreign, tmp_path, extra):
    home = run_home(tmp_path)
    done, seconds = rollout(foreign.env, home, *extra)
    print(f"run beside the other cluster: {seconds:.1f}s")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ray: started an embedded local cluster" in done.stderr
    assert "joined" not in done.stderr and "Traceback" not in done.stderr
    [row] = results(home)
    assert row["status"] == "completed" and row["node_id"]
    assert row["node_id"] not in foreign.before["nodes"]  # it ran on the run's own node
    assert_untouched(foreign, home.name)


@pytest.mark.parametrize("case", ["no-auth-mode", "wrong-token"])
def test_joining_without_the_clusters_token_is_one_line_and_exit_2(foreign, tmp_path, case):
    auth, says = {
        # the token is at hand (~/.ray/auth_token), the mode is not set: Ray sends no token to a named address
        "no-auth-mode": ({}, "requires an authentication token: run with RAY_AUTH_MODE=token"),
        "wrong-token": ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(foreign.other_token)},
                        "refused this process's authentication token"),
    }[case]
    home = run_home(tmp_path)
    done, seconds = rollout({**foreign.env, **auth}, home, "--address", foreign.address)
    assert done.returncode == 2, done.stderr[-3000:]
    [line] = done.stderr.splitlines()  # Ray alone: 20 s of warnings, then a traceback and exit 1
    port = foreign.address.rsplit(":", 1)[1]
    assert line.startswith(f"config error: farm.address: the Ray cluster at {_host()}:{port} {says}"), line
    assert seconds < 30
    assert not home.exists()  # nothing written
    assert_untouched(foreign, home.name)


def test_an_explicit_join_with_the_token_runs_there_and_leaves_the_cluster_running(foreign, tmp_path):
    home = run_home(tmp_path)
    done, _ = rollout(foreign.owner_env, home, "--address", foreign.address)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"ray: joined the cluster at {foreign.address}" in done.stderr
    [row] = results(home)
    assert row["node_id"] in foreign.before["nodes"]
    now = foreign.state()
    assert now["keeper_pid"] == foreign.before["keeper_pid"] and now["nodes"] == foreign.before["nodes"]
    assert len([job for job in now["jobs"] if home.name in job]) == 1  # the run ran there, as it was asked to


@pytest.fixture
def machine_tmp():
    """A short RAY_TMPDIR (Ray's socket paths under it must fit), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="rf-st-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_killed_clusters_address_file_is_never_joined(tmp_path, machine_tmp):
    # What `kill -9` of a head started by `ray start` leaves: its address file, naming a GCS nobody answers at.
    (machine_tmp / "ray").mkdir()
    [dead] = free_ports(1)
    address_file = machine_tmp / "ray" / "ray_current_cluster"
    address_file.write_text(f"127.0.0.1:{dead}")
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env = {**base, "HOME": str(tmp_path / "home"), "RAY_TMPDIR": str(machine_tmp)}

    done, seconds = rollout(env, tmp_path / "runs")  # Ray alone: over ten minutes of retries, doing nothing
    print(f"run beside a stale address file: {seconds:.1f}s")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ray: started an embedded local cluster" in done.stderr
    assert results(tmp_path / "runs")[0]["status"] == "completed"

    asked, seconds = rollout(env, tmp_path / "auto", "--address", "auto")  # explicit: one line, at once
    [line] = asked.stderr.splitlines()
    assert asked.returncode == 2 and seconds < 30 and line.startswith("config error: farm.address: ")
    if f":{dead}" in line:
        assert line.startswith(f"config error: farm.address: no Ray cluster answers at {_host()}:{dead}")
        assert str(address_file) in line and "leave the address out" in line
    else:  # Ray's `auto` prefers the one live GCS on the machine to the address file: the foreign cluster here,
        # which wants a token this run does not have (with two or more live, it reads the file, as above)
        assert "found its GCS process on this machine" in line, line

    named, seconds = rollout({**env, "RAY_ADDRESS": f"127.0.0.1:{dead}"}, tmp_path / "env")
    [line] = named.stderr.splitlines()
    assert named.returncode == 2 and seconds < 30
    assert line.startswith("config error: RAY_ADDRESS: no Ray cluster answers at ") and "unset RAY_ADDRESS" in line
    assert address_file.read_text() == f"127.0.0.1:{dead}"  # not ours to remove


def _host() -> str:
    """How Ray writes 127.0.0.1 back: this node's address."""
    from ray._private.services import resolve_ip_for_localhost

    return resolve_ip_for_localhost("127.0.0.1")
