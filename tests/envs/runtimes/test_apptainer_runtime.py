"""ApptainerRuntime: the command lines it builds, and its behaviour against a stand-in CLI that runs commands here.

The stand-in is a real executable named ``apptainer`` first on PATH: it logs its argv, keeps instances as
files, builds "images" on request, and runs exec'd commands (``timeout`` wrapper included) with bash on this
host, so exec, timeout, output cap and file paths are exercised for real. It stands in only for what a real
binary cannot be made to do on demand (hang, fail a conversion, be slow to convert); the real binary, unprivileged,
is ``test_apptainer_real.py``'s.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import textwrap

import pytest
from runtime_helpers import survivors

from envs.images.apptainer_images import INSTALL_HINT, build_argv, cached_sif, default_cache_dir
from envs.runtimes.apptainer.runtime import (
    ApptainerRuntime,
    ApptainerRuntimeConfig,
    exec_argv,
    limits_argv,
    start_argv,
    stop_argv,
    workspace_mount,
)
from envs.runtimes.check import check_runtime
from envs.runtimes.process import kill_pid_namespace
from rollout.errors import ConfigError, ContainerStartError, RuntimeFailure

BASE_IMAGE = "rollout-farm/base:bookworm"

FAKE_CLI = r"""#!/bin/bash
# Stand-in for the apptainer CLI: logs its argv, keeps instances as files, runs exec'd commands on this host.
here=$(dirname "$0")
record=$(printf '%s\x1f' "$@")
printf '%s\x1e' "$record" >> "$here/log"
fail() { echo "FATAL:   $*" >&2; exit 255; }
case "$1 $2" in
  "build "*)
    [[ "$3" == *missing* ]] && fail "image $3 not found"
    printf 'SIF-' > "$2"; sleep "${FAKE_BUILD_SECONDS:-0}"; printf 'done' >> "$2"; exit 0 ;;
  "instance start")
    shift 2; sif=${@: -2:1}; name=${@: -1}
    [ "$(cat "$sif" 2>/dev/null)" = SIF-done ] || fail "$sif is not a SIF image"
    while [ "$1" != --bind ]; do shift; done
    mkdir -p "$here/instances"; printf '%s' "$2" > "$here/instances/$name"
    echo "INFO:    instance started successfully"; exit 0 ;;
  "instance stop")
    name=${@: -1}
    [ -e "$here/instances/$name" ] || fail "no instance found with name $name"
    rm "$here/instances/$name"; exit 0 ;;
  "exec "*)
    shift; pwd=/
    while [[ "$1" == -* ]]; do [ "$1" = --pwd ] && { pwd=$2; shift; }; shift; done
    name=${1#instance://}; shift
    [ -e "$here/instances/$name" ] || fail "no instance found with name $name"
    bind=$(cat "$here/instances/$name"); host=${bind%%:*}; mount=${bind#*:}
    pwd=${pwd/#"$mount"/"$host"}
    set -- "${@//"$mount"/"$host"}"
    cd "$pwd" 2>/dev/null || fail "could not change directory to $pwd"
    if [ -n "$FAKE_IGNORE_TIMEOUT" ]; then  # drop `timeout -k K T` (after the limits' prlimit ... --)
      kept=(); while [ $# -gt 0 ]; do [ "$1" = timeout ] && { shift 4; continue; }; kept+=("$1"); shift; done
      set -- "${kept[@]}"
    fi
    mkdir -p "$here/home"  # like --containall: a clean environment and an empty home
    exec env -i PATH="$PATH" HOME="$here/home" "$@" ;;
esac
fail "unknown command: $*"
"""


class FakeCli:
    def __init__(self, bin_dir):
        self.bin_dir = bin_dir
        self.path = str(bin_dir / "apptainer")

    def calls(self, verb: str | None = None) -> list[list[str]]:
        """Every argv the stand-in received (without the binary), optionally only those starting with ``verb``."""
        log = self.bin_dir / "log"
        records = log.read_text().split("\x1e")[:-1] if log.exists() else []
        argvs = [record.split("\x1f")[:-1] for record in records]
        return [argv for argv in argvs if verb is None or " ".join(argv).startswith(verb)]

    def instances(self) -> list[str]:
        folder = self.bin_dir / "instances"
        return sorted(os.listdir(folder)) if folder.exists() else []


@pytest.fixture
def fake_cli(tmp_path, monkeypatch) -> FakeCli:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(FAKE_CLI)
    (bin_dir / "apptainer").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return FakeCli(bin_dir)


@pytest.fixture
def sif(tmp_path) -> str:
    path = tmp_path / "image.sif"
    path.write_text("SIF-done")
    return str(path)


def runtime(tmp_path, image: str, **overrides) -> ApptainerRuntime:
    config = {"image": image, "workspace_root": str(tmp_path / "ws"), "cache_dir": str(tmp_path / "cache"),
              "convert_to": "sif", "workspace_mount": "/workspace"}  # the stand-in: .sif files, workdir on the host
    return ApptainerRuntime({**config, **overrides})


def workspaces(tmp_path) -> list[str]:
    return os.listdir(tmp_path / "ws") if (tmp_path / "ws").exists() else []


# ---- command lines ----------------------------------------------------------------------------------------


def test_start_argv_defaults_isolate_and_bind_the_workspace():
    config = ApptainerRuntimeConfig()
    expected = ("ap instance start --userns --containall --writable-tmpfs --net --network none "
                "--bind /host/ws:/workspace")
    assert start_argv(config, "/img.sif", "r1", "/host/ws", "ap", "/workspace") == [*expected.split(), "/img.sif", "r1"]


def test_the_workspace_is_bound_where_it_hides_nothing_of_the_image(tmp_path):
    config = ApptainerRuntimeConfig(workdir="/testbed")
    (tmp_path / "with" / "testbed").mkdir(parents=True)
    (tmp_path / "without").mkdir()
    assert workspace_mount(config, str(tmp_path / "with")) == "/rollout-workspace"  # the image's /testbed stays
    assert workspace_mount(config, str(tmp_path / "without")) == "/testbed"
    assert workspace_mount(config, str(tmp_path / "image.sif")) == "/rollout-workspace"  # a SIF is not looked into
    assert workspace_mount(config.model_copy(update={"workspace_mount": "/io"}), str(tmp_path / "with")) == "/io"


PLAIN = {"network": "host", "containall": False, "writable_tmpfs": False, "userns": False}
"""No isolation flags, so each case below shows only what its options add."""


@pytest.mark.parametrize(
    "overrides, flags",
    [
        ({"network": "host"}, "--userns --containall --writable-tmpfs --bind /ws:/workspace"),
        ({**PLAIN, "network": "none", "no_home": True}, "--no-home --net --network none --bind /ws:/workspace"),
        ({**PLAIN, "workdir": "/testbed", "workspace_mount": "/rollout-io"}, "--bind /ws:/rollout-io"),
        ({**PLAIN, "workdir": "/job/", "binds": ["/data:/data:ro"]}, "--bind /ws:/job --bind /data:/data:ro"),
        (
            {**PLAIN, "memory": "2g", "cpus": 1.5, "pids_limit": 256, "start_args": ["--fakeroot"]},
            "--bind /ws:/workspace --memory 2g --cpus 1.5 --pids-limit 256 --fakeroot",
        ),
    ],
)
def test_start_argv_options(overrides, flags):
    config = ApptainerRuntimeConfig(**overrides)
    argv = start_argv(config, "/i.sif", "n", "/ws", "ap", config.workspace_mount or config.workdir)
    assert argv == ["ap", "instance", "start", *flags.split(), "/i.sif", "n"]


def test_start_argv_uses_the_configured_binary_by_default():
    assert start_argv(ApptainerRuntimeConfig(binary="singularity"), "i.sif", "n", "/ws")[0] == "singularity"


def test_exec_argv_wraps_the_command_in_its_limits_and_timeout_inside_the_instance():
    argv = exec_argv(ApptainerRuntimeConfig(), "r1", "ls -la", timeout=30, pwd="/workspace", binary="ap")
    expected = ("ap exec --cleanenv --pwd /workspace instance://r1 "
                "prlimit --fsize=1073741824:1073741824 -- "  # the file size limit, 1g by default: on the command alone
                "timeout -k 2 30 bash -lc")
    assert argv == [*expected.split(), "ls -la"]
    outside = exec_argv(ApptainerRuntimeConfig(), "r1", "ls", timeout=30, pwd="/w", binary="ap", limits_inside=False)
    assert outside[:4] == ["prlimit", "--fsize=1073741824:1073741824", "--", "ap"]  # an image without prlimit


def test_exec_argv_passes_variables_exactly_with_per_call_ones_winning():
    config = ApptainerRuntimeConfig(env={"PAGER": "cat", "A": "config"}, shell=["sh", "-c"], kill_grace=0.5,
                                    max_file_size=None)
    tricky = 'x=1,y="2"'  # what the CLI's --env would split as CSV and strip quotes from
    argv = exec_argv(config, "r1", "env", timeout=1.25, pwd="/w/sub", env={"A": "call", "B": tricky}, binary="ap")
    expected = "ap exec --cleanenv --pwd /w/sub instance://r1 timeout -k 0.5 1.25 env PAGER=cat A=call"
    assert argv == [*expected.split(), f"B={tricky}", "sh", "-c", "env"]


def test_the_farm_sets_resource_limits_on_each_command_with_prlimit():
    config = ApptainerRuntimeConfig(max_file_size="64m", ulimits={"nproc": "256:512", "as": "2g", "nofile": 1024})
    limits = exec_argv(config, "r1", "true", timeout=1, pwd="/w", binary="ap")[6:12]
    assert limits == ["prlimit", "--as=2147483648:2147483648", "--fsize=67108864:67108864", "--nofile=1024:1024",
                      "--nproc=256:512", "--"]
    assert "prlimit" not in exec_argv(ApptainerRuntimeConfig(max_file_size=None), "r1", "true", timeout=1, pwd="/w")
    in_bytes = ApptainerRuntimeConfig(max_file_size="4096b", ulimits={"cpu": "unlimited"})  # every form the fields take
    assert exec_argv(in_bytes, "r1", "true", timeout=1, pwd="/w")[6:10] == [
        "prlimit", "--cpu=unlimited:unlimited", "--fsize=4096:4096", "--"]


def test_build_and_stop_argv():
    assert build_argv("ap", "/c/x.sif", "docker-daemon:a/b:c") == ["ap", "build", "/c/x.sif", "docker-daemon:a/b:c"]
    assert build_argv("ap", "/c/x", "docker-archive:/i.tar", sandbox=True) == [
        "ap", "build", "--sandbox", "/c/x", "docker-archive:/i.tar"]
    assert stop_argv("ap", "r1") == ["ap", "instance", "stop", "--force", "r1"]


@pytest.mark.parametrize(
    "config, field",
    [
        ({"workdir": "workspace"}, "runtime.workdir"),
        ({"network": "bridge"}, "runtime.network"),
        ({"workspace_root": "/tmp/a:b"}, "runtime.workspace_root"),
        ({"imag": "x.sif"}, "runtime.imag"),
        ({"ulimits": {"procs": 10}}, "runtime.ulimits"),
        ({"ulimits": {"nproc": "lots"}}, "runtime.ulimits"),
        ({"convert_to": "squashfs"}, "runtime.convert_to"),
        ({"transport": "ftp"}, "runtime.transport"),
    ],
)
def test_bad_config_names_the_field(config, field):
    with pytest.raises(ConfigError) as info:
        ApptainerRuntime(config)
    assert info.value.field == field


def test_from_config_ignores_unknown_deps_and_names_the_instance_after_the_run():
    rt = ApptainerRuntime.from_config({"image": "x.sif"}, trusted_model=True, run_id="my run/1")
    assert rt.name.startswith("rollout-my-run-1-") and rt.workdir == "/workspace"


def test_cache_dir_follows_rollout_home_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("ROLLOUT_HOME", str(tmp_path / "home"))
    assert default_cache_dir() == str(tmp_path / "home" / ".apptainer-cache")
    monkeypatch.delenv("ROLLOUT_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "xdg" / "rollout-farm" / "apptainer")
    a, b = cached_sif("/c", "docker://a/b:1"), cached_sif("/c", "docker://a_b:1")
    assert a != b and os.path.dirname(a) == "/c" and a.endswith(".sif") and "a_b_1" in a


# ---- errors before anything runs ---------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [None, "singularity-nowhere"])
def test_missing_binary_says_what_to_install(binary, tmp_path, monkeypatch, sif):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rt = runtime(tmp_path, sif, binary=binary)
    with pytest.raises(ContainerStartError) as info:
        asyncio.run(rt.start())
    assert INSTALL_HINT in str(info.value) and not info.value.retryable
    assert workspaces(tmp_path) == []


def test_missing_image_file_is_a_start_error(fake_cli, tmp_path):
    with pytest.raises(ContainerStartError, match="no-such.sif"):
        asyncio.run(runtime(tmp_path, str(tmp_path / "no-such.sif")).start())
    assert fake_cli.calls() == []


def test_failed_instance_start_leaves_nothing(fake_cli, tmp_path):
    bad = tmp_path / "bad.sif"
    bad.write_text("not an image")
    with pytest.raises(ContainerStartError, match="not a SIF image"):
        asyncio.run(runtime(tmp_path, str(bad)).start())
    assert workspaces(tmp_path) == [] and fake_cli.instances() == []


# ---- against the stand-in CLI ------------------------------------------------------------------------------


def test_stand_in_passes_the_conformance_checker(fake_cli, tmp_path, sif):
    asyncio.run(check_runtime(lambda: runtime(tmp_path, sif, max_output_bytes=10_000)))
    assert fake_cli.instances() == [] and workspaces(tmp_path) == []


def test_the_cli_receives_exactly_the_built_command_lines(fake_cli, tmp_path, sif):
    rt = runtime(tmp_path, sif, env={"PAGER": "cat"})

    async def go():
        await rt.start()
        result = await rt.exec("pwd; echo $PAGER", timeout=5, cwd="sub/..", env={"X": "1"})
        await rt.close()
        return result

    result = asyncio.run(go())
    assert result.returncode == 0 and result.output.endswith("\ncat\n")
    config = rt.config
    assert fake_cli.calls() == [
        start_argv(config, sif, rt.name, rt.workspace, fake_cli.path)[1:],
        ["exec", "--cleanenv", f"instance://{rt.name}", *limits_argv(config), "true"],  # the limits tried once
        exec_argv(config, rt.name, "pwd; echo $PAGER", timeout=5, pwd="/workspace", env={"X": "1"})[1:],
        stop_argv(fake_cli.path, rt.name)[1:],
    ]


def test_a_referenced_image_is_converted_once(fake_cli, tmp_path):
    image = "docker://example/base:1"  # (a docker-daemon: name is keyed by its image id too)

    async def go():
        first, second = runtime(tmp_path, image), runtime(tmp_path, image)
        await first.start()
        await second.start()
        await asyncio.gather(first.close(), second.close())
        fresh = [runtime(tmp_path, image, cache_dir=str(tmp_path / "cache2")) for _ in range(3)]
        await asyncio.gather(*(rt.start() for rt in fresh))  # all ask before any conversion finishes
        await asyncio.gather(*(rt.close() for rt in fresh))

    asyncio.run(go())
    builds = fake_cli.calls("build")
    assert [argv[2] for argv in builds] == [image, image]
    for argv, cache in zip(builds, ("cache", "cache2")):
        assert os.listdir(tmp_path / cache) == [os.path.basename(cached_sif(str(tmp_path / cache), image))]
        assert argv[1] != cached_sif(str(tmp_path / cache), image)  # built aside, then renamed into place
    started = [argv[-2] for argv in fake_cli.calls("instance start")]
    first, second = (cached_sif(str(tmp_path / cache), image) for cache in ("cache", "cache2"))
    assert started == [first, first, second, second, second]


def test_processes_converting_the_same_image_never_see_a_partial_file(fake_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_BUILD_SECONDS", "0.5")
    script = textwrap.dedent(f"""
        import asyncio
        from envs.runtimes.apptainer.runtime import ApptainerRuntime
        async def main():
            rt = ApptainerRuntime({{"image": "docker://example/x:1", "cache_dir": {str(tmp_path / "cache")!r},
                                  "convert_to": "sif", "workspace_mount": "/workspace"}})
            await rt.start()
            print((await rt.exec("echo ok")).output, end="")
            await rt.close()
        asyncio.run(main())
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and outputs == ["ok\n", "ok\n"]
    (cached,) = os.listdir(tmp_path / "cache")  # no partial file left behind
    assert (tmp_path / "cache" / cached).read_text() == "SIF-done"


def test_a_failed_conversion_fails_every_waiter_and_is_retried_later(fake_cli, tmp_path):
    image = "docker://missing/image:1"

    async def go():
        results = await asyncio.gather(*(runtime(tmp_path, image).start() for _ in range(2)), return_exceptions=True)
        again = await asyncio.gather(runtime(tmp_path, image).start(), return_exceptions=True)
        return results + again

    errors = asyncio.run(go())
    assert all(isinstance(e, ContainerStartError) and "missing/image" in str(e) for e in errors)
    assert len(fake_cli.calls("build")) == 2  # one for the two concurrent starts, one for the later start
    assert workspaces(tmp_path) == [] and os.listdir(tmp_path / "cache") == []  # no partial image left


@pytest.mark.parametrize("ignore_timeout", [False, True], ids=["in-container timeout", "host deadline"])
def test_a_timed_out_command_is_reported_and_leaves_no_process(ignore_timeout, fake_cli, tmp_path, sif, monkeypatch):
    if ignore_timeout:  # the CLI hangs past the in-container timeout: the host deadline must end it
        monkeypatch.setenv("FAKE_IGNORE_TIMEOUT", "1")
    marker = f"100.{random.randrange(10**8, 10**9)}"
    rt = runtime(tmp_path, sif, kill_grace=0.2, host_grace=0.3)

    async def go():
        await rt.start()
        result = await rt.exec(f"sleep {marker} & sleep {marker}", timeout=0.5)
        left = await survivors(marker, seconds=1.0)
        after = await rt.exec("echo still here", timeout=5)
        await rt.close()
        return result, left, after

    result, left, after = asyncio.run(go())
    assert result.timed_out and result.returncode == (-9 if ignore_timeout else 124)
    assert result.duration < 3  # generous: the deadline is 0.5 + 0.2 + 0.3 s
    assert left == [] and after.output == "still here\n" and not after.timed_out


def test_a_command_exiting_124_by_itself_is_not_a_timeout(fake_cli, tmp_path, sif):
    async def go():
        rt = runtime(tmp_path, sif)
        await rt.start()
        try:
            return await rt.exec("exit 124", timeout=30)
        finally:
            await rt.close()

    result = asyncio.run(go())
    assert result.returncode == 124 and not result.timed_out


def test_close_is_idempotent_stops_the_instance_once_and_removes_the_workspace(fake_cli, tmp_path, sif):
    rt = runtime(tmp_path, sif)

    async def go():
        await rt.start()
        await rt.write_file("notes.txt", b"hi")
        assert (await rt.exec("cat notes.txt")).output == "hi"
        await rt.close()
        await rt.close()
        with pytest.raises(RuntimeFailure):
            await rt.exec("echo after")
        with pytest.raises(RuntimeFailure):
            await rt.start()

    asyncio.run(go())
    assert fake_cli.calls("instance stop") == [["instance", "stop", "--force", rt.name]]
    assert fake_cli.instances() == [] and workspaces(tmp_path) == []


def test_an_instance_that_vanished_is_a_runtime_failure(fake_cli, tmp_path, sif):
    async def go():
        rt = runtime(tmp_path, sif)
        await rt.start()
        stop = [fake_cli.path, *stop_argv("x", rt.name)[1:]]
        await asyncio.to_thread(subprocess.run, stop, check=True)  # stopped behind our back
        try:
            with pytest.raises(RuntimeFailure, match="is gone"):
                await rt.exec("echo hi")
        finally:
            await rt.close()

    asyncio.run(go())


def test_files_outside_the_workspace_go_through_the_container(fake_cli, tmp_path, sif):
    outside = tmp_path / "elsewhere"  # the stand-in shares this host's filesystem, so it "exists inside" too

    async def go():
        rt = runtime(tmp_path, sif)
        await rt.start()
        try:
            await rt.write_file(str(outside / "deep" / "data.bin"), bytes(range(256)))
            back = await rt.read_file(str(outside / "deep" / "data.bin"))
            with pytest.raises(FileNotFoundError):
                await rt.read_file(str(outside / "missing.bin"))
            await rt.write_file("/workspace/in.txt", b"mapped")
            inside = await rt.read_file("in.txt")
            leftovers = os.listdir(rt.workspace)
        finally:
            await rt.close()
        return back, inside, leftovers

    back, inside, leftovers = asyncio.run(go())
    assert back == bytes(range(256)) and (outside / "deep" / "data.bin").read_bytes() == back
    assert inside == b"mapped" and leftovers == ["in.txt"]  # no staging file left in the workspace


def test_instances_left_running_are_stopped_at_interpreter_exit(fake_cli, tmp_path, sif):
    script = textwrap.dedent(f"""
        import asyncio, atexit
        import envs.runtimes.apptainer.runtime as m
        from envs.runtimes import exit_stops
        assert not exit_stops._atexit_installed  # nothing is registered at import (one exit hook, shared)
        rt = m.ApptainerRuntime({{"image": {sif!r}, "workspace_root": {str(tmp_path / "ws")!r},
                                  "convert_to": "sif", "workspace_mount": "/workspace"}})
        asyncio.run(rt.start())
        print(rt.name)
    """)
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    name = done.stdout.strip()
    assert fake_cli.calls("instance stop") == [["instance", "stop", "--force", name]]
    assert fake_cli.instances() == [] and workspaces(tmp_path) == []


def test_leftovers_are_killed_only_in_a_pid_namespace_of_their_own():
    """After a timeout the runtime kills what is left in the instance's PID namespace from the host: never where
    the "instance" shares this process's namespace (the whole host), nor for a process already gone."""
    assert kill_pid_namespace(os.getpid()) == 0
    assert kill_pid_namespace(2**22 + 1) == 0  # past any pid_max: gone
    assert os.path.exists(f"/proc/{os.getppid()}")  # the one who ran us is alive
