"""Harbor task directories read as a user would write them: task.toml fields, errors that name the field, the
dataset's checks, the images' FROM lines, reward files and step aggregation (no containers here)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envs.harbor.dataset import describe_unhonoured, load_harbor_tasks, task_dirs
from envs.harbor.env import check_tasks
from envs.harbor.grading import parse_reward
from envs.harbor.images import from_images
from envs.harbor.steps import gate_missed
from envs.harbor.task_config import TaskConfigError, parse_task_toml
from envs.harbor.verifier import aggregate
from rollout.errors import ConfigError, VerifierError

TASKS = Path(__file__).resolve().parents[3] / "configs" / "harbor" / "tasks"


def write_task(root: Path, name: str = "t", toml: str = "", *, dockerfile: str | None = "FROM scratch\n",
               instruction: str = "Do it.\n", test: str | None = "echo 1 > /logs/verifier/reward.txt\n") -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "task.toml").write_text(toml)
    if instruction is not None:
        (task / "instruction.md").write_text(instruction)
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    if test is not None:
        (task / "tests").mkdir()
        (task / "tests" / "test.sh").write_text(test)
    return task


def test_the_bundled_tasks_load_with_their_fields():
    tasks = {t.task_id: t for t in load_harbor_tasks(TASKS)}
    assert len(tasks) >= 7
    hello = tasks["hello-file"]
    assert hello.prompt.startswith("Create a file `/app/hello.txt`")
    config = parse_task_toml(hello.data["harbor"]["toml"], {})
    assert (config.cpus, config.memory_mb, config.workdir, config.agent.timeout_sec) == (1.0, 512, "/app", 120.0)
    assert config.env == {"GREETING": "Hello, world!"}  # the ${VAR:-default} default
    assert hello.metadata["harbor_name"] == "rollout-farm/hello-file"
    assert tasks["two-steps"].data["harbor"]["steps"] == ["create", "extend"]
    assert tasks["two-steps"].prompt.startswith("Create `/app/list.txt`")  # the first step's instruction
    assert tasks["style-report"].data["harbor"]["image"] == "rollout-farm/base:bookworm"  # docker_image
    assert tasks["compose-user"].data["harbor"]["build"].startswith("rollout-farm/harbor:compose-user-")


def test_schema_versions_legacy_key_and_unknown_keys():
    assert parse_task_toml('version = "1.0"\n').schema_version == "1.0"
    config = parse_task_toml('schema_version = "1.4"\nfuture_key = 1\n[environment]\nshiny = true\n'
                             '[environment.mcp_servers]\n')
    assert config.unknown == ["future_key", "environment.shiny"]
    with pytest.raises(TaskConfigError, match="schema 1.x"):
        parse_task_toml('schema_version = "2.0"\n')


@pytest.mark.parametrize("toml, field", [
    ("[agent]\ntimeout_sec = 'soon'\n", "agent.timeout_sec"),
    ("[verifier]\ntimeout_sec = -1\n", "verifier.timeout_sec"),
    ("[environment]\nnetwork_mode = 'sometimes'\n", "environment.network_mode"),
    ("[environment]\nos = 'windows'\n", "environment.os"),
    ("[environment]\ngpus = 1\n", "environment.gpus"),
    ("[environment]\nmemory_mb = 1.5\n", "environment.memory_mb"),
    ("[verifier]\nenvironment_mode = 'elsewhere'\n", "verifier.environment_mode"),
    ("[environment.healthcheck]\ninterval_sec = 1\n", "environment.healthcheck.command"),
    ("multi_step_reward_strategy = 'max'\n", "multi_step_reward_strategy"),
    ("[[steps]]\nname = '../up'\n", "steps[0].name"),
    ("[[steps]]\nname = 'a'\nmin_reward = 'high'\n", "steps[0].min_reward"),
    ("this is not toml", "not TOML"),
])
def test_a_wrong_value_names_its_field(toml, field):
    with pytest.raises(TaskConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_task_toml(toml)


def test_variables_resolve_from_the_environment_or_their_default():
    toml = '[environment.env]\nA = "${X:-dflt}"\nB = "pre-${Y}"\n[verifier.env]\nC = "${X}"\n'
    config = parse_task_toml(toml, {"Y": "why", "X": "ex"})
    assert config.env == {"A": "ex", "B": "pre-why"} and config.verifier.env == {"C": "ex"}
    assert parse_task_toml(toml.replace("B =", "#"), {"X": ""}).env == {"A": "dflt"}  # empty: the default
    with pytest.raises(TaskConfigError, match=r"environment.env.B: \$\{Y\} is not set"):
        parse_task_toml(toml, {"X": "ex"})


def test_legacy_spellings_and_what_is_not_honoured_are_named(tmp_path):
    config = parse_task_toml('[environment]\nmemory = "2G"\nstorage = "512M"\nallow_internet = true\n'
                             'skills_dir = "s"\n')
    assert (config.memory_mb, config.storage_mb, config.network_mode) == (2048, 512, "public")
    assert config.ignored == ["environment.skills_dir (skills are not copied)"]
    write_task(tmp_path, "a", '[environment]\nskills_dir = "s"\nnew_thing = 1\n')
    write_task(tmp_path, "b", "")
    note = describe_unhonoured(load_harbor_tasks(tmp_path))
    assert "environment.skills_dir (skills are not copied) in 1 task(s)" in note
    assert "environment.new_thing (1)" in note and "2 task(s) name no network_mode" in note


def test_networks_the_runtime_cannot_give_are_refused_before_work(tmp_path):
    write_task(tmp_path, "open", '[environment]\nnetwork_mode = "public"\n')
    write_task(tmp_path, "listed", '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n')
    tasks = {t.task_id: [t] for t in load_harbor_tasks(tmp_path)}
    with pytest.raises(ConfigError, match="task open .* 'public'.*allow_network is true"):
        check_tasks(tasks["open"], {"type": "harbor"})
    check_tasks(tasks["open"], {"type": "harbor", "allow_network": True})
    with pytest.raises(ConfigError, match="'allowlist': this runtime cannot enforce"):
        check_tasks(tasks["listed"], {"type": "harbor", "allow_network": True})


@pytest.mark.parametrize("case, message", [
    ("no instruction", "instruction.md is missing"),
    ("no tests", "no tests/test.sh"),
    ("no image", "nothing to run the task in"),
    ("bad name", "task directory name"),
    ("two services", "services besides main"),
    ("step without instruction", "step 'a' has no steps/a/instruction.md"),
])
def test_a_broken_task_directory_is_named(tmp_path, case, message):
    if case == "no instruction":
        write_task(tmp_path, instruction=None)
    elif case == "no tests":
        write_task(tmp_path, test=None)
    elif case == "no image":
        write_task(tmp_path, dockerfile=None)
    elif case == "bad name":
        write_task(tmp_path, "has space")
    elif case == "two services":
        task = write_task(tmp_path)
        (task / "environment" / "docker-compose.yaml").write_text(
            "services:\n  main: {build: .}\n  db: {image: postgres}\n")
    else:
        write_task(tmp_path, toml='[[steps]]\nname = "a"\n')
    with pytest.raises(ConfigError, match=message) as info:
        load_harbor_tasks(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_one_task_or_a_directory_of_them(tmp_path):
    shutil.copytree(TASKS / "hello-file", tmp_path / "hello-file")
    assert [p.name for p in task_dirs(tmp_path / "hello-file")] == ["hello-file"]
    assert [p.name for p in task_dirs(tmp_path)] == ["hello-file"]
    with pytest.raises(ConfigError, match="holds no Harbor task"):
        task_dirs(tmp_path / "hello-file" / "environment")


def test_the_archive_follows_the_content_and_refuses_links(tmp_path):
    task = write_task(tmp_path)
    first = load_harbor_tasks(task)[0].data
    assert load_harbor_tasks(task)[0].data["harbor"]["digest"] == first["harbor"]["digest"]  # same bytes
    (task / "tests" / "test.sh").write_text("echo 0 > /logs/verifier/reward.txt\n")
    assert load_harbor_tasks(task)[0].data["harbor"]["digest"] != first["harbor"]["digest"]
    (task / "environment" / "link").symlink_to("/etc/passwd")
    with pytest.raises(ConfigError, match="link: a symbolic link"):
        load_harbor_tasks(task)


def test_from_lines_name_what_the_build_needs():
    text = ("ARG BASE=debian:12\nFROM ${BASE} AS build\nRUN true\nFROM --platform=linux/amd64 build AS two\n"
            "FROM scratch\nFROM \\\n  python:3.11\n")
    assert from_images(text) == ["debian:12", "python:3.11"]


@pytest.mark.parametrize("name, data, expected", [
    ("reward.txt", b"0.75\n", {"reward": 0.75}),
    ("reward.json", b'{"reward": 0.5, "style": 1}', {"reward": 0.5, "style": 1.0}),
    ("reward.txt", b"", "is empty"),
    ("reward.txt", b"nan", "non-finite"),
    ("reward.txt", b"yes", "not a number"),
    ("reward.json", b'{"reward": Infinity}', "not a finite number"),
    ("reward.json", b'{"reward": true}', "not a finite number"),
    ("reward.json", b'{"reward": "1"}', "not a finite number"),
    ("reward.json", b"[1]", "a table of numbers"),
    ("reward.json", b"{}", "a table of numbers"),
    ("reward.json", b"{reward: 1}", "not JSON"),
])
def test_reward_files_are_numbers_or_a_verifier_failure(name, data, expected):
    if isinstance(expected, dict):
        assert parse_reward(name, data) == expected
        return
    with pytest.raises(VerifierError, match=expected) as info:
        parse_reward(name, data)
    assert info.value.retryable is False


def test_steps_aggregate_and_gate():
    steps = [{"reward": 1.0, "style": 1.0}, {"reward": 0.0}]
    assert aggregate(steps, "mean") == {"reward": 0.5, "style": 0.5}  # a key a step lacks counts 0
    assert aggregate(steps, "final") == {"reward": 0.0}
    assert gate_missed({"reward": 0.5}, 1.0) == "reward=0.5 below min_reward 1.0"
    assert gate_missed({"reward": 1.0, "style": 0.0}, {"style": 0.5}) == "style=0.0 below min_reward 0.5"
    assert gate_missed({"reward": 1.0}, {"style": 0.5}) == "style=None below min_reward 0.5"
    assert gate_missed({"reward": 1.0}, 1.0) is None and gate_missed({}, None) is None
