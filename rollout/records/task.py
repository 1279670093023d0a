"""What a rollout is given: the Task, and the identity it carries to the model (RequestMeta)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, PrivateAttr

from rollout.records.base import Message, Record


class Task(Record):
    """One unit of work. ``data`` holds whatever the environment and verifier need."""

    task_id: str
    prompt: str | None = None
    """The user's request; becomes the first user message unless ``messages`` is given."""
    messages: list[Message] | None = None
    """A full opening conversation, used as is."""
    data: dict[str, Any] = Field(default_factory=dict)
    """Environment/verifier inputs (expected answer, SWE-bench fields, ...)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Carried through to the result, never interpreted."""
    _row_hash: str | None = PrivateAttr(default=None)
    """Hash of the dataset row this task was read from (set by ``rollout.data.dataset.load_tasks``)."""

    def opening_messages(self, system_prompt: str | None = None) -> list[Message]:
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        out: list[Message] = []
        if system_prompt:
            out.append({"role": "system", "content": system_prompt})
        out.append({"role": "user", "content": self.prompt or ""})
        return out


class RequestMeta(Record):
    """The rollout's identity, sent with every model request (served policies, replica affinity)."""

    rollout_id: str = ""
    task_id: str = ""
    sample_index: int = 0
    attempt: int = 1
    run_id: str = ""
    seed: int | None = None
    group_id: str = ""
    """The group this sample belongs to (n samples of one task, GRPO style); ``sample_index`` is its index."""
    policy_version: str | None = None
    """The policy version the request is sampled under (``set_policy_version``; ``cache_salt`` salts with it)."""
