"""The live page of a run: one static page (``static/``, the charting library vendored beside it) and
``api/state`` (``RunView.state``), served by the standard library's HTTP server on a thread of its own, so the
driver's event loop and ``rollout status --web`` can both start it (``start_for_run``).

Bound to 127.0.0.1 unless told otherwise. Bound to anything else it needs a token (``?token=`` on the URL, or an
``Authorization: Bearer`` or ``X-Rollout-Token`` header); one is generated when none is given, and ``url`` has it.
"""

from __future__ import annotations

import mimetypes
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, quote, urlsplit

from cluster.web.live_state import RunView, dumps
from rollout.access import HOW_TO_PASS, allowed, presented, token_for

STATIC = Path(__file__).resolve().parent / "static"
SAMPLE_INTERVAL = 1.0
"""Seconds between the history samples the server takes for the charts (pages poll as often)."""


@dataclass
class LivePage:
    """A live page being served: open ``url``; ``stop()`` shuts it down (also on the process's exit: the
    thread is a daemon)."""

    url: str
    host: str
    port: int
    token: str | None
    server: ThreadingHTTPServer
    thread: threading.Thread
    sampler: threading.Thread
    stopping: threading.Event

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
        self.sampler.join(timeout=5)


def start_for_run(run_dir: str | Path, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                  stall: float = 60.0) -> LivePage:
    """Serve ``run_dir``'s live page on ``host:port`` (port 0: any free one) from now on; returns at once.
    A host other than 127.0.0.1/localhost/::1 requires ``token`` (generated when None). Raises OSError when the
    address cannot be bound."""
    token = token_for(host, token)  # rollout.access: the rule every service the farm listens with follows
    view = RunView(run_dir, stall=stall)
    server_class = _IPv6Server if ":" in host else ThreadingHTTPServer
    server = server_class((host, port), _handler(view, token))
    server.daemon_threads = True
    bound = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name=f"live-page:{bound}", daemon=True)
    stopping = threading.Event()
    sampler = threading.Thread(target=_sample, args=(view, stopping), name=f"live-page-history:{bound}", daemon=True)
    thread.start()
    sampler.start()
    return LivePage(page_url(host, bound, token), host, bound, token, server, thread, sampler, stopping)


def _sample(view: RunView, stopping: threading.Event) -> None:
    """The charts' history grows whether a page is open or not."""
    while not stopping.wait(SAMPLE_INTERVAL):
        try:
            view.state()
        except (OSError, ValueError):
            continue


def page_url(host: str, port: int, token: str | None) -> str:
    """The URL to open: a wildcard address is shown as this machine's name."""
    shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}/" + (f"?token={quote(token)}" if token else "")


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _handler(view: RunView, token: str | None) -> type[BaseHTTPRequestHandler]:
    static_files = {p.relative_to(STATIC).as_posix(): p for p in STATIC.rglob("*") if p.is_file()}

    class Handler(BaseHTTPRequestHandler):
        server_version = "rollout-farm-live"

        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            parts = urlsplit(self.path)
            path = parts.path
            if path.startswith("/static/"):  # the page's code and library: no run data, no token
                file = static_files.get(path[len("/static/"):])
                if file is None:
                    return self._send(404, b"not found\n", "text/plain")
                kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
                return self._send(200, file.read_bytes(), kind, cache=True)
            if path not in ("/", "/index.html", "/api/state"):
                return self._send(404, b"not found\n", "text/plain")
            if not self._authorized(parts.query):
                return self._send(401, f"this page needs its token: open the URL with ?token=... that was printed "
                                       f"when it started, or {HOW_TO_PASS}\n".encode(), "text/plain")
            if path == "/api/state":
                try:
                    return self._send(200, dumps(view.state()), "application/json")
                except (OSError, ValueError) as exc:  # say why on the page rather than drop the connection
                    return self._send(500, f"cannot read the run: {type(exc).__name__}: {exc}\n".encode(), "text/plain")
            return self._send(200, (STATIC / "index.html").read_bytes(), "text/html; charset=utf-8")

        def _authorized(self, query: str) -> bool:
            return allowed(presented(self.headers.get, parse_qs(query).get("token", [""])[0]), token)

        def _send(self, code: int, body: bytes, kind: str, cache: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "max-age=3600" if cache else "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: the run's output is its own
            pass

    return Handler


@dataclass
class LivePageSettings:
    """``rollout run --web``'s page: where it listens, and the token that guards it (None: a fresh one)."""

    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None


def open_for_run(web: LivePageSettings | None, run_dir: str | Path, say: Callable[[str], None]) -> LivePage | None:
    """``rollout run --web``: the run's live page while it runs (its URL said), or None without ``web``."""
    if web is None:
        return None
    page = start_for_run(run_dir, web.host, web.port, web.token)
    say(f"live page: {page.url}")
    return page
