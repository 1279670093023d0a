"""NeMo Gym bodies ⇄ the farm's tasks and results, for both contract generations.

- Legacy (``/run``, ``/v1/responses``, the collection CLI): a row = ``responses_create_params`` (a Responses
  request) + task fields. ``legacy_task`` makes it a ``Task`` (the conversation, the row's sampling, the
  resources-server context in ``task.gym``, a ``GymContext``; the row's other fields in ``data`` for environments
  that read them, such as SWE rows); ``verify_reply`` is what ``/run`` answers: the resources server's verify
  response with our Responses object (token data on its items) and ``mask_sample``/``failure_kind``/``failure_reason``.
- Episode (NeMo Gym 0.7.0): ``{episode_id: {rollout_id, attempt}, task: {task_id: {taskset, task_id},
  task_input}}`` → ``episode_task``; ``episode_reply`` answers ``{episode_id, task_id}`` + ``result`` xor
  ``failure``, the failure from ``FAILURES``, the one table from our exit reasons to its vocabulary.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from cluster.gym.responses_request import request_problem
from rollout.errors import ConfigError
from rollout.records import GymContext, RolloutResult, Task
from rollout.wire.responses import ResponsesFormatError, chat_messages
from rollout.wire.responses_items import result_response

ROLLOUT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens", "seed": "seed"}
"""Responses request fields a rollout samples with, and their chat-completions names."""
NOT_TASK_DATA = ("agent_ref", "task_source")

FAILURES: dict[str, tuple[str | None, str, bool]] = {
    # our exit reason / event   → (NeMo Gym failure_kind, stage, terminal)
    "model_error": ("agent_run_error", "agent", False),
    "runtime_error": ("provider_unavailable", "agent", False),
    "container_start_failed": ("provider_unavailable", "seed", False),
    "environment_error": ("session_lost", "agent", False),
    "seed_failed": ("session_lost", "seed", False),
    "verifier_error": ("verifier_error", "verification", False),
    "worker_died": ("kill_shaped", "agent", False),
    "deadline_exceeded": ("agent_timeout", "agent", False),
    "episode_timeout": ("agent_timeout", "agent", False),
    "admission_timeout": (None, "admission", False),
    "cancelled": ("cancelled", "agent", False),
    "internal_error": ("agent_run_error", "agent", True),
    "bad_request": ("agent_request_failed", "admission", True),
}
"""How a failed episode is reported. Non-terminal: the collector may try the episode again (an infrastructure
failure the farm's own retries did not outlast, a timeout); terminal: trying again cannot help (a request we
cannot read, a failure the farm marked not retryable, an unhandled error)."""


class RowError(ConfigError, ValueError):
    """A body we cannot run: a bad task, as a ``ConfigError`` (HTTP 422; the message names the field)."""


def _params(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, Mapping):
        raise RowError(f"{where}: a JSON object")
    params = row.get("responses_create_params")
    if not isinstance(params, Mapping):
        raise RowError(f"{where}.responses_create_params: a Responses create request (an object with `input`)")
    if "input" not in params:
        raise RowError(f"{where}.responses_create_params.input: missing")
    problem = request_problem(params)
    if problem is not None:
        raise RowError(f"{where}.responses_create_params.{problem}")
    return dict(params)


HOST_PATHS = ("repo_path",)
"""Row fields naming a path on the agent server's machine (a SWE row's local repository): refused over HTTP unless
the server allows them (``gym.allow_repo_paths``), since a request could otherwise name any path."""


def _task(key: str, params: dict[str, Any], data: dict[str, Any], gym: GymContext,
          profiles: Any, agent_ref: Any, allow_paths: bool = False) -> Task:
    named = [f for f in HOST_PATHS if data.get(f) is not None]
    if named and not allow_paths:
        raise RowError(f"{named[0]}: a path on the agent server's machine; this server does not take them "
                       "(gym.allow_repo_paths: true to allow)")
    try:
        messages = chat_messages(params)
    except ResponsesFormatError as exc:
        raise RowError(f"responses_create_params.{exc}") from None
    sampling = {ours: params[theirs] for theirs, ours in SAMPLING.items() if params.get(theirs) is not None}
    data = {**data, "sampling": sampling}
    name = agent_ref.get("name") if isinstance(agent_ref, Mapping) else agent_ref
    if isinstance(name, str) and name in (profiles or ()):
        data["profile"] = name
    return Task(task_id=key, messages=messages, data=data, gym=gym)


def legacy_task(row: Any, key: str, *, mode: str = "legacy", cookies: Mapping[str, str] | None = None,
                profiles: Any = (), allow_paths: bool = False) -> Task:
    """A legacy row (``/run`` body or a collection line) as a task whose id is ``key``."""
    params = _params(row, "body")
    base = {k: v for k, v in row.items() if not str(k).startswith("_ng_")}
    data = {k: v for k, v in base.items() if k != "responses_create_params" and k not in NOT_TASK_DATA}
    gym = GymContext(mode=mode, row=base, cookies=dict(cookies or {}), session_id=key)
    return _task(key, params, data, gym, profiles, row.get("agent_ref"), allow_paths)


def parse_episode(body: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(episode_id, task_id, task_input) of an episode request, checked as NeMo Gym 0.7.0 does."""
    if not isinstance(body, Mapping) or set(body) - {"episode_id", "task"}:
        raise RowError("body: an object with exactly `episode_id` and `task`")
    episode, task = body.get("episode_id"), body.get("task")
    if not isinstance(episode, Mapping) or set(episode) - {"rollout_id", "attempt"}:
        raise RowError("episode_id: {rollout_id, attempt}")
    rollout_id, attempt = episode.get("rollout_id"), episode.get("attempt", 0)
    if not isinstance(rollout_id, str) or not ROLLOUT_ID.fullmatch(rollout_id):
        raise RowError("episode_id.rollout_id: letters, digits, '.', '_' or '-', starting with a letter or digit")
    if re.search(r"-a[1-9][0-9]*$", rollout_id):
        raise RowError("episode_id.rollout_id: must not end with the reserved attempt suffix '-a<N>'")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        raise RowError("episode_id.attempt: an integer >= 0")
    if not isinstance(task, Mapping) or set(task) != {"task_id", "task_input"}:
        raise RowError("task: an object with exactly `task_id` and `task_input`")
    task_id = task["task_id"]
    if (not isinstance(task_id, Mapping) or set(task_id) != {"taskset", "task_id"}
            or not all(isinstance(task_id[k], str) and task_id[k] for k in ("taskset", "task_id"))):
        raise RowError("task.task_id: {taskset, task_id}, both non-empty strings")
    if not isinstance(task["task_input"], Mapping):
        raise RowError("task.task_input: an object")
    return {"rollout_id": rollout_id, "attempt": attempt}, dict(task_id), dict(task["task_input"])


def capture_key(episode_id: Mapping[str, Any]) -> str:
    """NeMo Gym's attempt-qualified key of an episode (the rollout id, ``-a<N>`` after a first attempt)."""
    attempt = episode_id.get("attempt", 0)
    return episode_id["rollout_id"] if not attempt else f"{episode_id['rollout_id']}-a{attempt}"


def episode_task(body: Any, profiles: Any = (),
                 allow_paths: bool = False) -> tuple[Task, dict[str, Any], dict[str, Any]]:
    """(the task, episode_id, task_id) of an episode request. ``task_input`` is a flat row or
    ``{responses_create_params, task_data}`` (flat fields merged into ``task_data``, conflicts refused)."""
    episode_id, task_id, task_input = parse_episode(body)
    params = _params(task_input, "task.task_input")
    task_data = task_input.get("task_data", {})
    if not isinstance(task_data, Mapping):
        raise RowError("task.task_input.task_data: an object")
    flat = {k: v for k, v in task_input.items() if k not in ("responses_create_params", "task_data")}
    for key in flat.keys() & task_data.keys():
        if flat[key] != task_data[key]:
            raise RowError(f"task.task_input: field {key!r} differs inside and outside task_data")
    task_data = {**task_data, **flat}
    key = capture_key(episode_id)
    row = {**task_data, "responses_create_params": params}
    gym = GymContext(mode="episode", row=row, session_id=key, episode_id=episode_id, task_id=task_id,
                     task_data=task_data)
    data = {k: v for k, v in task_data.items() if k not in NOT_TASK_DATA}
    task = _task(key, params, data, gym, profiles, task_data.get("agent_ref"), allow_paths)
    return task, episode_id, task_id


def verify_reply(result: RolloutResult, row: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A completed rollout as the legacy ``/run`` answer: the row's fields, the resources server's verify response
    over them, and our Responses object (the one ``/verify`` read, with the engine's token data on its items)."""
    reply = {**(row or {}), **(result.reward_details.get("verify_response") or {})}
    params = (row or {}).get("responses_create_params") or {}
    reply["response"] = result.outputs.response or result_response(result, params)  # (SWE: graded in a container)
    reply["reward"] = result.reward
    reply.setdefault("mask_sample", False)
    reply.setdefault("failure_kind", None)
    partial = result.exit_reason.value not in ("natural_completion", "environment_done", "submitted")
    reply.setdefault("failure_reason", f"{result.exit_reason.value}: {result.trajectory.exit_message or ''}"
                     .rstrip(": ") if partial else None)
    return reply


def failure_of(result: RolloutResult | None, event: str | None = None, reason: str = "") -> dict[str, Any]:
    """The episode ``failure`` of an infrastructure-failed result, or of an event (admission timeout, ...)."""
    if event is None and result is not None:
        event = result.exit_reason.value
        if result.error is not None and result.error.type == "SeedFailed":
            event = "seed_failed"
        elif event == "environment_error" and not result.trajectory.steps:
            event = "seed_failed"
        reason = reason or f"{event}: {result.error.message if result.error else ''}"
    kind, stage, terminal = FAILURES.get(event or "internal_error", FAILURES["internal_error"])
    if result is not None and result.error is not None and not result.error.retryable:
        terminal = True
    failure = {"failure_reason": (reason or event or "failed")[:2000], "terminal": terminal, "stage": stage}
    if kind is not None:
        failure["failure_kind"] = kind
    return failure


def episode_reply(episode_id: dict[str, Any], task_id: dict[str, Any], result: RolloutResult | None = None,
                  failure: dict[str, Any] | None = None, row: Mapping[str, Any] | None = None) -> dict[str, Any]:
    reply: dict[str, Any] = {"episode_id": episode_id, "task_id": task_id}
    if failure is None and result is not None and result.status == "completed":
        reply["result"] = verify_reply(result, row)
    else:
        reply["failure"] = failure or failure_of(result)
    return reply
