"""A request's checks as OpenAI makes them: one 400 naming the field (``Invalid``), for the body's shape, its
prompts, the counts it asks for and the type of every sampling field (``temperature: "hot"`` is refused, as
OpenAI refuses it, whether or not the scripted policy reads the field)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rollout.models import scripted_tokens
from rollout.records import Message
from rollout.wire.chat import error_body

MAX_N, MAX_TOP_LOGPROBS = 128, 20
TEXT_MAX_TOKENS = 16
"""``/v1/completions`` answers at most 16 tokens unless told, as OpenAI's and vLLM's do."""
NUMBER, INTEGER, STRING, BOOLEAN, OBJECT, ARRAY = "a number", "an integer", "a string", "a boolean", "an object", \
    "an array"
SAMPLING_TYPES: dict[str, tuple[str, ...]] = {
    "temperature": (NUMBER,), "top_p": (NUMBER,), "presence_penalty": (NUMBER,), "frequency_penalty": (NUMBER,),
    "seed": (INTEGER,), "stop": (STRING, ARRAY), "logit_bias": (OBJECT,), "user": (STRING,),
    "top_k": (INTEGER,), "min_p": (NUMBER,), "repetition_penalty": (NUMBER,), "min_tokens": (INTEGER,),
    "ignore_eos": (BOOLEAN,), "stop_token_ids": (ARRAY,), "skip_special_tokens": (BOOLEAN,),
    "include_stop_str_in_output": (BOOLEAN,), "metadata": (OBJECT,), "tools": (ARRAY,),
    "parallel_tool_calls": (BOOLEAN,), "response_format": (OBJECT,), "return_token_ids": (BOOLEAN,),
}
"""The JSON type(s) each sampling field a client may send must have (the counts are checked with their bounds)."""


class Invalid(ValueError):
    """A request OpenAI refuses with 400; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.param, self.code = param, code

    def body(self) -> dict[str, Any]:
        return error_body(str(self), 400, kind="invalid_request_error", code=self.code, param=self.param)


@dataclass
class ApiRequest:
    kind: str
    """``chat`` (``/v1/chat/completions``) or ``text`` (``/v1/completions``)."""
    body: dict[str, Any]
    prompts: list[list[Message]]
    """The conversations to answer: a chat request's messages, or per text prompt its user message (a token-id
    prompt: the conversation its fake ids render, ``scripted_tokens.messages_of``)."""
    prompt_ids: list[list[int]] | None = None
    """A text request's prompt ids, as sent (token-id prompts) or as the fake tokenizer splits the text."""
    n: int = 1
    max_tokens: int | None = None
    logprobs: int | None = None
    """None: no logprobs; else how many alternatives each token's ``top_logprobs`` lists."""
    stream: bool = False
    include_usage: bool = False


def load_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError:
        raise Invalid("We could not parse the JSON body of your request: it is not JSON.", None,
                      "invalid_json") from None
    if not isinstance(body, dict):
        raise Invalid(f"The request body must be a JSON object, but got {a(body)} instead.", None, "invalid_type")
    return body


def parse_request(raw: bytes, kind: str) -> ApiRequest:
    """The request's fields, checked as OpenAI checks them; anything else a client may send is ignored."""
    body = load_object(raw)
    prompts, prompt_ids = _prompts(body, kind)
    req = ApiRequest(kind, body, prompts, prompt_ids, n=integer(body, "n", 1, 1, MAX_N))
    limit = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    req.max_tokens = integer(body, limit, TEXT_MAX_TOKENS if kind == "text" else None, 1)
    if kind == "chat":
        top = integer(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
        if top and not boolean(body, "logprobs"):
            raise Invalid("Invalid value for 'top_logprobs': 'logprobs' must be true to use it.", "top_logprobs")
        req.logprobs = top if boolean(body, "logprobs") else None
    else:
        req.logprobs = integer(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)
    req.stream = boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise Invalid(f"Invalid type for 'stream_options': expected an object, but got {a(options)} instead.",
                      "stream_options", "invalid_type")
    req.include_usage = boolean(options or {}, "include_usage", "stream_options.include_usage")
    check_sampling(body)
    return req


def check_sampling(fields: dict[str, Any], prefix: str = "") -> None:
    """Every field of ``SAMPLING_TYPES`` present in ``fields`` has its type (``prefix`` names where they sit)."""
    for name, types in SAMPLING_TYPES.items():
        value = fields.get(name)
        if value is not None and a(value) not in types and not (NUMBER in types and a(value) == INTEGER):
            raise Invalid(f"Invalid type for '{prefix}{name}': expected {' or '.join(types)}, but got {a(value)} "
                          "instead.", prefix + name, "invalid_type")


def _prompts(body: dict[str, Any], kind: str) -> tuple[list[list[Message]], list[list[int]] | None]:
    name = "messages" if kind == "chat" else "prompt"
    if body.get(name) is None:
        raise Invalid(f"Missing required parameter: '{name}'.", name, "missing_required_parameter")
    value = body[name]
    if kind == "chat":
        if not isinstance(value, list):
            raise Invalid(f"Invalid type for 'messages': expected an array of objects, but got {a(value)} instead.",
                          "messages", "invalid_type")
        for i, message in enumerate(value):
            if not isinstance(message, dict):
                raise Invalid(f"Invalid type for 'messages[{i}]': expected an object, but got {a(message)} instead.",
                              f"messages[{i}]", "invalid_type")
        return [value], None
    if isinstance(value, list) and value and all(token_list(p) for p in value):
        ids = value
    elif token_list(value):
        ids = [value]
    else:
        prompts = [value] if isinstance(value, str) else value
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise Invalid("Invalid value for 'prompt': expected a string, an array of strings, an array of token "
                          "ids or an array of arrays of token ids.", "prompt")
        return [[{"role": "user", "content": p}] for p in prompts], [scripted_tokens.token_ids(p) for p in prompts]
    return [scripted_tokens.messages_of(scripted_tokens.decode(p)) for p in ids], [list(p) for p in ids]


def token_list(value: Any) -> bool:
    """A non-empty array of token ids (non-negative integers)."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value))


def a(value: Any) -> str:
    """The JSON type of ``value``, with its article."""
    if isinstance(value, bool):
        return BOOLEAN
    names = {str: STRING, int: INTEGER, float: NUMBER, list: ARRAY, dict: OBJECT}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def integer(body: dict[str, Any], name: str, default: int | None, low: int, high: int | None = None,
            param: str | None = None) -> int | None:
    value, param = body.get(name), param or name
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"Invalid type for '{param}': expected an integer, but got {a(value)} instead.", param,
                      "invalid_type")
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise Invalid(f"Invalid value for '{param}': expected an integer {bound}, but got {value} instead.", param,
                      "integer_below_min_value" if value < low else "integer_above_max_value")
    return value


def boolean(body: dict[str, Any], name: str, param: str | None = None) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise Invalid(f"Invalid type for '{param or name}': expected a boolean, but got {a(value)} instead.",
                      param or name, "invalid_type")
    return bool(value)
