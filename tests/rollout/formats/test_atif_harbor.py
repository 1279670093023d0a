"""ATIF files from real farm runs, read by software we did not write: Harbor 0.25.0's own validator (its pydantic
models) accepts every file `rollout run` and `rollout export` write, from the demo's three agents (the Mini-SWE bash
agent, function calling, ReAct text actions; the scripted server's token ids and logprobs recorded) and from an
external agent farmed through the model gateway (one conversation, tool calls, a compacted prompt); it rejects a
file with a gap in its step ids. Harbor's own trace export reads our files as the rows `--format sharegpt` writes.
The Harbor venv: ``tests/foreign_venvs.py``, its child ``tests/harbor_venv.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from foreign_venvs import run_function
from harbor_venv import traces, validate

from cluster.gym.gateway import gateway_app
from cluster.serving.scripted_server.server import serve_in_thread as scripted_server_in_thread
from envs.resources.serving import serve_in_thread
from rollout.context import message_text
from rollout.models.scripted import ScriptedModel

REPO = Path(__file__).resolve().parents[3]
SAMPLES = 25  # x 8 demo tasks: 200 rollouts


def rollout(home, *args, timeout=300):
    env = {**os.environ, "ROLLOUT_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "cluster", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def latest(run_dir):
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The local demo, 200 rollouts of three agents with token data, writing ATIF files as rollouts finish."""
    home = tmp_path_factory.mktemp("home")
    done = rollout(home, "run", "--local", "configs/local_demo.yaml", f"run.samples={SAMPLES}", "run.concurrency=16",
                   "serve.latency=0", "run.progress_interval=60", "output.trajectory_format=atif")
    assert done.returncode == 0, done.stderr[-3000:]
    return home / "local_demo"


AGENT = r"""
import json, os, sys, urllib.request
base, task = os.environ["OPENAI_BASE_URL"], sys.stdin.read()

def ask(messages):
    body = json.dumps({"model": "scripted", "messages": messages}).encode()
    request = urllib.request.Request(base + "/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    return json.load(urllib.request.urlopen(request, timeout=30))["choices"][0]["message"]

messages = [{"role": "system", "content": "You are an outside agent."}, {"role": "user", "content": task}]
for turn in range(3):
    reply = ask(messages)
    messages.append(reply)
    for call in reply.get("tool_calls") or []:
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "main.py\nsetup.py"})
    if not reply.get("tool_calls"):
        messages.append({"role": "user", "content": f"result {turn}"})
if "compact" in task:  # the agent rewrites its prompt: a summary instead of the history
    messages = [messages[0], {"role": "user", "content": "summary: " + task + ", three turns done"}]
    messages += [ask(messages), {"role": "user", "content": "go on"}]
    ask(messages)
"""
"""An agent that only speaks OpenAI: three calls, a tool call answered when the task asks for one, and for a task
that says "compact" a rewritten prompt and one more call after it."""


def upstream_policy(messages, ctx):
    last = message_text(next(m for m in reversed(messages) if m.get("role") in ("user", "tool")))
    if last.startswith("tool:") and len(messages) == 2:
        return {"content": "Listing first.", "tool_calls": [{"name": "ls", "arguments": {"path": last[5:]}}]}
    return "echo: " + last.splitlines()[0]


@pytest.fixture(scope="module")
def external_run(tmp_path_factory):
    """An external agent's rollouts through the model gateway (the scripted server upstream), by `rollout run`."""
    where = tmp_path_factory.mktemp("external")
    (where / "agent.py").write_text(AGENT)
    tasks = [{"task_id": f"{kind}-{n}", "prompt": prompt} for n in range(2) for kind, prompt in
             [("plain", "count to three"), ("tool", "tool:src"), ("compact", "a long compact task")]]
    (where / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    with scripted_server_in_thread(None, ScriptedModel(policy=upstream_policy)) as upstream, \
            serve_in_thread(gateway_app(upstream.url)) as gateway:
        (where / "external.yaml").write_text(textwrap.dedent(f"""\
            run_id: external
            model: {{type: openai, base_url: "{upstream.url}", model: scripted}}
            agent: {{type: external, command: "{sys.executable} {where / 'agent.py'}", gateway_url: "{gateway.url}",
                     timeout: 60}}
            environment: {{type: shell}}
            runtime: {{type: local, allow_host_exec: true}}  # the command is this test's agent, not a model's
            dataset: {{path: tasks.jsonl}}
            run: {{samples: 2, concurrency: 6, progress_interval: 60}}
            output: {{trajectory_format: atif}}
            """))
        done = rollout(where, "run", "--local", str(where / "external.yaml"))
    assert done.returncode == 0, done.stderr[-3000:]
    return where / "external"


def beside(run_dir):
    """The ATIF file the run wrote beside each rollout's trajectory, by rollout id."""
    return {r["rollout_id"]: run_dir / r["trajectory_path"].replace(".json", ".atif.json") for r in latest(run_dir)}


def test_the_run_writes_an_atif_file_beside_each_trajectory_and_export_writes_the_same(demo_run, tmp_path):
    files = beside(demo_run)
    assert len(files) == 8 * SAMPLES and all(path.exists() for path in files.values())
    done = rollout(tmp_path, "export", str(demo_run), "--format", "atif", "--out", str(tmp_path / "atif"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{8 * SAMPLES} ATIF file(s) in {tmp_path / 'atif'}" and done.stderr == ""
    exported = {path.name: json.loads(path.read_text()) for path in (tmp_path / "atif").iterdir()}
    assert set(exported) == {f"{rollout_id}.json" for rollout_id in files}  # named by rollout id
    for rollout_id, path in files.items():
        doc = json.loads(path.read_text())
        assert doc == exported[f"{rollout_id}.json"]
        kind = rollout_id.split("-")[0]  # the demo's profiles: shell (default), tools, game
        assert doc["agent"]["name"] == {"shell": "mini_swe", "tools": "tool_calling", "game": "text_action"}[kind]
        assert doc["agent"]["model_name"] == "scripted" and doc["extra"]["rollout_id"] == rollout_id


def test_every_step_carries_the_runs_own_token_data(demo_run, external_run):
    for run_dir in (demo_run, external_run):
        for result in latest(run_dir):
            steps = json.loads((run_dir / result["trajectory_path"]).read_text())["trajectory"]["steps"]
            doc = json.loads((run_dir / result["trajectory_path"].replace(".json", ".atif.json")).read_text())
            calls = [s for s in doc["steps"] if s.get("llm_call_count") == 1]
            assert [s["extra"]["turn"] for s in calls] == [s["index"] for s in steps]
            for atif, step in zip(calls, steps):
                assert step["prompt_token_ids"] and step["logprobs"]  # recorded by the run
                for name in ("prompt_token_ids", "completion_token_ids", "logprobs"):
                    assert atif["metrics"][name] == step[name]
            assert doc["final_metrics"]["extra"]["reward"] == result["reward"]
            assert doc["final_metrics"]["total_completion_tokens"] == result["usage"]["completion_tokens"]


def test_an_external_agents_calls_become_steps_its_compacted_prompt_copied_context(external_run):
    docs = {rollout_id: json.loads(path.read_text()) for rollout_id, path in beside(external_run).items()}
    assert len(docs) == 12 and {d["agent"]["name"] for d in docs.values()} == {"external"}
    for rollout_id, doc in docs.items():
        own = [s for s in doc["steps"] if s.get("llm_call_count") == 1]
        copied = [s for s in doc["steps"] if s.get("is_copied_context")]
        assert not any("metrics" in s for s in copied)
        if rollout_id.startswith("compact"):
            assert len(own) == 5 and [s["source"] for s in copied] == ["system", "user"]
            assert [b["turn"] for b in doc["final_metrics"]["extra"]["token_breaks"]] == [4]
        else:
            assert len(own) == 3 and not copied and [s["source"] for s in doc["steps"][:2]] == ["system", "user"]
        if rollout_id.startswith("tool"):
            [call] = own[0]["tool_calls"]
            assert call["function_name"] == "ls" and call["arguments"] == {"path": "src"}
            assert own[0]["observation"]["results"][0]["source_call_id"] == call["tool_call_id"]


def test_harbor_validates_every_file_we_write_and_rejects_a_gap_in_step_ids(harbor, demo_run, external_run,
                                                                          tmp_path):
    files = [*beside(demo_run).values(), *beside(external_run).values()]
    assert len(files) >= 200
    errors = validate(harbor, files)
    assert {path: found for path, found in errors.items() if found} == {}
    broken = json.loads(files[0].read_text())
    broken["steps"][1]["step_id"] = 3  # 1, 3, 3, ...: a gap
    control = tmp_path / "gap.json"
    control.write_text(json.dumps(broken))
    assert validate(harbor, [control])[str(control)] == [
        "trajectory.: Value error, steps[1].step_id: expected 2 (sequential from 1), got 3"]
    # the validator's own command line, as a Harbor user runs it
    for path, code in ((files[0], 0), (control, 1)):
        out = subprocess.run([str(harbor), "-m", "harbor.utils.trajectory_validator", str(path)],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == code, out.stderr


def test_harbors_trace_export_reads_our_files_as_our_sharegpt_rows(harbor, demo_run, external_run, tmp_path):
    for run_dir in (demo_run, external_run):
        out = tmp_path / run_dir.name
        for fmt in ("atif", "sharegpt", "hf"):
            done = rollout(tmp_path, "export", str(run_dir), "--format", fmt, "--out", str(out))
            assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for line in (out / "sharegpt.jsonl").read_text().splitlines()]
        hf = [json.loads(line) for line in (out / "hf.jsonl").read_text().splitlines()]
        assert len(rows) == len(latest(run_dir)) and [{**r, "conversations_sharegpt": None} for r in rows] == [
            {**r, "conversations_sharegpt": None} for r in hf]
        theirs = traces(harbor, [out / f"{row['trial_name']}.json" for row in rows])
        for row in rows:
            harbor_row = theirs[str(out / f"{row['trial_name']}.json")]
            assert row["conversations"] == harbor_row["conversations"], row["trial_name"]
            assert row["episode"] == harbor_row["episode"]
            assert row.get("tool_definitions") == harbor_row.get("tool_definitions")
            assert set(harbor_row) <= set(row)
            assert [m["from"] for m in row["conversations_sharegpt"]] == [
                {"user": "human", "assistant": "gpt"}[m["role"]] for m in row["conversations"]]


def test_export_of_a_run_that_is_not_there_exits_2(tmp_path):
    done = rollout(tmp_path, "export", str(tmp_path / "nowhere"), "--format", "atif")
    assert done.returncode == 2 and "no run directory" in done.stderr


def task_config(request):
    """In the Harbor venv: a task.toml read by Harbor's own ``TaskConfig`` (what ``envs.harbor`` tests reuse)."""
    from harbor.models.task.config import TaskConfig

    return TaskConfig.model_validate_toml(request["toml"]).model_dump(mode="json")["verifier"]["timeout_sec"]


def test_the_harbor_venv_also_reads_task_configs(harbor):
    assert run_function(harbor, task_config, {"toml": "[verifier]\ntimeout_sec = 120.0\n"}) == 120.0
