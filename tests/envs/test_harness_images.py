"""Harness layers: pip requirements on top of an image, their console script run without network, kept off the path
of what that script runs; reused once built; a requirement without a wheel refused clearly; the docker runtime's
``harness``."""

from __future__ import annotations

import asyncio
import re
import subprocess
import uuid

import pytest

from envs.images.daemon import ImageError
from envs.images.harness_images import ensure_harness_image, harness_tag
from envs.runtimes.docker.runtime import DockerRuntime

HARNESS = ["invoke==2.2.0"]
"""Small, pure Python, no dependencies, and a console script that runs commands of its own (``c.run``)."""
REFERENCE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*:[\w][\w.-]{0,127}$")


def docker_run(image: str, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "run", "--rm", "--network", "none", image, "bash", "-c", script],
                          capture_output=True, text=True, timeout=120)


def image_id(image: str) -> str:
    return subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_harness_tags_read_like_their_image_and_follow_what_is_installed():
    image = "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    tag = harness_tag(image, "sha256:1", ["mini-swe-agent==2.4.6"])
    assert tag.startswith("rollout-farm/harness:sweb.eval.x86_64.django_1776_django-11099-latest-")
    assert REFERENCE.match(tag) and REFERENCE.match(harness_tag("x" * 300 + ":y", "sha256:1", ["a"]))
    others = [harness_tag(image, "sha256:2", ["mini-swe-agent==2.4.6"]), harness_tag(image, "sha256:1", ["a"])]
    assert len({tag, *others}) == 3


@pytest.fixture(scope="module")
def base(base_image, tmp_path_factory):
    """The base image under a name of this session's own (so its harness layer is built here, not found), with an
    empty wheel cache (so pip runs)."""
    alias = f"rollout-farm/harness-test:{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "tag", base_image, alias], check=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield alias
    tags = [harness_tag(alias, image_id(alias), HARNESS), alias]
    subprocess.run(["docker", "rmi", *tags], capture_output=True)  # never the base image: only our names


@pytest.fixture(scope="module")
def layer(base):
    return ensure_harness_image(base, HARNESS)


@pytest.mark.docker
def test_the_console_script_runs_in_a_container_without_network(base, layer):
    assert layer != base and layer.startswith("rollout-farm/harness:harness-test-")
    ran = docker_run(layer, "invoke --version; command -v invoke")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["Invoke 2.2.0", "/usr/local/bin/invoke"]


@pytest.mark.docker
def test_what_the_script_runs_does_not_see_the_harness(layer):
    # tasks.py imports invoke (the harness's own process sees it); the command it runs (a child) must not, nor
    # the container's shell; a repository holding modules of the names it imports does not break the script.
    script = """set -u
mkdir -p /repo/invoke && echo 'raise SystemExit("the repository shadowed the harness")' > /repo/invoke/__init__.py
cp /repo/invoke/__init__.py /repo/inspect.py  # a standard module invoke imports
cat > /repo/tasks.py <<'EOF'
from invoke import task

@task
def check(c):
    c.run("echo PYTHONPATH=${PYTHONPATH:-unset}; cd / && python3 -c 'import invoke'")
EOF
cd /repo && invoke check; echo "invoke exited $?"
python3 -c 'import invoke' 2>/dev/null || echo "the shell cannot import it"
"""
    ran = docker_run(layer, script)
    assert "PYTHONPATH=unset" in ran.stdout, ran.stdout + ran.stderr
    assert "ModuleNotFoundError: No module named 'invoke'" in ran.stderr
    assert "invoke exited 1" in ran.stdout and "the shell cannot import it" in ran.stdout
    assert "shadowed" not in ran.stdout + ran.stderr


@pytest.mark.docker
def test_a_second_ensure_reuses_the_layer(base, layer):
    before = image_id(layer)
    assert ensure_harness_image(base, HARNESS) == layer and image_id(layer) == before


@pytest.mark.docker
def test_a_requirement_without_a_wheel_is_refused_saying_which(base):
    with pytest.raises(ImageError) as raised:
        ensure_harness_image(base, ["docopt==0.6.2"])  # published as a source archive only
    message = str(raised.value)
    assert "docopt==0.6.2 has no wheel" in message and "CPython 3.11 on " in message
    assert "pin a version that publishes such a wheel" in message


def run_script(section: dict) -> str:
    """The output of the harness's script, and of the image's python importing it, in a runtime of ``section``."""

    async def scenario():
        rt = DockerRuntime(section, run_id=f"test-{uuid.uuid4().hex[:8]}", rollout_id="harness")
        await rt.start()
        try:
            result = await rt.exec("invoke --version && python3 -c 'import invoke' 2>&1 | tail -1")
        finally:
            await rt.close()
        assert result.returncode == 0, result.output
        return result.output

    return asyncio.run(scenario())


@pytest.mark.docker
def test_a_docker_runtime_with_a_harness_runs_its_script(base, layer):
    output = run_script({"image": base, "harness": HARNESS})
    assert output.splitlines() == ["Invoke 2.2.0", "ModuleNotFoundError: No module named 'invoke'"]


@pytest.mark.podman
def test_a_podman_runtime_builds_the_layer_in_podman(base, podman_available):
    if subprocess.run(["podman", "image", "exists", base]).returncode != 0:
        subprocess.run(["podman", "pull", "-q", f"docker-daemon:{base}"], check=True, capture_output=True)
    try:
        output = run_script({"type": "podman", "image": base, "harness": HARNESS})
        assert output.splitlines() == ["Invoke 2.2.0", "ModuleNotFoundError: No module named 'invoke'"]
    finally:
        ours = f"reference=rollout-farm/harness:harness-test-{base.rsplit(':', 1)[1]}-*"
        listed = subprocess.run(["podman", "images", "-q", "--filter", ours], capture_output=True, text=True)
        found = listed.stdout.split()
        subprocess.run(["podman", "rmi", "-f", *found, base], capture_output=True)  # our alias, never the base
