"""DockerRuntime against a real docker engine: the contract, runaway commands, limits, isolation, failures."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time

import pytest
from runtime_helpers import container_runtime, run

from envs.runtimes.check import check_runtime
from envs.runtimes.docker.runtime import DockerRuntime
from rollout.errors import ConfigError, ContainerStartError, RuntimeFailure

pytestmark = pytest.mark.docker


runtime = container_runtime


async def processes(rt: DockerRuntime) -> str:
    return (await rt.exec("ps -eo pid,stat,args")).output


def test_docker_runtime_passes_the_conformance_checker(base_image):
    asyncio.run(check_runtime(lambda: runtime(base_image, max_output_bytes=200_000)))


def test_timeout_leaves_nothing_running_and_the_container_usable(base_image):
    async def scenario(rt):
        began = time.monotonic()
        plain = await rt.exec("sleep 10000", timeout=3)
        seconds = time.monotonic() - began
        # background jobs, and one that left the process group: all of it goes
        spread = await rt.exec("sleep 10001 & setsid sleep 10002 & sleep 10003; wait", timeout=2)
        return plain, seconds, spread, await processes(rt), await rt.exec("echo alive")

    plain, seconds, spread, ps, after = run(scenario, runtime(base_image))
    assert plain.timed_out and plain.returncode == 124
    assert 3 <= seconds < 3 + 2 + 5
    assert spread.timed_out
    assert "sleep 100" not in ps, f"processes survived the timeout:\n{ps}"
    assert " Z" not in ps, f"killed processes were not reaped:\n{ps}"
    assert after.output == "alive\n" and after.returncode == 0


def test_yes_stops_promptly_at_the_output_cap(base_image):
    async def scenario(rt):
        began = time.monotonic()
        result = await rt.exec("yes", timeout=60)
        return result, time.monotonic() - began, await processes(rt)

    result, seconds, ps = run(scenario, runtime(base_image))
    assert result.truncated and not result.timed_out
    assert len(result.output) == 1_000_000 and result.output.startswith("y\ny\n")
    assert seconds < 10
    assert " yes" not in ps, f"'yes' kept running after the cap:\n{ps}"


def test_fork_bomb_hits_the_pids_limit_and_the_host_is_unharmed(base_image):
    async def scenario(rt):
        bomb = await rt.exec(":(){ :|:& };:; sleep 60", timeout=3)
        for _ in range(20):  # the killed bomb's processes may take a moment to be reaped
            after = await rt.exec("echo alive")
            if after.output == "alive\n":
                break
            await asyncio.sleep(0.25)
        limit = await rt.exec("cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max")
        return bomb, after, limit

    bomb, after, limit = run(scenario, runtime(base_image, pids_limit=256))
    assert bomb.timed_out and "Resource temporarily unavailable" in bomb.output  # fork failed at the limit
    assert limit.output.strip() == "256"
    assert after.output == "alive\n"
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


def test_memory_hog_is_killed_and_reported(base_image):
    async def scenario(rt):
        hog = await rt.exec('python3 -c "b = bytearray(8 << 30)"', timeout=30)
        return hog, await rt.exec("echo alive")

    hog, after = run(scenario, runtime(base_image, memory="256m"))
    assert hog.returncode != 0 and not hog.timed_out
    assert ("MemoryError" in hog.output) or (hog.returncode == 137 and "out of memory" in hog.output), hog
    assert after.output == "alive\n"


def test_limits_and_privileges_inside_the_container(base_image):
    async def scenario(rt):
        return (await rt.exec(
            "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; cat /sys/fs/cgroup/memory/memory.limit_in_bytes "
            "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max; "
            "echo pid1=$(ps -o args= -p 1); mount -t tmpfs x /mnt 2>/dev/null; echo mount=$?"
        )).output

    out = run(scenario, runtime(base_image, memory="512m"))
    caps = int(out.split("CapEff:")[1].split()[0], 16)
    allowed = (1 << 0) | (1 << 1) | (1 << 3) | (1 << 6) | (1 << 7)  # CHOWN DAC_OVERRIDE FOWNER SETGID SETUID
    assert caps & ~allowed == 0, f"unexpected capabilities {caps:#x}"
    assert "NoNewPrivs:\t1" in out
    assert str(512 * 1024 * 1024) in out
    assert "init" in out.split("pid1=")[1].splitlines()[0]  # an init reaps orphans as PID 1
    assert "mount=0" not in out


def test_network_none_has_only_loopback_and_cannot_reach_the_host(base_image, docker_bridge_ip):
    server = socket.create_server((docker_bridge_ip, 0))
    host, port = server.getsockname()[:2]
    threading.Thread(target=lambda: [server.accept()[0].close() for _ in range(10)], daemon=True).start()
    probe = f"python3 -c \"import socket; socket.create_connection(('{host}', {port}), timeout=2); print('reached')\""

    async def scenario(rt):
        return (await rt.exec("cat /proc/net/dev")).output, await rt.exec(probe)

    try:
        devices, isolated = run(scenario, runtime(base_image))
        _, bridged = run(scenario, runtime(base_image, network="bridge"))
    finally:
        server.close()
    interfaces = [line.split(":")[0].strip() for line in devices.splitlines()[2:]]
    assert interfaces == ["lo"]
    assert isolated.returncode != 0 and "reached" not in isolated.output
    assert bridged.output == "reached\n", bridged


def test_files_cwd_env_and_workdir(base_image):
    async def scenario(rt):
        await rt.write_file("deep/er/data.bin", b"\x00\xffbytes")
        await rt.write_file("/tmp/abs.txt", b"absolute")
        listing = await rt.exec("wc -c < data.bin; cat /tmp/abs.txt", cwd="deep/er")
        await rt.exec("printf '\\377made' > made.bin")
        made = await rt.read_file("made.bin")
        missing = None
        try:
            await rt.read_file("nope.txt")
        except FileNotFoundError as exc:
            missing = exc
        env = await rt.exec('echo "$FROM_CONFIG $FROM_CALL"', env={"FROM_CALL": "call"})
        pwd = await rt.exec("pwd")
        return listing, made, missing, env, pwd, rt.workdir

    listing, made, missing, env, pwd, workdir = run(scenario, runtime(base_image, workdir="/testbed",
                                                                       env={"FROM_CONFIG": "config"}))
    assert listing.output == "7\nabsolute"
    assert made == b"\xffmade"
    assert isinstance(missing, FileNotFoundError)
    assert env.output == "config call\n"
    assert pwd.output == "/testbed\n" and workdir == "/testbed"


def test_container_name_and_labels_identify_the_rollout(base_image):
    import docker

    rt = DockerRuntime.from_config({"image": base_image}, run_id="my run/1", rollout_id="task-7:s0", trusted_model=True)

    async def scenario(rt):
        return docker.from_env().api.inspect_container(rt.container_id)["Config"]["Labels"]

    labels = run(scenario, rt)
    assert rt.name.startswith("rf-my-run-1-task-7-s0-")
    assert labels["rollout-farm.run"] == "my run/1" and labels["rollout-farm.rollout"] == "task-7:s0"
    assert labels["rollout-farm.owner"].endswith(f":{__import__('os').getpid()}")


def test_a_container_holding_the_runtimes_own_name_is_its_lost_create_and_is_reclaimed(base_image):
    """A daemon that went down under a create may have made the container and lost the answer; the removal before
    the retry could not reach it either. The name is the runtime's alone, so the retry removes that container and
    starts; a container of another name is never touched."""
    import docker

    api = docker.from_env().api
    rt = runtime(base_image)
    lost = api.create_container(base_image, ["sleep", "600"], name=rt.name)["Id"]
    other = api.create_container(base_image, ["sleep", "600"], name=rt.name + "-other")["Id"]
    try:
        async def scenario(rt):
            return rt.container_id, (await rt.exec("echo started")).output

        started, said = run(scenario, rt)
        assert said == "started\n" and started != lost
        assert not api.containers(all=True, filters={"id": lost}), "the lost create was left holding the name"
        assert api.containers(all=True, filters={"id": other}), "a container of another name was removed"
    finally:
        for cid in (lost, other):
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


def test_missing_image_names_it_and_how_to_build_it(base_image):
    rt = runtime("rollout-farm/no-such-image:never")
    with pytest.raises(ContainerStartError) as caught:
        asyncio.run(rt.start())
    assert "rollout-farm/no-such-image:never" in str(caught.value) and "rollout images" in str(caught.value)
    assert not caught.value.retryable
    asyncio.run(rt.close())


def test_a_vanished_container_is_a_runtime_failure(base_image):
    async def removed(rt):
        subprocess.run(["docker", "rm", "-f", rt.container_id], capture_output=True, check=True)
        await rt.exec("echo hi")

    async def expired(rt):
        await asyncio.sleep(2.5)  # past the ttl: the container stopped and removed itself
        await rt.exec("echo hi")

    with pytest.raises(RuntimeFailure, match="is gone"):
        run(removed, runtime(base_image))
    with pytest.raises(RuntimeFailure, match="ttl"):
        run(expired, runtime(base_image, ttl=1))


def test_cancel_and_close_stop_the_running_command(base_image):
    async def scenario(rt):
        pending = asyncio.ensure_future(rt.exec("sleep 20001", timeout=60))
        await asyncio.sleep(1)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        await asyncio.sleep(0.5)
        ps = await processes(rt)
        pending = asyncio.ensure_future(rt.exec("sleep 20002", timeout=60))
        await asyncio.sleep(1)
        await rt.close()
        with pytest.raises(RuntimeFailure, match="closed"):
            await pending
        return ps

    assert "sleep 20001" not in run(scenario, runtime(base_image))


def test_bad_config_names_the_field():
    with pytest.raises(ConfigError) as caught:
        DockerRuntime({"memory": "lots"})
    assert caught.value.field == "runtime.memory"
    with pytest.raises(ConfigError, match="runtime.network"):
        DockerRuntime({"network": "host"})
    with pytest.raises(ConfigError, match="runtime.max_file_size"):
        DockerRuntime({"max_file_size": "huge"})


def test_a_disk_filler_stops_at_the_file_size_limit_and_the_container_stays_usable(base_image):
    async def scenario(rt):
        dd = await rt.exec("dd if=/dev/zero of=big bs=1M count=5000", timeout=120)
        flood = await rt.exec("yes > flood", timeout=120)
        sizes = await rt.exec("stat -c %s big flood")
        return dd, flood, sizes, await rt.exec("echo alive")

    dd, flood, sizes, after = run(scenario, runtime(base_image, max_file_size="64m"))
    for result in (dd, flood):
        assert result.returncode != 0 and not result.timed_out, result
        assert "File size limit exceeded" in result.output, result
    assert [int(n) for n in sizes.output.split()] == [64 << 20, 64 << 20]
    assert after.output == "alive\n"


def test_files_are_limited_to_a_gibibyte_by_default(base_image):
    async def scenario(rt):
        return (await rt.exec("ulimit -f")).output  # in 1024-byte blocks

    assert run(scenario, runtime(base_image)) == "1048576\n"
