"""What a rollout is given: the Task (with the agent server's GymContext when it came through NeMo Gym's
contract), and the identity it carries to the model (RequestMeta)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr

from rollout.records.base import Message, Record


class GymContext(Record):
    """What a task that came through NeMo Gym's contract carries for its resources server (``Task.gym``): written
    by the agent server and the collection CLI (``cluster.gym.rows``), read by the resources environments."""

    mode: Literal["legacy", "episode", "responses"] = "legacy"
    """``legacy``: a ``/run`` body or a collection line (seeded with the row, verified); ``episode``: NeMo Gym
    0.7.0's contract (seeded and closed by session id); ``responses``: ``/v1/responses``, the tool loop alone (no
    seed, verify or close)."""
    row: dict[str, Any] = Field(default_factory=dict)
    """The verify body's base: the row's fields and its ``responses_create_params``."""
    cookies: dict[str, str] = Field(default_factory=dict)
    """The caller's cookies: sent with the rollout's calls to the resources server, never another rollout's."""
    session_id: str = ""
    """The episode's key; each attempt's ``resources_session_id`` adds a suffix of its own."""
    episode_id: dict[str, Any] | None = None
    """Episode contract: ``{rollout_id, attempt}``."""
    task_id: dict[str, str] | None = None
    """Episode contract: ``{taskset, task_id}``."""
    task_data: dict[str, Any] = Field(default_factory=dict)
    """Episode contract: the task's fields, as the seed request sends them."""

    @property
    def request(self) -> dict[str, Any]:
        """The row's Responses request (``responses_create_params``; empty without one)."""
        return dict(self.row.get("responses_create_params") or {})

    @property
    def verified(self) -> bool:
        """Whether the rollout is seeded and verified: every mode but ``responses``."""
        return self.mode != "responses"


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
    gym: GymContext | None = None
    """The agent server's context, on a task that came through NeMo Gym's contract; None otherwise."""
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
