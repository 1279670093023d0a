"""Images for the apptainer runtime: finding the CLI, naming cached .sif files, and converting a reference once."""

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
"""Images given this way are converted once into a .sif in the cache; anything else is a local image path."""
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


def build_argv(binary: str, target: str, reference: str) -> list[str]:
    return [binary, "build", target, reference]


def default_cache_dir() -> str:
    if os.environ.get("ROLLOUT_HOME"):
        return os.path.join(os.environ["ROLLOUT_HOME"], ".apptainer-cache")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rollout-farm", "apptainer")


def cached_sif(cache_dir: str, reference: str) -> str:
    """A readable, collision-free file name per reference."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", reference).strip("._")[:80]
    return os.path.join(cache_dir, f"{safe}-{hashlib.sha256(reference.encode()).hexdigest()[:12]}.sif")


_conversions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Future]] = (
    weakref.WeakKeyDictionary()
)
"""Conversions in flight, per event loop: target .sif -> the task building it."""


async def ensure_sif(binary: str, image: str, cache_dir: str | None = None, timeout: float = 1800.0) -> str:
    """The .sif to start: a local image as is, a reference converted once. Concurrent callers in this
    process share one conversion; other processes build their own copy and rename it into place."""
    if not image.startswith(REFERENCE_PREFIXES):
        path = os.path.abspath(os.path.expanduser(image))
        if not os.path.exists(path):
            raise ContainerStartError(f"image {image!r}: no such file", retryable=False)
        return path
    target = cached_sif(cache_dir or default_cache_dir(), image)
    if os.path.exists(target):
        return target
    pending = _conversions.setdefault(asyncio.get_running_loop(), {})
    if target not in pending:
        task = pending[target] = asyncio.ensure_future(_convert(binary, image, target, timeout))
        # Marks the error retrieved even when every waiter was cancelled; a later call builds again.
        task.add_done_callback(lambda t: (pending.pop(target, None), t.cancelled() or t.exception()))
    await asyncio.shield(pending[target])  # one waiter's cancellation must not cancel the others' build
    return target


async def _convert(binary: str, reference: str, target: str, timeout: float) -> None:
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    except OSError as exc:
        raise ContainerStartError(f"cannot create the image cache: {exc}", retryable=False) from exc
    partial = f"{target[:-4]}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial.sif"
    try:
        ran = await run_capped(
            build_argv(binary, partial, reference), timeout=timeout, max_output_bytes=_BUILD_OUTPUT_CAP
        )
        if ran.returncode != 0 or ran.timed_out or not os.path.isfile(partial):
            raise ContainerStartError(
                f"converting {reference} into a .sif failed ({failure_reason(ran)}): {ran.output[-_TAIL:]}"
            )
        os.replace(partial, target)  # atomic: other processes see no file or a whole one
    finally:
        with contextlib.suppress(OSError):
            os.unlink(partial)
