"""ApptainerRuntime on the real binary, unprivileged (CI: Debian sid's apptainer through .ci/apptainer/bin): the
contract, every kind of image source converted once per node, who the commands run as, and the hostile-command
drills (a runaway writer, output without end, a process flood, memory, network, sleep).

What the farm does where apptainer has no cgroups (an unprivileged user without delegation): resource limits on
each command (``max_file_size``, ``ulimits``), the in-container ``timeout``, the output cap, no network, and an
instance per rollout whose PID namespace takes every process with it when the rollout closes. An unbounded fork
bomb is the site's to stop (Slurm's job cgroup, or ``ulimits.nproc`` for a user who is not root: the kernel does
not count root's processes against it, and the CI machine's apptainer user maps to root), so none is run here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import subprocess
import threading
import uuid

import pytest
from runtime_helpers import run, survivors

from envs.runtimes.apptainer.runtime import ApptainerRuntime
from envs.runtimes.check import check_runtime
from rollout.errors import ContainerStartError

pytestmark = [pytest.mark.apptainer, pytest.mark.docker]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    """The module's image cache: each source is converted once here, as once per node."""
    return str(tmp_path_factory.mktemp("apptainer-cache"))


@pytest.fixture(scope="module")
def source(apptainer_binary, base_image) -> str:
    return f"docker-daemon:{base_image}"


def runtime(image: str, cache: str, tmp_path, **overrides) -> ApptainerRuntime:
    config = {"image": image, "cache_dir": cache, "workspace_root": str(tmp_path / "ws"), **overrides}
    return ApptainerRuntime(config, run_id="real")


def test_the_real_binary_passes_the_conformance_checker(source, cache, tmp_path):
    asyncio.run(check_runtime(lambda: runtime(source, cache, tmp_path, max_output_bytes=200_000)))
    assert os.listdir(tmp_path / "ws") == []  # every workspace removed


def test_commands_run_unprivileged_and_their_files_belong_to_the_caller(source, cache, tmp_path):
    async def scenario(rt):
        status = (await rt.exec("grep -E '^(Uid|CapEff|CapPrm)' /proc/self/status; cat /proc/self/uid_map")).output
        await rt.exec(f"echo made > {rt.mount}/by-the-command")
        return status, os.stat(os.path.join(rt.workspace, "by-the-command")).st_uid

    status, owner = run(scenario, runtime(source, cache, tmp_path))
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    assert int(fields["CapEff"], 16) == 0 and int(fields["CapPrm"], 16) == 0, status
    assert fields["Uid"].split()[0] != "0", status  # not root inside: no --fakeroot, no setuid starter
    inside, outside, count = status.splitlines()[-1].split()
    assert count == "1", status  # a user namespace mapping the one user, as --userns makes for an unprivileged user
    assert owner == os.getuid()  # what a command writes in the workspace is the caller's


def test_every_kind_of_source_runs_and_is_converted_once_per_node(apptainer_binary, base_image, tmp_path):
    cache, work = str(tmp_path / "cache"), tmp_path / "images"
    work.mkdir()
    archive, sif, sandbox = work / "base.tar", work / "base.sif", work / "base-sandbox"
    subprocess.run(["docker", "save", "-o", str(archive), base_image], check=True)
    for target, flags in ((sif, []), (sandbox, ["--sandbox"])):
        built = subprocess.run([apptainer_binary, "build", *flags, str(target), f"docker-archive:{archive}"],
                               capture_output=True, text=True)
        assert built.returncode == 0, built.stdout + built.stderr
    sources = {"docker-daemon": f"docker-daemon:{base_image}", "a bare name (docker-daemon)": base_image,
               "docker-archive": f"docker-archive:{archive}", "a SIF file": str(sif), "a sandbox": str(sandbox)}

    async def scenario(rt):
        return (await rt.exec("cat /etc/debian_version; python3 -c 'import sys; print(sys.version_info[:2])'")).output

    seen = {}
    for kind, image in sources.items():
        for attempt in (1, 2):
            output = run(scenario, runtime(image, cache, tmp_path))
            assert output.startswith("12.") and "(3, 11)" in output, (kind, output)
            entries = sorted(os.listdir(cache))
            seen[kind, attempt] = {e: os.stat(os.path.join(cache, e)).st_ino for e in entries}
        assert seen[kind, 1] == seen[kind, 2], kind  # the second start converted nothing
    # one sandbox per converted source: docker-daemon and its bare name share one, a sandbox is used where it is
    assert len(seen["a sandbox", 2]) == 3, seen["a sandbox", 2]
    assert not any(".partial" in entry for entry in seen["a sandbox", 2])


def test_a_runaway_writer_stops_at_the_file_size_limit_and_the_instance_stays_usable(source, cache, tmp_path):
    async def scenario(rt):
        dd = await rt.exec("dd if=/dev/zero of=big bs=1M count=5000", timeout=120)
        flood = await rt.exec(f"yes > {rt.mount}/flood", timeout=120)  # the workspace: this node's own disk
        sizes = await rt.exec(f"stat -c %s big {rt.mount}/flood")
        return dd, flood, sizes, await rt.exec("echo alive")

    dd, flood, sizes, after = run(scenario, runtime(source, cache, tmp_path, max_file_size="64m"))
    for result in (dd, flood):
        assert result.returncode != 0 and not result.timed_out, result
        assert "File size limit exceeded" in result.output, result
    assert [int(n) for n in sizes.output.split()] == [64 << 20, 64 << 20]
    assert after.output == "alive\n"


def test_output_without_end_stops_at_the_cap_and_leaves_nothing_running(source, cache, tmp_path):
    async def scenario(rt):
        result = await rt.exec("yes", timeout=60)
        return result, (await rt.exec("ps -eo args")).output

    result, ps = run(scenario, runtime(source, cache, tmp_path))
    assert result.truncated and not result.timed_out and len(result.output) == 1_000_000
    assert "\nyes" not in ps, ps


def test_a_sleeper_is_stopped_at_its_timeout_with_what_it_left_behind(source, cache, tmp_path):
    async def scenario(rt):
        slept = await rt.exec("sleep 10000", timeout=2)
        spread = await rt.exec("sleep 10001 & setsid sleep 10002 & sleep 10003; wait", timeout=2)
        await asyncio.sleep(1)
        return slept, spread, (await rt.exec("ps -eo args")).output, await rt.exec("echo alive")

    slept, spread, ps, after = run(scenario, runtime(source, cache, tmp_path))
    assert slept.timed_out and slept.returncode == 124 and spread.timed_out
    assert "sleep 1000" not in ps, f"processes outlived their command's timeout:\n{ps}"
    assert after.output == "alive\n"


def test_a_process_flood_dies_with_the_instance(source, cache, tmp_path):
    marker = f"4242{uuid.uuid4().int % 10**6}"

    async def scenario(rt):
        flood = await rt.exec(f"for i in $(seq 200); do setsid sleep {marker} & done; echo started", timeout=30)
        limit = await rt.exec("ulimit -u")
        return flood, limit

    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    nproc = 100000 if hard == resource.RLIM_INFINITY else hard
    flood, limit = run(scenario, runtime(source, cache, tmp_path, ulimits={"nproc": nproc}))
    assert flood.output.strip().endswith("started")
    assert limit.output.strip() == str(nproc)  # the farm's per-command limit reached the command
    left = asyncio.run(survivors(marker))
    assert left == [], f"{len(left)} of the flood's processes outlived the rollout"


def test_memory_beyond_the_address_space_limit_fails_the_command_not_the_node(source, cache, tmp_path):
    async def scenario(rt):
        hog = await rt.exec('python3 -c "b = bytearray(8 << 30)"', timeout=60)
        return hog, await rt.exec("echo alive")

    # 256m: less than apptainer's own Go runtime reserves, so the limit must be on the command alone (set on the CLI
    # it crashed every exec with `fatal error: failed to reserve page summary memory`; at 1g, on a busy node)
    hog, after = run(scenario, runtime(source, cache, tmp_path, ulimits={"as": "256m"}))
    assert hog.returncode != 0 and "MemoryError" in hog.output, hog
    assert after.output == "alive\n"


@pytest.fixture(scope="module")
def without_prlimit(source, base_image) -> str:
    """The base image without util-linux's ``prlimit`` (as a minimal image may be)."""
    tag = f"rollout-farm/test-no-prlimit:{uuid.uuid4().hex[:8]}"
    built = subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=f"FROM {base_image}\n"
                           "RUN rm /usr/bin/prlimit\n", capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    yield f"docker-daemon:{tag}"
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def test_an_image_without_prlimit_keeps_the_file_size_limit_and_refuses_a_memory_limit(without_prlimit, cache,
                                                                                      apptainer_binary, tmp_path):
    async def scenario(rt):
        return await rt.exec("dd if=/dev/zero of=big bs=1M count=200", timeout=120), await rt.exec("echo alive")

    dd, after = run(scenario, runtime(without_prlimit, cache, tmp_path, max_file_size="64m"))
    assert dd.returncode != 0 and "File size limit exceeded" in dd.output, dd  # set on the CLI: safe there
    assert after.output == "alive\n"
    refused_rt = runtime(without_prlimit, cache, tmp_path, ulimits={"as": "1g"})
    with pytest.raises(ContainerStartError, match="runtime.ulimits as: .* has no prlimit") as refused:
        asyncio.run(refused_rt.start())
    assert not refused.value.retryable
    listed = subprocess.run([apptainer_binary, "instance", "list"], capture_output=True, text=True).stdout
    assert refused_rt.name not in listed and os.listdir(tmp_path / "ws") == []  # its instance stopped, workspace gone


def test_no_network_but_loopback_and_nothing_of_the_host_answers(source, cache, tmp_path):
    servers = [socket.create_server((address, 0)) for address in ("127.0.0.1", _host_address())]
    for server in servers:
        threading.Thread(target=_answer, args=(server,), daemon=True).start()
    probes = [f"python3 -c \"import socket; socket.create_connection(('{h}', {p}), timeout=2); print('reached')\""
              for h, p in (server.getsockname()[:2] for server in servers)]

    async def scenario(rt):
        return (await rt.exec("cat /proc/net/dev")).output, [await rt.exec(probe) for probe in probes]

    try:
        devices, reached = run(scenario, runtime(source, cache, tmp_path))
    finally:
        for server in servers:
            server.close()
    assert [line.split(":")[0].strip() for line in devices.splitlines()[2:]] == ["lo"]
    for result in reached:
        assert result.returncode != 0 and "reached" not in result.output, result


def test_a_limit_that_cannot_be_set_fails_the_start_naming_the_field(source, cache, tmp_path):
    with open("/proc/sys/fs/nr_open") as handle:  # no process may open more files, root included
        beyond = int(handle.read()) + 1
    with pytest.raises(ContainerStartError, match="runtime.ulimits"):
        asyncio.run(runtime(source, cache, tmp_path, ulimits={"nofile": beyond}).start())


def _answer(server: socket.socket) -> None:
    """Accept and close connections until the server is closed."""
    with contextlib.suppress(OSError):
        while True:
            server.accept()[0].close()


def _host_address() -> str:
    """This host's address on its default route (not loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
        return probe.getsockname()[0]
