"""One command in a container through the engine API: an in-container wrapper, output read to a cap and deadline."""

from __future__ import annotations

import secrets
import signal
import socket
import threading
import time
from typing import Any

from envs.runtimes.output import CappedOutput

MARKER_VAR = "ROLLOUT_EXEC"
"""Environment variable carrying a per-command id; everything the command starts inherits it, so a
stray process can be found (and killed) even after it left the process group."""

# Runs under /bin/sh in the container with: $1 directory, $2 timeout, $3 kill grace, then shell argv + command.
# `timeout` puts itself and the command in a fresh process group, signals the whole group on expiry and
# SIGKILLs it (itself included) after the grace. Once the command is over, what it left in the group
# is killed too, so no background job outlives its command or holds the output stream open.
# The command's stdout and stderr share one pipe (stream 1, ordered as written); the exit code goes
# out on stream 2, which saves an inspect round trip per command. Its stdin is the exec's (fd 3 keeps it:
# a background job's own stdin would be /dev/null).
WRAPPER = """\
d=$1 t=$2 k=$3; shift 3
exec 3<&0
cd -- "$d" 2>/dev/null || { echo "cannot run the command in $d: no such directory"; printf 1 >&2; exit 1; }
timeout -k "$k" "$t" "$@" 0<&3 3<&- 2>&1 &
p=$!
wait "$p"; r=$?
kill -9 -"$p" 2>/dev/null
printf %s "$r" >&2
exit "$r"
"""

# Kills every process whose environment carries the marker ($1): the last resort when a command
# outlived its own timeout (or we stopped reading it), whatever process group it moved to.
KILL_MARKED = """\
for f in $(grep -lzxF "ROLLOUT_EXEC=$1" /proc/[0-9]*/environ 2>/dev/null); do
  f=${f#/proc/}; kill -9 "${f%/environ}" 2>/dev/null
done
true
"""

_HEADER = 8
"""Size of a frame header in the engine's multiplexed stream: stream id, 3 pad bytes, big-endian length."""
_KILL_WAIT = 10.0
"""Seconds the kill command may take (it reads every process's environment once)."""
_INSPECT_WAIT = 3.0
"""Seconds to wait for the engine to see a killed command as finished."""


class ExecJob:
    """One command's blocking run (in an I/O pool thread); ``abort()`` may be called from any thread."""

    def __init__(self, api: Any, container: str, argv: list[str], env: dict[str, str], limit: float,
                 grace: float, backstop: float, cap: int, stdin: bytes | None = None, user: str | None = None):
        self.api = api
        self.user = user
        self.stdin = stdin
        self.container = container
        self.marker = secrets.token_hex(8)
        self.argv = argv
        self.env = {**env, MARKER_VAR: self.marker}
        self.limit = limit
        self.grace = grace
        self.deadline_after = limit + grace + backstop
        self.output = CappedOutput(cap)
        self.aborted = False
        self._sock: Any = None
        self._lock = threading.Lock()

    def run(self) -> tuple[int, str]:
        """(exit code, how reading ended: "eof" | "full" | "deadline" | "aborted"). Engine errors propagate.
        A command still running when its output passed the cap is killed and gets ``-SIGKILL``."""
        deadline = time.monotonic() + self.deadline_after
        exec_id = self.api.exec_create(self.container, self.argv, environment=self.env,
                                       stdin=self.stdin is not None, user=self.user or "")["Id"]
        raw = _raw_socket(self.api.exec_start(exec_id, socket=True))
        with self._lock:
            self._sock = raw
            ended = "aborted" if self.aborted else None
        trailer = bytearray()
        feeder = None
        if self.stdin is not None and ended is None:
            # Written from a second thread while this one reads: a command may write before it reads all of it.
            feeder = threading.Thread(target=_feed, args=(raw, self.stdin), name="exec-stdin", daemon=True)
            feeder.start()
        try:
            if ended is None:
                ended = self._read(raw, deadline, trailer)
        finally:
            _close(raw)
            if feeder is not None:
                feeder.join(5.0)  # the closed socket ends a send still blocked
        code = int(trailer) if ended == "eof" and trailer.isdigit() else None
        if ended == "full" and self._still_running(exec_id):
            # Stopped at the output cap: what the engine reports after our kill (126, 137, even 0 for a pipe
            # whose last stage survived) says nothing about the command. Report the kill, as a host process would.
            self.kill()
            return -signal.SIGKILL, ended
        if ended != "eof" or code in (124, 137):
            # Stopped early, or timed out: also catch what escaped the process group (setsid, daemons).
            self.kill()
        return (self._exit_code(exec_id) if code is None else code), ended

    def abort(self) -> None:
        """Stop reading now (close() or a cancelled exec); ``run`` then kills the command."""
        with self._lock:
            self.aborted = True
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked recv() with EOF
                except OSError:
                    pass

    def kill(self) -> None:
        """SIGKILL every process of this command still in the container (best effort, bounded in time)."""
        try:
            kid = self.api.exec_create(self.container, ["sh", "-c", KILL_MARKED, "rollout-kill", self.marker],
                                       user="0")["Id"]
            raw = _raw_socket(self.api.exec_start(kid, socket=True))
        except Exception:  # noqa: BLE001 - the container may be gone or out of pids; the caller finds out next
            return
        try:
            raw.settimeout(_KILL_WAIT)
            while raw.recv(4096):
                pass
        except OSError:
            pass
        finally:
            _close(raw)

    def _read(self, raw: Any, deadline: float, trailer: bytearray) -> str:
        pending = bytearray()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "deadline"
            raw.settimeout(remaining)
            try:
                chunk = raw.recv(65536)
            except TimeoutError:
                return "deadline"
            except OSError:
                chunk = b""
            if not chunk:
                return "aborted" if self.aborted else "eof"
            pending += chunk
            while len(pending) >= _HEADER:
                size = int.from_bytes(pending[4:_HEADER], "big")
                if len(pending) < _HEADER + size:
                    break
                payload = pending[_HEADER:_HEADER + size]
                if pending[0] == 2:
                    trailer += payload
                elif self.output.feed(payload):
                    return "full"
                del pending[:_HEADER + size]

    def _still_running(self, exec_id: str) -> bool:
        info = self.api.exec_inspect(exec_id)
        return bool(info.get("Running")) or info.get("ExitCode") is None

    def _exit_code(self, exec_id: str) -> int:
        """The exit code as the engine saw it; -9 when it never reports one (the process was killed)."""
        deadline = time.monotonic() + _INSPECT_WAIT
        while True:
            info = self.api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if time.monotonic() > deadline:
                return -9
            time.sleep(0.02)


def _feed(raw: Any, data: bytes) -> None:
    """Send the command's stdin, then half-close: the engine closes the command's stdin (end of file)."""
    try:
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
    except OSError:  # the command ended (or was stopped) without reading it all
        pass


def _raw_socket(response: Any) -> Any:
    # The SDK hands back a SocketIO around the socket for unix and tcp; recv() with a timeout needs the socket.
    return getattr(response, "_sock", response)


def _close(raw: Any) -> None:
    # shutdown() first: the SDK's response object still holds a reference to the socket, so close() alone
    # would leave the connection open, the engine would keep writing into it, and once its buffer is full
    # the engine's copy blocks and wedges every later exec in the container.
    for step in (lambda: raw.shutdown(socket.SHUT_RDWR), raw.close):
        try:
            step()
        except OSError:
            pass
