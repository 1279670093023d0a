"""The gateway a run opens itself for an agent that only speaks OpenAI (``agent: {type: external}`` without a
gateway_url): ``rollout run`` on Ray starts it in each worker, the sandbox reaches it through its own loopback and a
bound unix socket, and a hostile harness inside the container reaches nothing else.

The harness here is a Python script that tries every reach it can think of and prints what happened (its output is
the rollout's submission); the model is the scripted Serve app of the run."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agents.external_agent import ExternalAgent
from cluster.gateway.sandbox import SandboxGateway
from cluster.serving.scripted_server.server import ScriptedServerConfig, serve_in_thread
from envs.runtimes.local import LocalRuntime
from envs.shell_env import ShellEnvironment
from rollout.context import message_text
from rollout.models import scripted_tokens
from rollout.models.scripted import ScriptedModel
from rollout.records import RequestMeta, Task
from rollout.runner import run_rollout

REPO = Path(__file__).resolve().parents[2]

HOSTILE = r'''
import json, os, socket, urllib.error, urllib.request
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
root, mine = base.split("/rollouts/")[0], base.rsplit("/v1", 1)[0]
body = json.dumps({"model": "scripted-bash", "messages": [{"role": "user", "content": "hi"}]}).encode()

def call(url, key=None, method="POST"):
    headers = {"Content-Type": "application/json", **({"Authorization": "Bearer " + key} if key else {})}
    request = urllib.request.Request(url, data=body if method == "POST" else None, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except Exception as exc:
        return type(exc).__name__

other = os.environ["ROLLOUT_ID"].replace(os.environ["ROLLOUT_TASK_ID"], os.environ["OTHER_TASK"])
out = {"own": call(base + "/chat/completions", key), "no key": call(base + "/chat/completions"),
       "a guessed key": call(base + "/chat/completions", "rk-" + "A" * 43),
       "another rollout's path": call(root + "/rollouts/" + other.replace("#", "%23") + "/v1/chat/completions", key),
       "its own calls": call(mine + "/calls", key, "GET"), "forgetting its calls": call(mine, key, "DELETE"),
       "models": call(base + "/models", key, "GET")}
reach = {}
for name, host, port in json.loads(os.environ["TARGETS"]):
    try:
        socket.create_connection((host, port), timeout=3).close()
        reach[name] = "connected"
    except OSError as exc:
        reach[name] = exc.strerror or type(exc).__name__
out["reach"] = reach
print(json.dumps(out))
'''
"""What a hostile harness tries from inside its rollout's container."""


def host_addresses() -> list[str]:
    """Every IPv4 address of this host (the docker bridge's included), as ``ip`` lists them."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    return sorted({line.split()[3].split("/")[0] for line in out.splitlines()} - {"127.0.0.1"})


@pytest.fixture
def listener():
    """A server on every address of the host (0.0.0.0), answering anyone who connects."""
    server = socket.create_server(("0.0.0.0", 0))
    stop = threading.Event()

    def accept():
        server.settimeout(0.5)
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


@pytest.fixture
def neighbour(base_image):
    """Another container, on docker's default bridge, with a server: (address, port)."""
    name = f"rf-test-neighbour-{os.getpid()}"
    subprocess.run(["docker", "run", "-d", "--rm", "--name", name, "--network", "bridge", base_image, "python3", "-m",
                    "http.server", "8080"], check=True, capture_output=True)
    try:
        address = subprocess.run(["docker", "inspect", "-f", "{{.NetworkSettings.IPAddress}}", name], check=True,
                                 capture_output=True, text=True).stdout.strip()
        yield address, 8080
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def test_a_hostile_harness_reaches_its_own_gateway_path_and_nothing_else(base_image, tmp_path, listener, neighbour):
    targets = [["the neighbour container's server", *neighbour], ["the internet", "8.8.8.8", 53]]
    for address in host_addresses():
        for name, port in (("Ray GCS", 6379), ("Ray dashboard", 8265), ("Serve proxy", 8000),
                           ("the agent server", 8080), ("the live page", 8266), ("a server on 0.0.0.0", listener),
                           ("ssh", 22)):
            targets.append([f"{name} at {address}:{port}", address, port])
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps({"task_id": t, "prompt": "try everything"}) + "\n"
                                                  for t in ("alpha", "beta")))
    config = tmp_path / "hostile.yaml"  # JSON is YAML
    config.write_text(json.dumps({
        "run_id": "hostile", "dataset": {"path": "tasks.jsonl"}, "run": {"concurrency": 2, "max_attempts": 1},
        "serve": {"app": "scripted", "name": "hostile-test", "route_prefix": "/hostile", "policy": "bash_echo"},
        "model": {"type": "openai", "model": "scripted-bash"},
        "agent": {"type": "external", "command": 'OTHER_TASK=$([ "$ROLLOUT_TASK_ID" = alpha ] && echo beta || echo '
                                                 'alpha) python3 -c "$HOSTILE"',
                  "submission": "output", "timeout": 120, "env": {"HOSTILE": HOSTILE, "TARGETS": json.dumps(targets)}},
        "environment": {"type": "shell"}, "runtime": {"type": "docker", "image": base_image}}))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-m", "cluster", "run", str(config)], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**env, "ROLLOUT_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in (tmp_path / "hostile" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in results) == ["alpha", "beta"]
    for result in results:
        assert result["status"] == "completed", result.get("error")
        seen = json.loads(result["submission"].strip().splitlines()[-1])
        print(result["task_id"], json.dumps(seen, indent=1))
        assert seen["own"] == 200 and seen["models"] == 200  # its own path, with its own key
        assert seen["no key"] == 401 and seen["a guessed key"] == 403
        assert seen["another rollout's path"] in (403, 404)  # another's lease (403), or one that ended (404)
        assert seen["its own calls"] == 404 and seen["forgetting its calls"] == 404  # never over the socket
        assert set(seen["reach"]) == {name for name, *_ in targets}
        connected = [name for name, how in seen["reach"].items() if how == "connected"]
        assert connected == [], f"the sandbox reached {connected}"
        # the one call it made on its own path is the rollout's step, with the engine's token data
        (trajectory,) = (tmp_path / "hostile" / "trajectories" / result["task_id"]).glob("*.json")
        steps = json.loads(trajectory.read_text())["trajectory"]["steps"]
        assert len(steps) == 1 and steps[0]["completion_token_ids"] and steps[0]["logprobs"]
        assert len(steps[0]["logprobs"]) == len(steps[0]["completion_token_ids"])


def test_an_outside_agent_with_a_model_that_has_no_http_face_fails_before_work_naming_the_field(tmp_path):
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"task_id": "t", "prompt": "p"}) + "\n")
    config = tmp_path / "no_url.yaml"
    config.write_text(json.dumps({
        "run_id": "no_url", "dataset": {"path": "tasks.jsonl"},
        "model": {"type": "scripted", "outputs": ["hello"]},
        "agent": {"type": "external", "command": "true"},
        "environment": {"type": "shell"}, "runtime": {"type": "local"}}))
    env = {**os.environ, "ROLLOUT_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "cluster", "run", "--local", str(config)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr[-2000:]
    why = "agent: an agent that speaks OpenAI through the run's gateway needs the model at an HTTP address"
    assert why in done.stderr
    assert not (tmp_path / "no_url").exists()  # nothing written


TWO_CALLS = r"""
import json, os, urllib.request
messages = [{"role": "user", "content": "hi"}]
for turn in range(2):
    body = json.dumps({"model": "scripted", "messages": messages}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    content = json.load(urllib.request.urlopen(request, timeout=30))["choices"][0]["message"]["content"]
    messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"result {turn}"}]
"""


def test_on_a_local_workspace_the_calls_carry_the_rollouts_identity_and_come_back_as_its_steps(tmp_path):
    """No container: the forwarder runs on the host and the socket is the directory itself. The served policy sees
    the rollout's task id; each step has the engine's token ids and the rollout's policy version."""
    seen = []

    def policy(messages, ctx):
        seen.append(ctx.meta.task_id)
        return "echo: " + message_text(messages[-1])

    async def play(gateway, agent, env):
        meta = RequestMeta(rollout_id="t#0", task_id="t", policy_version="7")
        try:
            return await run_rollout(Task(task_id="t", prompt="p"), agent, ScriptedModel([]), env, meta=meta)
        finally:
            await gateway.aclose()

    with serve_in_thread(ScriptedServerConfig(), ScriptedModel(policy=policy)) as upstream:
        gateway = SandboxGateway(str(tmp_path / "gateway"), None, upstream.url)
        agent = ExternalAgent({"command": 'python3 -c "$TWO_CALLS"', "env": {"TWO_CALLS": TWO_CALLS}}, gateway=gateway)
        env = ShellEnvironment(LocalRuntime({"allow_host_exec": True, "root": str(tmp_path / "work")}), {})
        result = asyncio.run(play(gateway, agent, env))
    assert result.status == "completed" and result.exit_reason == "natural_completion", result.error
    assert seen == ["t", "t"]
    steps = result.trajectory.steps
    assert [s.message["content"] for s in steps] == ["echo: hi", "echo: result 0"]
    for step in steps:
        text = scripted_tokens.render_reply(step.message)
        assert step.completion_token_ids == scripted_tokens.token_ids(text) and step.policy_version == "7"
    assert list((tmp_path / "gateway").iterdir()) == []  # the socket went with the server
