"""Serve on the connected cluster: started with the HTTP options a caller asks for, or, when it already runs, left as
it is and what the caller set that it runs otherwise named in one line. Ray's own "New http_options/controller_options
will not be applied" is kept out: Serve logs it at every ``serve.run`` (which connects through ``serve_start``), given
options or not, right after ours were applied."""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any, Iterator, TextIO

from cluster.session.ray_private import serve_http_config, serve_running

SERVE_LOGGER = "ray.serve"
RECONNECT_NOTE = "New http_options/controller_options will not be applied"
"""The words of Serve's line that says so on every reconnection to a running Serve."""


class _WithoutReconnectNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return RECONNECT_NOTE not in record.getMessage()


@contextlib.contextmanager
def quiet_reconnects() -> Iterator[None]:
    """Within it, Serve does not log its reconnection note (``serve.run``, ``serve.run_many``, ``serve.start``)."""
    logger, note = logging.getLogger(SERVE_LOGGER), _WithoutReconnectNote()
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)


def start_serve(host: str, port: int, *, asked: dict[str, Any], logging_config: dict[str, Any] | None = None,
                out: TextIO = sys.stderr) -> bool:
    """Serve's proxies on ``host:port`` when this call starts Serve; when Serve already runs, they stay as they are,
    and each of ``asked`` (the options the user set, by ``HTTPOptions`` name: ``host``, ``port``) that differs from
    what Serve runs with is named in one line on ``out``. True when this call started Serve."""
    from ray import serve  # the ray extra

    started = not serve_running()
    if started:
        with quiet_reconnects():  # Serve started by someone else meanwhile: the comparison below says so
            serve.start(http_options={"host": host, "port": port}, logging_config=logging_config)
    running = serve_http_config()
    differ = {name: value for name, value in asked.items() if value is not None and getattr(running, name) != value}
    if differ:
        print(f"serve: Serve already runs on this cluster with its proxies on {running.host}:{running.port}; "
              + ", ".join(f"{name} {value!r}" for name, value in differ.items())
              + " not applied (`serve shutdown` stops it, and its applications, so the next start takes them)",
              file=out, flush=True)
    return started
