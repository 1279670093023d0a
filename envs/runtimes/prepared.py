"""PreparedRepoRuntime: any Runtime whose start() also checks a repository out at a base commit, with no later
history."""

from __future__ import annotations

import asyncio
import os
import secrets
import shlex
import subprocess
import tempfile
from typing import Any

from envs.runtimes.output import decode
from rollout.data.carried import local_path, parse_ref
from rollout.errors import ContainerStartError
from rollout.protocols import ExecResult, Runtime

GIT_USER = ("rollout-farm agent", "agent@rollout-farm.invalid")
"""The identity commits get in a prepared repository, unless the runtime's git config names one."""
_NO_COMMIT = 3  # the prepare script's exit code when base_commit is not in the repository


class PreparedRepoRuntime:
    """Wraps ``inner``: ``start()`` starts it, then clones ``repo_path`` (a git repository or bundle on this
    host) into ``repo_dir`` (relative to the runtime's workdir, or absolute) and checks out ``base_commit``
    on the source's branch name; the clone copies every object file (no hard links), so nothing done in the
    workspace reaches the source. Branches and tags that ``base_commit`` cannot reach are dropped and their
    objects pruned, so ``git log --all`` shows no fix from the future; ``origin`` is removed.

    Every other Runtime method, ``workdir`` and any other attribute (``config``, ``workspace``...) are the
    inner runtime's. ``copy_in``: send the repository into the runtime as a bundle (containers) rather than
    clone it from its host path; none: clone from the host path only when the runtime's workdir is a host
    directory (a local workspace). A missing ``repo_path`` or ``base_commit`` is a non-retryable
    ``ContainerStartError``."""

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
    def workdir(self) -> Any:
        return getattr(self.inner, "workdir", None)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "inner":  # no recursion while half-built (copy, pickle)
            raise AttributeError(name)
        return getattr(self.inner, name)

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
        source, scratch = self.repo_path, None
        if self._copies_in():
            scratch = f"/tmp/rollout-src-{secrets.token_hex(6)}.bundle"
            await self.inner.write_file(scratch, await asyncio.to_thread(bundle_bytes, self.repo_path))
            source = scratch
        done = await self.inner.exec(_prepare_script(source, self.repo_dir, self.base_commit, scratch),
                                     timeout=self.timeout)
        if done.returncode == _NO_COMMIT:
            raise ContainerStartError(f"base_commit {self.base_commit} is not in {self.repo_path}", retryable=False)
        if done.returncode != 0 or done.timed_out:
            why = f"took more than {self.timeout:g}s" if done.timed_out else f"exit {done.returncode}"
            raise ContainerStartError(f"cloning {self.repo_path} into {self.repo_dir} failed ({why}): "
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
        workspace = getattr(self.inner, "workspace", None)
        return not (isinstance(workspace, str) and self.workdir == workspace and os.path.isdir(workspace))


def _prepare_script(source: str, dest: str, commit: str, scratch: str | None) -> str:
    q = shlex.quote
    name, email = GIT_USER
    lines = [
        "set -e",
        # --no-hardlinks: a local clone would share the source's object files (inodes); the agent can chmod
        # and overwrite them, corrupting the dataset's repository for every later rollout.
        f"git -c safe.directory='*' clone -q --no-hardlinks --no-checkout {q(source)} {q(dest)}",
        f"cd {q(dest)}",
        f'full=$(git rev-parse -q --verify {q(commit + "^{commit}")}) || exit {_NO_COMMIT}',
        'branch=$(git symbolic-ref -q --short HEAD || echo main)',
        'git checkout -q -B "$branch" "$full"',
        "git remote remove origin",
        # Refs the base cannot reach would show the fix: delete them, then their objects (only then: gc costs).
        "future=$(git for-each-ref --no-merged \"$full\" --format='%(refname)')",
        ('if [ -n "$future" ]; then for ref in $future; do git update-ref -d "$ref"; done;'
         " git reflog expire --expire=now --all; git gc -q --prune=now; fi"),
        f"git config user.name >/dev/null || git config user.name {q(name)}",
        f"git config user.email >/dev/null || git config user.email {q(email)}",
    ]
    if scratch:
        lines.append(f"rm -f {q(scratch)}")
    return "\n".join(lines) + "\n"


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
