"""run_capped: one host command in its own process group, output combined and capped, the whole group killed at
the end."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

from envs.runtimes.output import CappedOutput
from rollout.errors import RuntimeFailure
from rollout.protocols import ExecResult

REAP_GRACE = 5.0
"""Seconds to wait for a SIGKILLed group leader to be reaped (only a process stuck in the kernel takes longer)."""
DRAIN_GRACE = 1.0
"""Seconds to keep reading once the command is over. Only a process that left the group (``setsid``, or one
inside a container the kill does not reach) and kept the pipe open makes us wait this long; we then stop."""


async def run_capped(
    argv: Sequence[str],
    *,
    timeout: float,
    max_output_bytes: int,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    running: set[int] | None = None,
    stdin: bytes | None = None,
) -> ExecResult:
    """Run ``argv`` (stdin: ``stdin``'s bytes then end of file, or empty; stderr into stdout) in a new process
    group, and kill the whole group
    when it exits (background jobs it left), at ``timeout`` seconds, or once the output passes
    ``max_output_bytes``. ``running`` (the caller's) holds the group id while the command is in flight,
    so the caller can ``kill_group`` it from elsewhere. A cancelled call kills the group too. A command still
    running when its output passed the cap is killed: ``truncated`` and return code ``-SIGKILL``, as the
    docker runtime reports it.

    Never raises for what the command did; ``RuntimeFailure`` only when it cannot be started at all.
    """
    loop = asyncio.get_running_loop()
    began = time.monotonic()
    try:
        transport, proto = await loop.subprocess_exec(
            lambda: _Collector(max_output_bytes, loop),
            *argv,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,  # pgid == pid: one signal reaches everything the command starts
        )
    except OSError as exc:
        raise RuntimeFailure(f"cannot start {argv[0]!r}: {exc}", retryable=False) from exc
    pgid = transport.get_pid()
    if running is not None:
        running.add(pgid)
    if stdin is not None:
        feed = transport.get_pipe_transport(0)
        feed.write(stdin)  # buffered by the loop and written as the command reads: output is read meanwhile
        feed.write_eof()
    try:
        done, _ = await asyncio.wait((proto.exited, proto.full), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        # Timed out, output full, or finished with background jobs left: the whole group goes either way.
        kill_group(pgid)
        await asyncio.wait((proto.exited,), timeout=REAP_GRACE)
        if not proto.full.done():  # past the cap there is nothing left worth reading
            await asyncio.wait((proto.eof,), timeout=DRAIN_GRACE)
    finally:
        if not proto.exited.done():  # cancelled mid-command: don't leave it running
            kill_group(pgid)
        if running is not None:
            running.discard(pgid)
        transport.close()  # closing our end also stops writers the kill did not reach (SIGPIPE)
    returncode = transport.get_returncode()
    return ExecResult(
        output=proto.output.text(),
        returncode=-signal.SIGKILL if returncode is None else returncode,
        timed_out=not done,
        truncated=proto.output.truncated,
        duration=time.monotonic() - began,
    )


def kill_group(pgid: int) -> None:
    """SIGKILL the process group ``pgid``; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_pid_namespace(init: int, passes: int = 3) -> int:
    """SIGKILL every process in the PID namespace whose init is the host process ``init``, but ``init`` itself
    (the namespace, a container, lives on); how many were killed. Nothing when ``init`` shares this process's
    namespace: that would be every process of the host. A few passes catch children forked while it ran."""
    try:
        namespace = os.readlink(f"/proc/{init}/ns/pid")
        if namespace == os.readlink("/proc/self/ns/pid"):
            return 0
    except OSError:
        return 0
    killed = 0
    for _ in range(passes):
        found = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == init:
                continue
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                    os.kill(int(entry), signal.SIGKILL)
                    found += 1
        killed += found
        if not found:
            break
    return killed


def failure_reason(result: ExecResult) -> str:
    """``timed out`` or ``exit code N``, for error messages about a command that should have succeeded."""
    return "timed out" if result.timed_out else f"exit code {result.returncode}"


class _Collector(asyncio.SubprocessProtocol):
    """Keeps the combined output up to the cap and resolves a future on exit, on EOF and on a full buffer.

    A protocol rather than ``Process.communicate``/``wait``: the command's exit must be seen even while a
    background grandchild still holds the pipe open, and output past the cap must not be buffered.
    """

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop):
        self.output = CappedOutput(limit)
        self.exited = loop.create_future()
        self.eof = loop.create_future()
        self.full = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if self.output.feed(data):
            _resolve(self.full)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd != 0:  # the stdin pipe closing (all fed, or the command quit reading) is not the output's end
            _resolve(self.eof)

    def process_exited(self) -> None:
        _resolve(self.exited)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
