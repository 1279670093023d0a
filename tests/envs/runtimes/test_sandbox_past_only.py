"""The sandbox holds only the past: every way a sandbox gets its repository (a prepared workspace or container, an
instance image, a dataset's own image) gives it exactly the base commit's objects, one branch and the base's tags,
whatever the source held past the base (commits, tags, branches, notes, a stash, a remote, a reflog)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from runtime_helpers import podman_copy

from envs.images.image_names import image_for
from envs.images.instance_images import build_instance_images
from envs.runtimes.apptainer.runtime import ApptainerRuntime
from envs.runtimes.docker.runtime import DockerRuntime
from envs.runtimes.local import LocalRuntime
from envs.runtimes.past_repo import MissingCommit, past_pack
from envs.runtimes.prepared import PreparedRepoRuntime
from envs.swe.env import SweEnvironment, SweEnvironmentConfig
from rollout.records import Task

FIX_LINE = "    return total_of_the_future_7f3a9c  # upstream fix"
"""The fix's added line: no file a sandbox can read may hold it (as text: git objects are compressed, so the
object-set check covers them)."""
NOTE_TEXT = "note about the fix 5d21e8"


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=cwd,
                          check=True, capture_output=True, text=True)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> dict:
    """A repository on branch ``trunk`` whose HEAD is past the base commit: the fix and a commit after it, tags
    and a branch past the base, a note, a stash holding the fix, and an annotated tag at the base (a tag object
    the base does not reach: only its name may come along). Also a bundle of every ref, and the base's object ids
    as the host sees them."""
    root = tmp_path_factory.mktemp("past-only")
    repo = root / "calc"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "trunk")
    (repo / "calc.py").write_text("def total(xs):\n    return 0\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "calc")
    (repo / "README").write_text("calc\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "readme")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "tag", "-a", "v-base", "-m", "the base, annotated")
    git(repo, "notes", "add", "-m", NOTE_TEXT, base)
    (repo / "calc.py").write_text(f"def total(xs):\n{FIX_LINE}\n")
    git(repo, "stash", "-q")  # the fix, stashed first
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "feature.py").write_text("feature = True\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a feature past the base")
    git(repo, "checkout", "-q", "trunk")
    (repo / "calc.py").write_text(f"def total(xs):\n{FIX_LINE}\n")
    git(repo, "commit", "-qam", "fix total")
    git(repo, "tag", "v-fix")
    git(repo, "tag", "-a", "v-fix-annotated", "-m", "released")
    (repo / "README").write_text("calc, fixed\n")
    git(repo, "commit", "-qam", "after the fix")
    git(repo, "bundle", "create", "-q", str(root / "calc.bundle"), "--all")
    objects = {line.split()[0] for line in git(repo, "rev-list", "--objects", base).splitlines()}
    return {"root": root, "repo": repo, "bundle": root / "calc.bundle", "base": base, "objects": objects}


# What each sandbox is asked, in its repository; each answer is one section after a marker line.
PROBE = """
echo @@objects; git cat-file --batch-all-objects --batch-check='%(objectname)'
echo @@refs; git for-each-ref --format='%(refname)'
echo @@head; git rev-parse HEAD; git symbolic-ref HEAD
echo @@special; for f in FETCH_HEAD ORIG_HEAD MERGE_HEAD packed-refs objects/info/alternates shallow; do
  test -e "$(git rev-parse --git-dir)/$f" && echo "$f"; done; git remote; git stash list; true
echo @@status; git status --porcelain
"""


def grep_script(top: str, exclude: tuple[str, ...] = ()) -> str:
    """Files under ``top`` holding the fix's line, with the line spelled in octal so this command (and anything
    that keeps it) never holds it."""
    pattern = "".join(f"\\{ord(c):03o}" for c in FIX_LINE)
    skip = " ".join(exclude)
    return (f"pat=$(printf '{pattern}'); for d in {top}; do case \" {skip} \" in *\" $d \"*) continue;; esac;"
            ' grep -rlsF -e "$pat" "$d"; done; true')


def sections(output: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        if line.startswith("@@"):
            current = found.setdefault(line[2:], [])
        elif current is not None and line:
            current.append(line)
    return found


async def look_inside(runtime, repo_dir: str, grep: str) -> tuple[dict[str, list[str]], list[str]]:
    probe = await runtime.exec(PROBE, cwd=repo_dir, timeout=120)
    assert probe.returncode == 0, probe.output
    found = await runtime.exec(grep, timeout=600)
    return sections(probe.output), found.output.split()


def assert_past_only(seen: dict[str, list[str]], leaks: list[str], history: dict) -> None:
    assert set(seen["objects"]) == history["objects"], "objects in the sandbox differ from the base's"
    assert seen["refs"] == ["refs/heads/trunk", "refs/tags/v-base"]  # the base's tag kept, as a lightweight one
    assert seen["head"] == [history["base"], "refs/heads/trunk"]
    assert seen.get("special", []) == [] and seen.get("status", []) == []
    assert leaks == [], f"files holding the fix's line: {leaks}"


def container(engine: str, image: str, workdir: str) -> DockerRuntime | ApptainerRuntime:
    """A sandbox of ``image`` on ``engine``: docker or podman, or apptainer (the docker image, converted)."""
    if engine == "apptainer":
        return ApptainerRuntime({"image": image, "workdir": workdir}, run_id=f"test-past-{uuid.uuid4().hex[:8]}")
    return DockerRuntime({"type": engine, "image": image, "workdir": workdir},
                         run_id=f"test-past-{uuid.uuid4().hex[:8]}", rollout_id=f"past-{engine}")


def engine_ready(request, engine: str, image: str) -> None:
    """``image`` where ``engine`` runs it (podman gets a copy), or the test skipped (failed in CI) without it."""
    if engine == "podman":
        request.getfixturevalue("podman_available")
        podman_copy(image)
    if engine == "apptainer":
        request.getfixturevalue("apptainer_binary")


@pytest.fixture
def instance_image(history, base_image, tmp_path):
    """Build the per-instance image of a row naming ``source`` (``calc`` or ``calc.bundle``); yield its tag."""
    tags: list[str] = []

    def build(source: str) -> str:
        row = {"instance_id": f"demo__calc-past-{uuid.uuid4().hex[:8]}", "repo": "demo/calc",
               "base_commit": history["base"], "repo_path": source, "problem_statement": "total is 0",
               "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]", "version": "1"}
        dataset = history["root"] / f"{row['instance_id']}.jsonl"
        dataset.write_text(json.dumps(row) + "\n")
        report = build_instance_images(dataset, base=base_image, parallelism=1, progress=lambda line: None)
        assert report.built == [row["instance_id"]], report.failed
        tags.append(image_for(row, base=base_image))
        return tags[-1]

    yield build
    for tag in tags:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
        if shutil.which("podman"):
            subprocess.run(["podman", "rmi", "-f", tag], capture_output=True)


CONTAINER_TOPS = ("/proc", "/sys", "/dev")


@pytest.mark.parametrize(("kind", "source"), [
    ("local", "directory"),
    ("local", "bundle"),
    pytest.param("docker", "directory", marks=pytest.mark.docker),
    pytest.param("podman", "bundle", marks=pytest.mark.podman),
    pytest.param("apptainer", "directory", marks=pytest.mark.apptainer),
])
def test_a_prepared_repository_holds_exactly_the_base_commits_past(history, request, tmp_path, kind, source):
    path = str(history["repo"] if source == "directory" else history["bundle"])
    if kind == "local":
        inner, repo_dir = LocalRuntime({"root": str(tmp_path / "ws")}, trusted_model=True), "testbed"
    elif kind == "apptainer":
        request.getfixturevalue("apptainer_binary")
        inner = ApptainerRuntime({"image": f"docker-daemon:{request.getfixturevalue('base_image')}",
                                  "workspace_root": str(tmp_path)})
        repo_dir = "testbed"
    else:
        image = request.getfixturevalue("base_image")
        if kind == "podman":
            request.getfixturevalue("podman_available")
            podman_copy(image)
        inner, repo_dir = container(kind, image, "/work"), "/work/testbed"

    async def scenario():
        runtime = PreparedRepoRuntime(inner, path, history["base"][:12])
        try:
            await runtime.start()
            # The local workspace is a host directory: all of it is the sandbox (the host around it is not).
            workspace = getattr(inner, "workspace", None) if kind == "local" else None
            top = workspace or "/*"
            return await look_inside(runtime, repo_dir, grep_script(top, () if workspace else CONTAINER_TOPS))
        finally:
            await runtime.close()

    seen, leaks = asyncio.run(scenario())
    assert_past_only(seen, leaks, history)


@pytest.mark.parametrize(("engine", "source"), [
    pytest.param("docker", "calc", marks=pytest.mark.docker),
    pytest.param("podman", "calc.bundle", marks=pytest.mark.podman),
    pytest.param("apptainer", "calc.bundle", marks=[pytest.mark.docker, pytest.mark.apptainer]),
])
def test_an_instance_images_container_holds_exactly_the_base_commits_past(history, instance_image, request,
                                                                          engine, source):
    tag = instance_image(source)
    engine_ready(request, engine, tag)

    async def scenario():
        runtime = container(engine, tag, "/testbed")
        await runtime.start()
        try:
            return await look_inside(runtime, "/testbed", grep_script("/*", CONTAINER_TOPS))
        finally:
            await runtime.close()

    seen, leaks = asyncio.run(scenario())
    assert_past_only(seen, leaks, history)


@pytest.fixture
def dataset_image(history, base_image, tmp_path):
    """An image as a registry would ship it (built here: there is no registry): /testbed a full clone of the
    source reset to the base, so its remote refs, tags, reflog and ORIG_HEAD all lead past the base."""
    tag = f"rollout-farm-tests/dataset-image:past-{uuid.uuid4().hex[:8]}"
    testbed = tmp_path / "context" / "testbed"
    git(tmp_path, "clone", "-q", "--no-hardlinks", str(history["repo"]), str(testbed))
    git(testbed, "reset", "-q", "--hard", history["base"])
    Path(tmp_path, "context", "Dockerfile").write_text(
        f"FROM {base_image}\nCOPY testbed /testbed\nWORKDIR /testbed\n"
        "RUN git config --system --add safe.directory '*'\n")
    subprocess.run(["docker", "build", "-q", "-t", tag, str(tmp_path / "context")], check=True, capture_output=True)
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
    if shutil.which("podman"):
        subprocess.run(["podman", "rmi", "-f", tag], capture_output=True)


@pytest.mark.parametrize("engine", [pytest.param("docker", marks=pytest.mark.docker),
                                    pytest.param("podman", marks=pytest.mark.podman),
                                    pytest.param("apptainer", marks=[pytest.mark.docker, pytest.mark.apptainer])])
def test_a_dataset_images_repository_holds_only_the_past_once_the_agent_starts(history, dataset_image, request,
                                                                               engine):
    engine_ready(request, engine, dataset_image)
    row = {"instance_id": "demo__calc-1", "repo": "demo/calc", "base_commit": history["base"],
           "image_name": dataset_image, "problem_statement": "total is 0"}
    task = Task(task_id=row["instance_id"], data=row)

    def builder(**overrides):
        return container(engine, overrides.pop("image", dataset_image), overrides.pop("workdir", "/testbed"))

    async def scenario():
        env = SweEnvironment(SweEnvironmentConfig(build_images=False), runtime_builder=builder)
        try:
            await env.reset(task)
            return await look_inside(env.runtime, "/testbed", grep_script("/*", CONTAINER_TOPS))
        finally:
            await env.close()

    seen, leaks = asyncio.run(scenario())
    assert_past_only(seen, leaks, history)


def test_the_past_only_pack_is_made_once_and_names_a_missing_commit(history, tmp_path):
    cache = str(tmp_path / "cache")
    first = past_pack(str(history["repo"]), history["base"][:10], cache=cache)
    again = past_pack(str(history["repo"]), "v-base", cache=cache)  # another name of the commit: the same pack
    assert (first.commit, first.branch) == (history["base"], "trunk") and again == first
    listed = git(history["root"], "verify-pack", "-v", first.idx).splitlines()
    assert {line.split()[0] for line in listed if " " in line and len(line.split()[0]) == 40} == history["objects"]
    from_bundle = past_pack(str(history["bundle"]), history["base"], cache=cache)
    assert (from_bundle.commit, from_bundle.branch) == (history["base"], "trunk")
    for source in (history["repo"], history["bundle"]):
        with pytest.raises(MissingCommit, match="is not in") as caught:
            past_pack(str(source), "0" * 40, cache=cache)
        assert caught.value.retryable is False
