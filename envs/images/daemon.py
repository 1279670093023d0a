"""The docker daemon as the image code talks to it: a client (``docker_client``) whose calls give up once the daemon
has been silent ``ANSWER_TIMEOUT`` seconds, and ``watched`` around the calls that stream long work (a build, a pull,
a load, an import, a push), which may go quiet for up to ``LONG_WORK_TIMEOUT`` while the daemon keeps answering
beside them. A daemon that hangs (wedged, stopped, restarting badly) then costs a rollout one bounded wait, failed as
infrastructure, never a slot (and the image's lock other rollouts wait on) held for an hour."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from rollout.errors import ContainerStartError

ANSWER_TIMEOUT = 60
"""Seconds a daemon may be silent on a call that does no long work (an inspect, a list, a tag, a remove, the
client's version handshake): the docker CLI's and SDK's own default. Past it the daemon hangs."""
LONG_WORK_TIMEOUT = 3600
"""Seconds without a byte from the daemon on a call that streams long work: a silent install step of a build, the
unpacking of a large layer."""
WATCH_EVERY = 10.0
"""Seconds between two questions to the daemon (``info``) while long work runs (``watched``)."""
T = TypeVar("T")


class ImageError(ContainerStartError):
    """An image is missing and cannot be found, pulled or built; the message says how to get it."""

    def __init__(self, message: str = "", retryable: bool = False):
        super().__init__(message, retryable)


def docker_client(timeout: float = ANSWER_TIMEOUT) -> Any:
    """A client of this process's docker daemon (``DOCKER_HOST``, else the default socket); an ``ImageError``
    (retryable) when it does not answer."""
    try:
        import docker
    except ImportError:
        raise ImageError("the docker SDK is not installed: pip install 'rollout-farm[docker]'") from None
    try:
        return docker.from_env(timeout=timeout)
    except docker.errors.DockerException as exc:
        raise ImageError(f"cannot reach the docker daemon: {exc}", retryable=True) from None


@contextmanager
def patient(client: Any, seconds: float = LONG_WORK_TIMEOUT) -> Iterator[Any]:
    """``client`` waiting up to ``seconds`` for a byte on the calls made inside (the SDK reads its API client's
    ``timeout`` at each request, and a streamed response keeps the one it was opened with); its own timeout after.
    A client is one thread's (the SDK's HTTP session is not meant to be shared)."""
    before = client.api.timeout
    client.api.timeout = seconds
    try:
        yield client
    finally:
        client.api.timeout = before


def watched(client: Any, work: Callable[[], T], what: str, *, every: float = WATCH_EVERY,
            answer: float = ANSWER_TIMEOUT) -> T:
    """``work()``, calls on ``client`` that stream long work (``patient``), while this thread asks the daemon every
    ``every`` seconds for its ``info`` on a client of its own: a daemon that does not answer within ``answer`` seconds
    fails the work at once as infrastructure (a retryable ``ImageError`` naming ``what``), not after the hour its
    stream may stay quiet. The work's thread is then left to its own timeout. Every client of the image code is the
    environment's daemon's (``docker_client``), and so is the one that asks."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            with patient(client):
                outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as it was
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"docker {what}", daemon=True).start()
    asking = None
    try:
        while not done.wait(every):
            try:
                asking = asking or docker_client(timeout=answer)
                asking.api.info()
            except Exception as exc:  # noqa: BLE001 - any failure to answer is the daemon's
                raise ImageError(f"the docker daemon stopped answering during {what}: {exc}",
                                 retryable=True) from None
    finally:
        if asking is not None:
            asking.close()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
