"""What this process started and must stop when it ends: at interpreter exit or on SIGTERM, every stop
registered here and not forgotten runs, in parallel, within a bound (the containers' TTL catches what it misses).
Runtimes register what they start (docker and podman containers, apptainer instances) and forget it once
closed. Lock-free: ``stop_all`` runs inside a signal handler, which may interrupt the main thread anywhere, so
registering and forgetting are plain dict operations (atomic under the GIL) and each stop runs on a new thread."""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from typing import Any, Callable

EXIT_WAIT = 20.0
"""Seconds the exit-time stops may take together before the process gives up on them."""

_stops: dict[str, Callable[[], None]] = {}
_atexit_installed = False
_sigterm_installed = False
_previous_sigterm: Any = None


def stop_at_exit(key: str, stop: Callable[[], None]) -> None:
    """Run ``stop`` (blocking) when this process exits or gets SIGTERM, unless ``forget(key)`` came first."""
    install_hooks()
    _stops[key] = stop


def forget(key: str) -> None:
    _stops.pop(key, None)


def stop_all() -> list[str]:
    """Run every registered stop now, in parallel, within ``EXIT_WAIT``; returns their keys. A stop that fails
    is skipped (already gone, or its engine is down)."""
    items = list(_stops.items())
    _stops.clear()

    def run(stop: Callable[[], None]) -> None:
        try:
            stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass

    # Plain threads, not an executor: at interpreter exit, executors refuse new work.
    threads = [threading.Thread(target=run, args=(stop,), daemon=True) for _, stop in items]
    deadline = time.monotonic() + EXIT_WAIT
    for thread, (_, stop) in zip(threads, items):
        try:
            thread.start()
        except RuntimeError:  # no new threads this late in shutdown: do it here
            run(stop)
    for thread in threads:
        if thread.ident is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
    return [key for key, _ in items]


def install_hooks() -> None:
    """atexit and SIGTERM stops, installed on first use (never at import: Ray re-imports us everywhere). SIGTERM
    needs the main thread: from another one (an async Ray actor's loop) only atexit and the TTL remain, and a
    later call from the main thread completes the job."""
    global _atexit_installed, _sigterm_installed, _previous_sigterm
    if not _atexit_installed:
        _atexit_installed = True
        atexit.register(stop_all)
    if not _sigterm_installed and threading.current_thread() is threading.main_thread():
        _sigterm_installed = True
        _previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: Any) -> None:
    stop_all()
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # the default action: die of SIGTERM, as if we had never been here
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
