"""RolloutContext: what one running rollout carries (identity, limits, observers, the growing
trajectory), and the model-call and observation bookkeeping every agent loop shares."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterable

from rollout import events
from rollout.errors import ModelError, RolloutError, TaskOutcome
from rollout.events import Emitter, Observer
from rollout.protocols import Model
from rollout.records import Message, Observation, RequestMeta, Step, Trajectory
from rollout.termination import Limits, Termination
from rollout.waits import within


class RolloutContext:
    """Owned by the runner; agents append to ``trajectory`` so a cut-short rollout keeps its history."""

    def __init__(
        self,
        meta: RequestMeta | None = None,
        limits: Limits | None = None,
        observers: Iterable[Observer] = (),
        sampling: dict[str, Any] | None = None,
    ):
        self.meta = meta or RequestMeta()
        self.limits = limits or Limits()
        self.termination = Termination(self.limits)
        self.emitter = Emitter(observers, self.meta.rollout_id, self.meta.task_id)
        self.trajectory = Trajectory()
        self.sampling = dict(sampling or {})
        self.timings: dict[str, float] = {}
        """Seconds of the attempt's parts measured here (``reset``), copied into the result's ``timings``."""
        if self.meta.seed is not None:
            self.sampling.setdefault("seed", self.meta.seed)

    @property
    def messages(self) -> list[Message]:
        return self.trajectory.messages

    def add_messages(self, *messages: Message) -> None:
        """The message list only grows: prefix caches hit and token ids stay exact."""
        self.trajectory.messages.extend(messages)

    async def reset_env(self, env: Any, task: Any) -> Any:
        """``env.reset(task)``, timed (container start, repo checkout) and reported as ``env_ready``."""
        t0 = time.perf_counter()
        reset = await env.reset(task)
        self.termination.start_clock()  # image builds and container starts are not the agent's time
        self.timings["reset"] = time.perf_counter() - t0
        self.emitter.emit(events.ENV_READY, seconds=self.timings["reset"])
        return reset

    async def query(self, model: Model, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> Step:
        """Call the model on the prompt (the conversation as the agent shows it; the limits were checked before),
        record the step.

        The step is recorded before ``finish_reason == "length"`` ends the rollout, so the cut
        output (and its tokens) stay in the trajectory.
        """
        started = time.time()
        t0 = time.perf_counter()
        response = await self._complete(model, messages, tools)
        step = self.record_reply(response, started, time.perf_counter() - t0)
        self.emitter.emit(
            events.MODEL_CALL_DONE,
            step=step.index,
            seconds=step.model_seconds,
            finish_reason=response.finish_reason,
            prompt_tokens=response.usage.prompt_tokens,
            completion_tokens=response.usage.completion_tokens,
        )
        self.termination.after_model_call(response)
        return step

    def record_reply(self, response: Any, started: float, seconds: float) -> Step:
        """A model reply (ours, or one a caller generated) as the trajectory's next step and message."""
        message = clean_text(dict(response.message))
        message.setdefault("role", "assistant")
        message.setdefault("content", None)
        step = Step(
            index=len(self.trajectory.steps) + 1,
            message=message,
            finish_reason=response.finish_reason,
            started_at=started,
            model_seconds=seconds,
            usage=response.usage,
            prompt_token_ids=response.prompt_token_ids,
            completion_token_ids=response.completion_token_ids,
            logprobs=response.logprobs,
            policy_version=response.policy_version,
        )
        self.trajectory.messages.append(message)
        self.trajectory.steps.append(step)
        return step

    def record_exit(self, outcome: RolloutError) -> None:
        """How the episode ended, on the trajectory: the reason, the submission, the reason in words, the step it
        ended on. The one recorder of an exit: ``Episode.finish`` calls it for every outcome of the loop; the runner
        only for an exit no episode saw (its own time-limit cut, an agent not built on the loop)."""
        traj = self.trajectory
        traj.exit_reason = outcome.exit_reason
        traj.exit_message = outcome.message or None
        if isinstance(outcome, TaskOutcome) and outcome.submission is not None:
            traj.submission = outcome.submission
        if traj.steps:
            traj.steps[-1].termination_reason = outcome.exit_reason

    async def _complete(self, model: Model, messages: list[Message], tools: list[dict[str, Any]] | None) -> Any:
        """``model.complete`` on the model's clock, cut when the rollout's model budget is spent: a model that
        does not answer in time (an outage, retries, an overloaded server) is infrastructure, not the policy."""
        term = self.termination
        budget = term.model_time_left()
        call = model.complete(messages, tools, meta=self.meta, **self.sampling)
        term.model_call_started()
        try:
            return await within(call, budget)  # a timer, not a task per call as wait_for makes
        except (asyncio.TimeoutError, TimeoutError) as exc:
            spent = term.model_seconds()
            raise ModelError(
                f"no model reply within the rollout's model_time_limit={self.limits.model_budget:g}s "
                f"({spent:.1f}s spent in model calls, retries included)"
            ) from exc
        finally:
            term.model_call_ended()

    async def execute(self, env: Any, step: Step, actions: list[Any]) -> list[Observation]:
        """``env.step(actions)``, announced (``action_started``: a live view shows a command that hangs) and
        recorded on ``step`` with its time."""
        if actions:
            first = actions[0]
            self.emitter.emit(events.ACTION_STARTED, step=step.index,
                              command=first.arguments.get("command") or first.raw or first.name)
        t0 = time.perf_counter()
        observations = await env.step(actions)
        self.record_observations(step, observations, time.perf_counter() - t0)
        return observations

    def record_observations(self, step: Step, observations: list[Observation], seconds: float) -> None:
        step.observations.extend(observations)
        step.env_seconds += seconds
        for obs in observations:
            if obs.reward is not None:
                self.trajectory.env_reward += obs.reward
            self.emitter.emit(
                events.ACTION_EXECUTED,
                step=step.index,
                action=obs.action_name,
                success=obs.success,
                seconds=obs.info.get("duration", seconds / max(1, len(observations))),
                command=obs.info.get("command"),
            )

    def step_done(self, step: Step) -> None:
        self.emitter.emit(
            events.STEP_DONE,
            step=step.index,
            actions=[a.name for a in step.actions],
            format_error=step.format_error is not None,
            model_seconds=step.model_seconds,
            env_seconds=step.env_seconds,
            trajectory=self.trajectory,  # a reference, for observers that persist progress
        )


def clean_text(value: Any) -> Any:
    """Lone surrogates (from a broken decoder) replaced, so every trajectory can be written as UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {k: clean_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_text(v) for v in value]
    return value


def message_text(message: Message) -> str:
    """The text of a message's ``content``: a string, the text parts of a list joined, or ""."""
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)
