"""One builder from a run config's ``serve`` section to a Serve application, and the application's life: start
it on the connected Ray cluster, wait until it answers, give the base URL, delete it at the end."""

from __future__ import annotations

import hashlib
import json
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, TextIO

from cluster.serving.config import ServeSection
from cluster.serving.controls import ModelControls
from cluster.serving.face_keys import FaceKeys, admit, forget
from cluster.serving.kinds import app_for
from cluster.session.ray_private import head_node_address, kv_del, kv_get, kv_put, serve_http_config
from cluster.session.serve_instance import quiet_reconnects, start_serve
from rollout.access import is_loopback, listening_line


@dataclass
class ServedModel:
    """A model the run talks to: its API root, its served name, whether this process deployed it, and the key its
    HTTP face requires (None: none)."""

    base_url: str
    model_id: str
    section: ServeSection
    deployed: bool = False
    api_key: str | None = None

    @property
    def root_url(self) -> str:
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    def controls(self) -> ModelControls:
        """The RL controls of this model (``cluster.serving.controls``), as its kind gives them."""
        return app_for(self.section).controls(self)

    def stop(self, wait: bool = True) -> None:
        """Delete the application this process deployed (unless ``keep``); an endpoint has nothing to stop.
        ``wait=False`` returns once Serve has been told (a run that ends: its replicas stop on their own time, and
        the next ``start`` of the same name waits for them)."""
        if self.deployed and not self.section.keep:
            from ray import serve

            serve.delete(self.section.name, _blocking=wait)
            forget(self.section.name)
            if not wait:  # a later call to the same controller returns once the delete has reached it: this
                serve.status()  # process may disconnect next, and a request still in its send queue would be lost
            self.deployed = False
        elif self.deployed and self.api_key:
            forget(self.section.name, self.api_key)  # kept: a later run admits its own key


def build_app(section: ServeSection, model_id: str, *, dataset: str | None = None, token: str | None = None) -> Any:
    """The Serve application ``section`` describes (its kind builds it; ``app: endpoint`` has none); ``token``: the
    key its HTTP face requires (None: none), and any a later run admits (``face_keys``)."""
    from cluster.serving.router import router_options  # it imports ray at its top (its router is Ray's)

    options = {**router_options(section.router, section.session_ttl), **section.num_replicas_options()}
    options.setdefault("logging_config", {"log_level": section.log_level, "enable_access_log": False})
    keys = FaceKeys(section.name, token) if token is not None else None
    return app_for(section).build(section, model_id, options, dataset=dataset, keys=keys)


def face_key(section: ServeSection) -> str | None:
    """The key the application's HTTP face requires: ``serve.api_key`` if set, else the section's generated one when
    Serve's proxies listen beyond loopback (as started, here or before), else None."""
    return section.key() if section.api_key or not is_loopback(serve_http_config().host) else None


def start(section: ServeSection, model_id: str, *, base_url: str | None = None, dataset: str | None = None,
          remote: bool = False, out: TextIO = sys.stderr) -> ServedModel:
    """Deploy ``section``'s application on the connected Ray cluster (Serve started if it is not) and wait until
    its models list names ``model_id``. A kind that deploys nothing (``app: endpoint``) gives its URL.
    ``remote``: callers on other machines use it (a run that joined a cluster): Serve's proxies listen on every
    interface (unless ``serve.host`` names one) and the URL names the head node's address, where Serve always keeps
    a proxy, never 127.0.0.1. ``cluster.assembly`` is the one caller."""
    kind = app_for(section)
    if not kind.deploys:
        return ServedModel(kind.url(section, base_url), model_id, section)
    # Quiet by default: an access-log line per model call drowns the run's progress (``serve.log_level``).
    quiet = {"log_level": section.log_level, "enable_access_log": False}
    remote = remote or spans_machines()
    host = "0.0.0.0" if remote and section.host == "127.0.0.1" else section.host
    asked = {name: getattr(section, name) for name in ("host", "port") if name in section.model_fields_set}
    start_serve(host, section.port or free_port(host), asked=asked, logging_config=quiet, out=out)
    root = proxy_url(remote)
    token = face_key(section)
    mark = fingerprint(section, model_id, dataset, keyed=token is not None)
    if token is not None:
        admit(section.name, token)  # a kept application takes it as it is; a new one from its start
    standing = standing_app(section, model_id, mark, root, out, token)
    if standing is not None:
        return standing
    app = build_app(section, model_id, dataset=dataset, token=token)
    wait_deleted(section.name, section.ready_timeout)
    t0 = time.perf_counter()
    print(f"serve: deploying {section.app} application {section.name!r} ({model_id})", file=out, flush=True)
    deploy(app, section)
    served = ServedModel(root + section.route_prefix.rstrip("/") + "/v1", model_id, section, deployed=True,
                         api_key=token)
    try:
        wait_ready(served.base_url, model_id, section.ready_timeout, app_name=section.name, token=token)
    except BaseException:
        served.stop()
        raise
    print(f"serve: {section.name!r} answers at {served.base_url} after {time.perf_counter() - t0:.1f}s",
          file=out, flush=True)
    say_access(served, out)
    kv_put(FINGERPRINTS + section.name, mark.encode())
    return served


def say_access(served: ServedModel, out: TextIO) -> None:
    """The one line on where the model's face listens and the key it needs."""
    line = listening_line(f"serve: the model {served.model_id!r}", served.base_url, served.api_key,
                          generated=served.section.api_key is None, field="serve.api_key")
    print(line, file=out, flush=True)


FINGERPRINTS = "rollout-farm/serve-fingerprint/"
"""Ray KV keys: what each application this project deployed was deployed from (``fingerprint``)."""


def fingerprint(section: ServeSection, model_id: str, dataset: str | None = None, keyed: bool = False) -> str:
    """What an application's answers depend on: its kind, model, engine and deployment options, policy, and whether
    its face requires a key (not which: a later run's is admitted, ``face_keys``; nor how long to wait for it, nor
    whether to keep it)."""
    fields = section.model_dump(exclude={"keep", "ready_timeout", "log_level"})
    parts = [fields, model_id, dataset] + (["keyed"] if keyed else [])
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def standing_app(section: ServeSection, model_id: str, mark: str, root: str, out: TextIO,
                 token: str | None = None) -> ServedModel | None:
    """The application already running on a standing cluster from the same fingerprint (a run before kept it,
    ``serve.keep``), reused instead of redeployed; None when there is none, or it differs, or it does not answer."""
    if app_status(section.name)[0] != "RUNNING" or kv_get(FINGERPRINTS + section.name) != mark.encode():
        return None
    served = ServedModel(root + section.route_prefix.rstrip("/") + "/v1", model_id, section, deployed=True,
                         api_key=token)
    try:
        wait_ready(served.base_url, model_id, 30.0, app_name=section.name, token=token)
    except (TimeoutError, RuntimeError):
        return None  # redeployed below
    print(f"serve: {section.name!r} is already running from the same model, options and policy: reused at "
          f"{served.base_url}", file=out, flush=True)
    say_access(served, out)
    return served


def forget_fingerprint(section: ServeSection | None) -> None:
    """The served weights changed (``reload_weights``): the next run must not take the application for the one
    its config describes."""
    if section is not None:
        kv_del(FINGERPRINTS + section.name)


def spans_machines() -> bool:
    """The connected cluster has more than one node: its workers may run on other machines."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive")) > 1


def proxy_url(remote: bool = False) -> str:
    """The root URL of Serve's HTTP proxy on this cluster (its host and port as Serve was started with); ``remote``:
    one other machines reach (the head node's address when the proxies listen on every interface)."""
    options = serve_http_config()
    everywhere = options.host in ("0.0.0.0", "::", "")
    if remote and not everywhere and options.host.startswith("127."):
        print(f"serve: Serve's proxies listen on {options.host} only (started so before this run): workers on "
              "other machines cannot reach the model; restart Serve (`serve shutdown`) or set serve.host: 0.0.0.0",
              file=sys.stderr, flush=True)
    host = (head_node_address() if remote else "127.0.0.1") if everywhere else options.host
    return f"http://{host}:{options.port}"


def deploy(app: Any, section: ServeSection) -> None:
    """Deploy ``app`` under ``section.name`` without ``serve.run``'s wait for RUNNING (it looks once a second):
    ``wait_ready`` sees it answer through the proxy sooner, and a failed deployment by its status."""
    from ray import serve

    try:
        from ray.serve.api import RunTarget
    except ImportError:  # a Ray without run_many
        RunTarget = None  # noqa: N806
    with quiet_reconnects():  # Serve is started (start_serve): no options are given here for it to refuse
        if RunTarget is None or not hasattr(serve, "run_many"):
            serve.run(app, name=section.name, route_prefix=section.route_prefix, blocking=False)
            return
        serve.run_many([RunTarget(target=app, name=section.name, route_prefix=section.route_prefix)],
                       wait_for_applications_running=False)


def app_status(name: str) -> tuple[str | None, str]:
    """The status of application ``name`` ("RUNNING", "DEPLOY_FAILED", ...; None: no such app) and its message."""
    from ray import serve

    app = serve.status().applications.get(name)
    if app is None:
        return None, ""
    return str(getattr(app.status, "value", app.status)), str(getattr(app, "message", "") or "")


def wait_deleted(name: str, timeout: float) -> None:
    """Return once no application ``name`` is being deleted (an earlier run's, stopped without waiting)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if app_status(name)[0] != "DELETING":
            return
        time.sleep(0.2)
    raise TimeoutError(f"the Serve application {name!r} of an earlier run was still being deleted after {timeout:g}s")


def wait_ready(base_url: str, model_id: str, timeout: float, app_name: str | None = None,
               token: str | None = None) -> None:
    """Poll ``GET {base_url}/models`` (with ``token``, the face's key) until it lists ``model_id`` and application
    ``app_name`` (if given) is RUNNING (every replica up: a router that saw one replica would put every first session
    on it); ``TimeoutError`` naming the last answer, a ``RuntimeError`` with Serve's message as soon as the
    application failed to deploy."""
    deadline, last, pause = time.monotonic() + timeout, "no answer yet", 0.05
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    while time.monotonic() < deadline:
        listed = False
        try:
            with urllib.request.urlopen(urllib.request.Request(base_url + "/models", headers=headers),
                                        timeout=10) as reply:
                body = reply.read().decode()
            listed = f'"{model_id}"' in body
            last = "answering; not every replica is up yet" if listed else \
                f"models list without {model_id!r}: {body[:200]}"
        except (urllib.error.URLError, OSError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        status, message = app_status(app_name) if app_name else (None, "")
        if listed and (app_name is None or status == "RUNNING"):
            return
        if status == "DEPLOY_FAILED":
            raise RuntimeError(f"the Serve application {app_name!r} failed to deploy: {message}")
        time.sleep(pause)
        pause = min(pause * 2, 0.2)  # an app that answers soon is seen soon
    raise TimeoutError(f"the served model {model_id!r} did not answer at {base_url} within {timeout:g}s; last: {last}")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host if host not in ("0.0.0.0", "::") else "", 0))
        return sock.getsockname()[1]
