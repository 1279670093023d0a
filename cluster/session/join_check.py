"""Whether the cluster an address names can be joined, asked before ``ray.init`` in one short call: something answers,
it is a Ray GCS, and it takes this process's authentication token.

Without it Ray answers a dead address (a cluster killed without ``ray stop`` leaves its address file behind) by
retrying for over ten minutes (20 tries of 40 s, deaf to SIGTERM meanwhile), printing warnings, and a cluster that
wants a token this process does not send with a warning a second for 20 s, then a traceback. Here each is one line
naming the fix (``ConfigError``). Anything else the probe cannot tell is left to ``ray.init``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from pathlib import Path
from typing import Iterator

from cluster.session.ray_private import address_file_for, enable_token_auth_if_available, gcs_probe_parts
from rollout.errors import ConfigError

PROBE_SECONDS = 10.0
"""How long the one call to the cluster may take."""
TOKEN_PLACES = "~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN"
"""Where Ray looks for its authentication token, in words."""


def check_join(address: str, field: str = "farm.address") -> None:
    """Raise ``ConfigError`` (on ``field``) when the cluster at ``address`` cannot be joined; return otherwise."""
    scheme, _, rest = address.partition("://") if "://" in address else ("", "", address)
    if scheme in ("http", "https"):
        raise ConfigError(f"{address} is a dashboard address (what `ray job submit` takes); to join the cluster give "
                          "its GCS address (host:6379) or its client address (ray://host:10001)", field)
    if scheme:  # a Ray client server: nothing to ask it short of connecting, so only whether it listens
        _check_listens(rest, address, field)
        return
    with _quiet_ray_logs():  # Ray's warnings on the way (which cluster `auto` picked) would bury the one line
        _check_gcs(address, field)


def _check_gcs(address: str, field: str) -> None:
    """Ask the GCS at ``address`` (host:port or ``auto``) for its cluster id, as ``ray.init`` is about to."""
    parts = gcs_probe_parts()
    try:
        import grpc  # comes with ray, an extra
    except ImportError:
        parts = None
    if parts is None:  # another Ray's internals: ray.init says what is wrong, as it would have
        return
    services, init_grpc_channel, gcs_service_pb2, gcs_service_pb2_grpc = parts
    if address == "auto":
        _token_as_auto_would()
    try:
        target = services.canonicalize_bootstrap_address(address)
    except ConnectionError:
        raise ConfigError(f"`auto` found no running Ray cluster on this machine: give its address, {_instead(field)}",
                          field) from None
    except ValueError:
        raise ConfigError(f"{address!r} is not a Ray address (host:port, auto or ray://host:port)", field) from None
    if target is None:  # "local": a new cluster, nothing to join
        return
    where = target + _origin(address, target, field)
    instead = _instead(field)
    channel = init_grpc_channel(target)
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
            gcs_service_pb2.GetClusterIdRequest(), timeout=PROBE_SECONDS)
    except grpc.RpcError as exc:
        code = exc.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            reason = (f"no answer within {PROBE_SECONDS:g}s" if code == grpc.StatusCode.DEADLINE_EXCEEDED
                      else "connection refused" if "refused" in (exc.details() or "") else "unreachable")
            raise ConfigError(f"no Ray cluster answers at {where}: {reason}; start it or fix the address, {instead}",
                              field) from None
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise ConfigError(_token_refused(where), field) from None
        if code == grpc.StatusCode.UNIMPLEMENTED:
            raise ConfigError(f"{where} answers, but not as a Ray cluster's GCS (the dashboard's port?); give the "
                              "GCS address (host:6379) or ray://host:10001", field) from None
    finally:
        channel.close()


def _token_refused(where: str) -> str:
    """The one line for a cluster that refused this process: which token it sent, and how to send the right one."""
    have = _token_at_hand()
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        if have:
            return (f"the Ray cluster at {where} requires an authentication token: run with RAY_AUTH_MODE=token (Ray "
                    f"sends the token it has, {have}, to a named cluster only then)")
        return (f"the Ray cluster at {where} requires an authentication token: run with RAY_AUTH_MODE=token and "
                f"the cluster's token in {TOKEN_PLACES}")
    sent = have or f"none found in {TOKEN_PLACES}"
    return (f"the Ray cluster at {where} refused this process's authentication token ({sent}): give it the "
            f"cluster's token (`ray get-auth-token` on its head node) in {TOKEN_PLACES}")


def _token_at_hand() -> str | None:
    """Where Ray would take this process's token from, in words; None without one."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "in RAY_AUTH_TOKEN"
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    return f"in {path}" if path.is_file() else None


def _origin(address: str, target: str, field: str) -> str:
    """Where ``target`` came from, when the address did not say it outright."""
    if field == "RAY_ADDRESS":
        return " (from $RAY_ADDRESS)"
    if address != "auto":
        return ""
    if os.environ.get("RAY_ADDRESS"):
        return " (`auto` took it from $RAY_ADDRESS)"
    written = address_file_for(target)
    if written:
        return (f" (`auto` read it from {written}, which the last `ray start` here wrote "
                "and a cluster killed without `ray stop` leaves behind)")
    return " (`auto` found its GCS process on this machine)"


def _instead(field: str) -> str:
    """The way out that needs no cluster at all."""
    what = "or unset RAY_ADDRESS" if field == "RAY_ADDRESS" else "or leave the address out"
    return f"{what} to run on an embedded cluster of the run's own"


@contextlib.contextmanager
def _quiet_ray_logs() -> Iterator[None]:
    """Ray's Python loggers hold back everything below ERROR inside the block."""
    logger = logging.getLogger("ray")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _token_as_auto_would() -> None:
    """``ray.init("auto")`` turns token authentication on when a token is at hand and RAY_AUTH_MODE is unset (an
    explicit address never does): the probe sends what ray.init will send."""
    enable_token_auth_if_available()


def _check_listens(host_port: str, address: str, field: str) -> None:
    host, _, port = host_port.rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{address!r} is not a Ray address (host:port, auto or ray://host:port)", field)
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_SECONDS):
            pass
    except OSError as exc:
        reason = f"no answer within {PROBE_SECONDS:g}s" if isinstance(exc, socket.timeout) else (
            exc.strerror or type(exc).__name__).lower()
        raise ConfigError(f"no Ray client server answers at {address}: {reason}; start it or fix the address, "
                          f"{_instead(field)}", field) from None
