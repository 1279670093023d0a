"""An override that changes a section's ``type`` (``runtime.type=local`` over a file's ``type: auto``): the keys
the files gave for the old type that the new type does not accept are dropped, and a note says which.

``load_config`` records each such change on the ``LoadedConfig`` it returns (what the files said, which keys the
command line set); the schema that knows what each type accepts applies them (``apply_retypes``) when it
validates. Keys set on the command line are never dropped: a bad one stays an error. A sub-section named after
the new type (``local: {...}`` under ``type: auto``) becomes the section's own keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection

Path = tuple[str, ...]
SectionKeys = Callable[[Path, Any], "Collection[str] | None"]
"""``(section path, type) -> the keys a section of that type accepts``, or None when unknown (nothing dropped)."""


@dataclass(frozen=True)
class Retype:
    section: Path
    old: Any
    """The type the files gave."""
    new: Any
    """The type the overrides gave."""
    override: str
    """The override that set the new type, as typed (``runtime.type=local``)."""
    user_keys: frozenset[str]
    """Keys of the section the command line set: never dropped."""


class LoadedConfig(dict):
    """A merged config (a plain mapping) that remembers the type changes its overrides made (``retypes``)."""

    retypes: list[Retype]

    def __init__(self, *args: Any, retypes: list[Retype] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.retypes = list(retypes)


def lookup(data: Any, path: Path) -> Any:
    for part in path:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def find_retypes(files: dict[str, Any], overrides: list[tuple[str, list[str]]], merged: dict[str, Any]) -> list[Retype]:
    """The sections whose ``type`` the overrides (each one's text and key path, in order) change from the one
    ``files`` gave to the one in ``merged``. A section an override replaces as a whole is the user's own."""
    retypes: list[Retype] = []
    paths = [tuple(p) for _, p in overrides]
    for path in paths:
        section = tuple(path[:-1])
        if path[-1] != "type" or not section or any(r.section == section for r in retypes):
            continue
        old, new = lookup(files, path), lookup(merged, path)
        if old is None or new == old:
            continue
        if any(len(p) <= len(section) and section[:len(p)] == p for p in paths):
            continue  # the section (or one holding it) is given whole on the command line
        user = frozenset(p[len(section)] for p in paths if len(p) > len(section) and p[:len(section)] == section)
        last = [text for text, p in overrides if tuple(p) == path][-1]
        retypes.append(Retype(section, old, new, last, user - {"type"}))
    return retypes


def apply_retypes(data: LoadedConfig, section_keys: SectionKeys) -> list[str]:
    """Drop from each retyped section of ``data`` (in place) the keys its new type does not accept; one note per
    section that lost keys. Done once: the pending changes are cleared."""
    notes = []
    for change in data.retypes:
        section, new = lookup(data, change.section), change.new
        if not isinstance(section, dict) or section.get("type") != new:
            continue  # changed since (``runtime: auto`` resolved to a runtime)
        accepted = section_keys(change.section, new)
        if accepted is None:
            continue
        where = ".".join(change.section)
        carried = section.get(str(new)) if str(new) not in accepted else None
        carried = carried if isinstance(carried, dict) else {}
        dropped = [k for k in section if k != "type" and k not in accepted and k not in change.user_keys]
        for key in dropped:
            del section[key]
        for key, value in carried.items():
            if key not in change.user_keys:
                section[key] = value
        if not dropped:
            continue
        note = f"{change.override} replaces {change.old}: dropped {', '.join(f'{where}.{k}' for k in dropped)} " \
               f"(not {'an option' if len(dropped) == 1 else 'options'} of {new})"
        if carried:
            note += f"; carried over {where}.{new}'s {', '.join(carried)}"
        notes.append(note)
    data.retypes = []
    return notes
