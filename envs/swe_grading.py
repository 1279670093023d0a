"""SWE-bench grading in a fresh runtime: model patch (lenient ladder), test files reset, test patch, tests, report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shlex
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field

from envs.output import decode
from envs.pytest_log import eval_section
from envs.swe_eval_script import INLINE_LIMIT, EvalScript, ScriptRun
from envs.swe_reports import CATEGORIES, Grade, is_resolved, status_by_category
from envs.swe_specs import eval_plan
from rollout.config import StrictModel, validate
from rollout.errors import VerifierError
from rollout.protocols import ExecResult, Runtime
from rollout.records import Reward, RolloutResult, Task

__all__ = ["APPLY_LADDER", "Grade", "SweVerifier", "SweVerifierConfig", "grade", "patch_of"]

APPLY_LADDER = ("git apply --verbose", "git apply --verbose --reject", "patch --batch --fuzz=5 -p1 -i")
"""The harness's commands, most exact first; the first that exits 0 applied the patch."""
_GIT = "git -c safe.directory='*'"  # a repository owned by another user (an image's /testbed) is still ours
_GUARD = 8.0
"""Seconds past the script's limit after which we stop waiting for a runtime that does not enforce timeouts."""


async def grade(task_data: Mapping[str, Any], model_patch: str | None, runtime_factory: Callable[[], Runtime], *,
                eval_timeout: float = 1800, repo_dir: str = "/testbed", log: Callable[[str], Any] | None = None,
                setup_timeout: float = 600, max_log_chars: int = 200_000) -> Grade:
    """Grade ``model_patch`` for one SWE-bench instance in a new runtime from ``runtime_factory()``
    (started here, always closed), whose repository at ``base_commit`` is in ``repo_dir`` (absolute, or
    relative to the runtime's workdir). Bad instance data or a test patch that does not apply raise
    ``VerifierError``; a patch that does not apply, failing tests or a timeout are an unresolved Grade.

    The work in the runtime is one ``exec`` of an ``envs.swe_eval_script`` script (patches inside): the
    apply ladder, the test files reset, the test patch, the tests (``setup_timeout`` per preparation step,
    ``eval_timeout`` for the tests, by ``timeout`` in the runtime; the exec's own limit is a backstop), the
    log printed last. A script too big for a command line is written to a file first; the log file is read
    back only when the output was cut short. Scratch files are removed afterwards only where they outlive
    the runtime (they show up on this host: a local workspace); a container's /tmp goes with it.
    ``durations``: start, write (if any), apply, reset, tests (by the script's clock), overhead (the rest of
    the exec: the call, the shells, printing the log), read and cleanup (if any), close, total."""
    say = log or (lambda _msg: None)
    ident = str(task_data.get("instance_id") or task_data.get("task_id") or "")
    expected = {c: _test_list(task_data, c, ident) for c in CATEGORIES}
    if "FAIL_TO_PASS" not in task_data:
        raise VerifierError(f"instance {ident} has no FAIL_TO_PASS tests", retryable=False)
    result = Grade(instance_id=ident, patch_is_None=model_patch is None,
                   patch_exists=bool(model_patch and model_patch.strip()))
    if not result.patch_exists:
        say(f"{ident}: no patch, unresolved")
        return result
    plan = eval_plan(task_data, ident)
    result.test_cmd = plan.command
    script = EvalScript(secrets.token_hex(6), model_patch, str(task_data.get("test_patch") or ""),
                        str(task_data.get("base_commit") or "HEAD"), plan.setup, plan.command, APPLY_LADDER, _GIT,
                        setup_timeout, eval_timeout)
    began = time.monotonic()
    mark = _clock(result, began)
    runtime = runtime_factory()
    try:
        await runtime.start()
        mark("start")
        run = ScriptRun(script, await _run(runtime, script, repo_dir, mark), ident)
        result.durations.update({k: round(v, 3) for k, v in run.phases(mark("exec", keep=False)).items()})
        result.apply_method, result.apply_output = _applied(run)
        if result.apply_method is None:
            say(f"{ident}: the patch did not apply, unresolved")
            return result
        result.patch_successfully_applied = True
        say(f"{ident}: patch applied with `{result.apply_method}`")
        _check_tests_prepared(run)
        tests = run.steps.get("tests")
        if tests is None or (tests.returncode is None and not run.ran.timed_out):
            raise run.stopped("before the tests" if tests is None else "while the tests ran")
        # Still running when the exec's backstop fired, or stopped by the in-container timeout.
        result.timed_out = tests.returncode is None or tests.stopped(eval_timeout)
        result.test_returncode = None if result.timed_out else tests.returncode
        text = await _log(runtime, run, mark)
        if result.timed_out:
            text += f"\n\nTimeout error: {eval_timeout:g} seconds exceeded.\n"
        result.test_statuses = plan.parse(eval_section(text)) or plan.parse(text)  # the harness's fallback
        result.test_output = text if len(text) <= max_log_chars else "[... cut ...]\n" + text[-max_log_chars:]
        result.tests_status = status_by_category(result.test_statuses, expected, fail_only=plan.fail_only)
        result.resolved = not result.timed_out and is_resolved(result.tests_status)
        result.reward = 1.0 if result.resolved else 0.0
        say(f"{ident}: {'timed out' if result.timed_out else 'resolved' if result.resolved else 'unresolved'}")
        return result
    finally:
        try:
            if os.path.exists(script.scratch) or os.path.exists(script.path):  # on this host: nothing else removes it
                await _remove_scratch(runtime, script)
                mark("cleanup")
        finally:
            await runtime.close()
            mark("close")
            result.durations["total"] = round(time.monotonic() - began, 3)


async def _run(runtime: Runtime, script: EvalScript, repo_dir: str, mark: Callable[..., float]) -> ExecResult:
    """The script's one exec. Plain bash, as the harness runs its eval script: the runtime's own shell (a
    login shell in containers) already set the environment up, and a login shell would reset PATH (and so
    a virtualenv) on a host."""
    text = script.text()
    command = f"bash -c {shlex.quote(text)} rollout-grade"
    if len(command.encode()) > INLINE_LIMIT:
        await runtime.write_file(script.path, text.encode())
        mark("write")
        command = f"bash {shlex.quote(script.path)}"
    try:
        return await asyncio.wait_for(runtime.exec(command, timeout=script.limit, cwd=repo_dir),
                                      script.limit + _GUARD)
    except asyncio.TimeoutError:
        return ExecResult(output="", returncode=-1, timed_out=True, duration=script.limit + _GUARD)


def _applied(run: ScriptRun) -> tuple[str | None, str]:
    """(the ladder command that applied the patch, or None; what the attempts printed)."""
    run.require("unpack")
    outputs = []
    for number, command in enumerate(APPLY_LADDER, 1):
        if number > 1:
            run.require("save" if number == 2 else "restore")
        attempt = run.require(f"apply{number}", failing_ok=True)
        outputs.append(f"$ {command}\n{attempt.output}")
        if attempt.returncode == 0:
            return command, "\n".join(outputs)
    return None, "\n".join(outputs)


def _check_tests_prepared(run: ScriptRun) -> None:
    """Test files as at ``base`` (whatever the model did to them), then the test patch on top."""
    script = run.script
    if not script.test_patch.strip():
        return
    reset = run.require("reset", failing_ok=True)
    if reset.returncode != 0:
        raise VerifierError(f"instance {run.ident}: resetting the test files to {script.base} failed:\n"
                            f"{reset.output[-2000:]}")
    applied = run.require("test_patch", failing_ok=True)
    if applied.returncode != 0:
        raise VerifierError(f"instance {run.ident}: the test patch does not apply:\n{applied.output[-2000:]}",
                            retryable=False)


async def _log(runtime: Runtime, run: ScriptRun, mark: Callable[..., float]) -> str:
    """The test log as printed; read back from its file when the output was cut before its end."""
    printed = run.steps.get("log")
    if printed is not None and printed.returncode == 0:
        return printed.output
    try:
        text = decode(await asyncio.wait_for(runtime.read_file(run.script.log_path), 60))
    except (FileNotFoundError, asyncio.TimeoutError):
        text = printed.output if printed is not None else ""
    mark("read")
    return text


async def _remove_scratch(runtime: Runtime, script: EvalScript) -> None:
    with contextlib.suppress(Exception):  # a runtime that never started or already died has nothing to clean
        await runtime.exec(f"rm -rf -- {shlex.quote(script.scratch)} {shlex.quote(script.path)}", timeout=60)


def _clock(result: Grade, began: float) -> Callable[..., float]:
    last = [began]

    def mark(phase: str, keep: bool = True) -> float:
        """Seconds since the previous mark, recorded under ``phase`` unless ``keep`` is false."""
        now = time.monotonic()
        seconds, last[0] = now - last[0], now
        if keep:
            result.durations[phase] = round(seconds, 3)
        return seconds

    return mark


def _test_list(task_data: Mapping[str, Any], key: str, ident: str) -> list[str]:
    value = task_data.get(key)
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise VerifierError(f"instance {ident}: {key} is neither a list nor a JSON list", retryable=False) from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise VerifierError(f"instance {ident}: {key} must be a list of test ids", retryable=False)
    return value


# ---- the verifier ------------------------------------------------------------------------------


def patch_of(result: RolloutResult) -> str | None:
    """The model's patch: what the rollout submitted (the Mini-SWE agent submits ``git diff`` output)."""
    return result.submission


class SweVerifierConfig(StrictModel):
    type: str = "swe"
    """Registry short name of this verifier."""
    eval_timeout: float = Field(1800.0, gt=0)
    """Seconds the tests may run; past it the instance is graded unresolved (timed out)."""
    setup_timeout: float = Field(600.0, gt=0)
    """Seconds each preparation command (patch application, test reset) may take."""
    repo_dir: str = "/testbed"
    """The repository in the grading runtime: absolute, or relative to the runtime's workdir ("." for a
    local workspace holding the clone)."""
    max_log_chars: int = Field(200_000, ge=1000)
    """Characters of the test log kept in the reward details (its tail)."""


class SweVerifier:
    """Grades a rollout's patch in a fresh runtime per task from ``runtime_factory(task)``; the reward is
    1.0 when resolved, the details are the Grade. ``patch_of`` picks the patch from a result."""

    def __init__(self, config: SweVerifierConfig | Mapping[str, Any] | None = None, *,
                 runtime_factory: Callable[[Task], Runtime] | None = None,
                 patch_of: Callable[[RolloutResult], str | None] = patch_of, log: Callable[[str], Any] | None = None,
                 env: Any = None, **_: Any):
        if config is None:
            config = SweVerifierConfig()
        elif not isinstance(config, SweVerifierConfig):
            config = validate(SweVerifierConfig, config, prefix="verifier")
        self.config = config
        self.runtime_factory = runtime_factory
        self.patch_of = patch_of
        self.log = log
        self.env = env
        """A SweEnvironment: it knows the rollout's runtime kind and the fallback patch."""

    @classmethod
    def from_config(cls, config: SweVerifierConfig | Mapping[str, Any], **deps: Any) -> SweVerifier:
        return cls(config, **deps)

    async def verify(self, task: Task, result: RolloutResult) -> Reward:
        cfg = self.config
        repo_dir, source = cfg.repo_dir, "submission"
        if self.env is not None and hasattr(self.env, "fresh_runtime"):
            patch, source = await self.env.final_patch(self.patch_of(result))
            repo_dir = self.env.repo_dir_for(task)

            def fresh() -> Runtime:
                return self.env.fresh_runtime(task)  # never the agent's runtime
        elif self.runtime_factory is not None:
            patch, factory = self.patch_of(result), self.runtime_factory

            def fresh() -> Runtime:
                return factory(task)
        else:
            raise VerifierError("the swe verifier has no runtime to grade in", retryable=False)
        graded = await grade({"instance_id": task.task_id, **task.data}, patch, fresh,
                             eval_timeout=cfg.eval_timeout, repo_dir=repo_dir, log=self.log,
                             setup_timeout=cfg.setup_timeout, max_log_chars=cfg.max_log_chars)
        details = graded.model_dump()
        details["patch_source"] = source
        details["model_patch"] = patch
        return Reward(value=graded.reward, details=details)
