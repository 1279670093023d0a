"""Reading a unified or git diff: the repository paths it names (every header format a patch tool reads, C-quoted
names unquoted, paths normalised as the filesystem resolves them) and the symbolic links it makes. A leaf: the row
shapes (``envs.swe.rows``) and the grader (``envs.swe.grading``) both read diffs with it."""

from __future__ import annotations

import posixpath
import re

_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def diff_paths(diff: str) -> list[str]:
    """Paths (relative to the repository root, ``a/`` / ``b/`` prefixes stripped, normalised: ``x//y`` and
    ``x/../y`` as the filesystem reads them) that ``diff`` names, old and new names alike, in order of appearance,
    ``/dev/null`` and paths out of the repository left out. Hunk bodies are skipped by their line counts, so a
    removed line that starts with ``-- `` is never read as a file header."""
    return [p for p in dict.fromkeys(normalise(p) for p in header_paths(diff)) if _safe(p)]


def header_paths(diff: str, every_format: bool = False) -> list[str]:
    """The names of ``diff``'s file headers as written (C-quoting undone, prefixes stripped); with
    ``every_format``, also those other patch formats name (``Index:``, context diffs' ``***``), which ``patch`` may
    read."""
    paths: list[str] = []
    old_left = new_left = 0
    for line in diff.split("\n"):
        if old_left > 0 or new_left > 0:
            if line.startswith("\\"):  # "\ No newline at end of file"
                continue
            tag = line[:1]
            old_left -= tag != "+"
            new_left -= tag != "-"
            continue
        hunk = _HUNK.match(line)
        if hunk:
            old_left, new_left = (int(n) if n is not None else 1 for n in hunk.groups())
        elif line.startswith("diff --git "):
            paths += _git_header_paths(line[len("diff --git "):])
        elif line.startswith(("--- ", "+++ ")) or (every_format and line.startswith("*** ")
                                                   and not line.startswith("*** ***")):
            name = _field(line[4:])
            if name != "/dev/null":
                paths.append(_strip_prefix(name))
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            paths.append(_field(line.split(" ", 2)[2]))
        elif every_format and line.startswith("Index: "):
            paths.append(_field(line[len("Index: "):]))
    return paths


def normalise(path: str) -> str:
    """``path`` as the filesystem resolves its name (doubled slashes and ``.`` / ``..`` components folded; a
    leading ``/`` kept)."""
    folded = posixpath.normpath(path) if path else path
    return folded[1:] if folded.startswith("//") else folded


def symlinks(diff: str) -> list[tuple[str, str]]:
    """(path, target) of every symbolic link ``diff`` creates or changes (git's mode 120000)."""
    found: list[tuple[str, str]] = []
    path, link = None, False
    for line in diff.split("\n"):
        if line.startswith("diff --git "):
            names = _git_header_paths(line[len("diff --git "):])
            path, link = (names[-1] if names else None), False
        elif line.startswith(("new file mode 120000", "new mode 120000")):
            link = True
        elif link and path is not None and line.startswith("+") and not line.startswith("+++"):
            found.append((normalise(path), line[1:]))
            link = False
    return found


def _git_header_paths(rest: str) -> list[str]:
    if rest.startswith('"') or rest.endswith('"'):
        names = _split_quoted(rest)
    else:
        # "a/x b/x": with spaces in the name, the split is where both halves name the same file.
        cuts = [i for i in range(len(rest)) if rest.startswith(" b/", i)] or [rest.find(" ")]
        same = [i for i in cuts if rest[2:i] == rest[i + 3:]]
        cut = (same or cuts)[0]
        names = [rest[:cut], rest[cut + 1:]] if cut > 0 else []
    return [_strip_prefix(n) for n in names if n and n != "/dev/null"]


def _split_quoted(rest: str) -> list[str]:
    names, i = [], 0
    while i < len(rest):
        if rest[i] == " ":
            i += 1
        elif rest[i] == '"':
            end = i + 1
            while end < len(rest) and rest[end] != '"':
                end += 2 if rest[end] == "\\" else 1
            names.append(_unquote(rest[i:end + 1]))
            i = end + 1
        else:
            end = rest.find(" ", i)
            end = len(rest) if end < 0 else end
            names.append(rest[i:end])
            i = end
    return names


def _field(text: str) -> str:
    """A file name field: C-quoted by git for unusual characters, else up to a tab (git adds one after
    names with spaces; diff -u puts a timestamp there)."""
    text = text.rstrip("\r")
    if text.startswith('"'):
        return _unquote(text[: _closing_quote(text) + 1])
    return text.split("\t", 1)[0]


def _closing_quote(text: str) -> int:
    i = 1
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i


def _unquote(text: str) -> str:
    """git's C-style quoting (octal bytes of UTF-8, \\t, \\n, \\", \\\\) back to the name."""
    body, out, i = text[1:-1] if text.endswith('"') else text[1:], bytearray(), 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and re.match(r"[0-7]{3}", body[i + 1:i + 4]):
                out.append(int(body[i + 1:i + 4], 8))
                i += 4
                continue
            out.append(_ESCAPES.get(nxt, ord(nxt)))
            i += 2
            continue
        out += ch.encode("utf-8")
        i += 1
    return out.decode("utf-8", errors="surrogateescape")


def _strip_prefix(name: str) -> str:
    """Drop the first path component, as ``git apply`` / ``patch -p1`` do."""
    return name.split("/", 1)[1] if "/" in name else name


def _safe(path: str) -> bool:
    return bool(path) and not path.startswith("/") and ".." not in path.split("/")
