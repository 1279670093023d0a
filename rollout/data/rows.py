"""Rows of a dataset file with the line each starts on: JSONL, a JSON list, or a Hugging Face dataset
(``hf://name[:split]``); every problem a ``ConfigError`` naming the file and the line."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, NoReturn

from rollout.errors import ConfigError

HF_PREFIX = "hf://"
"""``hf://<name>[:<split>]`` names a Hugging Face dataset (needs the optional ``datasets`` package and the hub)."""
HUB_TIMEOUT = 2.0
"""Seconds the hub's host (or the proxy to it) has to take a connection before a hub dataset fails at once."""
TRUE = ("1", "ON", "YES", "TRUE")


def hf_rows(spec: str) -> list[tuple[int, Any]]:
    """Rows of a hub dataset, numbered from 1 like lines, so errors point at a row. Offline (``HF_HUB_OFFLINE``,
    ``HF_DATASETS_OFFLINE``) only a cached copy is used; an unreachable hub fails at once, not after retries."""
    name, _, split = spec[len(HF_PREFIX):].partition(":")
    split = split or "test"
    try:
        import datasets
    except ImportError:
        raise ConfigError("a Hugging Face dataset needs the optional `datasets` package: pip install datasets",
                          spec) from None
    offline = offline_variable()
    if offline is None:
        endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
        down = unreachable(endpoint)
        if down:
            raise ConfigError(f"cannot load {name!r} (split {split!r}): the Hugging Face hub at {endpoint} is "
                              f"unreachable ({down}); with HF_HUB_OFFLINE=1 a cached copy is used", spec)
    try:
        rows = datasets.load_dataset(name, split=split)
    except Exception as exc:  # noqa: BLE001 - offline, unknown name, bad split: one line for the user
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if offline and isinstance(exc, ConnectionError):  # what datasets raises for a dataset it has no copy of
            reason = "no copy in the local cache"
        where = f"offline ({offline} is set)" if offline else "from the Hugging Face hub"
        raise ConfigError(f"cannot load {name!r} (split {split!r}) {where}: {reason}", spec) from None
    return [(i, dict(row)) for i, row in enumerate(rows, start=1)]


def offline_variable() -> str | None:
    """The variable that puts ``datasets`` in offline mode, or None (its rule: ``HF_DATASETS_OFFLINE`` when set,
    else ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    if os.environ.get("HF_DATASETS_OFFLINE") is not None:
        return "HF_DATASETS_OFFLINE" if os.environ["HF_DATASETS_OFFLINE"].upper() in TRUE else None
    return next((v for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if os.environ.get(v, "").upper() in TRUE),
                None)


def unreachable(endpoint: str, timeout: float = HUB_TIMEOUT) -> str | None:
    """Why ``endpoint``'s host (or the proxy the environment sets for it) takes no TCP connection within
    ``timeout`` seconds, name lookup included; None when it does."""
    url = urllib.parse.urlsplit(endpoint)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        proxy_url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy_url.hostname or "", proxy_url.port or 80
    if not host:
        return None  # no host to try: datasets says what is wrong with the endpoint
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=connect, name="hub-probe", daemon=True)  # a name lookup cannot be timed out
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"no connection to {host}:{port} within {timeout:g} s"
    exc = outcome[0]
    if exc is None:
        return None
    if isinstance(exc, socket.gaierror):
        return f"{host} does not resolve"
    if isinstance(exc, TimeoutError):
        return f"no connection to {host}:{port} within {timeout:g} s"
    return f"{host}:{port}: {exc.strerror or exc}"


def fail(path: Path, line: int, problem: str) -> NoReturn:
    raise ConfigError(f"line {line}: {problem}", str(path))


def utf8_text(data: bytes, path: Path) -> str:
    """A dataset file's bytes as text, newlines as text mode reads them; bytes that are not UTF-8 fail naming
    their line and column (the codec's own error gives a byte offset into the whole file)."""
    try:
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        column = len(data[start:exc.start].decode("utf-8")) + 1  # the bytes before the first bad one are UTF-8
        fail(path, data.count(b"\n", 0, exc.start) + 1,
             f"not UTF-8 text: byte 0x{data[exc.start]:02x} at column {column} (a dataset file must be UTF-8)")


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
