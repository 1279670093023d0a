"""A Harbor task's ``task.toml``: what the farm honours, read strictly where it matters and leniently elsewhere.

Schema 1.x (``schema_version``) and the legacy ``version`` key both load. Keys the farm does not know are kept in
``unknown`` (a newer schema must not make a dataset unloadable) and the fields it knows but cannot honour
(``mcp_servers``, ``skills_dir``, artifacts, GPUs, ...) in ``ignored``; a run names both once
(``envs.harbor.dataset.describe_unhonoured``). A field whose wrong value would change what the task means
(a timeout that is not a number, an unknown network mode, Windows) is an error naming the task and the field.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from envs.harbor.task_model import Healthcheck, Phase, Step, TaskConfig
from rollout.errors import ConfigError

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

NETWORK_MODES = ("no-network", "public", "allowlist")
"""Harbor's network modes. The farm's default is ``no-network`` (Harbor's is ``public``)."""

KNOWN = {
    "": {"schema_version", "version", "task", "metadata", "verifier", "agent", "environment", "solution", "source",
         "multi_step_reward_strategy", "steps", "artifacts"},
    "agent": {"timeout_sec", "user", "network_mode", "allowed_hosts"},
    "verifier": {"timeout_sec", "env", "user", "environment_mode", "environment", "collect", "network_mode",
                 "allowed_hosts"},
    "environment": {"build_timeout_sec", "docker_image", "os", "cpus", "memory_mb", "storage_mb", "gpus", "gpu_types",
                    "tpu", "mcp_servers", "env", "skills_dir", "healthcheck", "workdir", "allow_internet",
                    "network_mode", "allowed_hosts", "memory", "storage"},
    "solution": {"env"},
    "step": {"name", "agent", "verifier", "min_reward", "healthcheck", "artifacts"},
}
"""The keys of each section Harbor 0.25 defines; anything else is kept and named as unknown."""

NOT_HONOURED = {
    "environment.mcp_servers": "MCP servers are not started", "environment.skills_dir": "skills are not copied",
    "environment.gpu_types": "no GPUs", "environment.tpu": "no TPUs", "artifacts": "artifacts are not collected",
    "verifier.collect": "collect hooks do not run", "environment.allowed_hosts": "no allowlist",
}
"""Fields the farm knows and does not honour yet, with what that means (named in the run's one warning)."""

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class TaskConfigError(ConfigError, ValueError):
    """A task.toml problem (a bad task, as a ``ConfigError``); the message names the field."""


def parse_task_toml(text: str, environ: dict[str, str] | None = None) -> TaskConfig:
    """``text`` (a task.toml) as a ``TaskConfig``; ``${VAR}`` / ``${VAR:-default}`` in ``env`` tables resolved
    from ``environ`` (default: this process's environment). A ``TaskConfigError`` names the field."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TaskConfigError(f"task.toml is not TOML: {exc}") from None
    environ = dict(os.environ) if environ is None else environ
    cfg = TaskConfig(raw=raw)
    _unknown(raw, "", cfg.unknown)
    cfg.schema_version = str(raw.get("schema_version", raw.get("version", "1.0")))
    if not re.fullmatch(r"1(\.\d+)*", cfg.schema_version):
        raise TaskConfigError(f"schema_version {cfg.schema_version!r}: this farm reads schema 1.x")
    task = _table(raw, "task")
    cfg.name = task.get("name") if isinstance(task.get("name"), str) else None
    cfg.metadata = _table(raw, "metadata")
    cfg.agent = _phase(_table(raw, "agent"), "agent", environ, cfg.unknown)
    cfg.verifier = _phase(_table(raw, "verifier"), "verifier", environ, cfg.unknown, default_timeout=600.0)
    env = _table(raw, "environment")
    _unknown(env, "environment", cfg.unknown)
    if str(env.get("os", "linux")).lower() != "linux":
        raise TaskConfigError(f"environment.os {env['os']!r}: only linux containers run here")
    if env.get("gpus"):
        raise TaskConfigError(f"environment.gpus = {env['gpus']!r}: this farm has no GPUs to give a task")
    cfg.network_mode, cfg.network_mode_set = _network(env)
    cfg.docker_image = _opt_str(env, "docker_image", "environment")
    cfg.build_timeout_sec = _number(env, "build_timeout_sec", "environment", 600.0)
    cfg.cpus = _number(env, "cpus", "environment", None)
    cfg.memory_mb = _size_mb(env, "memory", "environment")
    cfg.storage_mb = _size_mb(env, "storage", "environment")
    cfg.env = _env(env.get("env"), "environment.env", environ)
    cfg.workdir = _opt_str(env, "workdir", "environment")
    cfg.healthcheck = _healthcheck(env.get("healthcheck"), "environment.healthcheck")
    cfg.solution_env = _env(_table(raw, "solution").get("env"), "solution.env", environ)
    for key, what in NOT_HONOURED.items():
        section, _, name = key.rpartition(".")
        if (_table(raw, section) if section else raw).get(name):
            cfg.ignored.append(f"{key} ({what})")
    if isinstance(cfg.raw.get("verifier", {}).get("environment"), dict):
        raise TaskConfigError("verifier.environment: a verifier environment of its own is not supported here "
                              "(environment_mode = 'separate' with the task's own environment is)")
    strategy = raw.get("multi_step_reward_strategy") or "mean"
    if strategy not in ("mean", "final"):
        raise TaskConfigError(f"multi_step_reward_strategy {strategy!r}: one of 'mean', 'final'")
    cfg.multi_step_reward_strategy = strategy
    cfg.steps = [_step(s, i, environ, cfg) for i, s in enumerate(raw.get("steps") or [])]
    return cfg


def _step(raw: Any, index: int, environ: dict[str, str], cfg: TaskConfig) -> Step:
    where = f"steps[{index}]"
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"].strip():
        raise TaskConfigError(f"{where}: a step is a table with a name")
    name = raw["name"]
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name) or ".." in name:
        raise TaskConfigError(f"{where}.name {name!r}: letters, digits, '.', '_' and '-' only")
    _unknown(raw, "step", cfg.unknown, where)
    gate = raw.get("min_reward")
    if gate is not None and not (_finite(gate) or (isinstance(gate, dict) and all(map(_finite, gate.values())))):
        raise TaskConfigError(f"{where}.min_reward: a number or a table of numbers")
    return Step(name, _phase(_table(raw, "agent"), f"{where}.agent", environ, cfg.unknown, inherit=cfg.agent),
                _phase(_table(raw, "verifier"), f"{where}.verifier", environ, cfg.unknown, inherit=cfg.verifier),
                gate, _healthcheck(raw.get("healthcheck"), f"{where}.healthcheck"))


def _phase(raw: dict[str, Any], where: str, environ: dict[str, str], unknown: list[str], *,
           default_timeout: float | None = None, inherit: Phase | None = None) -> Phase:
    _unknown(raw, where.rsplit(".", 1)[-1], unknown, where)
    base = inherit or Phase(timeout_sec=default_timeout)
    mode = raw.get("environment_mode") or ("separate" if isinstance(raw.get("environment"), dict)
                                           else base.environment_mode)
    if mode not in ("shared", "separate"):
        raise TaskConfigError(f"{where}.environment_mode {mode!r}: 'shared' or 'separate'")
    user = raw.get("user", base.user)
    network = raw.get("network_mode", base.network_mode)
    if network is not None and network not in NETWORK_MODES:
        raise TaskConfigError(f"{where}.network_mode {network!r}: one of {', '.join(NETWORK_MODES)}")
    return Phase(timeout_sec=_number(raw, "timeout_sec", where, base.timeout_sec),
                 user=None if user is None else str(user), network_mode=network,
                 env={**base.env, **_env(raw.get("env"), f"{where}.env", environ)}, environment_mode=mode)


def _network(env: dict[str, Any]) -> tuple[str, bool]:
    mode = env.get("network_mode")
    if mode is None and env.get("allow_internet") is not None:  # the deprecated spelling
        mode = "public" if env["allow_internet"] else "no-network"
    if mode is None:
        return "no-network", False
    if mode not in NETWORK_MODES:
        raise TaskConfigError(f"environment.network_mode {mode!r}: one of {', '.join(NETWORK_MODES)}")
    return mode, True


def _env(raw: Any, where: str, environ: dict[str, str]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise TaskConfigError(f"{where}: a table of strings")
    out = {}
    for key, value in raw.items():
        if not isinstance(value, (str, int, float, bool)):
            raise TaskConfigError(f"{where}.{key}: a string")
        out[str(key)] = resolve_vars(str(value), environ, f"{where}.{key}")
    return out


def resolve_vars(text: str, environ: dict[str, str], where: str) -> str:
    """``${VAR}`` and ``${VAR:-default}`` replaced from ``environ``; an unset ``${VAR}`` without a default is an
    error naming it (an empty credential must not pass silently)."""
    def value(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ and (environ[name] or default is None):
            return environ[name]
        if default is None:
            raise TaskConfigError(f"{where}: ${{{name}}} is not set in the environment (give ${{{name}:-default}})")
        return default

    return _VAR.sub(value, text)


def _healthcheck(raw: Any, where: str) -> Healthcheck | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("command"), str) or not raw["command"].strip():
        raise TaskConfigError(f"{where}.command: a shell command")
    check = Healthcheck(raw["command"])
    for name in ("interval_sec", "timeout_sec", "start_period_sec", "start_interval_sec"):
        setattr(check, name, _number(raw, name, where, getattr(check, name)))
    retries = raw.get("retries", check.retries)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 1:
        raise TaskConfigError(f"{where}.retries: a whole number ≥ 1")
    check.retries = retries
    return check


def _table(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise TaskConfigError(f"{key}: a table, got {type(value).__name__}")
    return value


def _unknown(raw: dict[str, Any], section: str, out: list[str], where: str | None = None) -> None:
    known = KNOWN.get(section)
    if known is None:
        return
    prefix = f"{where or section}." if (where or section) else ""
    out.extend(prefix + key for key in raw if key not in known)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(raw: dict[str, Any], key: str, where: str, default: Any) -> Any:
    value = raw.get(key, default)
    if value is None or value is default:
        return value
    if not _finite(value) or value <= 0:
        raise TaskConfigError(f"{where}.{key} = {value!r}: a positive number")
    return float(value)


def _opt_str(raw: dict[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise TaskConfigError(f"{where}.{key}: a non-empty string")
    return value


def _size_mb(raw: dict[str, Any], name: str, where: str) -> int | None:
    value = raw.get(f"{name}_mb")
    if value is None and isinstance(raw.get(name), str):  # the deprecated "2G" spelling
        match = re.fullmatch(r"\s*([0-9.]+)\s*([GMK])\s*", raw[name].upper())
        if not match:
            raise TaskConfigError(f"{where}.{name} {raw[name]!r}: like '2G' or '512M'")
        value = int(float(match.group(1)) * {"G": 1024, "M": 1, "K": 1 / 1024}[match.group(2)])
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise TaskConfigError(f"{where}.{name}_mb = {value!r}: a positive whole number of MB")
    return value
