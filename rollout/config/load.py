"""Config loading: YAML files merged in order, ``key.path=value`` overrides, strict validation.

Every failure is a ``ConfigError`` whose text starts with the dotted path of the bad field, so
``rollout run`` can print one line and exit 2 before any work starts.
"""

from __future__ import annotations

import copy
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Iterable, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from rollout.config.retype import LoadedConfig, find_retypes
from rollout.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class _Loader(yaml.SafeLoader):
    """YAML 1.1 minus sexagesimal numbers: ``slice: 3:5`` stays the string "3:5", not 185."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?(?:0|[1-9][0-9_]*))$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
               r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)


def yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


class StrictModel(BaseModel):
    """Base of every config section: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) is replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc.strerror}", str(path)) from None
    try:
        data = yaml_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"invalid YAML: {getattr(exc, 'problem', exc)}", where) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"top level must be a mapping, got {type(data).__name__}", str(path))
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not key.path=value", "overrides")
    try:
        value = yaml_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"cannot set {'.'.join(path)}: {'.'.join(path[: i + 1])} is not a mapping", text)
            node = child
        node[path[-1]] = value
    return out


def load_config(paths: list[str | Path], overrides: list[str] = ()) -> LoadedConfig:
    """The files merged in order, then the overrides; remembers the sections whose ``type`` an override changed
    (``rollout.config.retype``: the schema drops the old type's keys when it validates)."""
    data: dict[str, Any] = {}
    for path in paths:
        data = deep_merge(data, load_yaml(path))
    merged = apply_overrides(data, list(overrides))
    retypes = find_retypes(data, [(text, parse_override(text)[0]) for text in overrides], merged)
    return LoadedConfig(merged, retypes=retypes)


def validate(model: type[M], data: Any, prefix: str = "") -> M:
    """``model.model_validate(data)``, its errors turned into a ConfigError (``config_error``)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, prefix, model) from None


def coerce(model: type[M], config: Any, prefix: str = "") -> M:
    """A component's config from what its constructor was given: the defaults for None, an instance as is,
    anything else validated (errors name ``prefix.<field>``)."""
    if config is None:
        return model()
    return config if isinstance(config, model) else validate(model, config, prefix)


def config_error(exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> ConfigError:
    """Every problem, one line each (``field: message``); the error's ``field`` is the first problem's. With the
    ``model`` that was validated, an unknown key close to one its section takes says which (``did you mean``)."""
    problems: list[tuple[str, str]] = []
    for error in exc.errors():
        found = problem(error, prefix, model_name(exc), model)
        if found not in problems:
            problems.append(found)
    (field, first), *rest = problems
    return ConfigError("\n".join([first, *(f"{f}: {m}" for f, m in rest)]), field)


def problem(error: Any, prefix: str, model: str, schema: type[BaseModel] | None = None) -> tuple[str, str]:
    """(field, message) of one validation error."""
    loc = ".".join(str(p) for p in error["loc"])
    field = ".".join(p for p in (prefix, loc) if p) or model
    msg = error["msg"]
    if error["type"] == "extra_forbidden":
        parent = ".".join(p for p in (prefix, *map(str, error["loc"][:-1])) if p)
        msg = unknown_key(str(error["loc"][-1]), keys_at(schema, error["loc"][:-1]) if schema else set(), parent)
    elif "input" in error and not isinstance(error["input"], (dict, list)):
        msg = f"{msg} (got {error['input']!r})"
    return field, msg


def model_name(exc: ValidationError) -> str:
    return str(exc.title)


def unknown_key(key: str, known: Iterable[str], parent: str = "") -> str:
    """"unknown key", with the closest key the section takes by its full dotted path when one is close:
    ``unknown key (did you mean agent.max_steps?)``."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return f"unknown key (did you mean {'.'.join(p for p in (parent, close[0]) if p)}?)" if close else "unknown key"


def keys_at(schema: Any, path: tuple[Any, ...]) -> set[str]:
    """The keys the section at ``path`` (a validation error's location) of ``schema`` takes: its fields and their
    aliases; none when ``path`` leads to no model (a free-form mapping)."""
    if not path:
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            return {*schema.model_fields, *(f.alias for f in schema.model_fields.values() if f.alias)}
        return set().union(*(keys_at(arm, path) for arm in _arms(schema)))
    part, rest = path[0], path[1:]
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        fields = {f.alias or name: f for name, f in schema.model_fields.items()} | schema.model_fields
        return keys_at(fields[part].annotation, rest) if part in fields else set()
    arms = _arms(schema)
    named = [arm for arm in arms if getattr(arm, "__name__", None) == part]  # a union's member, named in the loc
    if named:
        return keys_at(named[0], rest)
    origin, args = typing.get_origin(schema), typing.get_args(schema)
    if origin in (list, tuple, set, frozenset) and args and isinstance(part, int):
        return keys_at(args[0], rest)
    if origin is dict and len(args) == 2:
        return keys_at(args[1], rest)
    return set().union(*(keys_at(arm, path) for arm in arms))


def _arms(schema: Any) -> tuple[Any, ...]:
    """The types a union (``X | None``, ``Optional``, ``Annotated``) may hold; none for anything else."""
    if typing.get_origin(schema) is typing.Annotated:
        return (typing.get_args(schema)[0],)
    if typing.get_origin(schema) in (typing.Union, types.UnionType):
        return typing.get_args(schema)
    return ()
