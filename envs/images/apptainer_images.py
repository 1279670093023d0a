"""Images for the apptainer runtime: finding the CLI, naming cached images, and converting a source once per node.

A source is a local image (a .sif file or a sandbox directory), a reference apptainer builds from
(``docker-daemon:``, ``docker-archive:``, ``docker://``, ``oras://``, ``library://``), or a bare image name (the
SWE environment's instance images), read through ``transport``. Each is converted once into the node's cache, into a
sandbox directory by default: an unprivileged user without squashfuse or a loop device cannot mount a SIF, and
apptainer would then unpack it again for every instance."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import uuid
import weakref

from envs.runtimes.process import failure_reason, run_capped
from rollout.errors import ContainerStartError

INSTALL_HINT = "install apptainer (https://apptainer.org) or singularity, or use runtime.type: docker/local"
REFERENCE_PREFIXES = ("docker-daemon:", "docker-archive:", "docker://", "oras://", "library://")
"""Images given this way are built from once into the cache."""
TRANSPORTS = {"docker-daemon": "docker-daemon:", "docker": "docker://", "oras": "oras://", "library": "library://"}
"""Where a bare image name is read from (``runtime.transport``): ``docker-daemon`` reads ``rollout-farm/instance:x``
as ``docker-daemon:rollout-farm/instance:x``."""
_BUILD_OUTPUT_CAP = 1 << 20
"""Output kept from a conversion (only its tail is ever shown)."""
_TAIL = 2000


def find_binary(binary: str | None = None) -> str:
    """The CLI's path, or ``ContainerStartError`` naming what to install."""
    found = shutil.which(binary) if binary else shutil.which("apptainer") or shutil.which("singularity")
    if found is None:
        what = f"{binary!r} was not found" if binary else "neither apptainer nor singularity is on PATH"
        raise ContainerStartError(f"the apptainer runtime cannot start: {what}; {INSTALL_HINT}", retryable=False)
    return found


def build_argv(binary: str, target: str, reference: str, sandbox: bool = False) -> list[str]:
    return [binary, "build", *(["--sandbox"] if sandbox else []), target, reference]


def source_of(image: str, transport: str = "docker-daemon") -> tuple[str, bool]:
    """``(source, local)``: a local image path (absolute), or the reference to build from."""
    if image.startswith(REFERENCE_PREFIXES):
        return image, False
    path = os.path.abspath(os.path.expanduser(image))
    if image.startswith(("/", ".", "~")) or image.endswith(".sif") or os.path.exists(path):
        return path, True
    return TRANSPORTS[transport] + image, False


def default_cache_dir() -> str:
    if os.environ.get("ROLLOUT_HOME"):
        return os.path.join(os.environ["ROLLOUT_HOME"], ".apptainer-cache")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rollout-farm", "apptainer")


def cached_sif(cache_dir: str, reference: str, sandbox: bool = False) -> str:
    """A readable, collision-free name per reference: a .sif file, or a sandbox directory."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", reference).strip("._")[:80]
    name = f"{safe}-{hashlib.sha256(reference.encode()).hexdigest()[:12]}"
    return os.path.join(cache_dir, name if sandbox else f"{name}.sif")


_conversions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Future]] = (
    weakref.WeakKeyDictionary()
)
"""Conversions in flight, per event loop: target .sif -> the task building it."""


async def ensure_sif(
    binary: str, image: str, cache_dir: str | None = None, timeout: float = 1800.0, *, convert_to: str = "sif",
    transport: str = "docker-daemon",
) -> str:
    """The image to start: a local sandbox directory (or a .sif, unless ``convert_to`` is ``sandbox``) as is;
    anything else converted once into the cache. Concurrent callers in this process share one conversion; other
    processes build their own copy and rename it into place (the first one there wins)."""
    source, local = source_of(image, transport)
    sandbox = convert_to == "sandbox"
    if local:
        if not os.path.exists(source):
            raise ContainerStartError(f"image {image!r}: no such file or directory", retryable=False)
        if os.path.isdir(source) or not sandbox:
            return source
    key = source
    if source.startswith("docker-daemon:"):  # a rebuilt image under the same name is converted again
        key = f"{source}@{await _daemon_image_id(source.removeprefix('docker-daemon:'))}"
    target = cached_sif(cache_dir or default_cache_dir(), key, sandbox)
    if os.path.exists(target):
        return target
    pending = _conversions.setdefault(asyncio.get_running_loop(), {})
    if target not in pending:
        task = pending[target] = asyncio.ensure_future(_convert(binary, source, target, timeout, sandbox))
        # Marks the error retrieved even when every waiter was cancelled; a later call builds again.
        task.add_done_callback(lambda t: (pending.pop(target, None), t.cancelled() or t.exception()))
    await asyncio.shield(pending[target])  # one waiter's cancellation must not cancel the others' build
    return target


async def _daemon_image_id(reference: str) -> str:
    """The image's id in this node's docker (``DOCKER_HOST``), or ``unknown`` when the docker CLI cannot say."""
    if shutil.which("docker") is None:
        return "unknown"
    ran = await run_capped(["docker", "image", "inspect", "--format", "{{.Id}}", reference], timeout=60,
                           max_output_bytes=4096)
    digest = ran.output.strip().removeprefix("sha256:")
    return digest[:16] if ran.returncode == 0 and re.fullmatch(r"[0-9a-f]{16,}", digest) else "unknown"


async def _convert(binary: str, reference: str, target: str, timeout: float, sandbox: bool) -> None:
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    except OSError as exc:
        raise ContainerStartError(f"cannot create the image cache: {exc}", retryable=False) from exc
    stem = target[:-4] if target.endswith(".sif") else target
    partial = f"{stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial" + ("" if sandbox else ".sif")
    try:
        ran = await run_capped(
            build_argv(binary, partial, reference, sandbox), timeout=timeout, max_output_bytes=_BUILD_OUTPUT_CAP
        )
        if ran.returncode != 0 or ran.timed_out or not os.path.exists(partial):
            raise ContainerStartError(
                f"converting {reference} into {'a sandbox' if sandbox else 'a .sif'} failed ({failure_reason(ran)}): "
                f"{ran.output[-_TAIL:]}"
            )
        try:
            os.replace(partial, target)  # atomic: other processes see nothing or a whole image
        except OSError:
            if not os.path.isdir(target):  # another process's sandbox got there first: keep it, drop ours
                raise
    finally:
        await asyncio.to_thread(remove_image, partial)


def remove_image(path: str) -> None:
    """Remove a .sif or a sandbox directory (whose read-only directories an unprivileged build leaves)."""
    if os.path.isdir(path) and not os.path.islink(path):
        def writable_then_retry(function, name, _exc):
            with contextlib.suppress(OSError):
                os.chmod(os.path.dirname(name), 0o700)
                function(name)

        shutil.rmtree(path, onerror=writable_then_retry)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)
