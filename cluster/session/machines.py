"""Separate machines on this one (``rollout dev-cluster``, the tests and the bench of the farm across nodes): each
``Machine`` is a Ray node with its own docker daemon (its own data root, exec root, socket and bridge: an empty image
store), its own view of the filesystem (a mount namespace where the head's directories are masked by a tmpfs), its
own network address (a network namespace on a bridge of the caller's, ``cluster.session.netns``: its 127.0.0.1 is
its own, and the head and the driver reach it only at that address) and its own CPUs. Killing one kills every process
in its mount namespace: the raylet, its workers and its daemon, as a machine that dies; cutting its link is a
partition.

Not ``--bridge=none`` for the daemon: a daemon started with it deletes the main daemon's ``docker0``. Each machine's
daemon makes its own ``docker0`` inside the machine's network namespace, gone with it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from cluster.session.netns import NetNamespace, Network


def mount_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def namespace_pids(namespace: str | None) -> list[int]:
    """Every process in mount namespace ``namespace`` (never this process's own: nothing outside is touched)."""
    if namespace is None or namespace == mount_namespace("self"):
        return []
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and mount_namespace(p.name) == namespace]


def pids_naming(path: Path) -> list[int]:
    """Every process whose command line names a file under ``path`` (a machine's daemon and its containerd name
    their config, data and exec roots there)."""
    mark, found = f"{path}/".encode(), []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def kill_until_gone(pids: Callable[[], list[int]], timeout: float = 10.0) -> None:
    """SIGKILL what ``pids()`` lists until it lists nothing (a process may start one more while it dies)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = pids()
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def running(pid: int) -> bool:
    """Whether process ``pid`` still runs: an exited daemon nobody reaps (the machine's ``ray start`` is its parent
    once the shell that started it exec'd) stays a zombie in the process table."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class Machine:
    def __init__(self, name: str, index: int, head: str, root: Path, *, network: Network, masked: list[str],
                 num_cpus: int = 0, resources: dict[str, float] | None = None, insecure_registries: list[str] = ()):
        self.name, self.head, self.root = name, head, root
        self.masked, self.num_cpus = list(masked), num_cpus
        self.resources = {name: 1.0, **(resources or {})}
        self.netns = NetNamespace(f"rollout-farm-{name}", network, index)
        self.insecure_registries = list(insecure_registries)
        """Registries the daemon may reach over plain HTTP (docker allows only 127.0.0.0/8 unless told)."""
        self.socket = root / "docker.sock"
        self.cgroup = f"rollout-farm-{name}"
        """The daemon's cgroup parent: its containers' processes are in no mount namespace of the machine's."""
        self.process: subprocess.Popen | None = None
        self.namespace: str | None = None

    @property
    def address(self) -> str:
        """The machine's own network address: where the head, the driver and the other machines reach it."""
        return self.netns.address

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def docker(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", *args], env={**os.environ, "DOCKER_HOST": self.docker_host},
                              capture_output=True, text=True, timeout=timeout)

    def script(self) -> str:
        masks = "\n".join(f"mkdir -p {shlex.quote(p)} && mount -t tmpfs tmpfs {shlex.quote(p)}" for p in self.masked)
        resources = shlex.quote(json.dumps(self.resources))
        ray = shlex.quote(str(Path(sys.executable).with_name("ray")))  # beside this interpreter: the venv's
        return f"""set -e
{masks}
{self.dockerd_command()} > {self.root}/dockerd.log 2>&1 &
for _ in $(seq 1 60); do docker info > /dev/null 2>&1 && break; sleep 0.5; done
exec {ray} start --address={self.head} --node-ip-address={self.address} --num-cpus={self.num_cpus} \\
    --resources={resources} --block > {self.root}/ray.log 2>&1
"""

    def dockerd_command(self) -> str:
        """The machine's docker daemon (its own docker0 inside the machine's network namespace), with a
        configuration file of its own: never this host's ``/etc/docker/daemon.json``."""
        data, run, config = self.root / "data", self.root / "exec", self.root / "daemon.json"
        config.write_text(json.dumps({"insecure-registries": self.insecure_registries}))
        return (f"dockerd --config-file {config} --data-root {data} --exec-root {run} --pidfile {self.root}/docker.pid"
                f" -H {self.docker_host} --iptables=false --ip-masq=false --cgroup-parent=/{self.cgroup}")

    def restart_daemon(self, down: float = 0.0, timeout: float = 120) -> float:
        """The machine's docker daemon restarted as an operator restarts it: SIGTERM (it stops its containers
        first), gone with its containerd, ``down`` seconds without one, then the same daemon started again inside the
        machine (its mount and network namespaces); its raylet and workers go on throughout. The seconds it did not
        answer.

        The new daemon starts only once every process of the old one is gone: a daemon that finds its containerd's
        pid file naming a containerd still shutting down connects to it and hangs."""
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"machine {self.name} is not running")
        pid = self.daemon_pid()
        os.kill(pid, signal.SIGTERM)
        stopped = time.monotonic()
        deadline = stopped + timeout
        while (running(pid) or self.socket.exists() or self.daemon_pids()) and time.monotonic() < deadline:
            time.sleep(0.2)  # the old daemon gone, socket, containerd and shims too, before the new one starts
        if running(pid) or self.daemon_pids():
            raise TimeoutError(f"machine {self.name}'s daemon did not stop within {timeout:g}s "
                               f"(left: {self.daemon_pids()}): {self.logs()}")
        time.sleep(down)
        enter = ["nsenter", "-t", str(self.process.pid), "-m", "-n"]
        subprocess.Popen([*enter, "bash", "-c", f"exec {self.dockerd_command()} >> {self.root}/dockerd.log 2>&1"],
                         stdin=subprocess.DEVNULL, start_new_session=True)
        while not self.answers():
            if time.monotonic() > deadline + down:
                raise TimeoutError(f"machine {self.name}'s daemon did not answer again: {self.logs()}")
            time.sleep(0.2)
        return time.monotonic() - stopped

    def hang_daemon(self) -> None:
        """The machine's docker daemon stopped (SIGSTOP) and left in place: a wedged daemon, whose socket still takes
        connections and never answers. ``resume_daemon`` lets it go on."""
        os.kill(self.daemon_pid(), signal.SIGSTOP)

    def resume_daemon(self) -> None:
        os.kill(self.daemon_pid(), signal.SIGCONT)

    def daemon_pid(self) -> int:
        """The machine's docker daemon's pid, from its pid file."""
        return int((self.root / "docker.pid").read_text())

    def daemon_pids(self) -> list[int]:
        """The machine's docker daemon, its containerd and their shims, running (their command lines name their
        roots under the machine's)."""
        return [pid for pid in pids_naming(self.root) if running(pid)]

    def answers(self, timeout: float = 15) -> bool:
        """Whether the machine's daemon answers ``docker info`` within ``timeout`` seconds (a daemon that hangs
        does not)."""
        try:
            return self.docker("info", timeout=timeout).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def start(self, timeout: float = 90) -> "Machine":
        self.root.mkdir(parents=True, exist_ok=True)
        self.netns.create()
        project = str(Path(__file__).resolve().parents[2])  # the node's workers import the project from its tree
        pythonpath = os.pathsep.join(p for p in (project, os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "DOCKER_HOST": self.docker_host, "RAY_AUTH_MODE": "token", "PYTHONPATH": pythonpath}
        env.pop("RAY_ADDRESS", None)
        self.process = subprocess.Popen([*self.netns.enter(), "unshare", "-m", "--propagation", "private", "bash",
                                         "-c", self.script()], env=env, start_new_session=True)
        deadline, ours = time.monotonic() + timeout, mount_namespace("self")
        while time.monotonic() < deadline:
            if self.namespace is None and mount_namespace(self.process.pid) not in (None, ours):
                self.namespace = mount_namespace(self.process.pid)  # only once unshare has made its own
            if self.process.poll() is not None:
                raise RuntimeError(f"machine {self.name} did not start: {self.logs()}")
            if self.namespace is not None and self.joined():
                return self
            time.sleep(0.5)
        raise TimeoutError(f"machine {self.name} did not join within {timeout:g}s: {self.logs()}")

    def joined(self) -> bool:
        import ray  # the ray extra

        return any(n.get("Alive") and n.get("Resources", {}).get(self.name) for n in ray.nodes())

    def state(self) -> dict:
        """What ``from_state`` needs to find this machine again from another process (to stop it)."""
        return {"name": self.name, "index": self.netns.index, "root": str(self.root), "namespace": self.namespace,
                "head": self.head, "cgroup": self.cgroup, "network": self.netns.network.state(),
                "address": self.address}

    @classmethod
    def from_state(cls, state: dict) -> "Machine":
        machine = cls(state["name"], state["index"], state["head"], Path(state["root"]), masked=[],
                      network=Network.from_state(state["network"]))
        machine.namespace, machine.cgroup = state["namespace"], state["cgroup"]
        return machine

    def node_id(self) -> str | None:
        import ray  # the ray extra

        return next((n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(self.name)),
                    None)

    def gone(self, timeout: float = 90) -> bool:
        """Wait until Ray has marked this machine's node dead (its health checks failed); whether it did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.joined():
                return True
            time.sleep(1)
        return False

    def logs(self) -> str:
        return " | ".join(p.read_text()[-600:] for p in (self.root / "dockerd.log", self.root / "ray.log")
                          if p.exists())

    def pids(self) -> list[int]:
        """Every process in this machine's mount namespace (never this process's own: nothing outside the machine
        is ever killed)."""
        return namespace_pids(self.namespace)

    def container_pids(self) -> list[int]:
        """The processes of the daemon's containers (every controller's view of its cgroup parent)."""
        found: set[int] = set()
        for procs in Path("/sys/fs/cgroup").glob(f"*/{self.cgroup}/**/cgroup.procs"):
            try:
                found.update(int(line) for line in procs.read_text().split())
            except OSError:
                pass
        return sorted(found)

    def kill(self) -> None:
        """The machine dies: every process in its namespace is killed at once (its raylet, workers, daemon), and the
        processes of its containers with them. Then its namespace is forgotten: once its last process is gone the
        kernel may give the number to another machine's, which a second ``kill`` by that number would kill."""
        if self.process is not None and self.process.poll() is not None:
            self.namespace = None  # dead already: the number may be another machine's by now
        # by its files too: a machine whose raylet exited on its own (declared dead after a partition) has a daemon
        # left in a namespace no longer known by number
        kill_until_gone(lambda: self.pids() + self.container_pids() + pids_naming(self.root))
        if self.process is not None:
            self.process.wait(timeout=30)
        self.namespace = None

    def stop(self) -> None:
        """Kill the machine, wait until Ray has let go of its node (so later work on the cluster never waits on a
        dead node), and delete its network namespace and files."""
        self.kill()
        self.gone()
        self.netns.delete()
        for group in sorted(Path("/sys/fs/cgroup").glob(f"*/{self.cgroup}/**/"), key=lambda p: -len(p.parts)):
            try:
                group.rmdir()
            except OSError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """Debian's ``docker-registry`` (distribution 2.8) on ``host`` (the machines' network's gateway, where every
    machine reaches it; a registry on 127.0.0.1 would be each machine's own), its storage in a directory of its own;
    ``users``: ``{name: password}`` for basic auth (an htpasswd file of bcrypt hashes)."""

    def __init__(self, root: Path, host: str, users: dict[str, str] | None = None):
        self.root, self.port = root, free_port()
        self.address = f"{host}:{self.port}"
        auth = ""
        if users:
            import bcrypt  # the dev extra: the tests' registry with basic auth

            (root / "htpasswd").write_text("".join(
                f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n"
                for user, password in users.items()))
            auth = f"auth:\n  htpasswd:\n    realm: rollout-farm\n    path: {root / 'htpasswd'}\n"
        (root / "config.yml").write_text(
            f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.address}\n{auth}")
        self.process: subprocess.Popen | None = None

    def start(self) -> "Registry":
        log = open(self.root / "registry.log", "w")
        self.process = subprocess.Popen(["docker-registry", "serve", str(self.root / "config.yml")], stdout=log,
                                        stderr=subprocess.STDOUT)
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://{self.address}/v2/", timeout=2)
                return self
            except urllib.error.HTTPError:
                return self  # 401: up, and asking for credentials
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"the registry did not answer: {(self.root / 'registry.log').read_text()[-1000:]}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
