"""Harness layers: pip requirements installed on top of any image as a layer of their own, from wheels fetched on the
building machine (containers have no network), each console script a wrapper that keeps the packages off its children.

The packages go to ``LIB_DIR``, which is on no path but the wrappers': ``/usr/local/bin/<script>`` runs the image's
own Python with ``LIB_DIR`` first on ``sys.path`` and exports nothing, so the commands a harness runs (an agent's
shell commands, a repository's tests) see the image as it was. The wheels are chosen for that Python (asked in a
throwaway container) and kept per requirement set under ``harness_cache_dir()``; the image is tagged
``rollout-farm/harness:<image>-<hash>`` and reused while the base image and the requirements stay the same.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from envs.images.base_image import docker_build, ensure_image, last_lines
from envs.images.daemon import LONG_WORK_TIMEOUT, ImageError, docker_client
from envs.images.image_names import HASH_LENGTH, MAX_TAG_LENGTH, sanitise_tag
from envs.runtimes.output import decode

RECIPE_VERSION = 1
"""Part of every hash here: bumped when the layer's recipe changes, so nothing an older recipe made is reused."""
HARNESS_REPOSITORY = "rollout-farm/harness"
LIB_DIR = "/opt/rollout-harness/lib"
"""Where the packages go in the image; on the wrappers' ``sys.path`` only."""
LABEL = "rollout-farm.harness"
"""On every harness image; its value is the hash in the tag."""
PIP_TIMEOUT = 1800
PROBE = (
    "import json, os, platform, sys; print(json.dumps({'python': sys.executable, "
    "'version': '%d.%d' % sys.version_info[:2], 'machine': platform.machine(), 'libc': platform.libc_ver(), "
    "'commands': sorted({n for d in os.environ.get('PATH', '').split(os.pathsep) if os.path.isdir(d) "
    "for n in os.listdir(d)})}))"
)
"""What the harness needs to know of the image's Python: where it is, its version and platform (which wheels fit),
and the commands already on its PATH (a dependency's script never replaces one)."""
PROBE_ULIMITS = {"nofile": 20000, "nproc": 4096}

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def ensure_harness_image(image: str, requirements: Sequence[str], client: Any = None,
                         progress: Callable[[str], Any] = print) -> str:
    """The tag of an image built ``FROM image`` with the pip ``requirements`` installed as a layer of their own
    (``image`` itself when there are none). Present: reused; missing: built here, once per tag in this process
    however many rollouts ask. An ``ImageError`` names a requirement that has no wheel for the image's Python."""
    requirements = [str(r).strip() for r in requirements if str(r).strip()]
    if not requirements:
        return image
    client = client or docker_client()
    if not _present(client, image):
        ensure_image(image, client)
    tag = harness_tag(image, _image_id(client, image), requirements)
    with _locks_guard:
        lock = _locks.setdefault(tag, threading.Lock())
    with lock:
        if not _present(client, tag):
            progress(f"harness: building {tag} on {image}: {' '.join(requirements)} (pip, then docker build; once "
                     "per machine)")
            t0 = time.monotonic()
            _build(client, image, tag, requirements)
            progress(f"harness: {tag} built in {time.monotonic() - t0:.0f}s")
    return tag


def harness_tag(image: str, image_id: str, requirements: Sequence[str]) -> str:
    """``rollout-farm/harness:<image's name and tag>-<hash of (recipe, image id, requirements)>``."""
    identity = [RECIPE_VERSION, image_id or image, sorted(requirements)]
    digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:HASH_LENGTH]
    name = image.split("@", 1)[0].rsplit("/", 1)[-1]
    readable = sanitise_tag(name.replace(":", "-"))[: MAX_TAG_LENGTH - HASH_LENGTH - 1].rstrip(".-") or "image"
    return f"{HARNESS_REPOSITORY}:{readable}-{digest}"


def harness_cache_dir() -> Path:
    """Where installed requirement sets are kept: ``$XDG_CACHE_HOME/rollout-farm/harness`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "rollout-farm", "harness")


# ---- building -------------------------------------------------------------------------------


def _build(client: Any, image: str, tag: str, requirements: list[str]) -> None:

    found = _probe(client, image)
    lib = _installed(requirements, found)
    wanted = {_normalise(_requirement_name(r)) for r in requirements}
    with tempfile.TemporaryDirectory(prefix="rollout-harness-", dir=lib.parent.parent) as context:
        shutil.copytree(lib, Path(context, "lib"), copy_function=_link_or_copy, symlinks=True)
        scripts = Path(context, "bin")
        scripts.mkdir()
        for name, text in _wrappers(lib, found["python"], wanted, set(found["commands"])).items():
            path = scripts / name
            path.write_text(text)
            path.chmod(0o755)
        user = (_inspect(client, image).get("Config") or {}).get("User") or ""
        Path(context, "Dockerfile").write_text(_dockerfile(image, tag, found["python"], user))
        # the client's timeout is the daemon's silence we bear (copying and compiling a large harness says nothing)
        docker_build(client, tag, path=context, rm=True, forcerm=True, pull=False, network_mode="none",
                     timeout=LONG_WORK_TIMEOUT)


def _dockerfile(image: str, tag: str, python: str, user: str) -> str:
    lines = [
        f"FROM {image}",
        f"LABEL {LABEL}={json.dumps(tag.rsplit('-', 1)[-1])}",
        "USER root",  # the layer is root's whoever the image runs as; the image's USER comes back below
        f"COPY lib {LIB_DIR}",
        "COPY bin/ /usr/local/bin/",
        # Byte-compiled once here, by the Python that runs it: otherwise every container compiles the harness again.
        "RUN " + json.dumps([python, "-c", f"import compileall; compileall.compile_dir({LIB_DIR!r}, quiet=2)"]),
    ]
    if user:
        lines.append(f"USER {user}")
    return "\n".join(lines) + "\n"


def _wrappers(lib: Path, python: str, wanted: set[str], commands: set[str]) -> dict[str, str]:
    """``{script name: sh wrapper}`` for the console scripts the installed distributions declare. A dependency's
    script never replaces a command the image already has (a requested distribution's always does)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=[str(lib)]):
        own = _normalise(dist.metadata["Name"] or "") in wanted
        for entry in dist.entry_points:
            if entry.group != "console_scripts" or not entry.attr or "/" in entry.name:
                continue
            if entry.name in commands and not own:
                continue
            head, _, rest = entry.attr.partition(".")
            call = f"{head}.{rest}" if rest else head
            # With -c, sys.path[0] is the current directory: the library takes its place, so a repository's own
            # modules (a json.py, a yaml/) never shadow the harness's.
            code = (f"import sys; sys.path[0:1] = [{LIB_DIR!r}]; sys.argv[0] = {'/usr/local/bin/' + entry.name!r}; "
                    f"from {entry.module} import {head}; sys.exit({call}())")
            found[entry.name] = (f"#!/bin/sh\n# {entry.name} of {dist.metadata['Name']}, from the harness layer: its "
                                 f"packages stay off the path of what it runs\nexec {shlex.quote(python)} -c "
                                 f"{shlex.quote(code)} \"$@\"\n")
    return found


def _installed(requirements: list[str], found: dict[str, Any]) -> Path:
    """The requirements installed for the image's Python and platform: a cached directory per requirement set."""
    platforms = _platforms(found["machine"], found["libc"])
    identity = [RECIPE_VERSION, found["version"], platforms, sorted(requirements)]
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]
    done = harness_cache_dir() / key / "lib"
    if done.is_dir():
        return done
    if importlib.util.find_spec("pip") is None:
        raise ImageError(f"cannot install the harness {requirements}: pip is missing from {sys.executable} "
                         "(it fetches the wheels on this machine): install pip there")
    done.parent.mkdir(parents=True, exist_ok=True)
    target = Path(tempfile.mkdtemp(prefix="installing-", dir=done.parent))
    argv = [sys.executable, "-m", "pip", "install", "--target", str(target), "--only-binary=:all:",
            "--python-version", found["version"], "--implementation", "cp", "--no-compile", "--no-input",
            "--disable-pip-version-check", "--no-warn-script-location", "--progress-bar", "off"]
    for platform_tag in platforms:
        argv += ["--platform", platform_tag]
    try:
        ran = subprocess.run([*argv, *requirements], capture_output=True, timeout=PIP_TIMEOUT)
    except subprocess.TimeoutExpired:
        shutil.rmtree(target, ignore_errors=True)
        raise ImageError(f"pip install of the harness {requirements} took over {PIP_TIMEOUT}s",
                         retryable=True) from None
    if ran.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        raise _pip_error(decode(ran.stdout + ran.stderr), requirements, found)
    shutil.rmtree(target / "bin", ignore_errors=True)  # pip's scripts name this machine's Python: ours replace them
    try:
        target.rename(done)  # whole or absent: a crash mid-install leaves only an "installing-" directory
    except OSError:  # another process finished the same set first
        shutil.rmtree(target, ignore_errors=True)
    return done


def _pip_error(output: str, requirements: list[str], found: dict[str, Any]) -> ImageError:
    where = f"CPython {found['version']} on {found['machine']} ({' '.join(found['libc']).strip() or 'no glibc'})"
    missing = re.search(r"No matching distribution found for (\S+)", output)
    if missing:
        return ImageError(f"harness requirement {missing.group(1)} has no wheel for the image's Python, {where}: "
                          "the harness is installed from wheels only (the container has no network or compiler); "
                          "pin a version that publishes such a wheel, or build one and give pip its directory "
                          f"(find-links in pip's configuration)\n{last_lines(output, 5)}")
    return ImageError(f"pip could not install the harness {requirements} for {where}:\n{last_lines(output)}")


def _platforms(machine: str, libc: Sequence[str]) -> list[str]:
    """pip ``--platform`` tags a wheel may carry to run on the image: every manylinux up to its glibc (pip does not
    expand one into the older ones itself), or musllinux without glibc. Pure-Python wheels always fit."""
    name, version = (*libc, "", "")[:2]
    if name == "glibc" and re.fullmatch(r"2\.\d+", version or ""):
        newest = int(version.split(".")[1])
        tags = [f"manylinux_2_{minor}_{machine}" for minor in range(newest, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        return tags + [f"{alias}_{machine}" for minor, alias in legacy.items() if minor <= newest]
    return [f"musllinux_1_2_{machine}", f"musllinux_1_1_{machine}"]


def _probe(client: Any, image: str) -> dict[str, Any]:
    """The image's Python, asked in a throwaway container without network."""
    import docker

    try:
        # explicit limits: podman's defaults cannot be applied in a nested container
        limits = [docker.types.Ulimit(name=name, soft=value, hard=value) for name, value in PROBE_ULIMITS.items()]
        out = client.containers.run(image, ["-c", PROBE], entrypoint=["python3"], network_mode="none", remove=True,
                                    stdout=True, stderr=True, ulimits=limits)
        return json.loads(decode(out).strip().splitlines()[-1])
    except docker.errors.ContainerError as exc:
        detail = decode(exc.stderr or b"").strip()
        raise ImageError(f"image {image} cannot run python3, which the harness needs: "
                         f"{last_lines(detail, 5)}") from None
    except docker.errors.APIError as exc:
        if "executable file not found" in str(exc) or "no such file" in str(exc).lower():
            raise ImageError(f"image {image} has no python3 on its PATH: the harness needs one") from None
        raise ImageError(f"cannot ask image {image} for its python: {exc}", retryable=True) from None
    except (ValueError, IndexError):
        raise ImageError(f"image {image}'s python3 did not say what it is") from None


def _image_id(client: Any, image: str) -> str:
    return str(_inspect(client, image).get("Id") or "")


def _inspect(client: Any, image: str) -> dict[str, Any]:
    import docker

    try:
        return client.api.inspect_image(image)
    except docker.errors.ImageNotFound:
        raise ImageError(f"image {image} is missing") from None
    except docker.errors.APIError as exc:
        raise ImageError(f"cannot inspect image {image}: {exc}", retryable=True) from None


def _present(client: Any, tag: str) -> bool:
    try:
        _inspect(client, tag)
        return True
    except ImageError as exc:
        if exc.retryable:
            raise
        return False


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return match.group(1) if match else requirement


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _link_or_copy(source: str, dest: str) -> None:
    """A hard link where the cache and the build context share a filesystem (they do: the context is made beside
    the cache), else a copy."""
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)

