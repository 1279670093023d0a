"""The scripted policy over HTTP for a run or a farm whose config has a ``fake_server`` section (demos, tests):
one starter for both. On 127.0.0.1, unless the run joins a cluster: then on every interface, advertised with
this node's address so workers on other nodes reach it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cluster.names import POLICIES
from cluster.run.home import in_ray_job
from rollout.config.load import validate


def joins_cluster(farm: Any) -> bool:
    """A ray backend on a cluster that other nodes may be part of (given, from the environment, or a job's)."""
    return farm.backend == "ray" and bool(farm.address or os.environ.get("RAY_ADDRESS") or in_ray_job())


async def start_demo_server(section: Any, *, dataset: str | Path | None = None, remote: bool = False) -> Any:
    """Serve ``section``'s policy; the server's ``url`` is what models should use as their base URL."""
    from cluster.serving.scripted_server.server import ScriptedServerConfig, start_scripted_server

    config = validate(ScriptedServerConfig, {
        "policy": POLICIES.resolve(section.policy), "latency": section.latency, "faults": section.faults,
        "dataset": str(dataset) if dataset is not None else None, "host": "0.0.0.0" if remote else "127.0.0.1",
    }, prefix="fake_server")
    server = await start_scripted_server(config)
    if remote:
        port = server.root_url.rsplit(":", 1)[1]
        server.root_url = f"http://{node_address()}:{port}"
        server.url = server.root_url + "/v1"
    return server


def node_address() -> str:
    """This node's address as the cluster sees it."""
    from ray.util import get_node_ip_address

    return get_node_ip_address()


class DemoServer:
    """A farm's ``fake_server`` section served for as long as the farm lives; ``start`` points the source's
    model at it. Nothing happens without that section."""

    needs_ray = False

    def __init__(self, section: Any, source: Any, remote: bool = False):
        self.section, self.source, self.remote, self.server = section, source, remote, None

    async def start(self) -> None:
        if self.section is not None:
            self.server = await start_demo_server(self.section, remote=self.remote)
            self.source.base_url = self.server.url

    async def bind_tasks(self, tasks: list[Any]) -> None:
        """The scripted policy sees the tasks a trainer's call hands the farm (looked up by the request's task id)."""
        if self.server is not None:
            self.server.model.tasks.update({task.task_id: task for task in tasks})

    def controls(self) -> Any:
        from cluster.serving.controls import EndpointControls, ScriptedControls

        return ScriptedControls() if self.section is not None else EndpointControls()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None
