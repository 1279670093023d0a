"""The Harbor reward contract, run against a hostile agent.

After the agent: every process it left in the container is killed (a background job could otherwise write the
reward after the wipe); ``/logs/verifier`` and ``/tests`` are removed and made again as root (a reward or a test
file the agent planted is gone); only then are the task's tests copied in, by the engine (the agent never saw
them); ``tests/test.sh`` runs as the verifier's user with the verifier's variables and timeout, its exit code
ignored; the reward is read by the engine, not by a program in the container: ``reward.json`` (a table of
finite numbers) over ``reward.txt`` (one finite number) when both exist, as Harbor 0.25 reads them. No reward
file, an empty one, or a value that is not a finite number is a verifier failure (``VerifierError``), never 0.

In ``shared`` mode (Harbor's default) the tests run in the agent's container, with its programs: an agent that
is root there can change what the tests run with, as in Harbor. ``separate`` mode runs them in a fresh container
of the task's image with only the agent's working directory copied in; a non-root ``agent.user`` also keeps the
agent away from the system's files.
"""

from __future__ import annotations

import io
import json
import math
import posixpath
import shlex
import tarfile

from envs.runtimes.docker.files import EngineContainer, get_tree, put_tree
from rollout.errors import VerifierError

ROOT = "0"
SHELL = ["bash", "--noprofile", "--norc", "-c"]
"""The grader's commands skip the login shell's start-up files, which an agent could have written."""
KILL_LEFTOVERS = """\
keep=" $1 "; me=$$
p=$me
while [ -n "$p" ] && [ "$p" != 0 ]; do keep="$keep$p "; p=$(awk '/^PPid:/{print $2}' /proc/$p/status 2>/dev/null); done
for round in 1 2 3 4 5; do
  left=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$keep" in *" $p "*) continue;; esac
    kill -9 "$p" 2>/dev/null && left=1
  done
  [ "$left" = 0 ] && break
done
true
"""
"""Runs as root with $1 the container's own processes (seen before the agent's first command): every other
process but this script's own chain is killed, again until none is left (a job that forks while it dies)."""
LIST_PROCESSES = "ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '"
MAX_WORKSPACE_BYTES = 1 << 30
"""The largest working directory copied into a separate verifier container."""


async def own_processes(runtime: EngineContainer) -> str:
    """The container's processes right after its start (its init and main command), as ``"1 7 8"``; the shell
    that lists them is gone by the time anyone reads the list."""
    out = await runtime.exec(LIST_PROCESSES, timeout=30, cwd="/", user=ROOT, shell=SHELL)
    return out.output.strip()


async def kill_leftovers(runtime: EngineContainer, keep: str) -> None:
    out = await runtime.exec(f"sh -c {shlex.quote(KILL_LEFTOVERS)} rollout-kill {shlex.quote(keep)}", timeout=60,
                             cwd="/", user=ROOT, shell=SHELL)
    if out.returncode != 0:
        raise VerifierError(f"could not stop the agent's processes before the tests: {out.output[-500:]}")


async def fresh_dirs(runtime: EngineContainer) -> None:
    """``/logs/verifier`` and ``/tests`` removed (a symbolic link is removed, never followed) and made again."""
    out = await runtime.exec("rm -rf /logs/verifier /tests && mkdir -p /logs/verifier /tests && "
                             "chmod 0777 /logs/verifier && chmod 0755 /tests", timeout=120, cwd="/", user=ROOT,
                             shell=SHELL)
    if out.returncode != 0:
        raise VerifierError(f"could not prepare /logs/verifier and /tests: {out.output[-500:]}")


async def copy_tests(runtime: EngineContainer, archive: bytes) -> None:
    await runtime.engine_call(put_tree, "/tests", archive)


async def run_test_script(runtime: EngineContainer, *, user: str | None, env: dict[str, str], timeout: float,
                          workdir: str) -> tuple[str, bool]:
    """(the test script's output, whether it timed out). Its exit code says nothing (Harbor ignores it)."""
    command = "bash /tests/test.sh 2>&1 | tee /logs/verifier/test-stdout.txt; exit ${PIPESTATUS[0]}"
    out = await runtime.exec(command, timeout=timeout, cwd=workdir, env=env or None, user=user or ROOT, shell=SHELL)
    return out.output, out.timed_out


async def read_rewards(runtime: EngineContainer) -> tuple[dict[str, float], str]:
    """(the rewards, which file they came from). ``reward.json`` wins over ``reward.txt`` (Harbor 0.25's order)."""
    for name in ("reward.json", "reward.txt"):
        try:
            data = await runtime.read_file(f"/logs/verifier/{name}")
        except (FileNotFoundError, IsADirectoryError):
            continue
        return parse_reward(name, data), name
    raise VerifierError("the tests wrote no reward: neither /logs/verifier/reward.json nor reward.txt exists",
                        retryable=False)


def parse_reward(name: str, data: bytes) -> dict[str, float]:
    text = data.decode("utf-8", errors="replace").strip()
    if not text:
        raise VerifierError(f"/logs/verifier/{name} is empty", retryable=False)
    if name == "reward.txt":
        try:
            value = float(text)
        except ValueError:
            raise VerifierError(f"/logs/verifier/reward.txt is not a number: {text[:80]!r}", retryable=False) from None
        if not math.isfinite(value):
            raise VerifierError(f"/logs/verifier/reward.txt holds a non-finite value {text[:40]!r}", retryable=False)
        return {"reward": value}
    try:
        rewards = json.loads(text)
    except ValueError:
        raise VerifierError(f"/logs/verifier/reward.json is not JSON: {text[:80]!r}", retryable=False) from None
    if not isinstance(rewards, dict) or not rewards:
        raise VerifierError("/logs/verifier/reward.json must be a table of numbers, e.g. {\"reward\": 1}",
                            retryable=False)
    for key, value in rewards.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise VerifierError(f"/logs/verifier/reward.json: {key!r} is {value!r}, not a finite number",
                                retryable=False)
    return {str(k): float(v) for k, v in rewards.items()}


async def copy_workspace(source: EngineContainer, target: EngineContainer, workdir: str) -> int:
    """The agent's working directory copied by the engine into a fresh container (its bytes)."""
    if posixpath.normpath(workdir) == "/":
        raise VerifierError("environment_mode 'separate' copies the agent's working directory, and the task's "
                            "is / (set environment.workdir in task.toml)", retryable=False)
    archive = await source.engine_call(get_tree, workdir)
    if len(archive) > MAX_WORKSPACE_BYTES:
        raise VerifierError(f"the working directory holds more than {MAX_WORKSPACE_BYTES >> 20} MB", retryable=False)
    parent = posixpath.dirname(posixpath.normpath(workdir)) or "/"
    await target.exec(f"mkdir -p {shlex.quote(parent)}", timeout=60, cwd="/", user=ROOT, shell=SHELL)
    await target.engine_call(put_tree, parent, archive)
    return len(archive)


def merged_tests(shared: dict[str, bytes], own: dict[str, bytes], executable: set[str]) -> bytes:
    """The task's ``tests/`` with a step's own tests over it, as a tar for ``/tests``."""
    files = {**shared, **own}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel, data in sorted(files.items()):
            info = tarfile.TarInfo(rel)
            info.size, info.mode = len(data), 0o755 if rel in executable or rel.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
