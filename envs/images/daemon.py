"""The docker daemon as the image code talks to it: a client (``docker_client``) whose calls give up once the daemon
has been silent ``ANSWER_TIMEOUT`` seconds, and ``patient`` around the calls that stream long work (a pull, a load,
an import, a push), which may go quiet for up to ``LONG_WORK_TIMEOUT``. A daemon that hangs (wedged, stopped,
restarting badly) then costs a rollout one bounded wait, failed as infrastructure, never a slot held for an hour;
a build passes its own timeout per call (``base_image.docker_build``)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from rollout.errors import ContainerStartError

ANSWER_TIMEOUT = 60
"""Seconds a daemon may be silent on a call that does no long work (an inspect, a list, a tag, a remove, the
client's version handshake): the docker CLI's and SDK's own default. Past it the daemon hangs."""
LONG_WORK_TIMEOUT = 3600
"""Seconds without a byte from the daemon on a call that streams long work: a silent install step of a build, the
unpacking of a large layer."""


class ImageError(ContainerStartError):
    """An image is missing and cannot be found, pulled or built; the message says how to get it."""

    def __init__(self, message: str = "", retryable: bool = False):
        super().__init__(message, retryable)


def docker_client(timeout: int = ANSWER_TIMEOUT) -> Any:
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
def patient(client: Any, seconds: int = LONG_WORK_TIMEOUT) -> Iterator[Any]:
    """``client`` waiting up to ``seconds`` for a byte on the calls made inside (the SDK reads its API client's
    ``timeout`` at each request, and a streamed response keeps the one it was opened with); its own timeout after.
    A client is one thread's (the SDK's HTTP session is not meant to be shared)."""
    before = client.api.timeout
    client.api.timeout = seconds
    try:
        yield client
    finally:
        client.api.timeout = before
