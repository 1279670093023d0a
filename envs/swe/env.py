"""SweEnvironment: a SWE-bench instance's repository in a runtime, driven one bash command per turn.

The runtime comes from the run's runtime section: a container from the instance's image (repo at
/testbed, from ``rollout images build`` or a registry), or a local workspace with the repo cloned
at ``base_commit``. Grading never happens here: the verifier starts a fresh runtime.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from typing import Any, Callable, Literal

from pydantic import Field, field_validator

from envs.images.harness_images import ensure_harness_image
from envs.images.image_gc import parse_size
from envs.images.image_names import DEFAULT_BASE_IMAGE, NAME_FIELDS, image_for
from envs.images.instance_images import ensure_instance_image
from envs.runtimes.past_repo import in_place_script
from envs.runtimes.prepared import GIT_USER, PreparedRepoRuntime
from envs.shell_env import ShellEnvironment, ShellEnvironmentConfig
from envs.swe.diffs import diff_paths
from envs.swe.rows.shapes import agent_base, check_shape, ref_problem, required_fields, start_ref
from rollout.config.components import InstallsHarness, RunsImages
from rollout.config.load import StrictModel
from rollout.errors import ContainerStartError
from rollout.protocols import EnvReset, HasConfig, Runtime
from rollout.records import Action, Observation, Task

RuntimeBuilder = Callable[..., Runtime]
"""``builder(**overrides) -> Runtime``: the run's runtime section with e.g. ``image=`` / ``workdir=`` set."""

LIST_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS")


class SweEnvironmentConfig(StrictModel):
    type: str = "swe"
    command_timeout: float = Field(600.0, gt=0)
    """Seconds per command (NeMo Gym's Mini SWE default)."""
    repo_dir: str | None = None
    """Where the repository is; none: /testbed in a container, ``testbed`` in a local workspace."""
    fallback_patch: Literal["none", "diff"] = "none"
    """What is graded when the agent never submitted: nothing (as mini-swe-agent scores), or the
    working tree's diff against base_commit."""
    env: dict[str, str] = Field(default_factory=lambda: {"PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb"})
    """Environment variables of every command."""
    build_images: bool = True
    """Build a missing instance image from the row's ``repo_path`` (once per process) before starting."""
    past_only: bool = True
    """In a container of an image this project did not build (the row names it, or has no ``repo_path``), give the
    repository a new ``.git`` holding only the base commit's past before the agent starts: a registry's image may
    carry the upstream fix in its history. Costs one pack of that history per rollout; our own images need none."""
    image_budget: str | None = None
    """Disk budget for per-instance images on each node, e.g. ``20G``; least recently used ones are removed
    beyond it (checked after each build). None: no limit."""

    @field_validator("image_budget", mode="before")
    @classmethod
    def _size(cls, value: Any) -> str | None:
        if value is None:
            return None
        parse_size(value)  # a ValueError names the bad text; pydantic adds the field
        return str(value)

    @property
    def image_budget_bytes(self) -> int | None:
        return None if self.image_budget is None else parse_size(self.image_budget)


def check_row(task: Task) -> None:
    """A SWE row's fields, checked when the dataset loads (the loader adds the line number)."""
    for name in required_fields(task.data):
        if not isinstance(task.data.get(name), str) or not task.data[name]:
            raise ValueError(f"field {name}: missing or not a string")
    check_grading_fields(task)


def check_grading_fields(task: Task) -> None:
    """The fields grading reads, checked when a dataset loads (for a run and for ``rollout eval``):
    ``base_commit`` a commit or ref name, ``test_patch`` a diff, the test id lists lists of strings, and the
    fields of the row's shape (``envs.swe.rows.shapes.check_shape``: a 5.x row's eval script, parser, type, image)."""
    commit = task.data.get("base_commit")
    if commit is not None and ref_problem(commit):
        raise ValueError(f"field base_commit: {ref_problem(commit)}")
    problem = diff_problem(task.data.get("test_patch"))
    if problem:
        raise ValueError(f"field test_patch: {problem}")
    for name in LIST_FIELDS:
        value = task.data.get(name, [])
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError(f"field {name}: a JSON-encoded string that does not parse") from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"field {name}: must be a list of test ids")
        task.data[name] = value
    check_shape(str(task.data.get("instance_id") or task.task_id), task.data)


def diff_problem(patch: object) -> str | None:
    """Why ``patch`` (a row's ``test_patch``) is not a diff that ``git apply`` could take, or None. Empty or
    absent is fine (the tests are already in the repository)."""
    if patch is None or patch == "":
        return None
    if not isinstance(patch, str):
        return f"must be a string holding a diff, got {type(patch).__name__}"
    first = patch.strip().splitlines()[0][:60] if patch.strip() else ""
    if not diff_paths(patch):
        return f"not a diff (no file header such as 'diff --git a/... b/...' or '--- a/...'; starts {first!r})"
    if _CHANGE.search(patch) is None:
        return f"a diff header without any change (no '@@' hunk, mode, rename or binary part; starts {first!r})"
    return None


_CHANGE = re.compile(r"^(@@ -\d+(,\d+)? \+\d+(,\d+)? @@|GIT binary patch|rename from |copy from |new file mode |"
                     r"deleted file mode |old mode )", re.M)


class SweEnvironment:
    check_row = staticmethod(check_row)
    """A SWE row's fields, checked as the dataset loads (``rollout.config.components.ChecksRows``)."""

    @staticmethod
    def image_for(task: Task) -> str:
        """The row's instance image: each task runs in its own (``rollout.config.components.PicksImages``)."""
        return image_for(task.data)

    def __init__(self, config: SweEnvironmentConfig | None = None, *, runtime_builder: RuntimeBuilder):
        self.config = config or SweEnvironmentConfig()
        self.builder = runtime_builder
        probe = runtime_builder()
        self.images = _runs_images(probe)
        """Whether the runtime runs images (the repo is in the instance image) or is a bare workspace."""
        self.harness: list[str] = list(probe.config.harness) if self.images and isinstance(
            probe.config, InstallsHarness) else []
        """An outside agent's harness the runtime installs (``runtime.harness``): our instance images are built on
        its layer (one copy of it per node, whatever the number of instances), and the runtime adds none on top."""
        self._harness_base: str | None = None
        self.shell: ShellEnvironment | None = None
        self.task: Task | None = None
        self.repo_dir = "."

    @classmethod
    def from_config(cls, config: SweEnvironmentConfig, runtime_builder: RuntimeBuilder, **_: Any) -> "SweEnvironment":
        return cls(config, runtime_builder=runtime_builder)

    @property
    def runtime(self) -> Runtime:
        return self.shell.runtime

    @property
    def runtime_env(self) -> dict[str, str]:
        """The variables every command runs with (``env``): an agent's own command in the runtime gets them too."""
        return dict(self.config.env)

    def fresh_runtime(self, task: Task) -> Runtime:
        """A new, unstarted runtime for ``task`` with its repository at ``repo_dir_for(task)`` once started:
        a container of the instance's image, or a workspace where the repository is cloned at base_commit."""
        if self.images:
            if self.harness and _ours(task):
                return self.builder(image=image_for(task.data, self.harness_base()), workdir="/testbed", harness=[])
            return self.builder(image=self.image_for(task), workdir="/testbed")
        repo = task.data.get("repo_path")
        if not repo:
            raise ValueError(f"task {task.task_id} has no repo_path: a runtime without images cannot get its "
                             "repository")
        return PreparedRepoRuntime(self.builder(), repo, agent_base(_ident(task), task.data), "testbed")

    def harness_base(self) -> str:
        """The base image with the harness's layer, built on first use (blocking: call it off the loop)."""
        if self._harness_base is None:
            self._harness_base = ensure_harness_image(DEFAULT_BASE_IMAGE, self.harness)
        return self._harness_base

    def repo_dir_for(self, task: Task) -> str:
        return self.config.repo_dir or ("/testbed" if self.images else "testbed")

    async def reset(self, task: Task) -> EnvReset:
        if self.images and self.config.build_images:
            budget = self.config.image_budget_bytes
            base = await asyncio.to_thread(self.harness_base) if self.harness and _ours(task) else DEFAULT_BASE_IMAGE
            await asyncio.to_thread(ensure_instance_image, task, base, budget_bytes=budget)  # built once, off the loop
        runtime = self.fresh_runtime(task)
        self.repo_dir = self.repo_dir_for(task)
        self.task = task
        self.shell = ShellEnvironment(
            runtime,
            ShellEnvironmentConfig(cwd=self.repo_dir, command_timeout=self.config.command_timeout, env=self.config.env),
        )
        reset = await self.shell.reset(task)
        ref = start_ref(_ident(task), task.data) if self.images else None
        if ref is not None:  # a SWE-smith row: its instance branch (the bug, its failing tests removed)
            out = await runtime.exec(f"git -c advice.detachedHead=false checkout -q {shlex.quote(ref)} --",
                                     cwd=self.repo_dir, timeout=120)
            if out.returncode != 0:
                raise ContainerStartError(f"cannot check out {ref} in the image: {out.output[-500:]}", False)
        if self.images and self.config.past_only and _foreign_image(task):
            script = in_place_script(self.repo_dir, agent_base(_ident(task), task.data), GIT_USER)
            out = await runtime.exec(script, timeout=max(self.config.command_timeout, 600.0))
            if out.returncode != 0 or out.timed_out:
                raise ContainerStartError(f"cannot keep only the past of {self.repo_dir} in the image: "
                                          f"{out.output[-500:]}", retryable=out.timed_out)
        reset.info.update({"cwd": self.repo_dir, "repo": task.data.get("repo", ""), "image": _image_of(runtime)})
        return reset

    async def step(self, actions: list[Action]) -> list[Observation]:
        return await self.shell.step(actions)

    async def close(self) -> None:
        if self.shell is not None:
            await self.shell.close()

    async def final_patch(self, submission: str | None) -> tuple[str | None, str]:
        """The patch to grade and where it came from: the submission, the working tree's diff, or none."""
        if submission and submission.strip():
            return submission, "submission"
        if self.config.fallback_patch == "diff" and self.shell is not None and self.task is not None:
            base = agent_base(_ident(self.task), self.task.data)
            diff = f"git add -A && git diff --cached --binary {shlex.quote(base)} --"
            out = await self.runtime.exec(diff, cwd=self.repo_dir,
                                          timeout=120)
            if out.returncode == 0 and out.output.strip():
                return out.output, "diff"
        return None, "none"


def _foreign_image(task: Task) -> bool:
    """Whether the task's image is one this project did not build (``envs.images.instance_images`` builds a row
    with ``repo_path`` and no image name, already past-only)."""
    return not task.data.get("repo_path") or any(task.data.get(k) for k in NAME_FIELDS)


def _ident(task: Task) -> str:
    return str(task.data.get("instance_id") or task.task_id)


def _ours(task: Task) -> bool:
    """Whether the task's image is one we build from its row (a repository, no image named by the row)."""
    return bool(task.data.get("repo_path")) and not any(task.data.get(k) for k in NAME_FIELDS)


def _runs_images(runtime: Runtime) -> bool:
    """Whether ``runtime``'s section runs images (``HasConfig`` and ``RunsImages``)."""
    return isinstance(runtime, HasConfig) and isinstance(runtime.config, RunsImages)


def _image_of(runtime: Runtime) -> str | None:
    return runtime.config.image if _runs_images(runtime) else None
