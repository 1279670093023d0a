"""A standing local Ray cluster in a process of its own, for runs that join it (``rollout run ... --address``):

    with StandingCluster(num_cpus=2) as cluster:
        subprocess.run([... "rollout", "run", ..., "--address", cluster.address], env=cluster.env)

The process starts an embedded cluster (``ray.init(address="local")``: its own temp session, never one found on the
machine), prints its GCS address and holds it until its stdin closes; then ``ray.shutdown()`` stops what it
started, the workers runs kept on it among them. Only that cluster is stopped (by its process, never ``ray stop``).
``env``: this environment without ``RAY_ADDRESS``, with ``RAY_AUTH_MODE=token`` (the CLI's joins need it under Ray's
token authentication); ``api_key``: a ``serve.api_key`` for the runs on it.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys

HOLD = r'''
import sys
import ray

ray.init(address="local", num_cpus=int(sys.argv[1]), include_dashboard=False, log_to_driver=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the owner closes it
ray.shutdown()
'''


class StandingCluster:
    def __init__(self, num_cpus: int = 2):
        self.num_cpus = num_cpus
        self.address = ""
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
        self.env["RAY_AUTH_MODE"] = "token"
        self.api_key = secrets.token_urlsafe(16)
        """A ``serve.api_key`` for the runs on it: a later run reuses a kept model application only when its key is
        configured (a generated one is its process's own)."""
        self._proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> "StandingCluster":
        self._proc = subprocess.Popen([sys.executable, "-c", HOLD, str(self.num_cpus)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=self.env,
                                      start_new_session=True)
        line = self._proc.stdout.readline().strip()
        if not line:
            self.stop()
            raise RuntimeError("the standing Ray cluster did not start")
        self.address = line
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the Ray processes it started, nothing else
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)

    def __enter__(self) -> "StandingCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
