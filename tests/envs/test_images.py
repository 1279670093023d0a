"""Images: naming rules, per-instance builds from a repo and a bundle, cache hits, failures, the base image."""

from __future__ import annotations

import http.server
import json
import os
import pickle
import re
import shutil
import socketserver
import subprocess
import threading
import time
import uuid

import pytest

from cluster.cli.images import main as images_main
from envs.images.base_image import build_base_image, ensure_image, image_present
from envs.images.daemon import ANSWER_TIMEOUT, LONG_WORK_TIMEOUT, ImageError, docker_client, watched
from envs.images.image_names import image_for, instance_tag, swebench_name
from envs.images.instance_images import LABEL, build_instance_images
from rollout.data.dataset import load_tasks
from rollout.errors import ContainerStartError, ExitReason

# docker's grammar for name:tag, simplified to what we emit (lower-case path components, tag <= 128)
REFERENCE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*:[\w][\w.-]{0,127}$")


# ---- naming (no docker) ---------------------------------------------------------------------


def test_a_named_image_wins_then_our_tag_then_swebench():
    row = {"instance_id": "django__django-11099", "base_commit": "abc", "repo_path": "repos/django"}
    assert image_for({**row, "image_name": "registry.local/x:1"}) == "registry.local/x:1"
    assert image_for({**row, "docker_image": "y:2"}) == "y:2"
    assert image_for(row).startswith("rollout-farm/instance:django__django-11099-")
    swebench = "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert image_for({"instance_id": "django__django-11099"}) == swebench
    assert swebench_name("Astropy__Astropy-12907") == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"


def test_instance_tag_follows_content_not_location():
    row = {"instance_id": "a__b-1", "base_commit": "c1", "repo_path": "r", "install_cmd": "pip install -e ."}
    tag = instance_tag(row)
    assert tag == instance_tag(dict(row)) and REFERENCE.match(tag)
    assert instance_tag({**row, "repo_path": "elsewhere/r.bundle"}) == tag
    changed = [{**row, "base_commit": "c2"}, {**row, "install_cmd": "true"}, {**row, "instance_id": "A__b-1"}]
    assert len({tag, *(instance_tag(r) for r in changed), instance_tag(row, base="other/base:1")}) == 5


@pytest.mark.parametrize("ident", ["x" * 300, "Weird id/with spaces:and:colons", "..leading-dots", "__"])
def test_instance_tags_are_valid_references(ident):
    tag = instance_tag({"instance_id": ident, "base_commit": "c", "repo_path": "r"})
    assert REFERENCE.match(tag), tag
    assert len(tag.split(":", 1)[1]) <= 128


def test_image_for_reads_a_loaded_task_like_its_row(tmp_path):
    row = {"instance_id": "p__q-7", "problem_statement": "fix it", "base_commit": "c", "repo_path": "r"}
    (tmp_path / "d.jsonl").write_text(json.dumps(row) + "\n")
    [task] = load_tasks(tmp_path / "d.jsonl")
    assert image_for(task) == image_for(task.data) == image_for(row)


@pytest.mark.parametrize("message, retryable", [
    ("The command '/bin/sh -c test -d /nope' returned a non-zero code: 1", False),
    ("COPY failed: file not found in build context or excluded by .dockerignore: stat testbed: file does not exist",
     False),
    ('failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: '
     'error during container init: writing syncT "procResume": write init-p: broken pipe: unknown', True),
])
def test_a_build_step_the_engine_could_not_start_is_retried_and_a_failed_command_is_final(message, retryable):
    """The engine's own failure to run a step (CI saw runc's, under load) is infrastructure: the rollout runs again;
    the step's command failing, or the build's input missing, is the row's: final, with the build's last lines."""
    import docker

    from envs.images.base_image import docker_build

    class Engine:  # the fault, injected where the SDK raises it
        class api:
            timeout = 60

        class images:
            @staticmethod
            def build(**options):
                raise docker.errors.BuildError(message, [{"stream": "Step 5/5 : RUN git status\n"}])

    with pytest.raises(ImageError) as caught:
        docker_build(Engine(), "rollout-farm/instance:x")
    assert caught.value.retryable is retryable
    assert "rollout-farm/instance:x" in str(caught.value) and "Step 5/5" in str(caught.value)


def test_image_error_is_a_container_start_failure_that_pickles():
    error = pickle.loads(pickle.dumps(ImageError("image x is missing")))
    assert isinstance(error, ContainerStartError) and error.exit_reason is ExitReason.CONTAINER_START_FAILED
    assert str(error) == "image x is missing" and error.retryable is False


class SlowDaemon(http.server.BaseHTTPRequestHandler):
    """The docker API as a daemon that hangs answers it: ``/version`` at once, an image inspect (``No such image``)
    only after ``delay`` seconds (the injected fault)."""

    delay = 3.0
    wedged = ("/images/",)

    def do_GET(self):  # noqa: N802 - http.server's name
        if any(part in self.path for part in self.wedged):
            time.sleep(self.delay)
            body, code = {"message": "No such image"}, 404
        else:
            body, code = {"ApiVersion": "1.41", "Version": "24.0.0"}, 200
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):
        request, _ = super().get_request()
        return request, ("daemon", 0)  # http.server wants a (host, port)


class WedgedDaemon(SlowDaemon):
    """A daemon that hangs whole: its ``info`` as silent as its image inspects."""

    wedged = ("/images/", "/info")


def serve_daemon(path: str, handler: type) -> UnixServer:
    server = UnixServer(path, handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_daemon_silent_past_the_clients_timeout_fails_the_call_as_infrastructure_and_long_work_waits(
        tmp_path, monkeypatch):
    """The image code's client gives up on a daemon that stays silent (a hang costs a rollout one bounded wait, a
    retryable failure), by default after ``ANSWER_TIMEOUT``, never the hour long work may take; inside ``patient``
    the same call waits while the daemon answers beside it, and the client has its own timeout again after."""
    path = str(tmp_path / "docker.sock")
    server = serve_daemon(path, SlowDaemon)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    try:
        assert docker_client().api.timeout == ANSWER_TIMEOUT < LONG_WORK_TIMEOUT
        client = docker_client(timeout=1)
        began = time.monotonic()
        with pytest.raises(ImageError) as caught:
            image_present(client, "rollout-farm/instance:x")
        quick = time.monotonic() - began
        assert caught.value.retryable and quick < SlowDaemon.delay
        began = time.monotonic()
        assert watched(client, lambda: image_present(client, "rollout-farm/instance:x"), "an inspect", every=0.2)\
            is False
        assert time.monotonic() - began >= SlowDaemon.delay and client.api.timeout == 1
    finally:
        server.shutdown()
        server.server_close()


def test_long_work_on_a_daemon_that_stops_answering_beside_it_fails_at_once_as_infrastructure(tmp_path, monkeypatch):
    """A build, pull or load may stream nothing for long; the daemon must still answer its ``info`` beside it. One
    that does not (stopped, wedged) fails the work after that one question's wait, not after the hour."""
    path = str(tmp_path / "docker.sock")
    server = serve_daemon(path, WedgedDaemon)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    try:
        client = docker_client(timeout=1)
        began = time.monotonic()
        with pytest.raises(ImageError, match="stopped answering during the build of x") as caught:
            watched(client, lambda: image_present(client, "x"), "the build of x", every=0.2, answer=0.5)
        assert caught.value.retryable and time.monotonic() - began < WedgedDaemon.delay
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("argv", [["build", "no-such-dataset.jsonl"], ["build", "d.jsonl", "--parallel", "0"],
                                  ["frobnicate"], ["build"]])
def test_cli_bad_input_is_exit_2(argv, capsys):
    assert images_main(argv) == 2


# ---- per-instance builds (docker) -----------------------------------------------------------


def git(cwd, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def docker_run(image: str, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "run", "--rm", "--network", "none", image, "bash", "-c", script],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, base_image):
    """A buggy package committed, then fixed (tagged v1 and v2); rows for it as a directory and as a
    bundle, a row whose install fails, one with a missing repo, one naming a prebuilt image."""
    root = tmp_path_factory.mktemp("images")
    repo = root / "calc"
    (repo / "tests").mkdir(parents=True)
    git(root, "init", "-q", "-b", "main", str(repo))
    git(repo, "config", "user.email", "t@example.invalid")
    git(repo, "config", "user.name", "t")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    test = "from calc import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"
    (repo / "tests" / "test_calc.py").write_text(test)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "calc with a bug")
    git(repo, "tag", "v1")
    base_commit = git(repo, "rev-parse", "HEAD")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    git(repo, "commit", "-q", "-am", "fix add")
    git(repo, "tag", "v2")
    fix_commit = git(repo, "rev-parse", "HEAD")
    git(repo, "bundle", "create", "-q", str(root / "calc.bundle"), "--all")

    run = uuid.uuid4().hex[:8]  # fresh ids: a first build really builds, whatever an earlier session left
    common = {"repo": "demo/calc", "base_commit": base_commit, "problem_statement": "add subtracts",
              "FAIL_TO_PASS": '["tests/test_calc.py::test_add"]', "PASS_TO_PASS": "[]", "version": "1"}
    rows = {
        "dir": {**common, "instance_id": f"demo__calc-dir-{run}", "repo_path": "calc",
                "install_cmd": "echo installed > /opt/installed && python3 -c 'import calc'"},
        "bundle": {**common, "instance_id": f"demo__calc-bundle-{run}", "repo_path": "calc.bundle"},
        "broken": {**common, "instance_id": f"demo__calc-broken-{run}", "repo_path": "calc",
                   "install_cmd": "echo install-went-wrong >&2; exit 3"},
        "missing": {**common, "instance_id": f"demo__calc-missing-{run}", "repo_path": "nowhere"},
        "prebuilt": {**common, "instance_id": f"demo__calc-prebuilt-{run}", "image_name": "someone/else:1"},
    }
    path = root / "dataset.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows.values()))
    yield {"path": path, "rows": rows, "base_commit": base_commit, "fix_commit": fix_commit, "base": base_image}
    tags = [instance_tag(r, base_image) for r in rows.values()]
    subprocess.run(["docker", "rmi", "-f", *tags], capture_output=True)  # never the base image
    for row in rows.values():
        subprocess.run(["docker", "image", "prune", "-f", "--filter", f"label={LABEL}={row['instance_id']}"],
                       capture_output=True)


@pytest.fixture(scope="module")
def first_build(dataset):
    lines: list[str] = []
    report = build_instance_images(dataset["path"], base=dataset["base"], parallelism=2, progress=lines.append)
    return report, lines


@pytest.mark.docker
def test_builds_every_buildable_row_and_reports_the_rest(dataset, first_build):
    report, lines = first_build
    ids = {k: r["instance_id"] for k, r in dataset["rows"].items()}
    assert report.built == [ids["dir"], ids["bundle"]]
    assert report.skipped == [] and report.ignored == [ids["prebuilt"]]
    failed = dict(report.failed)
    assert set(failed) == {ids["broken"], ids["missing"]}
    assert "install-went-wrong" in failed[ids["broken"]]
    assert "nowhere" in failed[ids["missing"]] and "does not exist" in failed[ids["missing"]]
    assert sum(bool(re.fullmatch(r"built [1-4]/4 \(demo__calc-\w+-\w+\) in \d+\.\ds", line)) for line in lines) == 2


@pytest.mark.docker
def test_a_second_build_reuses_the_images(dataset, first_build):
    report = build_instance_images(dataset["path"], base=dataset["base"], progress=lambda line: None)
    assert report.built == [] and len(report.skipped) == 2 and len(report.failed) == 2


def untagged_layers(ident: str) -> list[str]:
    out = subprocess.run(["docker", "images", "-q", "-f", "dangling=true", "-f", f"label={LABEL}={ident}"],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.docker
def test_force_rebuilds_and_leaves_no_untagged_layers(dataset, first_build, tmp_path):
    assert untagged_layers(dataset["rows"]["broken"]["instance_id"]) == []  # the failed build cleaned up
    row = dataset["rows"]["bundle"]
    only = dataset["path"].with_name("bundle-only.jsonl")
    only.write_text(json.dumps(row) + "\n")
    image = image_for(row, base=dataset["base"])
    before = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image], capture_output=True, text=True)
    report = build_instance_images(only, base=dataset["base"], force=True, progress=lambda line: None)
    after = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image], capture_output=True, text=True)
    assert report.built == [row["instance_id"]] and after.stdout != before.stdout
    assert untagged_layers(row["instance_id"]) == []  # the replaced image is gone


@pytest.mark.parametrize("kind", ["dir", "bundle"])
@pytest.mark.docker
def test_image_holds_the_repo_at_base_commit_and_no_future(dataset, first_build, kind):
    image = image_for(dataset["rows"][kind], base=dataset["base"])
    out = docker_run(image, "pwd; git rev-parse HEAD; git tag; ls /opt/installed 2>/dev/null || echo no-install;"
                     f" git cat-file -e {dataset['fix_commit']} 2>/dev/null && echo fix-visible || echo fix-hidden;"
                     " python3 -m pytest -q 2>&1 | tail -1;"
                     " git commit -q --allow-empty -m agent && git log --format=%an -1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:4] == ["/testbed", dataset["base_commit"], "v1", "/opt/installed" if kind == "dir" else "no-install"]
    assert lines[4] == "fix-hidden"
    assert "1 failed" in lines[5]  # the bug is there for the agent to fix
    assert lines[6] == "rollout-farm agent"


@pytest.mark.docker
def test_ensure_image_names_a_missing_image_and_how_to_get_it(dataset, first_build):
    ensure_image(image_for(dataset["rows"]["dir"], base=dataset["base"]))  # present: returns
    missing = instance_tag({"instance_id": f"never-built-{uuid.uuid4().hex[:8]}", "repo_path": "x"})
    with pytest.raises(ImageError, match="rollout images build") as caught:
        ensure_image(missing)
    assert missing in str(caught.value)
    unpullable = f"rollout-farm-tests/absent-{uuid.uuid4().hex[:8]}:none"
    with pytest.raises(ImageError, match="could not be pulled") as caught:
        ensure_image(unpullable)
    assert unpullable in str(caught.value)


@pytest.mark.docker
def test_cli_build_summarises_and_fails_on_failed_rows(dataset, first_build, capsys):
    assert images_main(["build", str(dataset["path"]), "--base", dataset["base"]]) == 1
    out, err = capsys.readouterr()
    assert "built 0, skipped 2 (present), failed 2" in out
    assert dataset["rows"]["missing"]["instance_id"] in err


# ---- the base image -------------------------------------------------------------------------


@pytest.mark.docker
def test_base_image_present_is_skipped(base_image, capsys):
    before = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", base_image], capture_output=True, text=True)
    assert build_base_image(base_image, log=print) == base_image
    assert images_main(["base", "--tag", base_image]) == 0
    assert capsys.readouterr().out.count(f"{base_image}: present") == 2
    after = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", base_image], capture_output=True, text=True)
    assert after.stdout == before.stdout


@pytest.mark.docker
def test_base_image_without_debootstrap_says_how_to_install_it(docker_available, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no debootstrap on this PATH
    tag = f"rollout-farm/base:absent-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ImageError, match=r"apt-get install debootstrap"):
        build_base_image(tag, log=lambda line: None)


@pytest.mark.docker
def test_a_failed_debootstrap_says_why_and_leaves_no_rootfs(docker_available, tmp_path):
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        pytest.skip("needs debootstrap and root")
    tag = f"rollout-farm/base:unreachable-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ImageError, match=r"debootstrap exited .*\n(.|\n)*Release"):
        build_base_image(tag, mirror="http://127.0.0.1:9/debian", workdir=str(tmp_path), log=lambda line: None)
    assert list(tmp_path.iterdir()) == []
