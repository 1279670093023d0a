"""``rollout metrics scrape-config``: a Prometheus scrape config for the farm's metrics, so the Debian
``prometheus`` package plus this file shows the farm's series (``ray_rollout_farm_*``) with no other set-up.

Ray's metrics agents (one per node) serve every process's metrics, the farm's included. By default the config
reads Ray's service-discovery file (``<ray temp dir>/prom_metrics_service_discovery.json``, rewritten by the head
node as nodes come and go), so it stays right for the life of the cluster; ``--address`` (or ``--static``) lists
the metrics ports of a running cluster's nodes instead.

    rollout metrics scrape-config > /etc/prometheus/prometheus.yml && prometheus --config.file=...
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from cluster.cli.parser import HelpParser

SD_FILE = "prom_metrics_service_discovery.json"


def ray_temp_dir() -> Path:
    """Where Ray keeps its session files (``RAY_TMPDIR``, else the system temp dir's ``ray``)."""
    return Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"


def scrape_config(interval: float = 5.0, sd_file: str | None = None, targets: list[str] | None = None) -> str:
    """The config as YAML text: a ``ray`` job over the service-discovery file, or over ``targets``."""
    where = (f"    static_configs:\n      - targets: {json.dumps(targets)}\n" if targets is not None else
             f"    file_sd_configs:\n      - files: [{json.dumps(sd_file or str(ray_temp_dir() / SD_FILE))}]\n")
    return (f"# Prometheus scrape config for rollout-farm (Ray's metrics agents; the farm's series are "
            f"ray_rollout_farm_*)\nglobal:\n  scrape_interval: {interval:g}s\n  evaluation_interval: {interval:g}s\n"
            f"scrape_configs:\n  - job_name: ray\n{where}")


def cluster_targets(address: str | None) -> list[str]:
    """``host:port`` of every live node's metrics agent on the cluster at ``address``."""
    import io

    import ray

    from cluster.session.connect import ClusterSession

    ClusterSession(address, out=io.StringIO()).open()
    return [f"{n['NodeManagerAddress']}:{n['MetricsExportPort']}" for n in ray.nodes()
            if n.get("Alive") and n.get("MetricsExportPort")]


def main(argv: list[str]) -> int:
    parser = HelpParser(prog="rollout metrics", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cfg = sub.add_parser("scrape-config", help="print a Prometheus scrape config for the farm's metrics")
    cfg.add_argument("--interval", type=float, default=5.0, help="scrape interval in seconds (default 5)")
    cfg.add_argument("--sd-file", default=None,
                     help=f"Ray's service-discovery file (default <ray temp dir>/{SD_FILE})")
    cfg.add_argument("--address", default=None, help="list the metrics ports of the nodes of this running cluster")
    cfg.add_argument("--static", action="store_true", help="list the nodes of the cluster at --address or "
                     "$RAY_ADDRESS (static targets) instead of reading the service-discovery file")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be > 0")
    targets = None
    if args.address or args.static:
        address = args.address or os.environ.get("RAY_ADDRESS")
        if not address:
            print("metrics: --static needs --address or RAY_ADDRESS (a running cluster)", file=sys.stderr)
            return 2
        targets = cluster_targets(address)
        if not targets:
            print(f"metrics: no node of the cluster at {address} exports metrics", file=sys.stderr)
            return 1
    elif not Path(args.sd_file or ray_temp_dir() / SD_FILE).exists():
        print(f"metrics: {args.sd_file or ray_temp_dir() / SD_FILE} does not exist yet (Ray writes it when a head "
              "node starts); Prometheus reads it when it appears", file=sys.stderr)
    sys.stdout.write(scrape_config(args.interval, args.sd_file, targets))
    return 0
