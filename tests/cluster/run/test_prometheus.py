"""Prometheus without hand work: Debian's ``prometheus`` with the config ``rollout metrics scrape-config`` prints
sees the farm's started-rollouts counter rise during a run (CI installs the package; without it this skips,
with ROLLOUT_REQUIRE_PROMETHEUS=1 it fails)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("ROLLOUT_REQUIRE_PROMETHEUS", "") not in ("", "0", "false", "no"):
            pytest.fail("prometheus is not installed (apt-get install prometheus)")
        pytest.skip("prometheus is not installed (set ROLLOUT_REQUIRE_PROMETHEUS=1 to make this an error)")
    return path


def query(port: int, expr: str) -> float:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as reply:
        result = json.loads(reply.read())["data"]["result"]
    return sum(float(r["value"][1]) for r in result)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_prometheus_with_the_printed_config_sees_the_farms_counter(ray_cluster, prometheus_binary, tmp_path):
    from cluster import RolloutFarm

    address = ray_cluster.get_runtime_context().gcs_address
    out = subprocess.run([sys.executable, "-m", "cluster", "metrics", "scrape-config", "--interval", "1"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "file_sd_configs" in out.stdout and "prom_metrics_service_discovery.json" in out.stdout
    static = subprocess.run([sys.executable, "-m", "cluster", "metrics", "scrape-config", "--interval", "1",
                             "--address", address], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert static.returncode == 0 and "static_configs" in static.stdout, static.stderr
    # this session's cluster, by its own nodes (the machine may hold other clusters' discovery files)
    (tmp_path / "prometheus.yml").write_text(static.stdout)
    port = free_port()
    prom = subprocess.Popen([prometheus_binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        config = {"run_id": "prometheus-run", "model": {"type": "scripted", "policy": "bash_echo"},
                  "agent": {"type": "mini_swe", "max_steps": 5}, "environment": {"type": "shell"},
                  "runtime": {"type": "null", "echo": True, "delay": 0.01}, "farm": {"backend": "ray"}}
        with RolloutFarm.from_config(config) as farm:
            assert farm.generate([{"task_id": f"p{i}", "prompt": "go"} for i in range(4)], n=2).failed == 0
            seen, deadline = 0.0, time.monotonic() + 90
            expr = 'ray_rollout_farm_rollouts_started_total{run="prometheus-run"}'
            while time.monotonic() < deadline and seen < 8:
                try:
                    seen = query(port, expr)
                except OSError:
                    pass
                time.sleep(1)
        assert seen >= 8, f"prometheus saw {seen} started rollouts"
    finally:
        prom.terminate()
        prom.wait(timeout=30)
