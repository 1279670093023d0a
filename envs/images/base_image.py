"""The base image from debootstrap (no registry needed), and finding an image at run time."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from envs.images.daemon import LONG_WORK_TIMEOUT, ImageError, docker_client, watched
from envs.images.image_names import DEFAULT_BASE_IMAGE, image_for, is_instance_tag
from envs.images.sources import fetch_image
from envs.runtimes.output import decode

__all__ = ["DEFAULT_BASE_IMAGE", "build_base_image", "ensure_image", "image_for", "image_present"]

BASE_REPOSITORY = DEFAULT_BASE_IMAGE.split(":")[0]
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-pytest", "git", "patch", "procps", "coreutils", "ca-certificates")
BASE_CHANGES = ('CMD ["bash"]', "ENV LANG=C.UTF-8",
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "WORKDIR /")
DEBOOTSTRAP_TIMEOUT = 3600
_base_lock = threading.Lock()  # one debootstrap at a time per process


ENGINE_FAILURES = ("OCI runtime", "shim task", "runc", "containerd")
"""Words of a build step that failed because the engine could not start the step's container (its runtime failed
under load, say), not because the step's command failed: another try may pass."""


def docker_build(client: Any, tag: str, **options: Any) -> None:
    """``client.images.build(tag=tag, **options)``, its failure an ``ImageError`` naming the tag: a failed step with
    the build's last lines (final, unless the engine failed to run the step: ``ENGINE_FAILURES``), the daemon's error
    or its silence past the build's ``timeout`` (default ``LONG_WORK_TIMEOUT``: a silent install step can be long;
    retryable)."""
    import docker

    options.setdefault("timeout", LONG_WORK_TIMEOUT)
    try:
        watched(client, lambda: client.images.build(tag=tag, **options), f"the build of {tag}")
    except docker.errors.BuildError as exc:
        lines = [str(e.get("stream") or e.get("error") or "") for e in exc.build_log]
        engine = any(word in str(exc.msg) for word in ENGINE_FAILURES)
        raise ImageError(f"docker build of {tag} failed: {exc.msg}\n{last_lines(''.join(lines))}",
                         retryable=engine) from None
    except docker.errors.APIError as exc:
        raise ImageError(f"docker build of {tag} failed: {exc}", retryable=True) from None
    except Exception as exc:  # a timeout from the client's HTTP session
        raise ImageError(f"docker build of {tag} did not finish: {type(exc).__name__}: {exc}", retryable=True) from None


def image_present(client: Any, image: str) -> bool:
    """Whether the daemon holds ``image``; an ``ImageError`` (retryable) when it fails or does not answer in time."""
    import docker

    try:
        client.images.get(image)
        return True
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.APIError as exc:
        raise ImageError(f"cannot inspect image {image}: {exc}", retryable=True) from None
    except OSError as exc:  # the HTTP session's own: a connection refused or dropped, a daemon silent past the timeout
        raise ImageError(f"the docker daemon did not answer an inspect of {image}: {exc}", retryable=True) from None


# ---- the base image -------------------------------------------------------------------------


def build_base_image(tag: str = DEFAULT_BASE_IMAGE, mirror: str = DEFAULT_MIRROR, suite: str = "bookworm",
                     packages: tuple[str, ...] = BASE_PACKAGES, force: bool = False,
                     log: Callable[[str], Any] = print, workdir: str | None = None) -> str:
    """Debian ``suite`` (minbase + ``packages``) from ``mirror``, imported as ``tag``; skipped when present.
    The temporary rootfs (~400 MB) goes under ``workdir`` (default: the system temp dir) and is always removed."""
    client = docker_client()
    with _base_lock:
        if not force and image_present(client, tag):
            log(f"{tag}: present")
            return tag
        debootstrap = shutil.which("debootstrap")
        if debootstrap is None:
            raise ImageError(f"cannot build {tag}: debootstrap is not installed (apt-get install debootstrap)")
        if os.geteuid() != 0:
            raise ImageError(f"cannot build {tag}: debootstrap needs root (run `rollout images base` as root)")
        began = time.monotonic()
        rootfs = tempfile.mkdtemp(prefix="rollout-base-", dir=workdir)
        try:
            log(f"{tag}: debootstrap {suite} from {mirror} (about a minute)")
            _debootstrap(debootstrap, suite, rootfs, mirror, packages, tag)
            log(f"{tag}: importing into docker")
            _import_rootfs(client, rootfs, tag)
        finally:
            _remove_rootfs(rootfs, log)
        log(f"{tag}: built in {time.monotonic() - began:.0f}s")
        return tag


def _debootstrap(binary: str, suite: str, rootfs: str, mirror: str, packages: tuple[str, ...], tag: str) -> None:
    cmd = [binary, "--variant=minbase", f"--include={','.join(packages)}", suite, rootfs, mirror]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=DEBOOTSTRAP_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ImageError(f"cannot build {tag}: debootstrap took over {DEBOOTSTRAP_TIMEOUT}s", retryable=True) from None
    if done.returncode != 0:
        detail = decode(done.stdout + done.stderr)
        log_file = Path(rootfs, "debootstrap", "debootstrap.log")
        if log_file.is_file():  # the reason is often only here
            detail += "\n" + log_file.read_text(errors="replace")
        raise ImageError(f"cannot build {tag}: debootstrap exited {done.returncode}:\n{last_lines(detail)}",
                         retryable=True)
    # Package downloads and indexes are dead weight in the image (apt-get update refreshes them).
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in Path(rootfs, leftover).glob("*"):
            if entry.is_file():
                entry.unlink()


def _import_rootfs(client: Any, rootfs: str, tag: str) -> None:
    """Stream ``tar`` of the rootfs straight into the daemon: no tarball on disk, no copy in memory."""
    repository, _, version = tag.rpartition(":") if ":" in tag.split("/")[-1] else (tag, "", "latest")
    with tempfile.TemporaryFile() as errors:  # a file, not a pipe: tar's warnings can never block it
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", rootfs, "-cf", "-", "."],
                               stdout=subprocess.PIPE, stderr=errors)

        def chunks() -> Iterator[bytes]:
            while block := tar.stdout.read(1 << 20):
                yield block

        try:
            watched(client, lambda: client.api.import_image(src=chunks(), repository=repository, tag=version,
                                                            changes=list(BASE_CHANGES), stream_src=True),
                    f"the import of {tag}")
        except Exception as exc:  # the SDK raises requests' and its own errors alike
            raise ImageError(f"cannot import {tag}: {exc}", retryable=True) from None
        finally:
            tar.stdout.close()  # a failed import leaves tar writing: this ends it (broken pipe)
            tar.wait()
        if tar.returncode != 0:  # a truncated stream may still have been imported: never keep it
            client.images.remove(tag, force=True)
            errors.seek(0)
            raise ImageError(f"cannot import {tag}: tar exited {tar.returncode}: {last_lines(decode(errors.read()))}")


def _remove_rootfs(rootfs: str, log: Callable[[str], Any]) -> None:
    """Remove the temporary rootfs, unmounting first whatever a killed debootstrap left mounted in it
    (rmtree would otherwise walk into the host's /proc or /sys)."""
    root = os.path.realpath(rootfs) + "/"
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[1].replace("\\040", " ") for line in f]
    for point in sorted((m for m in mounts if m.startswith(root)), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    with open("/proc/self/mounts") as f:
        if any(line.split()[1].startswith(root) for line in f):
            log(f"left {rootfs} in place: something is still mounted inside it")
            return
    shutil.rmtree(rootfs, ignore_errors=True)


# ---- finding an image at run time -----------------------------------------------------------


def ensure_image(image: str, client: Any = None, log: Callable[[str], Any] = print) -> None:
    """Return when ``image`` is present: found, built (the default base) or pulled; else an ImageError
    saying how to get it."""
    client = client or docker_client()
    if image_present(client, image):
        return
    with _image_lock(image):  # one fetch, build or pull per image however many rollouts wait for it
        if image_present(client, image) or fetch_image(image, client) is not None:
            return
        _build_or_pull(image, client, log)


def _build_or_pull(image: str, client: Any, log: Callable[[str], Any]) -> None:
    import docker

    if image == DEFAULT_BASE_IMAGE:
        try:
            build_base_image(image, log=log)
            return
        except ImageError as exc:
            raise ImageError(f"image {image} is missing and cannot be built here: {exc}") from None
    if image.startswith(BASE_REPOSITORY + ":"):
        raise ImageError(f"image {image} is missing: build it with `rollout images base --tag {image}`")
    if is_instance_tag(image):
        raise ImageError(f"image {image} is missing: build it with `rollout images build DATASET`")
    try:
        watched(client, lambda: client.images.pull(image), f"the pull of {image}")
    except docker.errors.APIError as exc:
        reason = getattr(exc, "explanation", None) or exc
        raise ImageError(f"image {image} is missing and could not be pulled ({reason}): give the rows a repo_path "
                         "and run `rollout images build DATASET`, or `docker load` the image") from None


_image_locks: dict[str, threading.Lock] = {}
_image_locks_guard = threading.Lock()


def _image_lock(image: str) -> threading.Lock:
    with _image_locks_guard:
        return _image_locks.setdefault(image, threading.Lock())


def last_lines(text: str, lines: int = 20) -> str:
    """The end of a long log, which is where tools say what went wrong."""
    return "\n".join(text.strip().splitlines()[-lines:])
