"""SWE-bench grading in a fresh runtime: model patch (lenient ladder), test files reset, test patch, tests, report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shlex
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field

from envs.output import decode
from envs.pytest_log import END_MARKER, START_MARKER, eval_section
from envs.swe_patch import diff_paths, in_repo, reset_script
from envs.swe_reports import CATEGORIES, Grade, is_resolved, status_by_category
from envs.swe_specs import EvalPlan, eval_plan
from rollout.config import StrictModel, validate
from rollout.errors import VerifierError
from rollout.protocols import ExecResult, Runtime
from rollout.records import Reward, RolloutResult, Task

__all__ = ["APPLY_LADDER", "Grade", "SweVerifier", "SweVerifierConfig", "grade", "patch_of"]

APPLY_LADDER = ("git apply --verbose", "git apply --verbose --reject", "patch --batch --fuzz=5 -p1 -i")
"""The harness's commands, most exact first; the first that exits 0 applied the patch."""
LOG_CAP = 256 * 1024 * 1024
"""Bytes of test output kept on the runtime's disk (a test printing forever must not fill it)."""
_GIT = "git -c safe.directory='*'"  # a repository owned by another user (an image's /testbed) is still ours


async def grade(task_data: Mapping[str, Any], model_patch: str | None, runtime_factory: Callable[[], Runtime], *,
                eval_timeout: float = 1800, repo_dir: str = "/testbed", log: Callable[[str], Any] | None = None,
                setup_timeout: float = 600, max_log_chars: int = 200_000) -> Grade:
    """Grade ``model_patch`` for one SWE-bench instance in a new runtime from ``runtime_factory()``
    (started here, always closed), whose repository at ``base_commit`` is in ``repo_dir`` (absolute, or
    relative to the runtime's workdir). Bad instance data or a test patch that does not apply raise
    ``VerifierError``; a patch that does not apply, failing tests or a timeout are an unresolved Grade."""
    say = log or (lambda _msg: None)
    ident = str(task_data.get("instance_id") or task_data.get("task_id") or "")
    expected = {c: _test_list(task_data, c, ident) for c in CATEGORIES}
    if "FAIL_TO_PASS" not in task_data:
        raise VerifierError(f"instance {ident} has no FAIL_TO_PASS tests", retryable=False)
    base = str(task_data.get("base_commit") or "HEAD")
    test_patch = str(task_data.get("test_patch") or "")
    result = Grade(instance_id=ident, patch_is_None=model_patch is None,
                   patch_exists=bool(model_patch and model_patch.strip()))
    if not result.patch_exists:
        say(f"{ident}: no patch, unresolved")
        return result
    plan = eval_plan(task_data, ident)
    result.test_cmd = plan.command
    began = time.monotonic()
    scratch = f"/tmp/rollout-grade-{secrets.token_hex(6)}"  # outside the repository, unique per grading
    runtime = runtime_factory()
    try:
        await runtime.start()
        mark = _clock(result, began)
        mark("start")
        result.apply_method, result.apply_output = await _apply_model_patch(runtime, repo_dir, scratch, model_patch,
                                                                            setup_timeout)
        mark("apply")
        if result.apply_method is None:
            say(f"{ident}: the patch did not apply, unresolved")
            return result
        result.patch_successfully_applied = True
        say(f"{ident}: patch applied with `{result.apply_method}`")
        await _prepare_tests(runtime, repo_dir, scratch, base, test_patch, setup_timeout, ident)
        mark("reset")
        ran, text = await _run_tests(runtime, repo_dir, scratch, plan, eval_timeout)
        mark("tests")
        result.timed_out, result.test_returncode = ran.timed_out, None if ran.timed_out else ran.returncode
        if ran.timed_out:
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
            await _remove_scratch(runtime, scratch)
        finally:
            result.durations["total"] = round(time.monotonic() - began, 3)
            await runtime.close()


async def _remove_scratch(runtime: Runtime, scratch: str) -> None:
    """Best effort: a container goes away with its files, but a local runtime's /tmp is the host's."""
    with contextlib.suppress(Exception):  # a runtime that never started or already died has nothing to clean
        await runtime.exec(f"rm -rf {scratch}", timeout=60)


def _clock(result: Grade, began: float) -> Callable[[str], None]:
    last = [began]

    def mark(phase: str) -> None:
        now = time.monotonic()
        result.durations[phase] = round(now - last[0], 3)
        last[0] = now

    return mark


async def _apply_model_patch(runtime: Runtime, repo_dir: str, scratch: str, patch: str,
                             timeout: float) -> tuple[str | None, str]:
    """(the ladder command that applied the patch, or None; what the attempts printed). A failed
    attempt is undone before the next, so each starts from the original tree."""
    if not patch.endswith("\n"):
        patch += "\n"  # a patch whose last line lost its newline is corrupt to git apply
    path = f"{scratch}/model.patch"
    await runtime.write_file(path, patch.encode("utf-8", errors="replace"))
    touched = diff_paths(patch)
    saved: dict[str, bytes | None] | None = None
    outputs = []
    for number, command in enumerate(APPLY_LADDER):
        if number > 0:
            if saved is None:  # the first attempt is atomic: only later ones can leave half a patch behind
                saved = {p: await _read_or_none(runtime, in_repo(repo_dir, p)) for p in touched}
            else:
                await _restore(runtime, repo_dir, saved, timeout)
        done = await _checked(runtime, f"{command.replace('git ', _GIT + ' ', 1)} {shlex.quote(path)}", repo_dir,
                              timeout)
        outputs.append(f"$ {command}\n{done.output}")
        if done.returncode == 0:
            return command, "\n".join(outputs)
    return None, "\n".join(outputs)


async def _read_or_none(runtime: Runtime, path: str) -> bytes | None:
    try:
        return await runtime.read_file(path)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


async def _restore(runtime: Runtime, repo_dir: str, saved: dict[str, bytes | None], timeout: float) -> None:
    """Put the files a patch touched back as they were, and drop the ``.rej`` / ``.orig`` files it left."""
    leftovers = [f"{p}{suffix}" for p in saved for suffix in ("", ".rej", ".orig")]
    if leftovers:
        await _checked(runtime, "rm -rf -- " + " ".join(shlex.quote(p) for p in leftovers), repo_dir, timeout)
    for path, data in saved.items():
        if data is not None:
            await runtime.write_file(in_repo(repo_dir, path), data)


async def _prepare_tests(runtime: Runtime, repo_dir: str, scratch: str, base: str, test_patch: str,
                         timeout: float, ident: str) -> None:
    """Test files as at ``base`` (whatever the model did to them), then the test patch on top."""
    if not test_patch.strip():
        return
    reset = await _checked(runtime, reset_script(diff_paths(test_patch), base, git=_GIT), repo_dir, timeout)
    if reset.returncode != 0:
        raise VerifierError(f"instance {ident}: resetting the test files to {base} failed:\n{reset.output[-2000:]}")
    path = f"{scratch}/test.patch"
    await runtime.write_file(path, (test_patch if test_patch.endswith("\n") else test_patch + "\n").encode())
    applied = await _checked(runtime, f"{_GIT} apply --verbose {shlex.quote(path)}", repo_dir, timeout)
    if applied.returncode != 0:
        raise VerifierError(f"instance {ident}: the test patch does not apply:\n{applied.output[-2000:]}",
                            retryable=False)


async def _run_tests(runtime: Runtime, repo_dir: str, scratch: str, plan: EvalPlan,
                     timeout: float) -> tuple[ExecResult, str]:
    """Run the test command (in bash, in the repository, between the harness's markers) with its
    output in a file, so the runtime's output cap never cuts a long log; return the run and the whole log."""
    body = (f'cd -- "$1" || exit 2\n{plan.setup}\necho {shlex.quote(START_MARKER)}\n{plan.command}\nrc=$?\n'
            f'echo {shlex.quote(END_MARKER)}\nexit $rc\n')
    await runtime.write_file(f"{scratch}/eval.sh", body.encode("utf-8", errors="replace"))
    out = f"{scratch}/test_output.txt"
    # Plain bash, as the harness runs its eval script: the runtime's own shell (a login shell in containers)
    # already set the environment up, and a login shell here would reset PATH (and so a virtualenv) on a host.
    command = f'set -o pipefail; bash {scratch}/eval.sh "$PWD" 2>&1 | head -c {LOG_CAP} > {out}'
    try:
        # The runtime enforces the timeout; the extra seconds only guard against a runtime that does not.
        ran = await asyncio.wait_for(runtime.exec(command, timeout=timeout, cwd=repo_dir), timeout + 8)
    except asyncio.TimeoutError:
        ran = ExecResult(output="", returncode=-1, timed_out=True, duration=timeout + 8)
    try:
        text = decode(await asyncio.wait_for(runtime.read_file(out), 60))
    except (FileNotFoundError, asyncio.TimeoutError):
        text = ran.output
    return ran, text


async def _checked(runtime: Runtime, command: str, repo_dir: str, timeout: float) -> ExecResult:
    done = await runtime.exec(command, timeout=timeout, cwd=repo_dir)
    if done.timed_out:
        raise VerifierError(f"`{command.splitlines()[0]}` took more than {timeout:g}s in the grading runtime")
    return done


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
