"""Rows of a dataset file with the line each starts on: JSONL, a JSON list, or a Hugging Face dataset
(``hf://name[:split]``); every problem a ``ConfigError`` naming the file and the line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rollout.errors import ConfigError


HF_PREFIX = "hf://"
"""``hf://<name>[:<split>]`` names a Hugging Face dataset (needs the optional ``datasets`` package and the hub)."""


def hf_rows(spec: str) -> list[tuple[int, Any]]:
    """Rows of a hub dataset, numbered from 1 like lines, so errors point at a row."""
    name, _, split = spec[len(HF_PREFIX):].partition(":")
    try:
        import datasets
    except ImportError:
        raise ConfigError("a Hugging Face dataset needs the optional `datasets` package: pip install datasets",
                          spec) from None
    try:
        rows = datasets.load_dataset(name, split=split or "test")
    except Exception as exc:  # noqa: BLE001 - offline, unknown name, bad split: one line for the user
        raise ConfigError(f"cannot load {name!r} (split {split or 'test'!r}) from the Hugging Face hub: "
                          f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", spec) from None
    return [(i, dict(row)) for i, row in enumerate(rows, start=1)]


def fail(path: Path, line: int, problem: str) -> None:
    raise ConfigError(f"line {line}: {problem}", str(path))


def jsonl_rows(text: str, path: Path) -> list[tuple[int, Any]]:
    rows = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            rows.append((number, json.loads(raw)))
        except json.JSONDecodeError as exc:
            fail(path, number, f"invalid JSON: {exc.msg} (column {exc.colno})")
    return rows


def json_list_rows(text: str, path: Path) -> list[tuple[int, Any]]:
    """Decode the list item by item so each row still knows the line it starts on."""
    decoder = json.JSONDecoder()
    ws = re.compile(r"\s*")
    line_of = lambda pos: text.count("\n", 0, pos) + 1  # noqa: E731

    def decode_error(exc: json.JSONDecodeError) -> None:
        fail(path, exc.lineno, f"invalid JSON: {exc.msg} (column {exc.colno})")

    pos = ws.match(text, 0).end()
    if not text.startswith("[", pos):
        fail(path, line_of(pos), "a .json dataset must hold a list of tasks (use .jsonl for one task per line)")
    pos = ws.match(text, pos + 1).end()
    rows: list[tuple[int, Any]] = []
    if text.startswith("]", pos):
        return rows
    while True:
        try:
            item, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            decode_error(exc)
        rows.append((line_of(pos), item))
        pos = ws.match(text, end).end()
        if text.startswith("]", pos):
            break
        if not text.startswith(",", pos):
            fail(path, line_of(pos), "invalid JSON: expected ',' or ']' after a task")
        pos = ws.match(text, pos + 1).end()
    if ws.match(text, pos + 1).end() != len(text):
        fail(path, line_of(pos + 1), "invalid JSON: extra data after the list")
    return rows


def type_name(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )
