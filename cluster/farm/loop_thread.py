"""An event loop on a private thread, for objects with a blocking API over asyncio machinery (RolloutFarm)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine


class LoopThread:
    """Started on first use; ``run(coro)`` blocks the caller until the coroutine is done on the loop."""

    def __init__(self, name: str):
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            self._thread = threading.Thread(target=serve, name=self.name, daemon=True)
            self._thread.start()
            ready.wait()
            self.loop = loop
        return self.loop

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.start()).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, Any]) -> "asyncio.Future[Any]":
        """Schedule without waiting; returns a concurrent future."""
        return asyncio.run_coroutine_threadsafe(coro, self.start())

    def stop(self) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            self.loop = None
