"""The scripted policy over HTTP in the driver's process, for a run or a farm whose scripted ``serve`` section is
played here (``serve.in_process``, or the local backend; ``cluster.assembly`` starts it): one starter for both. On
127.0.0.1, unless the run joins a cluster: then on every interface, advertised with this node's address so
workers on other nodes reach it, and every request needs the section's key (``ServeSection.key``: ``serve.api_key``,
else one generated for the run), which the composer gives the run's client."""

from __future__ import annotations

from pathlib import Path

from cluster.names import POLICIES
from cluster.serving.config import ServeSection
from cluster.serving.scripted_server.config import ScriptedServerConfig
from cluster.serving.scripted_server.server import ScriptedServer, start_scripted_server
from rollout.config.load import validate


async def start_demo_server(section: ServeSection, *, dataset: str | Path | None = None,
                            remote: bool = False) -> ScriptedServer:
    """Serve ``section``'s policy (a scripted ``serve`` section: its policy, latency and faults); the server's
    ``url`` is what models should use as their base URL."""
    config = validate(ScriptedServerConfig, {
        "policy": POLICIES.resolve(section.policy), "latency": section.latency, "faults": section.faults,
        "dataset": str(dataset) if dataset is not None else None, "host": "0.0.0.0" if remote else "127.0.0.1",
        "check_model": False,  # the run's model section names the model as it likes; only the run calls it
        "token": section.key() if remote else section.api_key,
    }, prefix="serve")
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
