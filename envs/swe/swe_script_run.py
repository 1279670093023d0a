"""One grading script's run: the one exec (the script on its stdin), its marked steps read back and checked, the
log or report read back from the runtime when the output was cut, the scratch removed where it outlives the
runtime."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import Callable

from envs.runtimes.output import decode
from envs.swe.swe_eval_script import EvalScript, Step
from rollout.errors import VerifierError
from rollout.waits import within
from rollout.protocols import ExecResult, Runtime

GUARD = 8.0
"""Seconds past the script's own limit before the exec is abandoned (the in-runtime timeouts end it first)."""


class ScriptRun:
    """One run of an ``EvalScript`` read back: its steps, checks that say where it stopped, and the phases."""

    def __init__(self, script: EvalScript, ran: ExecResult, ident: str):
        self.script, self.ran, self.ident = script, ran, ident
        self.steps = script.steps(ran.output)

    def require(self, name: str, failing_ok: bool = False) -> Step:
        """The preparation step ``name``, ended in time (and with exit code 0 unless ``failing_ok``)."""
        step, limit = self.steps.get(name), self.script.setup_timeout
        if step is None or step.returncode is None:
            raise self.stopped(f"before its step {name!r} ended")
        if step.stopped(limit):
            raise VerifierError(f"instance {self.ident}: step {name!r} took more than {limit:g}s in the grading "
                                "runtime")
        if step.returncode in (124, 137) or (step.returncode != 0 and not failing_ok):
            raise VerifierError(f"instance {self.ident}: grading step {name!r} failed (exit code {step.returncode}):"
                                f"\n{step.output[-2000:]}")
        return step

    def stopped(self, where: str) -> VerifierError:
        ran = self.ran
        if ran.timed_out:
            why = f"it ran past its limit of {self.script.limit:g}s"
        elif ran.truncated:
            why = "its output passed the runtime's output cap"
        else:
            why = f"exit code {ran.returncode}"
        return VerifierError(f"instance {self.ident}: the grading script stopped {where} ({why}):\n"
                             f"{ran.output[-2000:]}")

    def phases(self, exec_seconds: float) -> dict[str, float]:
        """apply, reset and tests by the script's clock (those that ran); overhead: the rest of the exec."""
        steps, inside = self.steps, {}
        ladder = [s for n, s in steps.items() if n.startswith("apply") or n in ("save", "restore")]
        if "unpack" in steps and ladder:
            inside["apply"] = (ladder[-1].ended or ladder[-1].began) - steps["unpack"].began
        if "reset" in steps:
            inside["reset"] = sum(s.seconds for n, s in steps.items() if n in ("reset", "test_patch"))
        if "tests" in steps:
            inside["tests"] = steps["tests"].seconds
        inside = {phase: max(0.0, seconds) for phase, seconds in inside.items()}
        return {**inside, "overhead": max(0.0, exec_seconds - sum(inside.values()))}


async def run_script(runtime: Runtime, script: EvalScript, repo_dir: str, mark: Callable[..., float]) -> ExecResult:
    """The script's one exec. Plain bash, as the harness runs its eval script: the runtime's own shell (a
    login shell in containers) already set the environment up, and a login shell would reset PATH (and so
    a virtualenv) on a host. The script goes in on the exec's stdin: never on a command line or in a file."""
    try:
        return await within(runtime.exec(script.loader, timeout=script.limit, cwd=repo_dir,
                                                   stdin=script.text().encode()), script.limit + GUARD)
    except asyncio.TimeoutError:
        return ExecResult(output="", returncode=-1, timed_out=True, duration=script.limit + GUARD)


async def printed_step(runtime: Runtime, run: ScriptRun, step: str, path: str, mark: Callable[..., float]) -> str:
    """What the script printed in ``step`` (the log, the report); read back from ``path`` when the output was
    cut before its end."""
    printed = run.steps.get(step)
    if printed is not None and printed.returncode == 0:
        return printed.output
    if printed is not None and printed.returncode is not None:
        return ""  # the file is not there: cat failed
    try:
        text = decode(await within(runtime.read_file(path), 60))
    except (FileNotFoundError, asyncio.TimeoutError):
        text = printed.output if printed is not None else ""
    mark("read")
    return text


async def remove_scratch(runtime: Runtime, script: EvalScript) -> None:
    with contextlib.suppress(Exception):  # a runtime that never started or already died has nothing to clean
        await runtime.exec(f"rm -rf -- {shlex.quote(script.scratch)}", timeout=60)
