"""run_rollout: one attempt of one (task, sample), from reset to reward, as a RolloutResult.

This is the one place an exception becomes a recorded outcome: task outcomes are final and
rewarded; infrastructure failures (and any untyped error, labelled ``internal_error``) are
marked ``infra_failed`` and never scored. A bad rollout is data, not a crash.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Coroutine, Iterable

from rollout import events
from rollout.context import RolloutContext
from rollout.errors import (
    AgentProtocolError,
    ExitReason,
    FormatError,
    InfrastructureError,
    TaskOutcome,
    TimeLimitExceeded,
    VerifierError,
    exit_reason_of,
    is_retryable,
)
from rollout.events import Observer
from rollout.protocols import Agent, EndsSessions, Environment, Model, Staged, Verifier
from rollout.records import ErrorInfo, RequestMeta, RolloutResult, Task, Usage
from rollout.termination import Limits, Termination
from rollout.train.tokens import contiguity_breaks, has_token_data

TIME_LIMIT_GRACE = 5.0
"""Seconds of the agent's own time past ``time_limit`` before the loop is cancelled mid-action (a hung command)."""


async def run_rollout(
    task: Task,
    agent: Agent,
    model: Model,
    env: Environment,
    *,
    verifier: Verifier | None = None,
    meta: RequestMeta | None = None,
    limits: Limits | None = None,
    observers: Iterable[Observer] = (),
    sampling: dict[str, Any] | None = None,
) -> RolloutResult:
    meta = meta or RequestMeta(rollout_id=f"{task.task_id}#0", task_id=task.task_id)
    if task.data.get("sampling"):  # the task's own sampling (a Responses row's temperature, max_output_tokens)
        sampling = {**(sampling or {}), **dict(task.data["sampling"])}
    ctx = RolloutContext(meta, task_limits(task, limits), observers, sampling)
    ctx.emitter.emit(events.ROLLOUT_STARTED, sample_index=meta.sample_index, attempt=meta.attempt)
    t0 = time.perf_counter()
    try:
        outcome = await _run_agent(agent, task, model, env, ctx)
        outcome = await run_stages(agent, task, model, env, ctx, outcome)  # a task in stages
        t_agent = time.perf_counter()
        result = _result(task, meta, ctx, outcome)
        result.timings.update(ctx.timings)
        result.timings["agent"] = t_agent - t0
        if result.status == "completed":
            # Before close: a verifier may look inside the environment (a check command in its workspace).
            await _verify(verifier, task, result, ctx)
            result.timings["verify"] = time.perf_counter() - t_agent
            if verifier is not None:
                ctx.emitter.emit(events.VERIFY_DONE, seconds=result.timings["verify"], reward=result.reward)
    finally:
        await _end_session(model, meta)
        close_error = await _close(env)
    if close_error is not None:
        # The episode is over and scored; a failed cleanup is reported, not allowed to lose the result.
        result.metadata["close_error"] = f"{type(close_error).__name__}: {close_error}"
    result.timings["total"] = time.perf_counter() - t0
    steps = result.trajectory.steps
    if has_token_data(steps):  # the engine's ids on every turn: say where they stop being one sequence
        result.metadata["token_breaks"] = [b.as_dict() for b in contiguity_breaks(steps)]
    ctx.emitter.emit(
        events.ROLLOUT_FINISHED,
        status=result.status,
        exit_reason=result.exit_reason.value,
        reward=result.reward,
        steps=len(result.trajectory.steps),
        seconds=result.timings["total"],
        error_type=result.error.type if result.error else None,
    )
    return result


async def _end_session(model: Model, meta: RequestMeta) -> None:
    """A model that keeps something per rollout (``EndsSessions``: a token stream, a sticky replica) is told the
    rollout ended."""
    if isinstance(model, EndsSessions):
        try:
            await model.end_session(meta)
        except Exception:  # noqa: BLE001 - a courtesy to the server; the rollout's result stands
            pass


def failure_result(task: Task, meta: RequestMeta, exc: BaseException) -> RolloutResult:
    """The record of a rollout that failed before its loop could start (e.g. building its parts)."""
    return _result(task, meta, RolloutContext(meta), exc)


async def _run_agent(agent: Agent, task: Task, model: Model, env: Environment, ctx: RolloutContext) -> BaseException:
    """Run the agent; return (not raise) whatever ended it."""
    limit = ctx.limits.time_limit
    try:
        if limit is None:
            await agent.run(task, model, env, ctx)
        elif not await _within_time(agent.run(task, model, env, ctx), ctx.termination, limit + TIME_LIMIT_GRACE):
            return TimeLimitExceeded(f"time_limit={limit:g}s (the agent's own time) passed while an action ran")
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - every error becomes data
        return exc
    return AgentProtocolError(f"agent {type(agent).__name__} returned without an exit reason")


async def _within_time(run: Coroutine[Any, Any, None], termination: Termination, allowed: float) -> bool:
    """Run the agent; False (it cancelled) as soon as the agent's own clock passes ``allowed`` (an action that
    hangs); its errors propagate.

    The loop checks the limit before each model call; this only catches what never comes back to it. The
    agent's clock stands still during the environment's reset and the model's calls (the model has its own
    budget), so the wait is re-armed until the clock itself has run out.
    """
    work = asyncio.ensure_future(run)
    try:
        while not work.done():
            left = allowed - termination.agent_seconds()
            if left <= 0:
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                return False
            paused = termination.started is None or termination.in_model_call
            await asyncio.wait({work}, timeout=max(left, 1.0) if paused else left)
    except asyncio.CancelledError:
        work.cancel()
        raise
    await work
    return True


async def _verify(verifier: Verifier | None, task: Task, result: RolloutResult, ctx: RolloutContext) -> None:
    try:
        if verifier is None:
            result.reward = ctx.trajectory.env_reward
            return
        reward = await verifier.verify(task, result)
        result.reward, result.reward_details = reward.value, dict(reward.details)
    except Exception as exc:  # noqa: BLE001 - labelled: never scored 0 silently
        err = exc if isinstance(exc, InfrastructureError) else VerifierError(f"{type(exc).__name__}: {exc}")
        _mark_infra(result, err, original=exc)


async def _close(env: Environment) -> BaseException | None:
    try:
        await env.close()
    except Exception as exc:  # noqa: BLE001
        return exc
    return None


def _result(task: Task, meta: RequestMeta, ctx: RolloutContext, outcome: BaseException) -> RolloutResult:
    traj = ctx.trajectory
    usage = sum((s.usage for s in traj.steps), Usage())
    base = dict(
        run_id=meta.run_id,
        rollout_id=meta.rollout_id,
        task_id=task.task_id,
        sample_index=meta.sample_index,
        attempt=meta.attempt,
        trajectory=traj,
        usage=usage,
        metadata=dict(task.metadata),
        group_id=meta.group_id or task.task_id,
        seed=meta.seed,
    )
    if isinstance(outcome, (TaskOutcome, FormatError)):
        if traj.exit_reason is None:  # no episode saw this exit (the time limit's cut, an agent off the loop)
            ctx.record_exit(outcome)
        return RolloutResult(status="completed", exit_reason=traj.exit_reason, submission=traj.submission, **base)
    result = RolloutResult(status="infra_failed", exit_reason=exit_reason_of(outcome), **base)
    _mark_infra(result, outcome)
    return result


def _mark_infra(result: RolloutResult, exc: BaseException, original: BaseException | None = None) -> None:
    reason = exit_reason_of(exc)
    if not reason.is_infrastructure:
        reason = ExitReason.INTERNAL_ERROR
    result.status = "infra_failed"
    result.exit_reason = reason
    result.reward = None
    result.trajectory.exit_reason = reason
    info = ErrorInfo.from_exception(original or exc)
    info.infrastructure = True
    info.retryable = is_retryable(exc) and is_retryable(original or exc)
    if original is not None and original is not exc:
        info.type = f"{type(exc).__name__}({type(original).__name__})"
    result.error = info


def task_limits(task: Task, limits: Limits | None) -> Limits | None:
    """``limits`` with the task's own ``data["time_limit"]`` (seconds) when it is tighter (a Harbor task's agent
    timeout)."""
    own = task.data.get("time_limit")
    if not isinstance(own, (int, float)) or isinstance(own, bool) or own <= 0:
        return limits
    limits = limits or Limits()
    if limits.time_limit is not None and limits.time_limit <= own:
        return limits
    return limits.model_copy(update={"time_limit": float(own)})


async def run_stages(agent: Agent, task: Task, model: Model, env: Environment, ctx: RolloutContext,
                     outcome: BaseException) -> BaseException:
    """A task in stages (Harbor's multi-step tasks): while the last stage ended with a task outcome, a ``Staged``
    environment grades it and returns the next stage's task (its instruction as the prompt), or None (no more, or
    the stage's gate was not met). The agent runs again in the same environment with a fresh conversation
    and the stage's limits; its messages and steps join the rollout's trajectory (a trainer sees the new prompt as a
    break in the token stream), and the last stage's exit is the rollout's."""
    if not isinstance(env, Staged):
        return outcome
    while isinstance(outcome, (TaskOutcome, FormatError)):
        try:
            stage = await env.next_stage()
        except Exception as exc:  # noqa: BLE001 - grading a stage failed: the runner labels it
            return exc
        if stage is None:
            return outcome
        inner = RolloutContext(ctx.meta, task_limits(stage, ctx.limits), (), ctx.sampling)
        inner.emitter = ctx.emitter
        outcome = await _run_agent(agent, stage, model, env, inner)
        ctx.trajectory.messages.extend(inner.trajectory.messages)
        ctx.trajectory.steps.extend(inner.trajectory.steps)
        for name in ("exit_reason", "exit_message", "submission"):
            value = getattr(inner.trajectory, name)
            if value is not None:
                setattr(ctx.trajectory, name, value)
        ctx.trajectory.env_reward += inner.trajectory.env_reward
    return outcome
