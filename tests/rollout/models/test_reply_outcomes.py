"""Replies the client cannot read strictly and histories the server refuses, end to end: the Mini-SWE loop over
HTTP to the scripted server (``run_rollout``, and ``rollout run --local``). Both are the model's doing: a task outcome
or a format error fed back, never an infrastructure failure."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from agents.swe_agent import MiniSweAgent, MiniSweAgentConfig
from cluster.serving.scripted_server.server import ScriptedServerConfig, fake_server
from envs.runtimes.local import LocalRuntime, LocalRuntimeConfig
from envs.shell_env import ShellEnvironment
from rollout.errors import ExitReason
from rollout.models.client.model import OpenAIModel
from rollout.records import RequestMeta, Task
from rollout.runner import run_rollout

REPO = Path(__file__).resolve().parents[3]
TASK = Task(task_id="t1", prompt="Create hello.txt containing hello.")
SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def bash(cmd: str) -> str:
    return f"I will run it.\n```bash\n{cmd}\n```"


def run_over_http(outputs: list[str], tmp_path: Path):
    async def go():
        async with fake_server(ScriptedServerConfig(outputs=outputs)) as server:
            model = OpenAIModel(base_url=server.url, model="scripted", backoff=0.01, max_retries=2)
            agent = MiniSweAgent(MiniSweAgentConfig(max_steps=5))
            env = ShellEnvironment(LocalRuntime(LocalRuntimeConfig(root=str(tmp_path)), trusted_model=True))
            try:
                return await run_rollout(TASK, agent, model, env, limits=agent.limits(),
                                         meta=RequestMeta(rollout_id="r1#0", task_id=TASK.task_id))
            finally:
                await model.aclose()

    return asyncio.run(go())


def test_a_reply_with_lone_surrogates_is_fed_back_as_a_format_error_and_the_rollout_goes_on(tmp_path):
    result = run_over_http(["no command, and half a character: \ud800", bash(f"echo {SENTINEL} && echo done")],
                           tmp_path)
    assert (result.status, result.exit_reason) == ("completed", ExitReason.SUBMITTED), result.error
    first, second = result.trajectory.steps
    assert first.message["content"].endswith("half a character: \ufffd")
    assert first.format_error and "exactly ONE bash code block" in result.trajectory.messages[3]["content"]
    assert result.submission == "done\n"


def test_a_history_past_the_servers_body_limit_ends_as_the_token_limit(tmp_path):
    # A 1.1 MB reply (a command the loop runs) makes the next request larger than the server's 1 MiB body limit.
    result = run_over_http([bash("echo hi") + "\n" + "z" * 1_100_000, bash(f"echo {SENTINEL}")], tmp_path)
    assert (result.status, result.exit_reason) == ("completed", ExitReason.TOKEN_LIMIT), result.error
    assert result.error is None and len(result.trajectory.steps) == 1
    assert "<returncode>0</returncode>" in result.trajectory.messages[-1]["content"]
    assert "413" in result.trajectory.exit_message  # the record says why the episode ended


def rollout_run(home: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    env = {**os.environ, "ROLLOUT_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "cluster", "run", "--local", str(REPO / "configs" / "local_demo.yaml"),
                          "dataset.slice=0:1", "run.samples=1", "run.max_attempts=1", *overrides],
                         env=env, capture_output=True, text=True, timeout=180, cwd=REPO)
    path = home / "local_demo" / "results.jsonl"
    return out, [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_rollout_run_reads_replies_with_lone_surrogates_and_scores_the_task(tmp_path):
    out, [result] = rollout_run(tmp_path, "serve.faults.lone_surrogates=true")
    assert (result["status"], result["exit_reason"], result["reward"]) == ("completed", "submitted", 1.0), out.stdout
    assert out.returncode == 0, out.stderr


def test_rollout_run_scores_a_history_the_server_refuses_as_the_token_limit(tmp_path):
    out, [result] = rollout_run(tmp_path, "serve.faults.max_request_bytes=1")
    assert (result["status"], result["exit_reason"], result["reward"]) == ("completed", "token_limit", 0.0), out.stdout
    assert result["error"] is None and "infra failures  none" in out.stdout
    assert out.returncode == 0, out.stderr
