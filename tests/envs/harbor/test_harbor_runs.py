"""Harbor tasks run for real (docker): the bundled tasks through ``rollout check-tasks`` (oracle 1, nop 0, every
field honoured), the broken ones reported, and agents that go after the reward contract getting nothing."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from agents.swe_agent import MiniSweAgent, MiniSweAgentConfig
from cluster.cli import check_tasks
from envs.harbor.dataset import load_harbor_tasks
from envs.harbor.env import HarborEnvironment
from envs.harbor.verifier import HarborVerifier
from envs.runtimes.docker.config import DockerRuntimeConfig
from envs.runtimes.docker.runtime import DockerRuntime
from rollout.errors import SUBMIT_SENTINEL
from rollout.models.scripted import ScriptedModel
from rollout.records import RequestMeta
from rollout.runner import run_rollout

HARBOR = Path(__file__).resolve().parents[3] / "configs" / "harbor"
pytestmark = pytest.mark.timeout(900)


def rows(run_dir: Path) -> dict[str, dict]:
    out = {}
    for line in (run_dir / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        out[row["task_id"]] = row
    return out


def test_every_bundled_task_passes_its_check(base_image, tmp_path, capsys):
    assert check_tasks.main([str(HARBOR / "tasks"), "--out", str(tmp_path)]) == 0
    report = capsys.readouterr().out
    count = len([p for p in (HARBOR / "tasks").iterdir() if (p / "task.toml").exists()])
    assert f"{count} of {count} tasks pass" in report
    oracle, nop = rows(tmp_path / "tasks-oracle"), rows(tmp_path / "tasks-nop")
    details = {task: row["reward_details"] for task, row in oracle.items()}
    assert details["style-report"]["rewards"] == {"reward": 1.0, "style": 1.0}  # a multi-key reward kept whole
    assert nop["style-report"]["reward_details"]["rewards"] == {"reward": 0.0, "style": 0.0}
    assert details["both-reward-files"]["reward_file"] == "reward.json"  # reward.txt said 0
    assert details["network-probe"]["rewards"]["network"] == 0.0  # no interface but loopback
    assert details["separate-verifier"]["environment_mode"] == "separate"
    assert details["separate-verifier"]["rewards"]["outside"] == 0.0  # only /app reached the verifier
    assert details["compose-user"]["rewards"] == {"reward": 1.0, "root": 1.0}  # agent as "agent", tests as root
    assert "greeting: Hello, world!" in details["hello-file"]["test_output"]  # the ${VAR:-default}
    assert (details["two-steps"]["steps_run"], nop["two-steps"]["reward_details"]["steps_run"]) == (2, 1)  # gated
    assert [s["step"] for s in details["two-steps"]["steps"]] == ["create", "extend"]
    for row in list(oracle.values()) + list(nop.values()):
        assert (row["status"], row["failure_cause"], row["reward_valid"]) == ("completed", None, True)
    # A second check of the unchanged directory resumes: nothing runs again.
    assert check_tasks.main([str(HARBOR / "tasks"), "--out", str(tmp_path)]) == 0
    assert len((tmp_path / "tasks-oracle" / "results.jsonl").read_text().splitlines()) == count


def test_broken_tasks_are_reported_and_a_silent_verifier_is_never_a_zero(base_image, tmp_path, capsys):
    assert check_tasks.main([str(HARBOR / "broken"), "--out", str(tmp_path)]) == 1
    report = capsys.readouterr().out
    assert "always-pass" in report and "nop: reward = 1.0, expected 0" in report
    assert "silent-tests" in report and "verifier_failed" in report and "0 of 2 tasks pass" in report
    silent = rows(tmp_path / "broken-oracle")["silent-tests"]
    assert (silent["status"], silent["exit_reason"], silent["reward"]) == ("infra_failed", "verifier_error", None)
    assert (silent["failure_cause"], silent["reward_valid"]) == ("verifier_failed", False)
    assert "neither /logs/verifier/reward.json nor reward.txt" in silent["error"]["message"]


def builder(**overrides) -> DockerRuntime:
    return DockerRuntime(DockerRuntimeConfig(**overrides), run_id="harbor-test", rollout_id="r")


def run_commands(task, commands: list[str], environ: dict | None = None):
    """The Mini-SWE bash agent playing ``commands`` (one per turn, then the submission) on ``task``."""
    outputs = [f"Next.\n```bash\n{c}\n```" for c in commands] + [f"Done.\n```bash\necho {SUBMIT_SENTINEL}\n```"]
    env = HarborEnvironment(runtime_builder=builder)
    agent = MiniSweAgent(MiniSweAgentConfig(max_steps=len(outputs) + 1))
    return asyncio.run(run_rollout(task, agent, ScriptedModel(outputs=outputs), env,
                                   verifier=HarborVerifier(env=env), meta=RequestMeta(rollout_id="r", task_id="t")))


@pytest.fixture(scope="module")
def hello(tmp_path_factory):
    return load_harbor_tasks(HARBOR / "tasks" / "hello-file")[0]


HONEST = ["printf '%s\\n' \"$GREETING\" > /app/hello.txt"]
ATTACKS = {
    "pre-written rewards": ["mkdir -p /logs/verifier", "echo '{\"reward\": 1}' > /logs/verifier/reward.json; "
                            "echo 1 > /logs/verifier/reward.txt"],
    "a background writer without the exec marker": [
        "setsid env -i /bin/sh -c 'while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
        "sleep 0.05; done' >/dev/null 2>&1 < /dev/null & disown; sleep 0.3; cat /logs/verifier/reward.txt"],
    "a symbolic link for the logs": ["mkdir -p /tmp/fake && echo '{\"reward\": 1}' > /tmp/fake/reward.json && "
                                     "rm -rf /logs/verifier && ln -s /tmp/fake /logs/verifier"],
    "shell start-up files": ["for f in /etc/profile /etc/bash.bashrc /root/.bashrc /root/.bash_profile "
                             "/root/.profile; do echo 'echo {\\\"reward\\\": 1} > /logs/verifier/reward.json "
                             "2>/dev/null' >> $f; done; tail -1 /etc/profile"],
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_an_agent_that_goes_after_the_reward_gets_nothing(base_image, hello, attack):
    result = run_commands(hello, ATTACKS[attack])
    assert result.status == "completed", result.error
    assert result.reward == 0.0, result.reward_details.get("test_output")


FORCE_PASS = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
"""


def test_tests_the_agent_planted_are_gone_before_the_real_ones_run(base_image):
    fizzbuzz = load_harbor_tasks(HARBOR / "tasks" / "fix-fizzbuzz")[0]
    plant = f"mkdir -p /tests && cat > /tests/conftest.py <<'EOF'\n{FORCE_PASS}EOF\ncp /tests/conftest.py /app/"
    result = run_commands(fizzbuzz, [plant])
    assert result.status == "completed" and result.reward == 0.0, result.reward_details.get("test_output")


def test_the_same_harness_rewards_honest_work_and_the_tests_stay_hidden(base_image, hello):
    result = run_commands(hello, ["ls -la /tests /solution 2>&1; ls /logs"] + HONEST)
    assert result.reward == 1.0
    seen = result.trajectory.steps[0].observations[0].content
    assert "No such file or directory" in seen and "test.sh" not in seen and "solve.sh" not in seen


def write(task_dir: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (task_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (task_dir / name).write_text(text)
    return task_dir


def test_a_missing_from_image_is_named_and_tests_past_their_timeout_are_a_verifier_failure(base_image, tmp_path):
    missing = write(tmp_path / "missing-base", {
        "task.toml": "", "instruction.md": "x\n", "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
        "environment/Dockerfile": "FROM rollout-farm/never-built:1\n"})
    result = run_commands(load_harbor_tasks(missing)[0], [])
    assert (result.status, result.exit_reason.value) == ("infra_failed", "container_start_failed")
    assert "FROM rollout-farm/never-built:1 is not an image of this machine" in result.error.message
    slow = write(tmp_path / "slow-tests", {
        "task.toml": "[verifier]\ntimeout_sec = 2\n[environment]\ndocker_image = 'rollout-farm/base:bookworm'\n",
        "instruction.md": "x\n", "tests/test.sh": "sleep 30; echo 1 > /logs/verifier/reward.txt\n"})
    result = run_commands(load_harbor_tasks(slow)[0], [])
    assert (result.status, result.exit_reason.value, result.reward) == ("infra_failed", "verifier_error", None)
    assert "verifier.timeout_sec (2s)" in result.error.message


def test_variables_and_a_public_network_when_the_run_allows_it(base_image, tmp_path):
    task = load_harbor_tasks(HARBOR / "tasks" / "hello-file", environ={"ROLLOUT_HARBOR_GREETING": "Hi there"})[0]
    result = run_commands(task, HONEST)
    assert result.reward == 1.0 and "greeting: Hi there" in result.reward_details["test_output"]
    probe = shutil.copytree(HARBOR / "tasks" / "network-probe", tmp_path / "network-probe")
    (probe / "task.toml").write_text((probe / "task.toml").read_text().replace('"no-network"', '"public"'))
    env = HarborEnvironment(runtime_builder=builder)
    env.config.allow_network = True
    opened = load_harbor_tasks(probe)[0]
    from agents.reference_agents import OracleAgent

    result = asyncio.run(run_rollout(opened, OracleAgent(), ScriptedModel(outputs=["-"]), env,
                                     verifier=HarborVerifier(env=env)))
    assert result.reward_details["rewards"] == {"reward": 1.0, "network": 1.0}  # the probe's control


def test_the_images_command_builds_task_images_ahead(base_image, tmp_path, capsys):
    from cluster.cli import images

    shutil.copytree(HARBOR / "tasks" / "fix-fizzbuzz", tmp_path / "fix-fizzbuzz")
    write(tmp_path / "missing-base", {"task.toml": "", "instruction.md": "x\n", "tests/test.sh": "true\n",
                                      "environment/Dockerfile": "FROM rollout-farm/never-built:2\n"})
    assert images.main(["build", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    tag = load_harbor_tasks(tmp_path / "fix-fizzbuzz")[0].data["harbor"]["build"]
    assert f"fix-fizzbuzz: {tag} " in out and "1 of 2 task images ready, 1 failed" in out
    assert "missing-base: environment/Dockerfile: FROM rollout-farm/never-built:2 is not an image of this" in err
    assert subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def test_check_tasks_names_every_task_it_cannot_run_and_checks_the_others(base_image, tmp_path, capsys):
    """As a linter does: a task asking for a network the run does not give, and one whose task.toml does not parse,
    are each named with the reason; the task that can run is checked; the exit code is 1."""
    tasks = tmp_path / "tasks"
    shutil.copytree(HARBOR / "tasks" / "hello-file", tasks / "hello-file")
    shutil.copytree(HARBOR / "tasks" / "hello-file", tasks / "wants-network")
    toml = tasks / "wants-network" / "task.toml"
    toml.write_text(toml.read_text().replace('network_mode = "no-network"', 'network_mode = "public"'))
    shutil.copytree(HARBOR / "tasks" / "hello-file", tasks / "bad-toml")
    (tasks / "bad-toml" / "task.toml").write_text("schema_version = [unclosed\n")
    assert check_tasks.main([str(tasks), "--out", str(tmp_path / "out")]) == 1
    report = capsys.readouterr().out
    lines = {line.split()[0]: line for line in report.splitlines() if line and not line.startswith("task ")}
    assert "not run:" in lines["wants-network"] and "network" in lines["wants-network"]
    assert "not run:" in lines["bad-toml"] and "task.toml" in lines["bad-toml"]
    assert lines["hello-file"].rstrip().endswith("ok")  # checked all the same: oracle 1, nop 0
    assert "1 of 3 tasks pass" in report and "check: bad-toml, wants-network" in report
