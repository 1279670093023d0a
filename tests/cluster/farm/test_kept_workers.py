"""Workers that stay on a standing cluster (``cluster.workers.kept``): a second run built the same way takes the
worker the first one left, with nothing of the first run's in it; a run built differently, or one that finds the
worker leased, starts its own; a killed driver's lease expires; an idle worker exits; a source file changed since a
worker imported it is named (that worker takes no other run).

The session's Ray cluster stands in for the standing one: the backends here (and the runs in subprocesses, which
join it) keep their workers in it; each test ends every kept worker it left."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.assembly.backend_choice import WORKER_SECTIONS
from cluster.backends.sources import ConfigSource
from cluster.compose import Composer
from cluster.config.run_config import RunConfig
from rollout.config.load import validate
from rollout.records import RequestMeta, Task

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]
PROJECT = Path(__file__).resolve().parents[3]


def config(max_steps: int = 5, delay: float = 0.0) -> RunConfig:
    return validate(RunConfig, {
        "run_id": "kept", "model": {"type": "scripted", "policy": "bash_echo"},
        "agent": {"type": "mini_swe", "max_steps": max_steps}, "environment": {"type": "shell"},
        "runtime": {"type": "null", "echo": True, "delay": delay}, "dataset": {"path": "-"},
    })


def backend(run_id: str, cfg: RunConfig, *, idle: float = 60.0, ttl: float = 30.0):
    from cluster.placement.slots import Resources
    from cluster.workers.kept import KeepWorkers
    from cluster.workers.ray_backend import RayBackend

    keep = KeepWorkers(idle, cfg.model_dump(mode="json", include=set(WORKER_SECTIONS)), ttl=ttl)
    return RayBackend(ConfigSource(Composer(cfg)), run_id=run_id, resources=Resources(), concurrency=2, keep=keep,
                      out=sys.stderr)


async def rollout(b, run_id: str, task_id: str):
    meta = RequestMeta(rollout_id=f"{task_id}#0", task_id=task_id, run_id=run_id)
    return await b.execute(Task(task_id=task_id, prompt="go"), meta, [])


async def infos(b) -> list[dict]:
    return await b.broadcast("info")


@pytest.fixture
def kept(ray_cluster):
    """The session's cluster, with every kept worker ended after the test."""
    from cluster.workers.kept import KEPT_NAMESPACE, KEPT_PREFIX

    yield ray_cluster
    for entry in ray_cluster.util.list_named_actors(all_namespaces=True):
        if entry.get("namespace") == KEPT_NAMESPACE and entry["name"].startswith(KEPT_PREFIX):
            try:
                ray_cluster.kill(ray_cluster.get_actor(entry["name"], namespace=KEPT_NAMESPACE), no_restart=True)
            except ValueError:
                pass


def test_a_second_run_takes_the_kept_worker_clean_and_a_changed_config_does_not(kept):
    from cluster.workers.mailbox import LeaseLost

    async def main():
        first = await backend("first", config()).start()
        assert (first.workers_started, first.workers_reused) == (1, 0)
        for i in range(3):
            assert (await rollout(first, "first", f"t{i}")).status == "completed"
        (before,) = await infos(first)
        assert before["finished"] == 3
        actor, old_holder = first.workers()[0], first.holder
        await first.close()  # released, not ended

        second = await backend("second", config()).start()
        assert (second.workers_started, second.workers_reused) == (0, 1)
        (after,) = await infos(second)
        assert after["pid"] == before["pid"], "the same process"
        assert after["finished"] == 0 and after["in_flight"] == 0 and after["waiting"] == 0
        assert await second.live() == []
        with pytest.raises(LeaseLost):  # the first run's calls reach nothing of the second's
            await actor.collect.remote(0.01, old_holder)
        result = await rollout(second, "second", "u0")
        assert result.status == "completed" and result.run_id in (None, "second")
        transfers = await second.broadcast("transfers")
        assert all(not t["images"] for t in transfers)

        changed = await backend("changed", config(max_steps=4)).start()  # another agent section: another key
        assert (changed.workers_started, changed.workers_reused) == (1, 0)
        assert (await infos(changed))[0]["pid"] != before["pid"]
        await asyncio.gather(second.close(), changed.close())

    asyncio.run(main())


def test_two_runs_at_once_never_share_a_leased_worker(kept):
    async def main():
        left = await backend("left", config(max_steps=6)).start()
        await left.close()  # one kept worker for the key
        same = config(max_steps=6)
        a, b = await asyncio.gather(backend("a", same).start(), backend("b", same).start())
        assert sorted([a.workers_reused, b.workers_reused]) == [0, 1]
        assert a.workers_started + b.workers_started == 1
        pids = {(await infos(x))[0]["pid"] for x in (a, b)}
        assert len(pids) == 2
        outcomes = await asyncio.gather(*(rollout(x, x.run_id, f"{x.run_id}{i}") for x in (a, b) for i in range(3)))
        assert all(r.status == "completed" for r in outcomes)
        await asyncio.gather(a.close(), b.close())

    asyncio.run(main())


def test_an_idle_kept_worker_exits_after_its_timeout(kept):
    from cluster.workers.kept import kept_names

    async def main():
        b = await backend("idle", config(max_steps=3), idle=1.0).start()
        key = b.key
        assert len(kept_names(key)) == 1
        await b.close()
        return key

    key = asyncio.run(main())
    for _ in range(300):
        if not kept_names(key):
            break
        time.sleep(0.1)
    assert kept_names(key) == []


DRIVER = r'''
import asyncio, sys
sys.path.insert(0, sys.argv[2])
import ray
from tests.cluster.farm.test_kept_workers import backend, config, rollout

async def main():
    b = await backend("killed", config(max_steps=7, delay=2.0), ttl=3.0).start()
    asyncio.ensure_future(rollout(b, "killed", "long"))
    await asyncio.sleep(0.5)
    (info,) = await b.broadcast("info")
    print(info["pid"], flush=True)
    await asyncio.sleep(3600)

ray.init(address=sys.argv[1], log_to_driver=False)
asyncio.run(main())
'''


def test_a_killed_drivers_lease_blocks_nothing_and_expires(kept):
    address = kept.get_runtime_context().gcs_address
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, address, str(PROJECT)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env=env, cwd=PROJECT, start_new_session=True)
    try:
        line = driver.stdout.readline().strip()
        assert line, "the driver did not start its worker"
        killed_pid = int(line)
        os.killpg(driver.pid, signal.SIGKILL)  # mid-rollout, its lease held
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)

    async def main():
        slow = config(max_steps=7, delay=2.0)  # as the killed driver's (the same key)
        now = await backend("next", slow).start()  # the lease is still held: a worker of its own
        assert (now.workers_started, now.workers_reused) == (1, 0)
        await asyncio.sleep(3.5)  # the killed driver's lease (3 s) has expired by now
        later = await backend("later", slow).start()  # `now` holds its own: only the killed one is free
        assert (later.workers_started, later.workers_reused) == (0, 1)
        (info,) = await infos(later)
        assert info["pid"] == killed_pid
        assert info["finished"] == 0 and info["in_flight"] == 0 and info["waiting"] == 0
        assert (await rollout(later, "later", "v0")).status == "completed"
        await asyncio.gather(now.close(), later.close())

    asyncio.run(main())


def run(address: str, where: Path, run_id: str, *extra: str) -> tuple[str, dict]:
    command = [sys.executable, "-m", "cluster", "run", str(PROJECT / "configs" / "local_demo.yaml"),
               f"run_id={run_id}", f"farm.address={address}", "farm.keep_workers_idle=60",
               f"output.dir={where / run_id}", *extra]
    env = {**os.environ, "RAY_AUTH_MODE": "token", "PYTHONPATH": str(PROJECT)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    return out, json.loads((where / run_id / "summary.json").read_text())


def test_rollout_run_on_a_standing_cluster_says_it_reused_the_worker(kept, tmp_path):
    address = kept.get_runtime_context().gcs_address
    first, s1 = run(address, tmp_path, "first")
    assert s1["kept_workers"]["reused"] == 0 and s1["kept_workers"]["started"] == 1
    # a run that joins a cluster plays its scripted policy on every interface: keyed, its workers sent the key
    assert re.search(r"the scripted policy 'demo' listens at http://\S+; every request needs token", first), first
    second, s2 = run(address, tmp_path, "second")
    assert "reused a kept worker" in second, second[-4000:]
    for summary in (s1, s2):  # the kept worker calls the second run's server with the second run's key (a 401
        assert summary["rollouts"]["infra_failed"] == 0, summary["rollouts"]  # would fail the rollout as infra)
    assert s2["success_rate"] == s1["success_rate"] > 0
    assert s2["kept_workers"]["reused"] == 1 and s2["kept_workers"]["started"] == 0
    assert s2["startup"]["workers_reused"] == "1/1"
    assert s2["rollouts"] == s1["rollouts"], "the second run counts its own rollouts only"
    _, s3 = run(address, tmp_path, "changed", "agent.max_steps=11")
    assert s3["kept_workers"]["reused"] == 0


def test_a_source_file_changed_since_its_import_is_named(tmp_path):
    from cluster.workers.kept import changed_code

    kept_file, gone = tmp_path / "module.py", tmp_path / "gone.py"
    kept_file.write_text("A = 1\n")
    gone.write_text("B = 1\n")
    known = {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in (kept_file, gone)}
    assert changed_code(known) == []
    kept_file.write_text("A = 22\n")  # what a worker imported is no longer what a new process would import
    gone.unlink()
    assert changed_code(known) == sorted([str(kept_file), str(gone)])
