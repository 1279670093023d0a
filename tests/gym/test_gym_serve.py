"""``rollout gym serve``: the agent server as a Ray Serve application (its replica holds the farm) and as a command
that prints its URL and stops on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from envs.resources.calc_server import calc_rows

ROOT = Path(__file__).resolve().parents[2]


def wait_healthy(url: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer /health")


def test_the_agent_server_as_a_ray_serve_application(calc, ray_cluster):
    from cluster.assembly import FarmAssembly
    from cluster.gym.server import deploy, prepared

    raw, settings = prepared({"model": {"type": "scripted", "policy": "calculator"},
                              "agent": {"type": "tool_calling", "max_steps": 6},
                              "environment": {"type": "resources", "url": calc.url},
                              "gym": {"serve": True, "port": 0, "route_prefix": "/gym"}})
    assembly = FarmAssembly(backend=None)
    url = deploy(assembly, raw, settings, name="gym-test")
    try:
        assert url.endswith("/gym")
        wait_healthy(url)
        replies = [httpx.post(url + "/run", json=row, timeout=60).json() for row in calc_rows(2, seed=4)]
    finally:
        assembly.stop_ingress()
    assert [r["reward"] for r in replies] == [1.0, 1.0]
    assert all(r["response"]["output"][0]["type"] == "function_call" for r in replies)


def test_rollout_gym_serve_prints_its_url_and_stops_on_ctrl_c(calc):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "cluster", "gym", "serve", str(ROOT / "configs" / "gym_agent.yaml"),
                             f"environment.url={calc.url}", "farm.backend=local", "gym.port=0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else url
        reply = httpx.post(url + "/run", json=calc_rows(1, seed=8)[0], timeout=60).json()
        assert reply["reward"] == 1.0
        # the per-rollout model gateway, in front of the config's model (here its scripted server)
        chat = httpx.post(url + "/rollouts/r-1/v1/chat/completions", timeout=60,
                          json={"model": "scripted", "messages": [{"role": "user", "content": "Compute 2 + 3."}]})
        assert chat.status_code == 200, chat.text
        calls = httpx.get(url + "/rollouts/r-1/calls", timeout=10).json()["calls"]
        assert len(calls) == 1 and calls[0]["prompt_token_ids"] and calls[0]["completion_token_ids"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
