"""SweEnvironment over the local runtime: a workspace owns its git objects; the dataset's repository stays intact."""

from __future__ import annotations

import asyncio
import subprocess

from envs.runtimes.local import LocalRuntime
from envs.swe.env import SweEnvironment
from rollout.records import Action, Task

# Overwrites every file under .git/objects (read-only as git writes them): a shared inode would carry the damage.
CORRUPT = ("chmod -R u+w .git/objects && find .git/objects -type f -exec sh -c 'echo garbage > \"$1\"' _ {} \\;"
           " && echo done")


def git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def source_repo(tmp_path):
    """A repository with packed and loose objects; its HEAD is the base (no later history to prune)."""
    repo = tmp_path / "src"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "first")
    git(repo, "gc", "-q")
    (repo / "b.py").write_text("y = 2\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return repo, git(repo, "rev-parse", "HEAD")


def one_rollout(tmp_path, task, command):
    env = SweEnvironment(runtime_builder=lambda **_: LocalRuntime({"root": str(tmp_path / "ws")}, trusted_model=True))

    async def scenario():
        try:
            await env.reset(task)
            [obs] = await env.step([Action(kind="bash", name="bash", arguments={"command": command})])
            return obs
        finally:
            await env.close()

    return asyncio.run(scenario())


def test_a_workspace_that_overwrites_its_git_objects_leaves_the_source_repository_intact(tmp_path):
    repo, base = source_repo(tmp_path)
    task = Task(task_id="t", data={"repo_path": str(repo), "base_commit": base, "problem_statement": "p"})

    wrecked = one_rollout(tmp_path, task, CORRUPT)
    assert wrecked.content.strip().endswith("done"), wrecked.content

    fsck = subprocess.run(["git", "fsck", "--full"], cwd=repo, capture_output=True, text=True)
    assert fsck.returncode == 0, f"the source repository was corrupted through the workspace:\n{fsck.stderr}"
    again = one_rollout(tmp_path, task, "git log --format=%s && cat a.py b.py")
    assert again.success and again.content == "base\nfirst\nx = 1\ny = 2\n", again.content
