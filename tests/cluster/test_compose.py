"""The composer asks each component what its class or section declares (``rollout.config.components``) and never
probes by name: the engines whose leftovers a run reaps, the image a task runs in, the dataset's row checks, the
model's URL, the agent's limits, and how each part is built."""

from __future__ import annotations

import pytest

from cluster.compose import Composer, build
from cluster.config.run_config import RunConfig
from envs.runtimes.null import NullRuntime
from envs.swe.env import SweEnvironment
from rollout.config.load import validate
from rollout.records import RequestMeta, Task


def composer(**sections) -> Composer:
    raw = {"model": {"type": "scripted", "outputs": ["hi"]}, "agent": {"type": "mini_swe", "max_steps": 7},
           "environment": {"type": "shell"}, "runtime": {"type": "null"}, "dataset": {"path": "-"}, **sections}
    return Composer(validate(RunConfig, raw))


@pytest.mark.parametrize("runtime, engines", [
    ({"type": "docker"}, {"docker"}), ({"type": "podman"}, {"podman"}),
    ({"type": "docker", "engine": "podman"}, {"podman"}), ({"type": "apptainer"}, set()),
    ({"type": "local", "allow_host_exec": True}, set()), ({"type": "null"}, set()),
])
def test_the_engines_reaped_are_those_of_runtimes_that_run_containers(runtime, engines):
    assert composer(runtime=runtime).container_engines() == engines


def test_a_task_runs_in_its_environment_s_image_else_the_runtime_s_and_without_images_in_none():
    row = Task(task_id="a__b-1", data={"instance_id": "a__b-1", "image_name": "reg/img:1"})
    assert composer(runtime={"type": "docker", "image": "base:1"}).image_of(row) == "base:1"
    swe = composer(environment={"type": "swe"}, runtime={"type": "docker", "image": "base:1"})
    assert swe.image_of(row) == SweEnvironment.image_for(row) == "reg/img:1"
    assert composer(environment={"type": "swe"}, runtime={"type": "apptainer"}).image_of(row) == "reg/img:1"
    assert composer(environment={"type": "swe"}, runtime={"type": "null"}).image_of(row) is None


def test_the_dataset_is_checked_by_the_environments_that_check_rows():
    assert composer().row_check() is None
    check = composer(environment={"type": "swe"}, runtime={"type": "docker"}).row_check()
    with pytest.raises(ValueError, match="base_commit"):
        check(Task(task_id="a__b-1", data={"problem_statement": "fix", "base_commit": "$(id)"}))


def test_an_endpoint_model_takes_the_run_s_url_and_a_scripted_one_has_none():
    openai = composer(model={"type": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"})
    assert openai.model_url() == "http://127.0.0.1:9/v1"
    assert openai.model_url("http://127.0.0.1:7/v1") == "http://127.0.0.1:7/v1"
    assert openai.build_model("http://127.0.0.1:7/v1").config.base_url == "http://127.0.0.1:7/v1"
    scripted = composer()
    assert scripted.model_url() is None and scripted.build_model("http://127.0.0.1:7/v1").calls == 0


def test_the_agent_s_limits_come_from_its_config_and_parts_are_built_from_their_sections():
    comp = composer(runtime={"type": "null", "echo": True})
    assert comp.profiles[None].limits.max_steps == 7
    parts = comp.parts(Task(task_id="t", prompt="go"), RequestMeta(rollout_id="t#0", task_id="t", run_id="r"))
    assert isinstance(parts.env.runtime, NullRuntime) and parts.env.runtime.config.echo  # built by from_config
    assert parts.limits.max_steps == 7
    aviary = composer(agent={"type": "aviary"}, environment={"type": "aviary", "url": "http://127.0.0.1:9"},
                      runtime=None)
    env = build(aviary.profiles[None].environment)  # a class without from_config: its constructor
    assert env.config.url == "http://127.0.0.1:9"
