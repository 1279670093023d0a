"""``configs/kuberay/rayjob.yaml`` (not run here: no Kubernetes) holds none of the assumptions separate machines
break: every pod has its own network address, so nothing in the manifest, its entrypoint's config or the overrides
it passes may name a loopback address another pod would have to reach; the run's config validates as the driver
reads it; the workers go only to the sandbox group and the replicas only to the model group."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from cluster.config.run_config import RunConfig
from rollout.config.load import load_config, validate

PROJECT = Path(__file__).resolve().parents[2]
MANIFEST = PROJECT / "configs" / "kuberay" / "rayjob.yaml"
LOOPBACK = re.compile(r"\b(127\.\d+\.\d+\.\d+|localhost)\b|::1\b")


def strings(node) -> list[str]:
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in strings(key) + strings(value)]
    if isinstance(node, list):
        return [s for item in node for s in strings(item)]
    return [node] if isinstance(node, str) else []


def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def entrypoint_config() -> tuple[RunConfig, list[str]]:
    argv = shlex.split(manifest()["spec"]["entrypoint"])
    assert argv[:4] == ["python", "-m", "cluster", "run"], argv
    paths = [str(PROJECT / a) for a in argv[4:] if "=" not in a]
    overrides = [a for a in argv[4:] if "=" in a]
    raw = load_config(paths, overrides)
    return validate(RunConfig, raw), paths


def test_nothing_in_the_manifest_or_its_run_config_names_a_loopback_address():
    config, paths = entrypoint_config()
    found = [s for s in strings(manifest()) if LOOPBACK.search(s)]
    found += [line for path in paths for line in Path(path).read_text().splitlines()
              if LOOPBACK.search(line.split("#")[0])]
    assert found == [], found
    addresses = {"images.registry": config.images.registry, "farm.address": config.farm.address,
                 "model.base_url": getattr(config.model, "base_url", None)}
    assert not [f"{k}={v}" for k, v in addresses.items() if v and LOOPBACK.search(str(v))], addresses
    # Serve's proxies: a run that joins a cluster (RAY_ADDRESS, which KubeRay sets) listens on every interface
    # unless serve.host names one, and gives its workers the head's address; a host set here would be a pod's own.
    assert config.serve is not None and config.serve.host == "127.0.0.1"


def test_workers_and_replicas_land_on_their_own_groups_and_the_head_runs_the_driver_only():
    config, _ = entrypoint_config()
    spec = manifest()["spec"]["rayClusterSpec"]
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    groups = {g["groupName"]: yaml.safe_load(g["rayStartParams"]["resources"].strip('"').replace('\\"', '"'))
              for g in spec["workerGroupSpecs"]}
    assert set(config.farm.node_resources) <= set(groups["sandbox"])
    assert set(config.serve.placement) <= set(groups["model"])
    assert not set(config.farm.node_resources) & set(groups["model"])  # no rollout worker on a model pod
    sandbox = spec["workerGroupSpecs"][[g["groupName"] for g in spec["workerGroupSpecs"]].index("sandbox")]
    container = sandbox["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    assert env.get("DOCKER_HOST", "").startswith("unix://")  # each sandbox pod's own node's daemon, by socket
    assert config.runtime["type"] == "docker"  # never "auto": that would ask the driver's pod
