"""Rollouts exported as mini-swe-agent .traj.json files: the format's shape, exit statuses, dict input."""

import asyncio
import json

import pytest

from agents.swe_agent import MiniSweAgent, MiniSweAgentConfig
from envs.runtimes.local_runtime import LocalRuntime
from envs.shell_env import ShellEnvironment
from envs.swe.traj_export import to_mini_swe_traj, write_mini_swe_traj
from rollout.errors import ExitReason
from rollout.models.scripted import ScriptedModel
from rollout.records import ErrorInfo, RequestMeta, RolloutResult, Task
from rollout.runner import run_rollout

SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TASK = Task(task_id="demo__demo-1", prompt="Write hello into hello.txt and submit its content.")


def bash(command: str) -> str:
    return f"Running it.\n```bash\n{command}\n```"


def rollout(outputs, **agent_config) -> RolloutResult:
    agent = MiniSweAgent(MiniSweAgentConfig(**agent_config))
    env = ShellEnvironment(LocalRuntime({}, trusted_model=True))
    return asyncio.run(run_rollout(TASK, agent, ScriptedModel(outputs), env, limits=agent.limits(),
                                   meta=RequestMeta(rollout_id="demo__demo-1#0", task_id=TASK.task_id, run_id="r1")))


def test_a_submitted_rollout_in_the_mini_swe_agent_shape(tmp_path):
    result = rollout([bash("echo hello > hello.txt"), bash(f"echo {SENTINEL} && cat hello.txt")])
    result = result.model_copy(update={"reward": 1.0, "reward_details": {"resolved": True}})
    path = write_mini_swe_traj(tmp_path / "trajs" / "demo.traj.json", result, config={"agent": {"step_limit": 5}})
    data = json.loads(path.read_text())
    assert data["trajectory_format"] == "mini-swe-agent-1" and data["instance_id"] == TASK.task_id
    info = data["info"]
    assert info["exit_status"] == "Submitted" and info["submission"] == "hello\n"
    assert info["model_stats"] == {"instance_cost": 0.0, "api_calls": 2}
    assert info["resolved"] is True and info["reward"] == 1.0 and info["config"] == {"agent": {"step_limit": 5}}
    assert info["run_id"] == "r1" and info["exit_reason"] == "submitted"
    roles = [m["role"] for m in data["messages"]]
    assert roles[:2] == ["system", "user"] and roles.count("assistant") == 2
    assert all(isinstance(m["content"], str) for m in data["messages"])
    assert data["messages"] == to_mini_swe_traj(result)["messages"] == result.trajectory.messages


@pytest.mark.parametrize("outputs, config, status", [
    ([bash("echo one"), bash("echo two")], {"max_steps": 1}, "LimitsExceeded"),
    (["no command here"] * 3, {}, "FormatError"),
], ids=["step-limit", "format-errors"])
def test_exit_statuses_use_mini_swe_agent_names(outputs, config, status):
    result = rollout(outputs, **config)
    traj = to_mini_swe_traj(result)
    assert traj["info"]["exit_status"] == status and traj["info"]["submission"] == ""
    assert traj["info"]["model_stats"]["api_calls"] == len(result.trajectory.steps) >= 1


def test_a_results_line_and_an_infrastructure_failure():
    """A results.jsonl line (a dict with keys a RolloutResult lacks) exports; a failure shows its type and
    traceback, and a tool-calling message with no content gets an empty string."""
    try:
        raise ConnectionError("endpoint unreachable")
    except ConnectionError as exc:
        error = ErrorInfo.from_exception(exc)
    failed = RolloutResult(rollout_id="t#0", task_id="t", status="infra_failed", exit_reason=ExitReason.MODEL_ERROR,
                           error=error)
    line = {**json.loads(failed.model_dump_json()), "trajectory_path": "trajectories/t/0.a1.json", "num_steps": 0}
    line["trajectory"]["messages"] = [{"role": "user", "content": "go"},
                                      {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}]
    traj = to_mini_swe_traj(line)
    assert traj["info"]["exit_status"] == "ConnectionError" and traj["info"]["status"] == "infra_failed"
    assert "endpoint unreachable" in traj["info"]["traceback"] and traj["info"]["reward"] is None
    assert traj["messages"][1] == {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]}
    json.dumps(traj)  # serialisable as is
