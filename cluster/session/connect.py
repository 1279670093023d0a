"""Which Ray cluster a process runs on: the one an address names, joined, else a new embedded one of its own.

Joining is only ever explicit: ``farm.address`` / ``--address``, else ``$RAY_ADDRESS`` (what ``ray job submit`` sets
for its driver, KubeRay for its pods, or the user). Ray's own fallbacks for ``ray.init()`` with no address — the
address file the last ``ray start`` on the machine wrote, which outlives a killed cluster — are never used: an
embedded cluster is always a new one (``address="local"``), whatever else runs on the machine, and stops with the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Iterator, TextIO

from cluster.session.dashboard_hint import print_once
from cluster.session.join_check import check_join
from cluster.session.ray_private import embedded_processes

PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
"""The directory holding ``rollout/``, ``envs/``, ``agents/`` and ``cluster/``."""


def connect(address: str | None = None, *, num_cpus: int | None = None, dashboard: bool = False,
            out: TextIO = sys.stderr) -> str:
    """Initialise Ray once per process and say which cluster this is. Inside ``ray job submit`` the job's
    ``RAY_ADDRESS`` and runtime environment (its working dir) are inherited, so nothing needs installing."""
    import ray  # here, not at the top: the assembly, which holds a session, runs without Ray on the local backend

    if ray.is_initialized():
        return "ray: already connected"
    joining = join_address(address)
    if joining is not None:
        address, field = joining
        check_join(address, field)  # one line naming the fix, not Ray's minutes of retries or its traceback
        context = ray.init(address=address, log_to_driver=True)
        where = f"ray: joined the cluster at {address}" + (" ($RAY_ADDRESS)" if field == "RAY_ADDRESS" else "")
    else:
        # Workers import the project from its source tree, installed or not. The embedded cluster's processes
        # inherit this process's environment, so PYTHONPATH goes there while they start: a job runtime_env would
        # do the same, but then the workers Ray starts ahead (one per CPU) fit no actor, and every actor (Serve's
        # controller and proxy among them) waits for a process of its own.
        pythonpath = os.pathsep.join(p for p in (PROJECT_ROOT, os.environ.get("PYTHONPATH", "")) if p)
        with _environ(PYTHONPATH=pythonpath):
            context = ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard, log_to_driver=True)
        where = "ray: started an embedded local cluster (set farm.address, --address or RAY_ADDRESS to join one)"
    resources = ray.cluster_resources()
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    where += f"; {nodes} node(s), {resources.get('CPU', 0):g} CPUs"
    print(where, file=out, flush=True)
    if dashboard or address:  # the dashboard's URL, and how to sign in under Ray's token authentication
        print_once(getattr(context, "dashboard_url", None), out)
    return where


class ClusterSession:
    """The Ray cluster this process works on, and the one record of whether this process started it: ``open``
    joins the cluster ``address`` (else ``$RAY_ADDRESS``) names or starts an embedded one; ``release`` stops
    the cluster only if ``open`` started it. Every entry point reaches Ray through one (``cluster.assembly``)."""

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None, dashboard: bool = False,
                 out: TextIO = sys.stderr):
        self.address, self.num_cpus, self.dashboard, self.out = address, num_cpus, dashboard, out
        self.owned = False
        """This process started the cluster (embedded, local) in ``open``: ``release`` stops it."""
        self.joined = False
        """``open`` connected this process to a cluster it joined: ``release`` disconnects (the cluster stays)."""

    def open(self) -> "ClusterSession":
        """Join or start the cluster (on the main thread: Ray wants it); a process already connected stays so."""
        import ray  # as in connect: the session imports without Ray

        connected = ray.is_initialized()
        fresh = join_address(self.address) is None and not connected
        connect(self.address, num_cpus=self.num_cpus, dashboard=self.dashboard, out=self.out)
        self.owned = self.owned or fresh
        self.joined = self.joined or (not fresh and not connected)
        return self

    def release(self) -> bool:
        """Stop the cluster if this session started it (nothing needs it any more); from one it joined, only
        disconnect, now rather than at exit (what this process started there, its workers, ends with it; an app
        ``serve.keep`` leaves stays). A connection this session found open is left alone. True: a cluster stopped."""
        import ray  # as in connect: the session imports without Ray

        if self.joined:
            self.joined = False
            if ray.is_initialized():
                ray.shutdown()
        if not self.owned:
            return False
        self.owned = False
        stop_embedded()
        return True


def join_address(address: str | None) -> tuple[str, str] | None:
    """``(address, the field that gave it)`` of the cluster to join: ``address`` (``farm.address``), else
    ``$RAY_ADDRESS``; None: start an embedded cluster."""
    if address:
        return address, "farm.address"
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    return None


def stop_embedded() -> None:
    """Stop the local cluster ``connect`` started in this process now rather than at exit (where Ray first sleeps
    half a second for late log lines). The caller owns it (``ClusterSession.release``); call it on a thread once
    nothing needs Ray any more."""
    import ray  # as in connect: the session imports without Ray

    if ray.is_initialized():
        _stop_monitor()
        ray.shutdown()


def _stop_monitor() -> None:
    """The embedded cluster's autoscaler monitor, killed outright: on a SIGTERM it reports its own end to the GCS,
    which ``ray.shutdown`` has already stopped by then, and is killed a second later anyway (a second of every
    run's exit). A single-node cluster started for one run has nothing for it to scale."""
    for info in embedded_processes("monitor"):
        with contextlib.suppress(Exception):
            if info.process.poll() is None:
                info.process.send_signal(signal.SIGKILL)
                info.process.wait(timeout=5)


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` set inside the block, as it was after it."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
