"""A Harbor task directory as one tar file, named by its content, and read back wherever the task runs.

The dataset packs each task once on the machine that loads it (``pack``: sorted members, no owners or times, so
the same directory gives the same bytes and digest); the tar is the task's ``task_archive`` path field, which a
farm spread over machines carries to the node that runs the task (``rollout.data.carried``). The environment,
the verifier and the image build read the members they need from it (``TaskFiles``), never the directory.
Symbolic links and special files are refused at pack time: a task's files are files.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import tarfile
import threading
from pathlib import Path

from rollout.data.carried import local_path

MAX_ARCHIVE_BYTES = 512 << 20
"""The largest task directory packed (an environment with data files); beyond it the task is refused."""


def cache_dir() -> Path:
    """``ROLLOUT_FARM_CACHE``, else ``$XDG_CACHE_HOME/rollout-farm``, else ``~/.cache/rollout-farm``; then
    ``harbor-tasks``."""
    base = os.environ.get("ROLLOUT_FARM_CACHE") or Path(os.environ.get("XDG_CACHE_HOME")
                                                        or Path.home() / ".cache") / "rollout-farm"
    return Path(base) / "harbor-tasks"


def pack(task_dir: Path) -> tuple[Path, str]:
    """(the tar of ``task_dir`` in the cache, its SHA-256). A ``ValueError`` names a member it refuses."""
    buf = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(_walk(task_dir)):
            rel = path.relative_to(task_dir).as_posix()
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                raise ValueError(f"{rel}: a symbolic link or special file (a task holds files and directories)")
            info = tarfile.TarInfo(rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            data = path.read_bytes()
            total += len(data)
            if total > MAX_ARCHIVE_BYTES:
                raise ValueError(f"the task directory holds more than {MAX_ARCHIVE_BYTES >> 20} MB")
            info.size, info.mode = len(data), 0o755 if os.access(path, os.X_OK) else 0o644
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    target = cache_dir() / f"{digest}.tar"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
    return target, digest


def _walk(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if d not in (".git", "__pycache__")]
        for name in dirnames + filenames:
            out.append(Path(dirpath, name))
    return out


class TaskFiles:
    """The members of one task's archive (a path, or a carried reference fetched to this machine)."""

    def __init__(self, archive: str):
        path = local_path(archive)  # blocking on a node that fetches it: call from a thread
        with open(path, "rb") as f:
            data = f.read()
        self.members: dict[str, bytes] = {}
        self.executable: set[str] = set()
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for info in tar.getmembers():
                name = posixpath.normpath(info.name)
                if info.isfile() and not name.startswith(("/", "..")):
                    self.members[name] = tar.extractfile(info).read()
                    if info.mode & 0o100:
                        self.executable.add(name)

    def text(self, name: str) -> str | None:
        data = self.members.get(name)
        return None if data is None else data.decode("utf-8", errors="replace")

    def under(self, folder: str) -> dict[str, bytes]:
        """``{path relative to folder: bytes}`` of every file under ``folder`` (e.g. ``tests``)."""
        prefix = folder.rstrip("/") + "/"
        return {name[len(prefix):]: data for name, data in self.members.items() if name.startswith(prefix)}

    def executable_under(self, folder: str) -> set[str]:
        prefix = folder.rstrip("/") + "/"
        return {name[len(prefix):] for name in self.executable if folder and name.startswith(prefix)}

    def tar_of(self, folder: str) -> bytes:
        """The files under ``folder`` as a tar (a build context; a directory to put into a container)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for rel, data in sorted(self.under(folder).items()):
                info = tarfile.TarInfo(rel)
                info.size, info.mode = len(data), 0o755 if f"{folder}/{rel}" in self.executable else 0o644
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()


_cache: dict[str, TaskFiles] = {}
_lock = threading.Lock()


def task_files(archive: str) -> TaskFiles:
    """``TaskFiles`` of ``archive``, read once per process (the few most recent kept)."""
    with _lock:
        found = _cache.get(archive)
    if found is not None:
        return found
    files = TaskFiles(archive)
    with _lock:
        if len(_cache) >= 64:
            _cache.pop(next(iter(_cache)))
        _cache[archive] = files
    return files
