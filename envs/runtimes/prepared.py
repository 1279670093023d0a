"""PreparedRepoRuntime: any Runtime whose start() also checks a repository out at a base commit, with no later
history."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from envs.runtimes.host_files import HostWorkspace
from envs.runtimes.output import decode
from envs.runtimes.past_repo import NO_COMMIT, fresh_repo_script, past_pack
from rollout.data.carried import local_path, parse_ref
from rollout.errors import ContainerStartError
from rollout.protocols import ExecResult, HasConfig, HasWorkdir, Runtime

GIT_USER = ("rollout-farm agent", "agent@rollout-farm.invalid")
"""The identity commits get in a prepared repository, unless the runtime's git config names one."""


class PreparedRepoRuntime:
    """Wraps ``inner``: ``start()`` starts it, then makes ``repo_dir`` (relative to the runtime's workdir, or
    absolute) a new repository holding only ``base_commit``'s past, checked out on the source's branch name:
    ``repo_path`` (a git repository or bundle on this host) yields a past-only pack on the host once
    (``envs.runtimes.past_repo``), copied into the new repository, so no object, ref, tag, note, stash or reflog
    past the base ever enters the runtime, and no file is shared with the source (no hard links).

    Every other Runtime method is the inner runtime's, and so are what it declares beside them: ``workdir``
    (``HasWorkdir``) and ``config`` (``HasConfig``: its image, its output cap), None where it declares none.
    ``copy_in``: send the pack into the runtime (containers) rather than copy it from its host path; none: use the
    host path only when the runtime's workdir is a host directory (a local workspace, ``HostWorkspace``).
    A missing ``repo_path`` or ``base_commit`` is a non-retryable ``ContainerStartError``."""

    def __init__(self, inner: Runtime, repo_path: str, base_commit: str, repo_dir: str = "testbed", *,
                 copy_in: bool | None = None, timeout: float = 600.0):
        self.inner = inner
        self.repo_path = str(repo_path)
        self.base_commit = str(base_commit)
        self.repo_dir = repo_dir
        self.copy_in = copy_in
        self.timeout = timeout
        self.prepared = False

    @property
    def workdir(self) -> str | None:
        """The inner runtime's (``HasWorkdir``), or None."""
        return self.inner.workdir if isinstance(self.inner, HasWorkdir) else None

    @property
    def config(self) -> Any:
        """The inner runtime's section (``HasConfig``), or None."""
        return self.inner.config if isinstance(self.inner, HasConfig) else None

    async def start(self) -> None:
        await self.inner.start()
        if self.prepared:
            return
        if parse_ref(self.repo_path) is not None:  # a file carried from the machine that loaded the dataset
            self.repo_path = await asyncio.to_thread(local_path, self.repo_path)
        if not os.path.exists(self.repo_path):
            raise ContainerStartError(f"repo_path {self.repo_path} does not exist", retryable=False)
        if not self.base_commit:
            raise ContainerStartError(f"no base_commit to check {self.repo_path} out at", retryable=False)
        past = await asyncio.to_thread(past_pack, self.repo_path, self.base_commit)  # MissingCommit: not retried
        pack, idx, move = past.pack, past.idx, False
        if self._copies_in():
            scratch = f"/tmp/rollout-past-{secrets.token_hex(6)}"
            pack, idx, move = f"{scratch}.pack", f"{scratch}.idx", True
            for host, there in ((past.pack, pack), (past.idx, idx)):
                await self.inner.write_file(there, await asyncio.to_thread(Path(host).read_bytes))
        script = fresh_repo_script(pack, idx, self.repo_dir, past, identity=GIT_USER, move=move)
        done = await self.inner.exec(script, timeout=self.timeout)
        if done.returncode == NO_COMMIT:
            raise ContainerStartError(f"base_commit {self.base_commit} is not in {self.repo_path}", retryable=False)
        if done.returncode != 0 or done.timed_out:
            why = f"took more than {self.timeout:g}s" if done.timed_out else f"exit {done.returncode}"
            raise ContainerStartError(f"preparing {self.repo_path} in {self.repo_dir} failed ({why}): "
                                      f"{done.output[-1500:]}")
        self.prepared = True

    async def exec(self, command: str, timeout: float | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, stdin: bytes | None = None) -> ExecResult:
        return await self.inner.exec(command, timeout=timeout, cwd=cwd, env=env, stdin=stdin)

    async def write_file(self, path: str, data: bytes) -> None:
        await self.inner.write_file(path, data)

    async def read_file(self, path: str) -> bytes:
        return await self.inner.read_file(path)

    async def close(self) -> None:
        await self.inner.close()

    def _copies_in(self) -> bool:
        if self.copy_in is not None:
            return self.copy_in
        # A local workspace is a host directory: the host path is visible there, and cloning it is cheapest.
        workspace = self.inner.workspace if isinstance(self.inner, HostWorkspace) else None
        return not (isinstance(workspace, str) and self.workdir == workspace and os.path.isdir(workspace))


def bundle_bytes(repo_path: str) -> bytes:
    """A bundle file as is; a repository directory bundled (every ref) into a temporary file first."""
    if os.path.isfile(repo_path):
        with open(repo_path, "rb") as f:
            return f.read()
    with tempfile.TemporaryDirectory(prefix="rollout-bundle-") as tmp:
        out = os.path.join(tmp, "repo.bundle")
        done = subprocess.run(["git", "-c", "safe.directory=*", "bundle", "create", "-q", out, "--all"],
                              check=False, cwd=repo_path, capture_output=True, timeout=600)
        if done.returncode != 0:
            raise ContainerStartError(f"cannot bundle {repo_path}: {decode(done.stderr)[-1000:]}", retryable=False)
        with open(out, "rb") as f:
            return f.read()
