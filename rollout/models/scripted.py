"""ScriptedModel: the one model test double. Replays outputs or calls a policy; fakes token data.

Usable from YAML::

    model:
      type: scripted
      outputs: ["I'll look.\\n```bash\\nls\\n```", {content: done, finish_reason: stop}]
    # or
    model:
      type: scripted
      policy: demo            # a short name or a dotted path "pkg.module:function"
"""

from __future__ import annotations

import collections
import itertools
import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Union

from pydantic import BaseModel, ConfigDict, Field

from rollout.errors import ContextLengthExceeded, ModelError
from rollout.models import scripted_tokens
from rollout.models.registry import POLICIES
from rollout.protocols import ModelResponse
from rollout.records import Message, RequestMeta, Task, Usage

Output = Union[str, dict[str, Any]]
"""A scripted output: text, or ``{content?, tool_calls?: [{name, arguments}], finish_reason?}``.
``{"error": "context_length"}`` makes the call fail as a context-length rejection would."""


@dataclass
class PolicyContext:
    """What a policy may look at besides the messages."""

    meta: RequestMeta
    task: Task | None
    tools: list[dict[str, Any]] | None


Policy = Callable[[list[Message], PolicyContext], Output]


class ScriptedModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = "scripted"
    outputs: list[Output] | None = None
    """Outputs replayed in order, per rollout (each rollout id has its own cursor)."""
    policy: str | None = None
    """A policy's short name or dotted import path; called with (messages, PolicyContext)."""
    name: str = "scripted"
    context_window: int | None = Field(default=None, ge=1)
    """Reject prompts longer than this many fake tokens, like a server's context-length 400."""


_call_ids = itertools.count(1)


def to_message(output: Output) -> tuple[Message, str]:
    """Normalise a scripted output to an OpenAI assistant message and a finish reason."""
    if isinstance(output, str):
        return {"role": "assistant", "content": output}, "stop"
    if not isinstance(output, Mapping):
        raise ModelError(f"scripted output must be a string or a mapping, got {type(output).__name__}", retryable=False)
    message: Message = {"role": "assistant", "content": output.get("content")}
    calls = []
    for call in output.get("tool_calls") or []:
        args = call.get("arguments", {})
        calls.append(
            {
                "id": call.get("id") or f"call_{next(_call_ids)}",
                "type": "function",
                "function": {
                    "name": call.get("name", ""),
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    if calls:
        message["tool_calls"] = calls
    finish = output.get("finish_reason") or ("tool_calls" if calls else "stop")
    return message, finish


def fake_response(messages: list[Message], message: Message, finish: str, model: str = "scripted") -> ModelResponse:
    prompt_ids = scripted_tokens.prompt_token_ids(messages)  # ends with the generation prompt
    text = scripted_tokens.render_reply(message)
    completion_ids = scripted_tokens.token_ids(text)
    return ModelResponse(
        message=message,
        finish_reason=finish,
        usage=Usage(
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(completion_ids),
            total_tokens=len(prompt_ids) + len(completion_ids),
        ),
        prompt_token_ids=prompt_ids,
        completion_token_ids=completion_ids,
        logprobs=scripted_tokens.logprobs(text),
        model=model,
    )


class ScriptedModel:
    """Deterministic model: a list of outputs replayed per rollout, or a policy function."""

    def __init__(
        self,
        outputs: list[Output] | None = None,
        policy: Policy | None = None,
        *,
        tasks: Mapping[str, Task] | None = None,
        name: str = "scripted",
        context_window: int | None = None,
    ):
        if (outputs is None) == (policy is None):
            raise ValueError("ScriptedModel needs exactly one of outputs= or policy=")
        self.outputs = list(outputs) if outputs is not None else None
        self.policy = policy
        self.tasks = tasks if tasks is not None else {}  # a live view: tasks bound later are seen
        self.name = name
        self.context_window = context_window
        self._cursor: dict[str, int] = {}
        self.calls = 0
        self.requests: collections.deque[RequestMeta] = collections.deque(maxlen=10_000)
        """The identity of the latest requests, in order (tests and affinity checks read it)."""

    @classmethod
    def from_config(cls, config: ScriptedModelConfig, tasks: Mapping[str, Task] | None = None) -> "ScriptedModel":
        policy = None
        if config.policy is not None:
            policy = POLICIES.load(config.policy, field="model.policy")
        return cls(config.outputs, policy, tasks=tasks, name=config.name, context_window=config.context_window)

    def next_output(self, messages: list[Message], tools: list[dict[str, Any]] | None, meta: RequestMeta) -> Output:
        if self.policy is not None:
            return self.policy(messages, PolicyContext(meta, self.tasks.get(meta.task_id), tools))
        key = meta.rollout_id
        i = self._cursor.get(key, 0)
        if i >= len(self.outputs):
            raise ModelError(f"scripted model ran out of outputs after {i} for rollout {key!r}", retryable=False)
        self._cursor[key] = i + 1
        return self.outputs[i]

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        meta: RequestMeta | None = None,
        **sampling: Any,
    ) -> ModelResponse:
        meta = meta or RequestMeta()
        self.calls += 1
        self.requests.append(meta)
        output = self.next_output(messages, tools, meta)
        if isinstance(output, Mapping) and output.get("error") == "context_length":
            raise ContextLengthExceeded("scripted: prompt exceeds the context window")
        if self.context_window is not None:
            n = len(scripted_tokens.prompt_token_ids(messages))
            if n > self.context_window:
                raise ContextLengthExceeded(f"prompt has {n} tokens; context window is {self.context_window}")
        message, finish = to_message(output)
        return fake_response(messages, message, finish, self.name)
