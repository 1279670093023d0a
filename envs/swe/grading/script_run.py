"""One grading script's run: the one exec (the script on its stdin), its marked steps read back and checked (the
apply ladder and the test preparation as verdicts), the log or report read back from the runtime when the output was
cut, the scratch removed where it outlives the runtime."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from envs.runtimes.output import decode
from envs.swe.grading.eval_script import PRESENT, EvalScript
from envs.swe.grading.protect import restored_sections
from rollout.errors import VerifierError
from rollout.protocols import ExecResult, Runtime
from rollout.waits import within

GUARD = 8.0
"""Seconds past the script's own limit before the exec is abandoned (the in-runtime timeouts end it first)."""


@dataclass
class Step:
    """What one marked step printed, its exit code (None: the output ended inside it), and the script's
    clock (seconds) when it began and ended."""

    output: str
    returncode: int | None
    began: float
    ended: float | None = None

    @property
    def seconds(self) -> float:
        return 0.0 if self.ended is None else max(0.0, self.ended - self.began)

    def stopped(self, limit: float) -> bool:
        """``timeout`` ended it: its exit code, after ``limit`` seconds (less one: a shell without
        EPOCHREALTIME counts whole seconds)."""
        return self.returncode in (124, 137) and self.seconds >= limit - 1



def read_steps(script: EvalScript, output: str) -> dict[str, Step]:
    """The steps of ``script`` found in its ``output``, by name, in order; one the output ends inside has
    ``returncode`` None and what it printed so far."""
    found: dict[str, Step] = {}
    opening, pos = f"{script.prefix} begin ", 0
    while (at := output.find(opening, pos)) >= 0:
        line_end = output.find("\n", at)
        if line_end < 0:
            break
        name, _, began = output[at + len(opening):line_end].partition(" ")
        closing = f"\n{script.prefix} end {name} "
        end = output.find(closing, line_end + 1)
        tail_end = output.find("\n", end + len(closing)) if end >= 0 else -1
        if tail_end < 0:
            found[name] = Step(output[line_end + 1:], None, _clock(began))
            break
        code, _, ended = output[end + len(closing):tail_end].partition(" ")
        found[name] = Step(output[line_end + 1:end], int(code) if code.lstrip("-").isdigit() else None,
                           _clock(began), _clock(ended))
        pos = tail_end + 1
    return found


def _clock(text: str) -> float:
    try:
        return float(text.strip().replace(",", "."))  # some locales print EPOCHREALTIME with a comma
    except ValueError:
        return 0.0


class ScriptRun:
    """One run of an ``EvalScript`` read back: its steps, checks that say where it stopped, and the phases."""

    def __init__(self, script: EvalScript, ran: ExecResult, ident: str):
        self.script, self.ran, self.ident = script, ran, ident
        self.steps = read_steps(script, ran.output)

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


# ---- the preparation steps read back as verdicts ---------------------------------------------------------------


def applied(run: ScriptRun) -> tuple[str | None, str, str]:
    """(the ladder command that applied the patch, or None; what the attempts printed; why not). Output past
    the runtime's cap before the tests ran is the patch's doing (each step prints a bounded tail, so only the
    patch can make it that long): it did not apply."""
    run.require("unpack")
    for number in range(1, len(run.script.checkout) + 1):
        run.require(f"checkout{number}")
    run.require("snapshot")
    outputs = []
    for number, command in enumerate(run.script.ladder, 1):
        try:
            if number > 1:
                run.require("save" if number == 2 else "restore")
            attempt = run.require(f"apply{number}", failing_ok=True)
        except VerifierError:
            if not run.ran.truncated:
                raise
            return None, "\n".join(outputs), "the patch does not apply (its output passed the runtime's output cap)"
        outputs.append(f"$ {command}\n{attempt.output}")
        if attempt.returncode == 0:
            return command, "\n".join(outputs), ""
    return None, "\n".join(outputs), "the patch does not apply"


def near(touched: list[str], paths: list[str]) -> bool:
    """Whether the patch touched one of ``paths``, a directory above one, or a path below one: then a failure to
    put them back is the patch's doing."""
    return any(t == p or p.startswith(t + "/") or t.startswith(p + "/") for t in touched for p in paths)


def tests_prepared(run: ScriptRun, patch_touched: bool) -> list[str] | str:
    """Test files as at ``base`` (whatever the model did to them), then the test patch on top: the
    configuration files whose pytest section was put back, or why the patch is unresolved when the files it
    touched cannot be put back."""
    script, restored = run.script, []
    if script.resets():
        reset = run.require("reset", failing_ok=True)
        if reset.returncode != 0 and patch_touched:
            return f"the test files the patch touched cannot be restored:\n{reset.output[-2000:]}"
        if reset.returncode != 0:
            raise VerifierError(f"instance {run.ident}: resetting the test files to {script.base} failed:\n"
                                f"{reset.output[-2000:]}")
        restored = restored_sections(reset.output)
    if script.test_patch.strip():
        applied = run.require("test_patch", failing_ok=True)
        if applied.returncode != 0 and patch_touched:
            return f"the test patch does not apply over what the patch left:\n{applied.output[-2000:]}"
        if applied.returncode != 0:
            raise VerifierError(f"instance {run.ident}: the test patch does not apply:\n{applied.output[-2000:]}",
                                retryable=False)
    return restored


def log_only(run: ScriptRun, tested: list[str], id_files: list[str], later: Sequence[str]) -> list[str]:
    """The ``tested`` ids no item of this pytest run can have: one that is no node id (``[100%]``, as the harness's
    parser reads a progress line), or whose file the ``present`` step did not find in the repository (a 5.x row's
    test patch, applied ``later`` by its own script, adds its files after that step)."""
    step = run.steps.get("present")
    present = {line[len(PRESENT) + 1:] for line in (step.output if step else "").splitlines()
               if line.startswith(PRESENT + " ")}
    absent = set(id_files) - present - set(later) if step is not None else set()
    return [t for t in tested if "::" not in t or t.split("::", 1)[0] in absent]
