"""Serve an ASGI app (a FastAPI resources server, the agent server) on 127.0.0.1 from a background thread:
``with serve_in_thread(app) as server: server.url`` for tests, benchmarks and ``python -m`` entry points."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


class BackgroundServer:
    """A uvicorn server on its own thread; ``url`` once it listens, ``stop()`` (idempotent) to end it."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        self.host = host
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_keep_alive=30,
                                limit_concurrency=None, backlog=2048)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name=f"asgi-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "BackgroundServer":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0) -> BackgroundServer:
    """A started-on-enter server for ``app``: ``with serve_in_thread(app) as s: ... s.url``."""
    return BackgroundServer(app, host, port)


def serve_forever(app: Any, host: str, port: int) -> None:
    """Run ``app`` in the foreground until interrupted (the ``python -m envs.resources.<server>`` entry points)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="info")
