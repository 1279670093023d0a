"""A repository that holds only a base commit's past, built by construction: a past-only pack made on the host
once (``past_pack``), and the script that makes a fresh repository around it in a sandbox (``fresh_repo_script``).

Nothing past the base ever leaves the host: the pack holds exactly the objects ``git rev-list --objects <base>``
lists, and the new repository gets one branch at the base and the tags on its history (lightweight) and nothing else,
so no tag, note, stash, reflog, remote or alternate of the source can show a fix from the future, whatever the
source held (a directory, a bundle).
A pack with its index is what git keeps anyway: the sandbox copies two files instead of indexing a bundle."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from envs.runtimes.output import decode
from rollout.errors import ContainerStartError

NO_COMMIT = 3
"""The script's exit code when the pack lacks the base commit (the host resolved it, so: a corrupt copy)."""
CACHE_KEEP = 16
"""Past-only packs kept on a host (least recently used removed beyond it): rollouts of one instance share one,
made once; each is about the size of the source's history, so a few dozen instances' worth is the bound."""
CACHE_GRACE = 600.0
"""Seconds after its last use a pack is never removed, whatever the count: a rollout may be about to copy it."""
_TIMEOUT = 1800.0


class MissingCommit(ContainerStartError):
    """The base commit is not in the source: no rollout of the row can start (never retried)."""

    def __init__(self, message: str = "", retryable: bool = False):
        super().__init__(message, retryable)


@dataclass(frozen=True)
class PastPack:
    """A pack (``pack``, its index ``idx``) on this host holding ``commit``'s history and nothing else; the
    repository made from it has ``commit`` on ``branch``."""

    pack: str
    idx: str
    commit: str
    branch: str
    tags: tuple[tuple[str, str], ...] = ()
    """(name, commit) of the source's tags on ``commit``'s history, each a lightweight tag in the new repository:
    version tools (setuptools_scm's ``git describe --tags``) still find the release, and no tag object (whose
    message was written later) enters."""

    @property
    def name(self) -> str:
        """The pack's file name without extension, as git names it (``pack-<checksum>``)."""
        return Path(self.pack).stem


def past_pack(source: str, commit: str, cache: str | None = None) -> PastPack:
    """The past-only pack of ``commit`` (any name git resolves: sha, abbreviation, branch, tag) in ``source`` (a
    repository directory or a bundle file), made once per host and reused. The branch is named as the source's
    HEAD branch (``main`` when HEAD is detached); the tags the commit reaches are kept, as lightweight tags. A
    commit the source lacks raises ``MissingCommit``; any other failure a non-retryable ``ContainerStartError``."""
    cache = cache or os.path.join(tempfile.gettempdir(), f"rollout-past-{os.getuid()}")
    source = os.path.realpath(source)
    with tempfile.TemporaryDirectory(prefix="rollout-past-") as scratch:
        if os.path.isfile(source):
            # A bundle's refs are only known once its objects are indexed: its key is the file, not the commit's id.
            stat = os.stat(source)
            key = _key(source, str(stat.st_size), str(stat.st_mtime_ns), commit)
            if cached := _cached(cache, key):
                return cached
            repo = os.path.join(scratch, "source.git")
            _git(None, "clone", "--quiet", "--bare", source, repo)
        else:
            repo = source
        full = _git(repo, "rev-parse", "--quiet", "--verify", f"{commit}^{{commit}}", check=False)
        if not full:
            raise MissingCommit(f"base_commit {commit} is not in {source}")
        branch = _git(repo, "symbolic-ref", "--quiet", "--short", "HEAD", check=False) or "main"
        if not os.path.isfile(source):
            key = _key(source, full, branch)  # a commit's history never changes: named by what it holds
            if cached := _cached(cache, key):
                return cached
        return _make(repo, full, branch, _past_tags(repo, full), cache, key)


def fresh_repo_script(pack: str, idx: str, dest: str, past: PastPack, identity: tuple[str, str] | None = None,
                      move: bool = False) -> str:
    """A POSIX shell script that makes ``dest`` a new repository whose only objects are the pack at ``pack`` and
    ``idx`` (paths where the script runs), with ``past.branch`` at ``past.commit`` checked out and ``past.tags``:
    no remote, no FETCH_HEAD or ORIG_HEAD. ``identity`` (name, email): set unless git's config names one already.
    ``move``: the files are scratch copies, moved in (and removed if anything fails) rather than copied."""
    q = shlex.quote
    take = "mv -f" if move else "cp"  # cp, never a link: the agent may chmod and overwrite what it is given
    into = f'"$objects/pack/{past.name}'
    lines = ["set -e"]
    if move:
        lines.append(f"trap 'rm -f {q(pack)} {q(idx)}' EXIT")
    lines += [
        f"git init -q {q(dest)}",
        f"cd {q(dest)}",
        'objects=$(git rev-parse --git-path objects)',
        f'{take} {q(idx)} {into}.idx"',
        f'{take} {q(pack)} {into}.pack"',
        f"git cat-file -e {q(past.commit + '^{commit}')} 2>/dev/null || exit {NO_COMMIT}",
        f"git update-ref refs/heads/{q(past.branch)} {q(past.commit)}",
        f"git symbolic-ref HEAD refs/heads/{q(past.branch)}",
        "git checkout -q -f",
    ]
    if past.tags:  # one process for all of them (a project may have hundreds); the quoted delimiter: no expansion
        lines += ["git update-ref --stdin <<'ROLLOUT_PAST_TAGS'",
                  *(f"create refs/tags/{name} {sha}" for name, sha in past.tags), "ROLLOUT_PAST_TAGS"]
    if identity:
        name, email = identity
        lines += [f"git config user.name >/dev/null || git config user.name {q(name)}",
                  f"git config user.email >/dev/null || git config user.email {q(email)}"]
    return "\n".join(lines) + "\n"


def in_place_script(repo_dir: str, base: str, identity: tuple[str, str] | None = None) -> str:
    """A POSIX shell script that gives the repository at ``repo_dir`` (an image's, which may hold anything) a new
    ``.git`` holding only the past of HEAD and of ``base``: one pack of what they reach, HEAD's branch, the tags they
    reach (lightweight), the old ``info/exclude``; the working tree is left as it is. For images this project did not
    build: the old ``.git`` is removed, so the container no longer sees it (its image layer still holds it)."""
    q = shlex.quote
    peeled = "%(if)%(*objecttype)%(then)%(*objecttype) %(*objectname)%(else)%(objecttype) %(objectname)%(end)"
    lines = [
        "set -e",
        f"cd {q(repo_dir)}",
        f"base=$(git rev-parse -q --verify {q(base + '^{commit}')}) || exit {NO_COMMIT}",
        "head=$(git rev-parse -q --verify 'HEAD^{commit}')",
        "branch=$(git symbolic-ref -q --short HEAD || echo main)",
        'old=$(git rev-parse --absolute-git-dir)',
        'new=$(mktemp -d "$PWD/.git-past.XXXXXX")',  # beside .git: the move below is a rename, not a copy
        'trap \'rm -rf "$new"\' EXIT',
        'git init -q "$new"',
        'printf "%s\\n%s\\n" "$head" "$base" |'
        ' git pack-objects --revs --delta-base-offset -q "$new/.git/objects/pack/pack" >/dev/null',
        f"git for-each-ref --merged \"$head\" refs/tags --format='{peeled} %(refname)' |"
        " sed -n 's/^commit \\([0-9a-f]*\\) \\(.*\\)$/create \\2 \\1/p' > \"$new/tags\"",
        'cp "$old/info/exclude" "$new/.git/info/exclude" 2>/dev/null || true',
        'rm -rf "$old" .git',
        'mv "$new/.git" .git',
        'git update-ref "refs/heads/$branch" "$head"',
        'git symbolic-ref HEAD "refs/heads/$branch"',
        'git update-ref --stdin < "$new/tags"',
        "git read-tree HEAD",  # the index from HEAD; the working tree, whatever the image left in it, untouched
        "git update-index -q --refresh >/dev/null || true",
    ]
    if identity:
        name, email = identity
        lines += [f"git config user.name >/dev/null || git config user.name {q(name)}",
                  f"git config user.email >/dev/null || git config user.email {q(email)}"]
    return "\n".join(lines) + "\n"


def _past_tags(repo: str, full: str) -> dict[str, str]:
    listed = _git(repo, "for-each-ref", "--merged", full, "refs/tags",
                  "--format=%(refname)%00%(objecttype)%00%(objectname)%00%(*objecttype)%00%(*objectname)")
    tags = {}
    for line in listed.splitlines():
        ref, kind, sha, peeled_kind, peeled = line.split("\0")
        if kind == "commit" or peeled_kind == "commit":  # a tag of a tree or of a tag has no place on a branch
            tags[ref.removeprefix("refs/tags/")] = sha if kind == "commit" else peeled
    return tags


def _make(repo: str, full: str, branch: str, tags: dict[str, str], cache: str, key: str) -> PastPack:
    os.makedirs(cache, exist_ok=True)
    made = tempfile.mkdtemp(prefix=".making-", dir=cache)  # beside its place, so the rename below is atomic
    try:
        # pack-objects only reads the source (its deltas reused as they are) and writes the pack and its index.
        checksum = _git(repo, "pack-objects", "--revs", "--delta-base-offset", "--quiet", os.path.join(made, "pack"),
                        stdin=full + "\n")
        meta = {"name": f"pack-{checksum}", "commit": full, "branch": branch, "tags": tags}
        Path(made, "past.json").write_text(json.dumps(meta))
        target = os.path.join(cache, key)
        try:
            os.rename(made, target)  # whole or absent: a rollout never sees half an entry
        except OSError:
            if not os.path.isdir(target):  # else another rollout of the instance made it first (the same content)
                raise
    finally:
        shutil.rmtree(made, ignore_errors=True)
    _evict(cache, keep=target)
    cached = _cached(cache, key)
    if cached is None:
        raise ContainerStartError(f"the past-only pack of {full} vanished from {cache}", retryable=True)
    return cached


def _cached(cache: str, key: str) -> PastPack | None:
    entry = os.path.join(cache, key)
    try:
        meta = json.loads(Path(entry, "past.json").read_text())
        os.utime(entry)  # recently used: kept by eviction
    except (FileNotFoundError, ValueError):
        return None
    base = os.path.join(entry, meta["name"])
    return PastPack(f"{base}.pack", f"{base}.idx", meta["commit"], meta["branch"], tuple(meta.get("tags", {}).items()))


def _evict(cache: str, keep: str) -> None:
    for partial in Path(cache).glob(".making-*"):  # a process killed while making one left it
        if _mtime(partial) < time.time() - _TIMEOUT:
            shutil.rmtree(partial, ignore_errors=True)
    entries = sorted((p for p in Path(cache).iterdir() if p.is_dir() and not p.name.startswith(".")), key=_mtime,
                     reverse=True)
    for old in entries[CACHE_KEEP:]:
        if str(old) != keep and _mtime(old) < time.time() - CACHE_GRACE:
            shutil.rmtree(old, ignore_errors=True)  # a rollout copying it already keeps its open files


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # another process evicted it meanwhile
        return time.time() + 1.0


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _git(cwd: str | None, *args: str, check: bool = True, stdin: str | None = None) -> str:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    done = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, capture_output=True, env=env,
                          input=stdin.encode() if stdin is not None else None, timeout=_TIMEOUT)
    if done.returncode != 0:
        if not check:
            return ""
        command = next(a for a in args if not a.startswith("-"))
        raise ContainerStartError(f"git {command} failed: {decode(done.stderr)[-1000:]}", retryable=False)
    return decode(done.stdout).strip()
