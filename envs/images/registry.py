"""A registry every node can reach (``images.registry: HOST:PORT/prefix``): ``rollout images build`` pushes the base
and instance images there, and a node pulls what it lacks (only the layers it has not got) under the image's own
name. The registry name of ``rollout-farm/instance:x`` is ``HOST:PORT/prefix/rollout-farm/instance:x``.

Credentials come from ``ROLLOUT_REGISTRY_USERNAME`` / ``ROLLOUT_REGISTRY_PASSWORD`` or, without them, from the
docker config of the machine (``docker login``); they are never printed or written anywhere. ``check_registry``
tries them before work starts, so a wrong one is one clear error, not a run of failed pulls.
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import urllib.error
import urllib.request
from typing import Any, Callable

from envs.images.daemon import ImageError, watched
from rollout.errors import ConfigError

USER_VARIABLE, PASSWORD_VARIABLE = "ROLLOUT_REGISTRY_USERNAME", "ROLLOUT_REGISTRY_PASSWORD"
_NAME = re.compile(r"[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*")


def registry_problem(value: str) -> str | None:
    """Why ``value`` cannot name a registry and prefix (``HOST:PORT/prefix``), or None."""
    if not _NAME.fullmatch(value or "") or "." not in value.split("/")[0] and ":" not in value.split("/")[0] \
            and value.split("/")[0] != "localhost":
        return (f"{value!r} is not HOST[:PORT][/prefix] (a host with a dot or a port, or localhost, e.g. "
                "127.0.0.1:5000/rollout-farm)")
    return None


def credentials() -> dict[str, str] | None:
    """The registry login from the environment, or None (the docker config's is used then)."""
    user, password = os.environ.get(USER_VARIABLE), os.environ.get(PASSWORD_VARIABLE)
    return {"username": user, "password": password or ""} if user else None


def split(image: str) -> tuple[str, str]:
    """``(repository, tag)`` of an image name (``latest`` when it has none)."""
    last = image.rsplit("/", 1)[-1]
    return (image.rsplit(":", 1)[0], image.rsplit(":", 1)[1]) if ":" in last else (image, "latest")


class RegistrySource:
    """An ``envs.images.sources.ImageSource``: pull ``prefix/<image>``, then tag it as ``<image>``."""

    layered = True

    def __init__(self, prefix: str):
        self.prefix = prefix.rstrip("/")
        self.name = f"registry {self.prefix}"

    def remote(self, image: str) -> str:
        return f"{self.prefix}/{image}"

    def fetch(self, image: str, client: Any) -> int | None:
        import docker

        repository, tag = split(self.remote(image))
        layers: dict[str, int] = {}  # layer -> bytes downloaded (a layer the node has is "Already exists": none)
        try:
            for event in client.api.pull(repository, tag=tag, stream=True, decode=True, auth_config=credentials()):
                if event.get("error"):
                    raise docker.errors.APIError(event["error"])
                total = (event.get("progressDetail") or {}).get("total")
                if event.get("status") == "Downloading" and total:
                    layers[event.get("id", "")] = int(total)
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            text = str(getattr(exc, "explanation", None) or exc)
            if "manifest unknown" in text or "not found" in text.lower():
                return None  # the registry has not got it: another source, or a build here
            raise ImageError(f"pulling {repository}:{tag} failed: {text}", retryable=True) from None
        local_repository, local_tag = split(image)
        client.images.get(f"{repository}:{tag}").tag(local_repository, local_tag)
        client.api.remove_image(f"{repository}:{tag}", noprune=True)  # untag: the image keeps its own name
        return sum(layers.values())

    def push(self, image: str, client: Any, log: Callable[[str], Any] = print) -> None:
        """Push ``image`` (present here) as ``prefix/<image>``; an ``ImageError`` names what the registry said."""
        repository, tag = split(self.remote(image))
        client.images.get(image).tag(repository, tag)
        try:
            lines = watched(client, lambda: list(client.api.push(repository, tag=tag, stream=True, decode=True,
                                                                 auth_config=credentials())),
                            f"the push of {image}")
            for line in lines:
                if line.get("error"):
                    raise ImageError(f"pushing {image} to {self.prefix} failed: {line['error']}", retryable=True)
        finally:
            client.api.remove_image(f"{repository}:{tag}", noprune=True)
        log(f"pushed {image} to {self.prefix}")


def check_registry(prefix: str, field: str = "images.registry", timeout: float = 10.0) -> None:
    """The registry answers and takes this machine's credentials (its ``/v2/`` route), else a ``ConfigError``.
    As docker does: plain HTTP on the loopback, else HTTPS first and plain HTTP when the registry answers TLS with
    plain HTTP (a registry the daemons list as insecure, as a cluster's internal one often is)."""
    host = prefix.split("/")[0]
    login = credentials() or _docker_config_login(host)
    try:
        _ask(host, "http" if _plain_http(host) else "https", login, timeout)
    except urllib.error.URLError as exc:
        if not isinstance(exc.reason, ssl.SSLError) or _plain_http(host):
            _refuse(host, exc, login, field)
        try:
            _ask(host, "http", login, timeout)
        except (urllib.error.URLError, OSError) as plain:
            _refuse(host, plain, login, field)
    except OSError as exc:
        _refuse(host, exc, login, field)


def _ask(host: str, scheme: str, login: dict[str, str] | None, timeout: float) -> None:
    request = urllib.request.Request(f"{scheme}://{host}/v2/")
    if login:
        token = base64.b64encode(f"{login['username']}:{login['password']}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return
    except urllib.error.HTTPError as exc:
        if exc.code < 500 and exc.code != 401:  # a /v2/ that answers at all is a registry we can talk to
            return
        raise


def _refuse(host: str, exc: OSError, login: dict[str, str] | None, field: str) -> None:
    """The ``ConfigError`` for what ``_ask`` raised."""
    if isinstance(exc, urllib.error.HTTPError):
        if exc.code == 401:
            why = "refused the credentials given" if login else "needs credentials"
            raise ConfigError(f"the registry {host} {why} (set {USER_VARIABLE} and {PASSWORD_VARIABLE}, or "
                              "`docker login` on every node)", field) from None
        raise ConfigError(f"the registry {host} answered {exc.code}", field) from None
    raise ConfigError(f"the registry {host} cannot be reached: {getattr(exc, 'reason', exc)}", field) from None


def _plain_http(host: str) -> bool:
    """Docker talks plain HTTP to a registry on the loopback (its default insecure registries)."""
    name = host.split(":")[0]
    return name in ("localhost", "::1") or name.startswith("127.")


def _docker_config_login(host: str) -> dict[str, str] | None:
    path = os.path.join(os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker"), "config.json")
    try:
        with open(path) as f:
            auth = json.load(f).get("auths", {}).get(host, {}).get("auth")
    except (OSError, ValueError):
        return None
    if not auth:
        return None
    user, _, password = base64.b64decode(auth).decode(errors="replace").partition(":")
    return {"username": user, "password": password}
