"""What the grader does with a diff: refuse it before it applies (paths out of the repository or into ``.git``,
symbolic links to protected files), and the shell snippets that save, reset and restore the paths it touches.
Reading the diff is ``envs.swe.diffs``."""

from __future__ import annotations

import posixpath
import shlex

from envs.swe.diffs import header_paths, normalise, symlinks


def refusal(diff: str, protected: list[str]) -> str | None:
    """Why ``diff`` is refused before it is applied, or None: a path (in any header a patch tool may read) that
    leaves the repository or goes into ``.git``; a symbolic link that points out of the repository, into
    ``.git``, or at a ``protected`` file, or that stands where a directory above a protected file is."""
    for raw in header_paths(diff, every_format=True):
        path = normalise(raw)
        if path.startswith("/") or path == ".." or path.startswith("../"):
            return f"the patch names a path outside the repository ({raw!r})"
        if any(part.lower() == ".git" for part in path.split("/")):
            return f"the patch writes into .git ({raw!r})"
    keep = set(protected)
    for path, target in symlinks(diff):
        resolved = normalise(posixpath.join(posixpath.dirname(path), target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            return f"the patch makes {path} a symbolic link out of the repository ({target!r})"
        if (resolved in keep or path in keep or any(p.lower() == ".git" for p in resolved.split("/"))
                or any(k.startswith(path + "/") for k in keep)):
            return f"the patch makes {path} a symbolic link to a protected file ({target!r})"
    return None


def reset_script(paths: list[str], base: str, git: str = "git") -> str:
    """Shell lines that put each path back as it is at commit ``base``: checked out if it exists there,
    removed if it does not (a file the patch creates). Exits non-zero if a checkout fails."""
    if not paths:
        return "true"
    quoted = " ".join(shlex.quote(p) for p in paths)
    commit = shlex.quote(base)
    return (
        f"for p in {quoted}; do\n"
        f'  if {git} cat-file -e {commit}:"$p" 2>/dev/null; then\n'
        f'    {git} --literal-pathspecs checkout -q {commit} -- "$p" || exit 1\n'
        '  else\n'
        '    rm -rf -- "$p"\n'
        '  fi\n'
        'done'
    )


def save_script(paths: list[str], backup: str) -> str:
    """Shell lines that copy each path that exists (file, link or directory, mode kept) to the same path
    under ``backup``, so ``restore_script`` can put the tree back. Exits non-zero if a copy fails."""
    if not paths:
        return "true"
    return (
        f"b={shlex.quote(backup)}\n"
        f"for p in {' '.join(shlex.quote(p) for p in paths)}; do\n"
        '  if [ -e "$p" ] || [ -L "$p" ]; then\n'
        '    case $p in */*) mkdir -p -- "$b/${p%/*}" || exit 1 ;; *) mkdir -p -- "$b" || exit 1 ;; esac\n'
        '    cp -a -- "$p" "$b/$p" || exit 1\n'
        '  fi\n'
        'done'
    )


def restore_script(paths: list[str], backup: str) -> str:
    """Shell lines that undo a patch attempt on ``paths``: each removed with the ``.rej`` / ``.orig`` files
    an attempt leaves, then put back from ``backup`` if ``save_script`` found it. Exits non-zero on failure."""
    if not paths:
        return "true"
    leftovers = " ".join(shlex.quote(f"{p}{suffix}") for p in paths for suffix in ("", ".rej", ".orig"))
    return (
        f"rm -rf -- {leftovers} || exit 1\n"
        f"b={shlex.quote(backup)}\n"
        f"for p in {' '.join(shlex.quote(p) for p in paths)}; do\n"
        '  if [ -e "$b/$p" ] || [ -L "$b/$p" ]; then\n'
        '    case $p in */*) mkdir -p -- "${p%/*}" || exit 1 ;; esac\n'
        '    cp -a -- "$b/$p" "$p" || exit 1\n'
        '  fi\n'
        'done'
    )


def in_repo(repo_dir: str, path: str) -> str:
    """``path`` inside the repository, as a runtime path (absolute, or relative to the runtime's workdir)."""
    return posixpath.join(repo_dir, path) if repo_dir not in ("", ".") else path
