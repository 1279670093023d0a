"""Token-in mode: the client keeps each rollout's token stream, so the token data a trainer gets is exact by
construction, never a decode → re-encode round trip.

Turn 1's prompt is the conversation as the server's ``/tokenize`` renders it (chat template, tools, generation
prompt), or the model's own tokenizer in this process when ``tokenizer`` names it (Ray Serve LLM 2.60's
``/tokenize`` does not work with vLLM 0.32: it looks the tokenizer up under an old name). Turn k's prompt is
turn k-1's prompt ids + its completion ids + the template's end-of-turn tokens the completion lacks + the ids of
the messages added since (the observation delta), rendered as the difference between the conversation with them
and without them. The prompt goes as token ids to ``/v1/completions``, or (``token_in_route: generate``) to vLLM's
``/inference/v1/generate``, whose reply also names the weights version that sampled it; the completion text is
parsed for tool calls here (the server's chat parser is not in this path). When the agent rewrites earlier messages (a
conversation that is not append-only), or the template does not render the conversation append-only, the stream
starts over from a fresh rendering; the contiguity check
(``rollout.train.tokens``) then reports the break.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from rollout.errors import ModelError
from rollout.protocols import ModelResponse
from rollout.records import Message, RequestMeta, Usage
from rollout.wire.chat import snippet
from rollout.wire.generate import GENERATE_PATH, Generated, generate_body, parse_generate

DEFAULT_MAX_TOKENS = 1024
"""``/v1/completions`` answers 16 tokens unless told: a turn without ``max_tokens`` gets this many at most (less
when the context is nearly full)."""
HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class _Stream:
    messages: list[Message]
    """The conversation as of the end of the last turn, its assistant message included."""
    ids: list[int]
    """The last turn's prompt ids + completion ids."""
    stopped: bool
    """The last completion ended on a stop token (it holds the end-of-turn's first token)."""


class TokenStreams:
    """The token streams of one OpenAIModel's rollouts, keyed by rollout id."""

    def __init__(self, model: Any):
        self.model = model
        base = model.config.base_url.rstrip("/")
        self.root = base[: -len("/v1")] if base.endswith("/v1") else base
        self.completions_url = base + "/completions"
        self.generate_url = self.root + GENERATE_PATH
        self.streams: dict[str, _Stream] = {}
        self._end_of_turn: list[int] | None = None
        self._max_model_len: int | None = None
        self._tokenizer: Any = None

    def forget(self, rollout_id: str) -> None:
        self.streams.pop(rollout_id, None)

    async def tokenize(self, messages: list[Message] | None, tools: list | None, *, generation_prompt: bool = True,
                       text: str | None = None, headers: dict[str, str] | None = None) -> list[int]:
        if self.model.config.tokenizer:
            return self.local_tokenize(messages, tools, generation_prompt, text)
        body: dict[str, Any] = {"model": self.model.config.model}
        if text is not None:
            body.update(prompt=text, add_special_tokens=False)
        else:
            body.update(messages=messages, add_generation_prompt=generation_prompt)
            if tools:
                body["tools"] = tools
        data = await self.model._post(body, headers or self.model._headers, self.root + "/tokenize")
        if self._max_model_len is None and isinstance(data.get("max_model_len"), int):
            self._max_model_len = data["max_model_len"]
        return list(data["tokens"])

    def local_tokenize(self, messages: list[Message] | None, tools: list | None, generation_prompt: bool,
                       text: str | None) -> list[int]:
        """The same rendering with the model's own tokenizer and chat template, in this process (``tokenizer``):
        what vLLM's ``/tokenize`` does, for servers whose route is missing or broken."""
        tokenizer = self.local_tokenizer()
        if text is not None:
            return list(tokenizer.encode(text, add_special_tokens=False))
        ids = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=True,
                                                  add_generation_prompt=generation_prompt, return_dict=False)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)

    def local_tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model.config.tokenizer)
        return self._tokenizer

    async def end_of_turn(self, headers: dict[str, str]) -> list[int]:
        """The tokens the template puts after an assistant message's content (``<|im_end|>\\n`` for ChatML)."""
        if self._end_of_turn is None:
            user = [{"role": "user", "content": "a"}]
            with_reply = await self.tokenize(user + [{"role": "assistant", "content": "b"}], None,
                                             generation_prompt=False, headers=headers)
            asked = await self.tokenize(user, None, headers=headers)
            reply = await self.tokenize(None, None, text="b", headers=headers)
            if with_reply[: len(asked)] != asked or with_reply[len(asked): len(asked) + len(reply)] != reply:
                self._end_of_turn = []  # a template that does not render a reply after its prompt: no tail
            else:
                self._end_of_turn = with_reply[len(asked) + len(reply):]
        return self._end_of_turn

    async def prompt_ids(self, messages: list[Message], tools: list | None, key: str,
                         headers: dict[str, str]) -> list[int]:
        stream = self.streams.get(key)
        if stream is None or messages[: len(stream.messages)] != stream.messages:
            return await self.tokenize(messages, tools, headers=headers)
        full = await self.tokenize(messages, tools, headers=headers)
        upto = await self.tokenize(stream.messages, tools, generation_prompt=False, headers=headers)
        if full[: len(upto)] != upto:  # the template rewrites earlier turns: start over (a reported break)
            return full
        tail = await self.end_of_turn(headers)
        if stream.stopped and tail and stream.ids and stream.ids[-1] == tail[0]:
            tail = tail[1:]
        return stream.ids + tail + full[len(upto):]

    async def complete(self, messages: list[Message], tools: list | None, meta: RequestMeta | None,
                       sampling: dict[str, Any]) -> ModelResponse:
        model, cfg = self.model, self.model.config
        headers = model._request_headers(meta)
        key = meta.rollout_id if meta is not None else ""
        prompt = await self.prompt_ids(messages, tools, key, headers)
        body = model.request_body(messages, None, meta, sampling)
        body.pop("messages", None)
        body.pop("tool_choice", None)
        body.update(prompt=prompt, return_token_ids=True, logprobs=1)
        if body.get("max_tokens") is None:
            room = (self._max_model_len - len(prompt)) if self._max_model_len else DEFAULT_MAX_TOKENS
            body["max_tokens"] = max(1, min(DEFAULT_MAX_TOKENS, room))
        generate = cfg.token_in_route == "generate"
        url = self.generate_url if generate else self.completions_url
        data = await model._post(generate_body(prompt, body) if generate else body, headers, url)
        try:
            got = parse_generate(data) if generate else parse_completion(data)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ModelError(f"POST {url}: malformed response ({exc!r}): {snippet(json.dumps(data))}") from None
        completion, logprobs, finish = got.completion_ids, got.logprobs, got.finish_reason
        text = got.text if got.text is not None else await self.detokenize(completion, headers)
        message = assistant_message(text, bool(tools), cfg.tool_call_format)
        if message.get("tool_calls") and finish == "stop":
            finish = "tool_calls"
        if key:
            self.streams[key] = _Stream(list(messages) + [message], prompt + completion, finish != "length")
        return ModelResponse(
            message=message, finish_reason=finish,
            usage=Usage(prompt_tokens=len(prompt), completion_tokens=len(completion),
                        total_tokens=len(prompt) + len(completion)),
            prompt_token_ids=prompt, completion_token_ids=completion, logprobs=logprobs or None,
            model=data.get("model") or cfg.model, policy_version=got.weight_version,
        )

    async def detokenize(self, ids: list[int], headers: dict[str, str]) -> str:
        """The text of ``ids``, for a generate server that answered token ids only: the model's own tokenizer
        (``tokenizer``), else the server's ``/detokenize``."""
        if self.model.config.tokenizer:
            return self.local_tokenizer().decode(ids, skip_special_tokens=True)
        data = await self.model._post({"model": self.model.config.model, "tokens": ids}, headers,
                                      self.root + "/detokenize")
        return str(data["prompt"])


def parse_completion(data: dict[str, Any]) -> Generated:
    """A ``/v1/completions`` reply to a token-id prompt, read as a generate reply is."""
    choice = data["choices"][0]
    return Generated(prompt_ids=None, completion_ids=list(choice["token_ids"]),
                     logprobs=[float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []],
                     finish_reason=choice.get("finish_reason"), text=choice.get("text") or "", weight_version=None,
                     model=data.get("model") or "")


def assistant_message(text: str, with_tools: bool, tool_call_format: str = "hermes") -> Message:
    """The assistant message of a raw completion: hermes ``<tool_call>`` blocks become ``tool_calls`` (a block
    that is not a JSON object with a name stays in the text, for the agent to feed back as a format error)."""
    if not with_tools or tool_call_format != "hermes":
        return {"role": "assistant", "content": text}
    calls, kept = [], text
    for n, match in enumerate(HERMES_CALL.finditer(text)):
        try:
            call = json.loads(match.group(1))
            name, args = call["name"], call.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            continue
        calls.append({"id": f"call_{n}", "type": "function",
                      "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}})
        kept = kept.replace(match.group(0), "", 1)
    message: Message = {"role": "assistant", "content": kept.strip() or None if calls else text}
    if calls:
        message["tool_calls"] = calls
    return message
