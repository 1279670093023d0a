"""Rollouts exported as mini-swe-agent 2.4.6 .traj.json files: the shape, exit statuses, per-message extra, the exit
message, dict input, and the files a SWE run writes (names, preds.json). ``test_traj_mini_swe.py`` compares them
with the files mini-swe-agent writes itself."""

import asyncio
import json
import re

import pytest

from agents.swe_agent import MiniSweAgent, MiniSweAgentConfig
from cluster.run.swe_outputs import write_swe_outputs
from envs.runtimes.local import LocalRuntime
from envs.shell_env import ShellEnvironment
from envs.swe.reports.traj_export import to_mini_swe_traj, write_mini_swe_traj
from rollout.errors import ExitReason
from rollout.models.scripted import ScriptedModel
from rollout.records import Action, ErrorInfo, Observation, RequestMeta, RolloutResult, Step, Task, Trajectory
from rollout.runner import run_rollout
from rollout.store.run_dir import RunStore

SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TASK = Task(task_id="demo__demo-1", prompt="Write hello into hello.txt and submit its content.")


def bash(command: str) -> str:
    return f"Running it.\n```bash\n{command}\n```"


def rollout(outputs, sample: int = 0, env_config=None, **agent_config) -> RolloutResult:
    agent = MiniSweAgent(MiniSweAgentConfig(**agent_config))
    env = ShellEnvironment(LocalRuntime({}, trusted_model=True), env_config)
    meta = RequestMeta(rollout_id=f"{TASK.task_id}#{sample}", task_id=TASK.task_id, run_id="r1", sample_index=sample)
    return asyncio.run(run_rollout(TASK, agent, ScriptedModel(outputs), env, limits=agent.limits(), meta=meta))


def test_a_submitted_rollout_in_the_mini_swe_agent_shape(tmp_path):
    result = rollout([bash("echo hello > hello.txt"), bash("exit 3"), bash(f"echo {SENTINEL} && cat hello.txt")])
    result = result.model_copy(update={"reward": 1.0, "reward_details": {"resolved": True}})
    config = {"agent": {"type": "mini_swe", "max_steps": 5}, "model": {"type": "openai", "api_key": "sk-secret"},
              "run": {"samples": 1}}
    path = write_mini_swe_traj(tmp_path / "trajs" / "demo.traj.json", result, config=config)
    data = json.loads(path.read_text())
    assert list(data) == ["info", "messages", "trajectory_format", "instance_id"]
    assert data["trajectory_format"] == "mini-swe-agent-1.1" and data["instance_id"] == TASK.task_id
    info = data["info"]
    # we wrote it, in mini-swe-agent 2.4.6's format: no mini-swe-agent release is claimed as the writer
    assert info["mini_version"] is None and info["format_of"] == "mini-swe-agent 2.4.6"
    assert re.fullmatch(r"rollout-farm \S+", info["written_by"]) and "2.4.6" not in info["written_by"]
    assert info["exit_status"] == "Submitted" and info["submission"] == "hello\n"
    assert info["model_stats"] == {"instance_cost": 0.0, "api_calls": 3}
    assert info["resolved"] is True and info["reward"] == 1.0 and info["run_id"] == "r1"
    assert info["config"] == {"agent": {"type": "mini_swe", "max_steps": 5}, "agent_type": "mini_swe",
                              "model": {"type": "openai"}, "model_type": "openai",  # no secret in a shared file
                              "environment": {}, "environment_type": "", "run": {"samples": 1}}

    messages = data["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user",
                                             "assistant", "exit"]
    assert [{k: v for k, v in m.items() if k != "extra"} for m in messages[:-1]] == result.trajectory.messages
    replies = [m["extra"] for m in messages if m["role"] == "assistant"]
    assert [r["actions"] for r in replies] == [[{"command": "echo hello > hello.txt"}], [{"command": "exit 3"}],
                                               [{"command": f"echo {SENTINEL} && cat hello.txt"}]]
    for reply, step in zip([m for m in messages if m["role"] == "assistant"], result.trajectory.steps):
        response = reply["extra"]["response"]  # the model's response, where mini-swe-agent keeps the provider's
        assert response["object"] == "chat.completion" and response["usage"] == step.usage.model_dump()
        assert response["choices"] == [{"index": 0, "message": step.message, "finish_reason": step.finish_reason,
                                        "token_ids": step.completion_token_ids}]  # as vLLM returns them
        assert response["choices"][0]["message"]["content"] == reply["content"]
    outputs = [m["extra"] for m in messages[3:6:2]]
    assert [(o["returncode"], o["raw_output"], o["exception_info"]) for o in outputs] == [(0, "", ""), (3, "", "")]
    stamps = [m["extra"]["timestamp"] for m in messages[2:7]]
    steps = result.trajectory.steps
    assert stamps == sorted(stamps) and steps[0].started_at <= stamps[0] <= steps[2].started_at
    assert messages[-1] == {"role": "exit", "content": "hello\n",
                            "extra": {"exit_status": "Submitted", "submission": "hello\n"}}


@pytest.mark.parametrize("outputs, config, status", [
    ([bash("echo one"), bash("echo two")], {"max_steps": 1}, "LimitsExceeded"),
    ([bash("sleep 0.3"), bash("echo two")], {"time_limit": 0.2}, "TimeExceeded"),
    (["no command here"] * 3, {}, "RepeatedFormatError"),
], ids=["step-limit", "time-limit", "format-errors"])
def test_exit_statuses_use_mini_swe_agent_2_names(outputs, config, status):
    result = rollout(outputs, **config)
    traj = to_mini_swe_traj(result)
    assert traj["info"]["exit_status"] == status and traj["info"]["submission"] == ""
    assert traj["info"]["model_stats"]["api_calls"] == len(result.trajectory.steps) >= 1
    assert traj["messages"][-1] == {"role": "exit", "content": status,
                                    "extra": {"exit_status": status, "submission": ""}}


def test_a_format_error_and_a_timed_out_command_say_so_in_extra():
    outputs = ["no command here", bash("sleep 5"), bash(f"echo {SENTINEL}")]
    result = rollout(outputs, env_config={"command_timeout": 0.3})
    messages = to_mini_swe_traj(result)["messages"]
    assert messages[3]["extra"] == {"interrupt_type": "FormatError", "model_response": "no command here"}
    timed_out = messages[5]["extra"]
    assert timed_out["timed_out"] is True and timed_out["exception_info"] == "the command timed out after 0.3 seconds"


def test_tool_replies_get_their_own_calls_output():
    """Observations reach the messages in any order; each tool message carries the output of its call."""
    calls = [Action(name="bash", arguments={"command": c}, call_id=i) for c, i in (("ls", "c1"), ("pwd", "c2"))]
    step = Step(index=1, message={"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
                actions=calls, started_at=100.0, model_seconds=1.0, env_seconds=2.0,
                observations=[Observation(content="a\n", call_id="c1", info={"returncode": 0, "duration": 0.5}),
                              Observation(content="/w\n", call_id="c2", success=False)])
    trajectory = Trajectory(messages=[{"role": "user", "content": "go"}, step.message,
                                      {"role": "tool", "tool_call_id": "c2", "content": "/w"},
                                      {"role": "tool", "tool_call_id": "c1", "content": "a"}], steps=[step])
    result = RolloutResult(rollout_id="t#0", task_id="t", status="completed", exit_reason=ExitReason.STEP_LIMIT,
                           trajectory=trajectory)
    messages = to_mini_swe_traj(result)["messages"]
    assert messages[1]["content"] == "" and messages[1]["extra"]["actions"] == [
        {"command": "ls", "tool_call_id": "c1"}, {"command": "pwd", "tool_call_id": "c2"}]
    assert messages[1]["extra"]["timestamp"] == 101.0
    second, first = messages[2]["extra"], messages[3]["extra"]
    assert (second["raw_output"], second["returncode"], second["timestamp"]) == ("/w\n", 1, 102.5)
    assert (first["raw_output"], first["returncode"], first["timestamp"]) == ("a\n", 0, 101.5)


def test_a_results_line_and_an_infrastructure_failure():
    """A results.jsonl line (a dict with keys a RolloutResult lacks) exports; a failure is named by its type and
    ends with mini-swe-agent's exit message for an uncaught exception."""
    try:
        raise ConnectionError("endpoint unreachable")
    except ConnectionError as exc:
        error = ErrorInfo.from_exception(exc)
    failed = RolloutResult(rollout_id="t#0", task_id="t", status="infra_failed", exit_reason=ExitReason.MODEL_ERROR,
                           error=error)
    line = {**json.loads(failed.model_dump_json()), "trajectory_path": "trajectories/t/0.a1.json", "num_steps": 0}
    line["trajectory"]["messages"] = [{"role": "user", "content": "go"}]
    traj = to_mini_swe_traj(line)
    info = traj["info"]
    assert info["exit_status"] == "ConnectionError" and info["status"] == "infra_failed" and info["reward"] is None
    assert info["exception_str"] == "endpoint unreachable" and "endpoint unreachable" in info["traceback"]
    assert traj["messages"][0] == {"role": "user", "content": "go"}
    assert traj["messages"][-1] == {"role": "exit", "content": "endpoint unreachable", "extra": {
        "exit_status": "ConnectionError", "submission": "", "exception_str": "endpoint unreachable",
        "traceback": info["traceback"]}}
    json.dumps(traj)  # serialisable as is


def test_a_swe_run_writes_instance_named_files_and_empty_patches_as_empty_strings(tmp_path):
    config = {"agent": {"type": "mini_swe", "max_steps": 3}, "environment": {"type": "shell"},
              "model": {"type": "openai", "model": "m", "api_key": "sk-1", "extra_headers": {"Authorization": "k"}}}
    store = RunStore(tmp_path / "run").open(config, {})
    submitted = rollout([bash(f"echo {SENTINEL} && echo diff")], max_steps=3)
    submitted.model_url = "http://10.0.0.7:8000/scripted/v1"  # the URL the run set at run time (a Serve app's)
    unsubmitted = rollout([bash("echo one")], sample=1, max_steps=1)
    for result in (submitted, unsubmitted):
        details = {"tests_status": {}, "resolved": False, "model_patch": result.submission}
        store.append(result.model_copy(update={"reward": 0.0, "reward_details": details}))
    old_name = store.run_dir / "trajectories" / TASK.task_id / "0.a1.traj.json"
    old_name.write_text("{}")  # an export under the old name, from before this run resumed
    never_started = RolloutResult(rollout_id="other#0", task_id="other", status="infra_failed",
                                  exit_reason=ExitReason.CONTAINER_START_FAILED)
    store.append(never_started)
    write_swe_outputs(store, "r1", "scripted")
    store.close()

    folder = store.run_dir / "trajectories" / TASK.task_id
    assert sorted(p.name for p in (store.run_dir / "trajectories").rglob("*.traj.json")) == [
        f"{TASK.task_id}.sample1.traj.json", f"{TASK.task_id}.traj.json"]  # none for a rollout that never started
    first = json.loads((folder / f"{TASK.task_id}.traj.json").read_text())
    second = json.loads((folder / f"{TASK.task_id}.sample1.traj.json").read_text())
    assert (first["info"]["sample_index"], first["info"]["exit_status"]) == (0, "Submitted")
    assert (second["info"]["sample_index"], second["info"]["exit_status"]) == (1, "LimitsExceeded")
    cfg = first["info"]["config"]
    assert cfg["agent_type"] == "agents.swe_agent.MiniSweAgent" and cfg["agent"]["max_steps"] == 3
    assert "system_template" in cfg["agent"]  # defaults filled in, as mini-swe-agent dumps its config
    assert cfg["model_type"] == "rollout.models.client.model.OpenAIModel" and cfg["model"]["model"] == "m"
    assert "sk-1" not in json.dumps(first) and cfg["model"]["extra_headers"] == {}  # no secret in a shared file
    assert cfg["model"]["base_url"] == "http://10.0.0.7:8000/scripted/v1"  # where the calls went, not the default
    assert second["info"]["config"]["model"]["base_url"] == "http://127.0.0.1:8000/v1"  # none recorded: the config's

    preds = json.loads((store.run_dir / "preds.json").read_text())
    assert preds[TASK.task_id]["model_patch"] == "diff\n" and preds["other"]["model_patch"] == ""
    assert json.loads((store.run_dir / "preds.sample1.json").read_text())[TASK.task_id]["model_patch"] == ""
