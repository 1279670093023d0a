"""What a run finds on its host before it starts: whether a docker daemon answers (``runtime: auto``), and the
containers a dead earlier attempt of the same run left behind."""

from __future__ import annotations

from typing import Any, TextIO

from envs.runtimes.docker.containers import remove_leftovers
from rollout.config.load import unknown_key
from rollout.errors import ConfigError

AUTO_CHOICES = ("docker", "local")
"""What ``runtime: {type: auto}`` picks between; each may have a sub-section of its options."""


def docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=5).ping()
        return True
    except Exception:  # noqa: BLE001 - no SDK, no daemon, no permission: all mean "not here"
        return False


def resolve_auto_runtimes(raw: dict[str, Any]) -> list[str]:
    """``runtime: {type: auto, ...}``: docker when a daemon answers, else the local runtime; says which
    and why. Keys of the section that the chosen runtime does not have are dropped."""
    sections = [("runtime", raw)] + [(f"profiles.{n}.runtime", p) for n, p in (raw.get("profiles") or {}).items()
                                     if isinstance(p, dict)]
    notes = []
    for where, holder in sections:
        section = holder.get("runtime")
        if not isinstance(section, dict) or section.get("type") != "auto":
            continue
        options = {k: v for k, v in section.items() if k != "type"}
        unknown = sorted(options.keys() - set(AUTO_CHOICES))
        if unknown:  # a misspelt sub-section would otherwise be dropped without a word
            raise ConfigError(unknown_key(unknown[0], AUTO_CHOICES, where), f"{where}.{unknown[0]}")
        chosen, why = ("docker", "a docker daemon answers") if docker_answers() else (
            "local", "no docker daemon answers; commands run in a local workspace")
        holder["runtime"] = {"type": chosen, **options.get(chosen, {})}
        notes.append(f"{where}: {chosen} ({why})")
    return notes


def reap_leftovers(run_id: str, engines: set[str], out: TextIO) -> None:
    """Containers an earlier, dead attempt of this run left behind (a SIGKILL skips every cleanup)."""
    for engine in sorted(engines):
        removed = remove_leftovers(run_id, engine)
        if removed:
            print(f"removed {len(removed)} {engine} container(s) left by an earlier attempt of {run_id}",
                  file=out, flush=True)
