"""The owner's watchdog: a small process that outlives the process starting apptainer instances and, once that
process is gone (however it died, SIGKILL included), stops every instance it had not closed and removes their host
directories. One watchdog per owner process and CLI binary, started before the owner's first instance:

    python -m envs.runtimes.apptainer.owner_watch <binary>

Its stdin is a pipe whose write end only the owner holds (not inherited by the owner's children, closed in a
forked child): the owner writes ``+<name>\\t<workspace>`` before each ``instance start`` and ``-<name>`` once it
has stopped it. End of file means the owner is gone: the watchdog stops what is still registered, in parallel,
each within a bound, removes the registered workspaces, and exits (with nothing registered it just exits).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from envs.runtimes.apptainer.argv import stop_argv

STOP_TIMEOUT = 30.0
"""Seconds one ``instance stop`` may take."""
START_GRACE = 120.0
"""How long an ``instance start`` the dead owner left running may still take to create the instance the watchdog
must then stop (the runtime's default ``start_timeout``)."""

_lock = threading.Lock()
_pipes: dict[str, int] = {}
"""CLI binary -> the write end of its watchdog's stdin (this process's; none until its first instance)."""
_fork_hook = False


def register(binary: str, name: str, workspace: str | None) -> None:
    """Tell the watchdog of ``binary`` (started now if this process has none) about instance ``name`` and the
    host directory to remove with it (none: keep it). Never raises: without a watchdog the exit hooks remain."""
    if workspace and ("\n" in workspace or "\t" in workspace):
        workspace = None  # not expressible on one line; the exit hooks still remove it
    _send(binary, f"+{name}\t{workspace or ''}\n")


def unregister(binary: str, name: str) -> None:
    """The instance is stopped and its directory handled: nothing left for the watchdog to do. Lock-free (it may
    run from the exit hooks while a signal handler interrupted a ``register``): one short write is atomic."""
    fd = _pipes.get(binary)
    if fd is not None:
        try:
            os.write(fd, os.fsencode(f"-{name}\n"))
        except OSError:  # the watchdog is gone: nothing to tell
            pass


def unregistering(binary: str, name: str, stop: Callable[[], None]) -> Callable[[], None]:
    """``stop`` (an exit hook's), then ``unregister``: what the exit hooks stopped, the watchdog does not stop again."""

    def run() -> None:
        stop()
        unregister(binary, name)

    return run


def _send(binary: str, line: str) -> None:
    data = os.fsencode(line)
    with _lock:
        fd = _pipes.get(binary)
        if fd is None:
            fd = _spawn(binary)
        if fd is None:
            return
        try:
            os.write(fd, data)  # one short write: atomic on a pipe, never interleaved with another thread's
        except OSError:  # the watchdog is gone: the next instance gets a new one
            _pipes.pop(binary, None)
            os.close(fd)


def _spawn(binary: str) -> int | None:
    """Start the watchdog of ``binary``; the write end of its stdin, or none if it could not be started."""
    global _fork_hook
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        read_end, write_end = os.pipe()  # both non-inheritable: no child the owner execs holds them
    except OSError:
        return None
    try:
        subprocess.Popen(
            [sys.executable, "-m", "envs.runtimes.apptainer.owner_watch", binary],
            env=env,
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            cwd="/",
        )
    except (OSError, subprocess.SubprocessError):
        os.close(write_end)
        return None
    finally:
        os.close(read_end)
    if not _fork_hook:  # inherited by forked children: registered once
        _fork_hook = True
        os.register_at_fork(after_in_child=_after_fork)
    _pipes[binary] = write_end
    return write_end


def _after_fork() -> None:
    """A forked child must not hold the owner's write ends (its watchdog would wait for the child's death too)."""
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    for fd in _pipes.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _pipes.clear()


def _processes_with(text: str) -> bool:
    """Whether a live process's command line holds ``text``: the instance itself, or the ``instance start`` the
    owner left running."""
    needle = os.fsencode(text)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        return True
            except OSError:
                continue
    return False


def stop(binary: str, name: str, workspace: str | None) -> None:
    """Stop instance ``name``, waiting for a start still under way to finish (within ``START_GRACE``); then remove
    its workspace."""
    deadline = time.monotonic() + START_GRACE
    while True:
        try:
            ran = subprocess.run(
                stop_argv(binary, name), stdin=subprocess.DEVNULL, capture_output=True, timeout=STOP_TIMEOUT
            )
            done = ran.returncode == 0
        except (OSError, subprocess.SubprocessError):
            done = False
        if done or time.monotonic() > deadline or not _processes_with(name):
            break
        time.sleep(0.5)
    if workspace:
        shutil.rmtree(workspace, ignore_errors=True)


def main(argv: list[str]) -> int:
    binary = argv[0]
    registered: dict[str, str | None] = {}
    for raw in sys.stdin.buffer:
        line = os.fsdecode(raw.rstrip(b"\n"))
        if line.startswith("+"):
            name, _, workspace = line[1:].partition("\t")
            registered[name] = workspace or None
        elif line.startswith("-"):
            registered.pop(line[1:], None)
    threads = [threading.Thread(target=stop, args=(binary, name, workspace)) for name, workspace in registered.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
