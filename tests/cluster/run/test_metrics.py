"""The farm's metrics reach Ray's Prometheus endpoint, and the Grafana dashboard uses only their names."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest

from cluster.workers.metrics import METRICS, exported_names

DASHBOARD = Path(__file__).resolve().parents[3] / "cluster" / "dashboards" / "rollout_farm.json"


def scrape(ray) -> str:
    text = []
    for node in ray.nodes():
        if node.get("Alive") and node.get("MetricsExportPort"):
            url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
            text.append(urllib.request.urlopen(url, timeout=10).read().decode())
    return "\n".join(text)


def values(text: str, name: str, run: str) -> list[float]:
    pattern = re.compile(rf"^{re.escape(name)}{{([^}}]*)}} ([0-9.eE+-]+)$", re.M)
    return [float(v) for labels, v in pattern.findall(text) if f'run="{run}"' in labels]


@pytest.mark.ray
@pytest.mark.slow
def test_a_farm_run_exports_started_finished_and_step_latency(ray_cluster):
    from cluster import RolloutFarm

    config = {
        "run_id": "metrics-run",
        "model": {"type": "scripted", "policy": "bash_echo"},
        "agent": {"type": "mini_swe", "max_steps": 5},
        "environment": {"type": "shell"},
        "runtime": {"type": "null", "echo": True, "delay": 0.01},
        "farm": {"backend": "ray"},
    }
    with RolloutFarm.from_config(config) as farm:
        batch = farm.generate([{"task_id": f"m{i}", "prompt": "go"} for i in range(6)], n=2)
        assert batch.failed == 0
        wanted = {
            "ray_rollout_farm_rollouts_started_total": lambda v: v >= 12,
            "ray_rollout_farm_rollouts_finished_total": lambda v: v >= 12,
            "ray_rollout_farm_step_seconds_count": lambda v: v >= 36,  # 3 turns each
            "ray_rollout_farm_attempts_total": lambda v: v >= 12,
            "ray_rollout_farm_tokens_total": lambda v: v > 0,
        }
        found: dict[str, float] = {}
        deadline = time.monotonic() + 60  # Ray exports every few seconds
        while time.monotonic() < deadline:
            text = scrape(ray_cluster)
            found = {name: sum(values(text, name, "metrics-run")) for name in wanted}
            if all(check(found[name]) for name, check in wanted.items()):
                break
            time.sleep(2)
    assert all(check(found[name]) for name, check in wanted.items()), found
    step_sum = sum(values(text, "ray_rollout_farm_step_seconds_sum", "metrics-run"))
    assert step_sum > 0, "step latency is measured, not just counted"


def test_the_grafana_dashboard_is_valid_and_uses_only_exported_names():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["panels"]
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = set(re.findall(r"\bray_rollout_farm_[a-z_]+", " ".join(exprs)))
    unknown = used - exported_names()
    assert not unknown, f"dashboard names metrics the farm does not export: {sorted(unknown)}"
    # every instrument shows up somewhere on the dashboard
    shown = {name for name in METRICS if any(f"ray_rollout_farm_{name}" in e for e in exprs)}
    assert shown == set(METRICS)
    for panel in dashboard["panels"]:
        assert {"id", "type", "title", "gridPos", "targets"} <= panel.keys()
