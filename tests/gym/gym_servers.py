"""What the agent-server tests share: an agent server over a farm (the scripted model on the scripted server, the
calculator resources server), and the bodies they send."""

from __future__ import annotations

import contextlib

import httpx

from agents.tool_agent import ToolCallingAgent, ToolCallingAgentConfig
from cluster.config.gym_section import GymSection
from cluster.farm.rollout_farm import RolloutFarm
from cluster.gym.agent_app import EpisodeRunner, build_app
from envs.resources.calc_server import calc_rows
from envs.resources.serving import serve_in_thread
from rollout.protocols import EnvironmentCapabilities

HERE = {"app": "scripted", "in_process": True}  # a scripted policy played on the farm's own event loop

MODEL = {"type": "openai", "return_token_ids": True, "logprobs": True, "max_retries": 1, "backoff": 0.0}


class WholeEpisodeAgent(ToolCallingAgent):
    """An agent named by import path whose class says it owns whole episodes (no ``/v1/responses``)."""

    speaks_responses_api = False


WholeEpisodeAgentConfig = ToolCallingAgentConfig


class SessionEnvironment(EnvironmentCapabilities):
    """An environment named by import path whose class says its ``close`` ends a remote session."""

    closes_sessions = True


def run_config(resources_url: str, *, faults: dict | None = None, latency: float = 0.0, max_steps: int = 6,
               backend: str = "local", agent: dict | None = None, profiles: dict | None = None,
               concurrency: int = 64, **sections) -> dict:
    """The farm's run config: the scripted tool user on the scripted server, the resources environment."""
    return {"model": MODEL, "serve": {**HERE, "policy": "tool_user", "faults": faults or {}, "latency": latency},
            "agent": agent or {"type": "tool_calling", "max_steps": max_steps},
            "environment": {"type": "resources", "url": resources_url, "timeout": 10},
            "profiles": profiles or {}, "farm": {"backend": backend},
            "run": {"max_attempts": 2, "concurrency": concurrency}, **sections}


@contextlib.contextmanager
def agent_server(resources_url: str, *, gym: dict | None = None, concurrency: int = 64, **options):
    farm = RolloutFarm.from_config(run_config(resources_url, concurrency=concurrency, **options),
                                   concurrency=concurrency).start()
    try:
        runner = EpisodeRunner(farm, GymSection(**(gym or {})))
        with serve_in_thread(build_app(runner)) as server:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                yield client
    finally:
        farm.close()


def row(prompt_tag: str = "", **fields) -> dict:
    base = calc_rows(1, seed=3)[0]
    if prompt_tag:
        base["responses_create_params"]["input"][0]["content"] += f" {prompt_tag}"
    return {**base, **fields}


def episode(body: dict, rollout_id: str = "ep-1") -> dict:
    return {"episode_id": {"rollout_id": rollout_id, "attempt": 0},
            "task": {"task_id": {"taskset": "calc", "task_id": body["task_id"]}, "task_input": body}}


def kinds(reply: dict) -> list[str]:
    return [item["type"] for item in reply["response"]["output"]]
